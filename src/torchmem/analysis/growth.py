"""Growth statistics: is a memory figure read at step boundaries growing steadily, and if not, why not.

- :func:`detect_growth` judges a per-step series: a steady test (every recent step grew by a similar amount),
  a noise-robust one (Theil–Sen slope, rising floors, Mann–Kendall) and, for runs too short for that, a
  staircase test; when it is not a leak it says why (below the threshold, too few readings, flat, shrinking,
  noisy).
- :func:`periodic_rate`: growth in regular jumps (every N steps), judged on the jumps themselves wherever the
  readings fell between them; :class:`~torchmem.analysis.growth_stream.GrowthStream` runs it on the jumps of
  the whole run (bounded), and gives :func:`detect_growth`'s verdict one reading at a time (its own module).
- :func:`short_run_growth` and :func:`inner_growth`: overwhelming growth in a run too short for the tests, and
  growth inside each call that falls back at its end.

Pure functions over numbers (re-exported by :mod:`torchmem.analysis.leaks`). Cost: O(n²) in the readings of
one window (32 at most) to explain a series or to run the robust test, only after O(n) pre-checks pass.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence

from torchmem._format import fmt_bytes
from torchmem.results.leaks import Growth

#: The least growth called growth when a series below the threshold is described (bytes per step).
SMALL_GROWTH = 1.0
# Readings the noise-robust test needs.
ROBUST_SAMPLES = 16


def _concordance(xs: Sequence[float], ys: Sequence[float]) -> float:
    conc = disc = 0
    n = len(ys)
    for i in range(n):
        for j in range(i + 1, n):
            d = (ys[j] - ys[i]) * (xs[j] - xs[i])
            if d > 0:
                conc += 1
            elif d < 0:
                disc += 1
    total = n * (n - 1) // 2
    return max(0.0, (conc - disc) / total) if total else 0.0


def _theil_sen(xs: Sequence[float], ys: Sequence[float]) -> float:
    slopes = sorted(
        (ys[j] - ys[i]) / (xs[j] - xs[i])
        for i in range(len(ys))
        for j in range(i + 1, len(ys))
        if xs[j] != xs[i]
    )
    return slopes[len(slopes) // 2] if slopes else 0.0


def _median(v: Sequence[float]) -> float:
    """The median (``statistics.median``: the one definition in the package), 0 for no values."""
    return float(statistics.median(v)) if len(v) else 0.0


def _steady_rate(xs: Sequence[int], ys: Sequence[int], k: int) -> float | None:
    """The per-step rise when each of the last ``k`` readings rose by a similar amount to a new high."""
    n = len(ys)
    if n < k or not all(ys[i] > ys[i - 1] for i in range(n - k + 1, n)):
        return None
    tx, ty = xs[-k:], ys[-k:]
    rates = [(ty[i + 1] - ty[i]) / (tx[i + 1] - tx[i]) for i in range(k - 1) if tx[i + 1] > tx[i]]
    if len(rates) != k - 1:
        return None
    med = _median(rates)
    agree = all(0.8 * med <= r <= 1.25 * med for r in rates)
    # ... and reach a new high: noise that happens to rise five times stays below its earlier peaks.
    new_high = n == k or ty[-1] >= max(ys[:-k]) + med * (tx[-1] - tx[-2])
    return med if agree and new_high else None


def _robust_rate(xs: Sequence[int], ys: Sequence[int], threshold: float) -> tuple[float, float] | None:
    """``(Theil–Sen slope, concordance)`` when the noise-robust test finds growth of ``threshold`` or more."""
    n = len(ys)
    q = n // 4
    bounds = [0, q, 2 * q, 3 * q, n]
    floors = [min(ys[bounds[i] : bounds[i + 1]]) for i in range(4)]
    # Cheap pre-checks: the last reading must be above the first quarter's floor by the minimum rate ...
    if ys[-1] - floors[0] < threshold * (xs[-1] - xs[0]) / 2:
        return None
    span = (xs[-1] - xs[0]) / 4
    # ... and each floor above the previous one by half of what the minimum rate predicts (implied by the
    # `rising` test below, since the slope must be at least the threshold): a one-time jump stops here,
    # before the O(n²) slope and trend statistics.
    least = 0.5 * threshold * span
    if threshold > 0 and any(floors[i + 1] - floors[i] < least for i in range(3)):
        return None
    slope = _theil_sen(xs, ys)
    trend = [ys[i] - slope * (xs[i] - xs[0]) for i in range(n)]
    mid = _median(trend)
    noise = _median([abs(t - mid) for t in trend])
    conf = _concordance(xs, ys)
    rising = all(floors[i + 1] - floors[i] >= 0.5 * slope * span for i in range(3))
    # ... and the last quarter still climbs: its median above the third quarter's by a quarter of what the
    # slope predicts (a buffer that filled over the middle of the window and stayed full has a raised floor
    # in every quarter, but a last quarter no higher than the third; medians, so that a spike does not count).
    later = _median(ys[bounds[3] :]) - _median(ys[bounds[2] : bounds[3]])
    rising = rising and later >= 0.25 * slope * span
    # Mann–Kendall: the upward trend must be significant (z > 4.5, p < 4e-6 one-sided), so that noise read
    # at every step of a long run does not fire by chance.
    s_stat = conf * n * (n - 1) / 2
    z = (s_stat - 1) / math.sqrt(n * (n - 1) * (2 * n + 5) / 18)
    if slope >= threshold and rising and floors[3] - floors[0] > 3 * noise and z > 4.5:
        return slope, conf
    return None


def suggested_threshold(bytes_per_step: float) -> int:
    """A ``min_bytes_per_step`` that reports growth of ``bytes_per_step`` with a margin: the largest power
    of two at most half of it.

    Example:
        >>> suggested_threshold(64 * 1024)
        32768
    """
    half = max(1, int(bytes_per_step / 2))
    return 1 << (half.bit_length() - 1)


def below_threshold_reason(rate: float, threshold: float) -> str:
    """Growth of ``rate`` per step under ``threshold``, in words, with the threshold that would report it."""
    thr, lower = int(threshold), suggested_threshold(rate)
    return (
        f"memory grows by {fmt_bytes(rate)}/step, below the reporting threshold of {fmt_bytes(thr)}/step "
        f"(min_bytes_per_step={thr}): pass min_bytes_per_step={lower} (`torchmem run --min-growth {lower}`) "
        "to report it as a leak and name its allocation site and holder"
    )


def _explain(
    xs: Sequence[int], ys: Sequence[int], threshold: float, steady_samples: int, robust_samples: int
) -> Growth:
    """Why a series that is not a leak is not one: growth below the threshold, too few readings, flat,
    shrinking or noisy — each with what to do next."""
    n = len(ys)

    def no(verdict: str, reason: str, trend: float = 0.0, conf: float = 0.0) -> Growth:
        return Growth(False, 0.0, conf, "none", n, reason, verdict, trend, threshold)

    if n < 2:
        return no("too_few", f"{n} reading(s): steady growth is judged on {steady_samples} readings")
    conf = _concordance(xs, ys)
    # Real growth, only smaller than the threshold: the same tests with any positive rate.
    rate = _steady_rate(xs, ys, steady_samples)
    if rate is None and n >= robust_samples:
        found = _robust_rate(xs, ys, SMALL_GROWTH)
        rate = found[0] if found else None
    if rate is not None and 0 < rate < threshold:
        return no("below_threshold", below_threshold_reason(rate, threshold), rate, conf)
    if rate is not None and rate >= threshold:  # steady, not yet enough of it (STEADY_EVIDENCE)
        return no(
            "too_few",
            f"grows by {fmt_bytes(rate)}/step over the last {steady_samples} readings, not yet "
            f"{fmt_bytes(STEADY_EVIDENCE * threshold)} in all: a leak is called once it is (a bounded cache "
            "that fills for a few steps stops before); run more steps",
            rate,
            conf,
        )
    slope = _theil_sen(xs, ys)
    lo, hi = min(ys), max(ys)
    span = f"{fmt_bytes(lo)}..{fmt_bytes(hi)}"
    if n < steady_samples:
        return no(
            "too_few",
            f"only {n} readings: steady growth is judged on {steady_samples} readings; run more steps",
            slope,
            conf,
        )
    if hi - lo < threshold:
        return no(
            "flat",
            f"flat: the figure stayed within {fmt_bytes(hi - lo)} ({span}) over the last {n} readings",
            slope,
            conf,
        )
    # How long has it been flat? A one-time rise (optimizer state, a cache that filled up) is not a leak.
    m = 1
    while m < n and max(ys[-m - 1 :]) - min(ys[-m - 1 :]) < threshold:
        m += 1
    before, tail = ys[:-m], ys[-m:]
    one_sided = all(y < min(tail) for y in before) or all(y > max(tail) for y in before)
    if m >= steady_samples and one_sided and not _staircase(xs, ys, n - m, threshold):
        change = ys[-m] - ys[0]
        what = f"a one-time {'rise' if change > 0 else 'fall'} of {fmt_bytes(abs(change))}"
        return no(
            "flat",
            f"flat for the last {m} readings (since step {xs[-m]}), after {what} before it: not a leak",
            slope,
            conf,
        )
    # Shrinking: the growth tests, mirrored (a steady or significant fall).
    neg = [-y for y in ys]
    fall = _steady_rate(xs, neg, steady_samples)
    if fall is None and n >= robust_samples:
        found = _robust_rate(xs, neg, SMALL_GROWTH)
        fall = found[0] if found else None
    if fall is not None:
        return no(
            "shrinking",
            f"shrinking: the figure fell from {fmt_bytes(ys[0])} to {fmt_bytes(ys[-1])} over the last {n} "
            f"readings ({fmt_bytes(fall)}/step): memory is being freed, not kept",
            -fall,
            conf,
        )
    moves = f"the figure moves within {span} over the last {n} readings with no sustained growth"
    if n < robust_samples:
        return no(
            "noisy",
            f"noisy: {moves}; the noise-robust test needs {robust_samples} readings, there were {n}: run "
            "more steps",
            slope,
            conf,
        )
    return no(
        "noisy",
        f"noisy: {moves} (trend {fmt_bytes(slope, signed=True)}/step, floors not rising in every quarter): "
        "no leak of min_bytes_per_step or more; for slower growth pass a smaller min_bytes_per_step, or "
        "mode='deep' to list the allocation sites that keep growing",
        slope,
        conf,
    )


# A run too short for the growth tests is judged on its overwhelming growth alone: each step rose by at least
# this much (and by 4x the reporting threshold), all rises within this band of their median.
SHORT_MIN_RISE = 1 << 20
SHORT_BAND = (0.75, 1.33)


def short_run_growth(
    series: Sequence[tuple[int, int]], min_bytes_per_step: float = 256 * 1024
) -> Growth | None:
    """A verdict on a run too short for :func:`detect_growth` (warm-up readings included): every step rose
    by about the same large amount — what a person reading the figures calls a leak. ``None`` unless the
    evidence is overwhelming: at least 2 rises (the first rise of a longer series is left out: step 1 -> 2
    makes one-time allocations such as optimizer state), each per-step rise within ±25-33 % of their median,
    the median at least 1 MiB and 4x ``min_bytes_per_step``. The confidence grows with the rises seen
    (2: 0.75, 3: 0.875, 5: 0.97).

    Example:
        >>> mib = 2**20
        >>> g = short_run_growth([(1, 100 * mib), (2, 164 * mib), (3, 228 * mib), (4, 292 * mib)])
        >>> g.leaking, g.bytes_per_step / mib, g.confidence
        (True, 64.0, 0.75)
        >>> short_run_growth([(1, 100 * mib), (2, 164 * mib), (3, 164 * mib)]) is None  # stopped
        True
    """
    pts = [(int(s), int(v)) for s, v in series if v is not None]
    rises = [(b - a) / (t - s) for (s, a), (t, b) in itertools.pairwise(pts) if t > s]
    use = rises[1:] if len(rises) >= 3 else rises
    if len(use) < 2:
        return None
    med = _median(use)
    lo, hi = SHORT_BAND
    if med < max(SHORT_MIN_RISE, 4 * min_bytes_per_step) or any(r < lo * med or r > hi * med for r in use):
        return None
    k = len(use)
    total = pts[-1][1] - pts[-1 - k][1]
    conf = 1.0 - 0.5**k
    reason = (
        f"{k} of {k} steps each kept about {fmt_bytes(int(med))} (every rise within "
        f"{int((1 - lo) * 100)}-{int((hi - 1) * 100)} % of the others), {fmt_bytes(total)} in all: too few "
        "steps for the steady test, but growth this large and this regular is a leak"
    )
    return Growth(True, med, conf, "short", len(pts), reason, "leak", med, min_bytes_per_step)


def inner_growth(
    series: Sequence[tuple[int, int]], min_bytes_per_step: float = 256 * 1024
) -> tuple[float, int, int, int] | None:
    """Growth inside each call: the figure climbs step after step and falls back at the end of each call
    (an inner loop whose iterations carry state — a graph kept from token to token), so nothing is kept
    across calls but each call's peak grows with its inner loop's length. ``(bytes per step, steps per
    ramp, height of a ramp, complete ramps)``, or ``None`` unless at least 2 complete ramps of at least 3
    readings each rose by a similar amount (median at least ``min_bytes_per_step``) and fell back near where
    they started (a ramp read fewer than 3 times, by a stride near its length, is left out of the judgement).

    Example:
        >>> mib = 2**20
        >>> saw = [(i, 100 * mib + (i % 8) * 2 * mib) for i in range(1, 33)]
        >>> rate, length, height, ramps = inner_growth(saw)
        >>> rate / mib, length, height / mib, ramps
        (2.0, 8, 14.0, 4)
        >>> inner_growth([(i, i * mib) for i in range(1, 33)]) is None  # a leak, not a sawtooth
        True
    """
    pts = [(int(s), int(v)) for s, v in series if v is not None]
    if len(pts) < 8:
        return None
    ramps: list[list[tuple[int, int]]] = []
    cur = [pts[0]]
    for p in pts[1:]:
        height = cur[-1][1] - cur[0][1]
        if len(cur) >= 2 and p[1] < cur[-1][1] - max(min_bytes_per_step, 0.5 * height) and height > 0:
            ramps.append(cur)
            cur = [p]
        else:
            cur.append(p)
    if len(ramps) < 2:
        return None
    meds: list[float] = []
    used: list[list[tuple[int, int]]] = []
    for i, r in enumerate(ramps):
        rises = [(b - a) / (t - s) for (s, a), (t, b) in itertools.pairwise(r) if t > s]
        if len(rises) < 2:
            # read too sparsely to judge (a stride near the ramp's length): left out, not a reason to call
            # the whole series no sawtooth; at least 2 ramps must still be judged
            continue
        med = _median(rises)
        if med < min_bytes_per_step or sum(1 for x in rises if 0.5 * med <= x <= 2 * med) < 0.8 * len(rises):
            return None
        nxt_step, nxt = ramps[i + 1][0] if i + 1 < len(ramps) else cur[0]
        height = r[-1][1] - r[0][1]
        # It fell back near where it started (memory was not kept across the call); a reading a few steps
        # into the next call may stand that many steps of growth higher.
        into_next = med * max(0, nxt_step - r[-1][0] - 1)
        if nxt > r[0][1] + 0.25 * height + into_next:
            return None
        meds.append(med)
        used.append(r)
    if len(used) < 2:
        return None
    rate = _median(meds)
    if any(not 0.5 * rate <= m <= 2 * rate for m in meds):
        return None
    length = int(_median([r[-1][0] - r[0][0] + 1 for r in used]))
    height = int(_median([r[-1][1] - r[0][1] for r in used]))
    # Nothing kept across calls: the calls' floors did not climb, over the whole series, by more than a
    # quarter of one call's rise, nor at every call (a leak under the sawtooth is a leak).
    starts = [r[0][1] for r in ramps] + [cur[0][1]]
    if min(starts[len(starts) // 2 :]) > min(starts[: len(starts) // 2]) + 0.25 * height:
        return None
    if len(starts) >= 3 and all(b > a + 0.02 * height for a, b in itertools.pairwise(starts)):
        return None
    return rate, length, height, len(used)


#: Readings after the warm-up that the steady test needs (:func:`detect_growth`'s ``steady_samples``), and the
#: readings the detector judges (its ``window``): one definition for the device and the host watchers.
STEADY_READINGS = 5
WINDOW_READINGS = 32


def detect_growth(
    steps: Sequence[int],
    values: Sequence[int],
    *,
    min_bytes_per_step: float = 256 * 1024,
    steady_samples: int = STEADY_READINGS,
    window: int = WINDOW_READINGS,
    explain: bool = True,
) -> Growth:
    """Decide whether ``values`` (a memory figure read at step boundaries, after warm-up) grows steadily.

    Two tests, either is enough:

    - **steady**: each of the last ``steady_samples`` readings rose by at least ``min_bytes_per_step`` per
      step, the rises agree (each within 0.8x..1.25x of their median) and the last reading is a new high
      above every earlier one — what a leak looks like on exact counters, found within ``steady_samples``
      readings;
    - **robust**: over the last ``window`` readings (at least 16), the Theil–Sen slope is at least
      ``min_bytes_per_step``, the floor (minimum) of each quarter of the window is higher than the previous
      one by at least half of what that slope predicts, and the total rise is above three times the noise
      (median absolute deviation around the trend), and the Mann–Kendall trend test is significant
      (z > 4.5) — a leak under noisy figures (dynamic shapes, periodic work); growth that stopped for a
      quarter of the window is not a leak any more.

    One-time jumps (optimizer state, lazily built buffers, workspaces), a bounded cache that stopped growing,
    periodic spikes and noise fail both tests.

    When it is not a leak, ``explain=True`` (the default) says why in ``verdict`` and ``reason``: steady
    growth *below* ``min_bytes_per_step`` (the same tests with any positive rate; ``trend_per_step`` gives
    it, and the reason the threshold that would report it), too few readings, flat, shrinking or noisy.
    ``explain=False`` skips that (a watcher's per-step call; it explains when asked for its report).

    Example:
        >>> detect_growth(range(8), [100 + 2**20 * i for i in range(8)]).leaking
        True
        >>> detect_growth(range(8), [100, 5000, 5000, 5000, 5000, 5000, 5000, 5000]).leaking
        False
        >>> g = detect_growth(range(8), [2**16 * i for i in range(8)])  # 64 KiB/step: below 256 KiB/step
        >>> g.leaking, g.verdict, g.trend_per_step
        (False, 'below_threshold', 65536.0)
    """
    xs = list(steps)
    ys = list(values)
    if len(xs) != len(ys):
        raise ValueError("steps and values must have the same length")
    if len(ys) > window:
        xs, ys = xs[-window:], ys[-window:]
    n = len(ys)
    thr = min_bytes_per_step

    def not_leaking(reason: str) -> Growth:
        if explain:
            return _explain(xs, ys, thr, steady_samples, ROBUST_SAMPLES)
        return Growth(False, 0.0, 0.0, "none", n, reason, "", 0.0, thr)

    if n < 2:
        return not_leaking("not enough steps yet")
    # Steady: the last k readings each rose by a similar amount (checked only when they all rose).
    steady = _steady_growth(xs, ys, thr, steady_samples)
    if steady is not None:
        return steady
    if n < ROBUST_SAMPLES:
        stair = _staircase_growth(xs, ys, thr)
        if stair is not None:
            return stair
        return not_leaking(f"{n} readings after warm-up, no steady growth yet")
    robust = _robust_growth(xs, ys, thr)
    if robust is not None:
        return robust
    return not_leaking("no sustained growth")


STEADY_EVIDENCE = 12
"""Growth the steady test needs before a verdict, in thresholds: ``12 x min_bytes_per_step`` in all (3 MiB at
the default 256 KiB/step). Growth of 768 KiB/step or more has it within the usual 5 readings; smaller growth
needs that many steps of the same rise — a bounded cache or buffer that fills for a few steps and stops (an
8-entry cache at +512 KiB/step) is not called a leak while it fills."""


def _steady_evidence(xs: Sequence[int], ys: Sequence[int], thr: float, k: int) -> tuple[float, int] | None:
    """``(rate, readings)`` of steady growth of ``thr`` or more per step (the last ``k`` readings agree) that
    also reached :data:`STEADY_EVIDENCE` thresholds in all: over those readings, or over as many earlier
    readings as that needs, each of which rose too."""
    med = _steady_rate(xs, ys, k)
    if med is None or med < thr:
        return None
    need = STEADY_EVIDENCE * thr
    kk = k
    # Earlier readings count when each rose by half the threshold per step or more (the agreement of the
    # last k is the rate; a noisy figure's earlier rises need not agree with it).
    while ys[-1] - ys[-kk] < need:
        if kk >= len(ys):
            return None
        a, b = len(ys) - kk - 1, len(ys) - kk
        if xs[b] <= xs[a] or (ys[b] - ys[a]) / (xs[b] - xs[a]) < thr / 2:
            return None
        kk += 1
    return med, kk


def _steady_growth(xs: Sequence[int], ys: Sequence[int], thr: float, k: int) -> Growth | None:
    """The steady test's leak verdict, or None."""
    found = _steady_evidence(xs, ys, thr, k)
    if found is None:
        return None
    med, k = found
    return Growth(
        True,
        med,
        _concordance(xs[-k:], ys[-k:]),
        "steady",
        len(ys),
        f"grew by {med:.0f} B/step on each of the last {k - 1} readings",
        "leak",
        med,
        thr,
    )


def _robust_growth(xs: Sequence[int], ys: Sequence[int], thr: float) -> Growth | None:
    """The noise-robust test's leak verdict, or None."""
    found = _robust_rate(xs, ys, thr)
    if found is None:
        return None
    slope, conf = found
    n = len(ys)
    return Growth(
        True,
        slope,
        conf,
        "robust",
        n,
        f"the floor rose in each quarter of the last {n} readings, {slope:.0f} B/step (Theil–Sen)",
        "leak",
        slope,
        thr,
    )


STAIR_SAMPLES = 8
"""Readings the staircase test needs (it is for runs with fewer than :data:`ROBUST_SAMPLES`)."""


def _staircase_growth(xs: Sequence[int], ys: Sequence[int], thr: float) -> Growth | None:
    """Growth that comes in steps (an optimizer made every other step, a buffer every few) in a run too
    short for the noise-robust test: the figure never fell, rose by :data:`STEADY_EVIDENCE` thresholds in
    all, and rose at about the same rate (0.5x..2x of the whole's) in each quarter of the readings, the last
    included — a cache that fills and stops has a flat last quarter."""
    n = len(ys)
    if n < STAIR_SAMPLES or xs[-1] <= xs[0]:
        return None
    if any(b < a for a, b in itertools.pairwise(ys)):
        return None
    total = ys[-1] - ys[0]
    rate = total / (xs[-1] - xs[0])
    if rate < thr or total < STEADY_EVIDENCE * thr:
        return None
    ends = [0] + [round(n * q / 4) - 1 for q in (1, 2, 3, 4)]
    for a, b in itertools.pairwise(ends):
        if xs[b] <= xs[a]:
            return None
        r = (ys[b] - ys[a]) / (xs[b] - xs[a])
        if not 0.5 * rate <= r <= 2 * rate:
            return None
    return Growth(
        True,
        rate,
        _concordance(xs, ys),
        "staircase",
        n,
        f"rose by {fmt_bytes(total)} over the last {n} readings and never fell, {fmt_bytes(rate)}/step in "
        "each quarter of them",
        "leak",
        rate,
        thr,
    )


PERIODIC_JUMPS = 4
"""Jumps the periodic test needs: growth that comes every N steps (a validation pass every 25 steps that
keeps its outputs) is judged on its last :data:`PERIODIC_JUMPS` to :data:`PERIODIC_LAST` jumps, wherever the
readings fell between them."""
PERIODIC_LAST = 8
"""The most jumps the periodic test reads (and a stream keeps)."""


def _staircase(xs: Sequence[int], ys: Sequence[int], k: int, threshold: float) -> bool:
    """The flat tail from reading ``k`` follows a flat stretch at least as long in steps that a rise came
    before too: growth in steps (outputs kept at every validation, every N steps), whose tail is only the
    current stair, not a one-time rise. Readings are denser after a rise (the schedule reads more often when
    the figure moves), so the lengths are compared in steps, not readings.

    Example:
        >>> xs = [0, 4, 8, 12, 16, 20, 21, 22, 23, 24, 28, 32, 36, 40, 41, 42, 43, 44, 48]
        >>> ys = [0] * 6 + [100] * 8 + [200] * 5
        >>> _staircase(xs, ys, 14, 50.0), _staircase(xs[6:], ys[6:], 8, 50.0)
        (True, False)
    """
    j = k - 1
    if j < 1:
        return False
    i = j
    while i > 0 and max(ys[i - 1 : j + 1]) - min(ys[i - 1 : j + 1]) < threshold:
        i -= 1
    return i > 0 and xs[j] - xs[i] >= xs[-1] - xs[k]


def periodic_rate(jumps: Sequence[tuple[int, ...]], step: int, value: int) -> tuple[float, int, float] | None:
    """``(bytes per step, one jump, period in steps)`` of growth that comes in regular jumps, or None.

    ``jumps``: ``(step, rise, value before[, step of the reading before])`` of each rise between two
    readings of at least the threshold, oldest first, since the figure last fell by as much (a jump happened
    somewhere between those two readings: each gap is judged over that range, so a grid of readings coarser
    than the jumps' period does not hide it); ``step``/``value``: the newest reading. The last 4 to 8 jumps
    must agree in size (each within 0.5x..2x of their median, times the periods its two readings span) and
    in spacing (each gap can be within 0.5x..2x of the mean gap), nothing of them may have been given back
    since (the figure now is at least 3/4 of their sum above where the first began), and the newest reading
    may not lie more than 1.5 gaps after the last jump: growth that stopped for two of its own periods is
    not periodic any more. The rate is the jumps after the first over the steps they span; one jump, the
    median of the jumps within 1.5x of the smallest (a reading that spans two sees both; a jump split over
    two readings leaves a smaller part); the period, one jump over the rate.

    Example:
        >>> periodic_rate([(25 * k, 4 << 20, (4 << 20) * k) for k in range(1, 6)], 130, 5 * (4 << 20))
        (167772.16, 4194304, 25.0)
        >>> periodic_rate([(25 * k, 4 << 20, (4 << 20) * k) for k in range(1, 6)], 200, 5 * (4 << 20)) is None
        True
    """
    use = _regular_tail(jumps, step, value)
    if use is None:
        return None
    return _periodic_of(use)


def _regular_tail(jumps: Sequence[tuple[int, ...]], step: int, value: int) -> list[tuple[int, ...]] | None:
    """The longest run of the last :data:`PERIODIC_JUMPS` to :data:`PERIODIC_LAST` jumps that
    :func:`periodic_rate` accepts (an irregular jump before them, a second rise within one validation pass,
    does not hide the regular ones after it), or None."""
    for k in range(min(len(jumps), PERIODIC_LAST), PERIODIC_JUMPS - 1, -1):
        use = list(jumps)[-k:]
        if _agree(use, step, value):
            return use
    return None


def _periodic_of(use: Sequence[tuple[int, ...]]) -> tuple[float, int, float]:
    at = [j[0] for j in use]
    sizes = [j[1] for j in use]
    rate = sum(sizes[1:]) / (at[-1] - at[0])
    # One jump: readings that span two of them see twice its size (the median of a coarse grid's readings
    # would give a period too long), and a jump split over two readings leaves one smaller part (the
    # smallest alone would give a period too short): the median of those within 1.5x of the smallest.
    low = min(sizes)
    base = _median([v for v in sizes if v < 1.5 * low])
    return rate, int(base), base / rate


def _agree(use: Sequence[tuple[int, ...]], step: int, value: int) -> bool:
    at = [j[0] for j in use]
    since = [j[3] if len(j) > 3 else j[0] for j in use]  # the reading before each jump's, where known
    sizes = [j[1] for j in use]
    size, gap = _median(sizes), (at[-1] - at[0]) / (len(at) - 1)  # the mean gap: the grid averages out
    if gap <= 0 or step - at[-1] > 1.5 * gap:
        return False
    # each jump is 0.5x..2x of the median, times the periods (the shortest gap seen) its two readings span:
    # a stride that widened late in the run reads several jumps as one
    shortest = max(1, min(b - a for a, b in itertools.pairwise(at)))
    for v, a, b in zip(sizes, at, since):
        if not 0.5 * size <= v <= 2 * size * max(1, math.ceil((a - b) / shortest)):
            return False
    for i in range(len(at) - 1):  # the gap lies between (since[i+1] - at[i]) and (at[i+1] - since[i])
        if at[i + 1] - since[i] < 0.5 * gap or since[i + 1] - at[i] > 2 * gap:
            return False
    return value - use[0][2] >= 0.75 * sum(sizes)


def read_between(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """A reading was taken between jump ``a`` and the next jump ``b`` (``b``'s reading before is after ``a``):
    the figure stayed flat between them, as a stair does, rather than rising at every reading."""
    return len(b) > 3 and b[3] > a[0]


def periodic_words(jumps: Sequence[tuple[int, ...]], size: float, period: float) -> str:
    """How growth of ``size`` every ``period`` steps was seen: in jumps with flat readings between them, or
    at every reading (steady growth read every few steps looks the same to :func:`periodic_rate`, and is
    not called periodic)."""
    use = list(jumps)[-PERIODIC_LAST:]
    if any(read_between(a, b) for a, b in itertools.pairwise(use)):
        return f"rises by about {fmt_bytes(size)} every {period:.0f} steps, flat between"
    return f"rises at every reading, about {fmt_bytes(size)} every {period:.0f} steps"


def _periodic_growth(jumps: Sequence[tuple[int, ...]], step: int, value: int, thr: float) -> Growth | None:
    """The periodic test's leak verdict (:func:`periodic_rate` at ``thr`` or more per step, and
    :data:`STEADY_EVIDENCE` thresholds in its jumps), or None."""
    use = _regular_tail(jumps, step, value)
    if use is None:
        return None
    rate, size, gap = _periodic_of(use)
    if rate < thr or sum(j[1] for j in use) < STEADY_EVIDENCE * thr:
        return None
    return Growth(
        True,
        rate,
        0.5 + len(use) / 16,
        "periodic",
        len(use),
        f"{periodic_words(use, size, gap)}, {len(use)} times, and never gave it back",
        "leak",
        rate,
        thr,
    )


__all__ = [
    "PERIODIC_JUMPS",
    "PERIODIC_LAST",
    "ROBUST_SAMPLES",
    "SHORT_BAND",
    "SHORT_MIN_RISE",
    "SMALL_GROWTH",
    "STAIR_SAMPLES",
    "STEADY_EVIDENCE",
    "STEADY_READINGS",
    "WINDOW_READINGS",
    "below_threshold_reason",
    "detect_growth",
    "inner_growth",
    "periodic_rate",
    "periodic_words",
    "read_between",
    "short_run_growth",
    "suggested_threshold",
]
