"""Leak analysis: is memory growing step over step, and which allocation site and holder make it grow.

Pure functions over numbers and typed holder paths captured by :mod:`torchmem.capture.watch`: nothing here
reads a device or changes an object, so every rule is testable with plain data.

- :func:`detect_growth` judges a per-step series: a steady test (every recent step grew by a similar amount)
  and a noise-robust one (Theil–Sen slope, rising floors, Mann–Kendall); when it is not a leak it says why.
- :class:`GrowthStream` gives the same verdict one reading at a time, at O(1) per reading for the series
  that are not leaks (what a watcher calls at every step).
- :func:`site_growth` finds the allocation sites whose live bytes keep rising over an attribution window.
- :func:`attribute` groups growing sites by the holder that keeps them (:func:`holder_pattern`) and decides
  each group's kind from the *kinds of the steps* of its holder paths (a ``grad_fn`` or ``saved_tensor``
  step: a retained graph; a ``hook`` entry or ``closure_cell``: a hook; a ``traceback`` step: stored
  exceptions; items of a module global: a registry; ...), never from the rendered text, then writes the fix.

The result types (:class:`Growth`, :class:`SiteGrowth`, :class:`Culprit`, :class:`LeakReport`) live in
:mod:`torchmem.results.leaks` and are re-exported here. Cost: O(n²) in the readings of one window (32 at
most) to explain a series or to run the robust test (only after O(n) pre-checks pass); linear in the paths
for the attribution.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

from torchmem._format import fmt_bytes
from torchmem.results.holders import HolderPath, HolderStep, StepKind
from torchmem.results.leaks import Culprit, Growth, LeakReport, SiteGrowth

# Culprit kinds, each with the one-line fix printed for it.
RETAINED_GRAPH = "retained_graph"
GRAPH_CHAIN = "graph_chain"
EXCEPTION = "exception"
CYCLE = "cycle"
HOOK = "hook"
GROWING_TENSOR = "growing_tensor"
GLOBAL = "global_registry"
CACHE = "cache"
ACCUMULATION = "device_accumulation"
KEPT_OPTIMIZER = "kept_optimizer"
UNKNOWN = "unknown"

KINDS = (
    RETAINED_GRAPH,
    GRAPH_CHAIN,
    EXCEPTION,
    CYCLE,
    HOOK,
    GROWING_TENSOR,
    GLOBAL,
    CACHE,
    ACCUMULATION,
    KEPT_OPTIMIZER,
    UNKNOWN,
)


# --------------------------------------------------------------------------------------------------
# Growth detection
# --------------------------------------------------------------------------------------------------
_NO = Growth(False, 0.0, 0.0, "none", 0, "")

# The least growth called growth when a series below the threshold is described (bytes per step).
_SMALL = 1.0
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
    s = sorted(v)
    n = len(s)
    return 0.0 if n == 0 else (s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2)


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


def _below_threshold(rate: float, threshold: float) -> str:
    thr = int(threshold)
    return (
        f"memory grows by {fmt_bytes(rate)}/step, below the reporting threshold of {fmt_bytes(thr)}/step "
        f"(min_bytes_per_step={thr}): pass min_bytes_per_step={suggested_threshold(rate)} to report it as a "
        "leak and name its allocation site and holder"
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
        found = _robust_rate(xs, ys, _SMALL)
        rate = found[0] if found else None
    if rate is not None and 0 < rate < threshold:
        return no("below_threshold", _below_threshold(rate, threshold), rate, conf)
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
    if m >= steady_samples and one_sided:
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
        found = _robust_rate(xs, neg, _SMALL)
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
    they started.

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
        if len(cur) >= 3 and p[1] < cur[-1][1] - max(min_bytes_per_step, 0.5 * height) and height > 0:
            ramps.append(cur)
            cur = [p]
        else:
            cur.append(p)
    if len(ramps) < 2:
        return None
    meds: list[float] = []
    for i, r in enumerate(ramps):
        rises = [(b - a) / (t - s) for (s, a), (t, b) in itertools.pairwise(r) if t > s]
        if len(rises) < 2:
            return None
        med = _median(rises)
        if med < min_bytes_per_step or sum(1 for x in rises if 0.5 * med <= x <= 2 * med) < 0.8 * len(rises):
            return None
        nxt = ramps[i + 1][0][1] if i + 1 < len(ramps) else cur[0][1]
        height = r[-1][1] - r[0][1]
        if nxt > r[0][1] + 0.25 * height:  # it did not fall back: memory was kept across the call
            return None
        meds.append(med)
    rate = _median(meds)
    if any(not 0.5 * rate <= m <= 2 * rate for m in meds):
        return None
    length = int(_median([r[-1][0] - r[0][0] + 1 for r in ramps]))
    height = int(_median([r[-1][1] - r[0][1] for r in ramps]))
    return rate, length, height, len(ramps)


def detect_growth(
    steps: Sequence[int],
    values: Sequence[int],
    *,
    min_bytes_per_step: float = 256 * 1024,
    steady_samples: int = 5,
    window: int = 32,
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


# How often (in readings) the noise-robust test is re-run while its cheap pre-check keeps passing.
ROBUST_EVERY = 4


class GrowthStream:
    """:func:`detect_growth` fed one reading at a time, at a cost that does not grow with the run.

    Keeps the last ``window`` readings. Each :meth:`add` first runs O(1) necessary conditions of the two
    tests: the steady test is run only when the last ``steady_samples - 1`` rises were each at least 0.8x
    ``min_bytes_per_step`` per step, and the noise-robust one only when the newest reading is above the
    window's minimum by half of what ``min_bytes_per_step`` predicts over the window (a C-level ``min()``
    of ``window`` numbers). A flat or noisy series costs a few microseconds per reading, whatever the run's
    length. The verdict is that of ``detect_growth(steps, values, explain=False)`` on the window, except
    that while the robust test's pre-check keeps passing (a noisy leak, or growth just under the
    threshold) the O(window²) test is re-run every ``robust_every`` readings rather than at each one: its
    verdict may come up to ``robust_every - 1`` readings late (``robust_every=1``: exactly
    :func:`detect_growth`'s verdict at every reading). ``leaking`` is an attribute (O(1)).

    Example:
        >>> g = GrowthStream(min_bytes_per_step=1024)
        >>> for step in range(1, 9):
        ...     _ = g.add(step, 10_000 + 4096 * step)
        >>> g.leaking, g.growth.method, g.growth.bytes_per_step
        (True, 'steady', 4096.0)
    """

    __slots__ = (
        "_cached",
        "_last_step",
        "_last_value",
        "_min",
        "_min_at",
        "_next_robust",
        "_not",
        "_rises",
        "_robust_every",
        "_robust_min",
        "_steady_rise",
        "added",
        "growth",
        "leaking",
        "min_bytes_per_step",
        "steady_samples",
        "steps",
        "values",
        "window",
    )

    def __init__(
        self,
        min_bytes_per_step: float = 256 * 1024,
        steady_samples: int = 5,
        window: int = 32,
        robust_every: int = ROBUST_EVERY,
    ) -> None:
        self.min_bytes_per_step = min_bytes_per_step
        self.steady_samples = steady_samples
        self.window = window
        self.steps: collections.deque[int] = collections.deque(maxlen=window)
        self.values: collections.deque[int] = collections.deque(maxlen=window)
        self._not = Growth(False, 0.0, 0.0, "none", 0, "no sustained growth", "", 0.0, min_bytes_per_step)
        self.growth = self._not
        self.leaking = False
        self.added = 0  # readings added
        self._rises = 0  # consecutive rises of at least 0.8x the threshold per step, ending at the newest
        self._steady_rise = 0.8 * min_bytes_per_step
        self._robust_min = max(ROBUST_SAMPLES, 2)
        self._robust_every = max(1, robust_every)
        self._next_robust = 0  # the reading count at which the robust test may run again
        self._cached: Growth | None = None  # its last verdict, while its pre-check keeps passing
        self._last_step: float = -math.inf  # the previous reading
        self._last_value = 0
        self._min = 0  # the window's minimum (valid once a reading is in) and the latest step it was read at
        self._min_at: float = -math.inf

    def add(self, step: int, value: int) -> Growth:
        """Add the reading ``value`` taken at ``step`` (steps strictly increasing); return the verdict (also
        kept in ``growth``; ``leaking`` is its ``leaking``)."""
        dx = step - self._last_step
        if dx > 0 and (value - self._last_value) / dx >= self._steady_rise:  # (first reading: 0 / inf)
            self._rises += 1
        else:
            self._rises = 0
        self._last_step = step
        self._last_value = value
        steps, values = self.steps, self.values
        steps.append(step)
        values.append(value)
        self.added += 1
        # The window's minimum, kept without scanning the window at each reading: rescanned only when the
        # reading that held it leaves the window.
        if value <= self._min or self.added == 1:
            self._min, self._min_at = value, step
        elif self._min_at < steps[0]:
            self._min = low = min(values)
            self._min_at = next(s for s, v in zip(reversed(steps), reversed(values)) if v == low)
        n = len(values)
        thr = self.min_bytes_per_step
        k = self.steady_samples
        growth: Growth | None = None
        if self._rises >= k - 1 and n >= k:  # every rise of the steady test is there: run it
            growth = _steady_growth(list(steps), list(values), thr, k)
        if growth is None:
            growth = self._not
            if n >= self._robust_min and value - self._min >= thr * (step - steps[0]) / 2:
                # The robust test's pre-check (loosened: the window's minimum is at most the first
                # quarter's floor) passed: run the test, or keep its verdict of a few readings ago.
                if self._cached is None or self.added >= self._next_robust:
                    self._cached = _robust_growth(list(steps), list(values), thr) or self._not
                    self._next_robust = self.added + self._robust_every
                growth = self._cached
            else:
                self._cached = None  # closed: the next opening runs the test at once
        self.growth = growth
        self.leaking = growth.leaking
        return growth


# --------------------------------------------------------------------------------------------------
# Growth that is large over the run, and growth on a timeline without steps
# --------------------------------------------------------------------------------------------------
LARGE_TOTAL = 256 << 20
"""Growth over a run reported as a leak whatever its rate per step: 256 MiB."""
LARGE_DOUBLED_MIN = 32 << 20
"""Growth that more than doubled the figure is large from this much on (32 MiB)."""


def large_total(first: float, last: float) -> bool:
    """Whether growth from ``first`` to ``last`` bytes is large over a run: :data:`LARGE_TOTAL` or more, or
    a figure that more than doubled, by :data:`LARGE_DOUBLED_MIN` or more. A per-step threshold never hides
    such growth (:func:`detect_run_growth`).

    Example:
        >>> MiB = 1 << 20
        >>> large_total(114 * MiB, 804 * MiB), large_total(300 * MiB, 500 * MiB), large_total(MiB, 9 * MiB)
        (True, False, False)
    """
    total = last - first
    return total >= LARGE_TOTAL or (total >= LARGE_DOUBLED_MIN and last > 2 * first)


def total_words(first: tuple[float, int], last: tuple[float, int], unit: str = "step") -> str:
    """The growth from ``first`` to ``last`` (``(step, bytes)``; ``(seconds, bytes)`` with ``unit="s"``).

    Example:
        >>> MiB = 1 << 20
        >>> total_words((4, 114 * MiB), (22035, 804 * MiB))
        '+690.00 MiB in all from step 4 to step 22035 (114.00 MiB -> 804.00 MiB, 7.1x)'
    """

    def at(x: float) -> str:
        return f"step {x:.0f}" if unit == "step" else f"{x:.0f} s"

    (x0, y0), (x1, y1) = first, last
    ratio = f", {y1 / y0:.1f}x" if y0 > 0 else ""
    return (
        f"{fmt_bytes(y1 - y0, signed=True)} in all from {at(x0)} to {at(x1)} "
        f"({fmt_bytes(y0)} -> {fmt_bytes(y1)}{ratio})"
    )


def large_growth(
    found: Growth, first: tuple[float, int], last: tuple[float, int], threshold: float, unit: str = "step"
) -> Growth:
    """The leak verdict for growth below ``threshold`` that is large over the run: ``found`` (the growth
    test's leak with a threshold lowered to the run's own rate) with its total and why it is reported."""
    return Growth(
        True,
        found.bytes_per_step,
        found.confidence,
        found.method,
        found.samples,
        f"{found.reason}; {total_words(first, last, unit)}: below the leak threshold of "
        f"{fmt_bytes(threshold)}/{unit}, reported for its total",
        "leak",
        found.bytes_per_step,
        found.min_bytes_per_step,
    )


def run_threshold(first: tuple[float, int], last: tuple[float, int]) -> float | None:
    """The threshold that tests growth found large over a run (:func:`large_total`): half the run's mean
    rate, so that the growth going on now accounts for the total; ``None`` when the growth is not large."""
    (x0, y0), (x1, y1) = first, last
    if x1 <= x0 or not large_total(y0, y1):
        return None
    return max((y1 - y0) / (x1 - x0) / 2, _SMALL)


def with_total(g: Growth, first: tuple[float, int], last: tuple[float, int], unit: str = "step") -> Growth:
    """``g`` with the run's total in its reason where the verdict is growth below the threshold and the
    total is large (:func:`large_total`); else ``g``."""
    if g.verdict != "below_threshold" or not large_total(first[1], last[1]):
        return g
    return Growth(
        g.leaking,
        g.bytes_per_step,
        g.confidence,
        g.method,
        g.samples,
        f"{g.reason}; {total_words(first, last, unit)}",
        g.verdict,
        g.trend_per_step,
        g.min_bytes_per_step,
    )


def detect_run_growth(
    steps: Sequence[int],
    values: Sequence[int],
    *,
    first: tuple[int, int] | None = None,
    min_bytes_per_step: float = 256 * 1024,
    window: int = 32,
) -> Growth:
    """:func:`detect_growth` on the last ``window`` readings, where the threshold never hides growth that is
    large over the whole run.

    ``first`` is the run's first reading (``(step, bytes)``, default the first of ``steps``/``values``).
    When the figure grew from it by :data:`LARGE_TOTAL` or more, or more than doubled by
    :data:`LARGE_DOUBLED_MIN` or more (:func:`large_total`), growth still going on at half the run's mean rate
    or more is a leak whatever ``min_bytes_per_step`` says; its reason gives the total and the rate. A
    one-time rise that the steady readings since do not explain is not one.

    Example:
        >>> MiB = 1 << 20
        >>> xs = range(0, 11000, 500)  # 64 KiB/step, read every 500 steps: below the 256 KiB/step threshold
        >>> g = detect_run_growth(xs, [114 * MiB + 65536 * x for x in xs])
        >>> g.leaking, g.bytes_per_step
        (True, 65536.0)
        >>> print(g.reason.split("; ")[1])  # doctest: +NORMALIZE_WHITESPACE
        +656.25 MiB in all from step 0 to step 10500 (114.00 MiB -> 770.25 MiB, 6.8x): below the leak
        threshold of 256.00 KiB/step, reported for its total
    """
    xs, ys = list(steps), list(values)
    g = detect_growth(xs, ys, min_bytes_per_step=min_bytes_per_step, window=window)
    if g.leaking or not ys:
        return g
    start = first if first is not None else (xs[0], ys[0])
    last = (xs[-1], ys[-1])
    lowered = run_threshold(start, last)
    if lowered is not None and lowered < min_bytes_per_step:
        found = detect_growth(xs, ys, min_bytes_per_step=lowered, window=window, explain=False)
        if found.leaking:
            return large_growth(found, start, last, min_bytes_per_step)
    return with_total(g, start, last)


TIMELINE_MIN_BYTES_PER_SECOND = 1 << 20
"""The timeline verdict's leak threshold: 1 MiB/s (a process that keeps what it allocates at that pace)."""
TIMELINE_WINDOW = 64
"""Readings of the timeline the verdict judges."""


def timeline_growth(
    points: Sequence[tuple[float, int]],
    *,
    min_bytes_per_second: float = TIMELINE_MIN_BYTES_PER_SECOND,
    _tail: bool = True,
) -> Growth | None:
    """Growth on a sampled ``(seconds, bytes)`` timeline (a run with no repeating step), per second.

    The figures of the :class:`Growth` are per second (``bytes_per_step`` is bytes per second), its reason
    speaks of seconds; growth below ``min_bytes_per_second`` that is large over the timeline is a leak with
    its total (:func:`detect_run_growth`). Growth that began late (the program's loop starts after seconds of
    imports and set-up, a plateau before it) is judged on the last half, third or quarter of the timeline
    (16 readings or more) when the whole does not show it. ``None`` for fewer than 8 readings.

    Example:
        >>> MiB = 1 << 20
        >>> g = timeline_growth([(0.05 * i, 90 * MiB + i * 2 * MiB) for i in range(60)])  # 40 MiB/s
        >>> g.leaking, round(g.bytes_per_step / MiB), g.reason
        (True, 40, 'the figure grew by 40.00 MiB/s over the sampled timeline (steady test)')
    """
    if len(points) < 8:
        return None
    t0 = points[0][0]
    dt = max((points[-1][0] - t0) / (len(points) - 1), 1e-3)
    xs = [round((t - t0) / dt) for t, _ in points]
    ys = [v for _, v in points]
    g = detect_run_growth(xs, ys, min_bytes_per_step=min_bytes_per_second * dt, window=TIMELINE_WINDOW)
    if not g.leaking and _tail:
        for part in (2, 3, 4):  # the last half, third, quarter: at least 16 readings
            tail = points[len(points) - len(points) // part :]
            if len(tail) < 16:
                break
            late = timeline_growth(tail, min_bytes_per_second=min_bytes_per_second, _tail=False)
            if late is not None and late.leaking:
                since = tail[0][0]
                return dataclasses.replace(late, reason=f"{late.reason}, since {since:.1f} s (it began late)")
    rate, trend = g.bytes_per_step / dt, g.trend_per_step / dt
    first, last = (points[0][0], ys[0]), (points[-1][0], ys[-1])
    recent = ys[-TIMELINE_WINDOW:]
    span = (points[-1][0] - points[-len(recent)][0]) if len(recent) > 1 else 0.0
    over = f"over the last {span:.0f} s of the sampled timeline"
    if g.leaking:
        reason = f"the figure grew by {fmt_bytes(rate)}/s over the sampled timeline ({g.method} test)"
        if g.min_bytes_per_step < min_bytes_per_second * dt:
            reason += (
                f"; {total_words(first, last, 's')}: below the leak threshold of "
                f"{fmt_bytes(min_bytes_per_second)}/s, reported for its total"
            )
    elif g.verdict == "below_threshold":
        reason = (
            f"the figure grows by {fmt_bytes(trend)}/s {over}, below the timeline's leak threshold of "
            f"{fmt_bytes(min_bytes_per_second)}/s"
        )
        if large_total(ys[0], ys[-1]):
            reason += f"; {total_words(first, last, 's')}"
    elif g.verdict == "shrinking":
        reason = f"shrinking: the figure falls by {fmt_bytes(-trend)}/s {over}: memory is freed, not kept"
    elif g.verdict == "flat":
        reason = f"flat: no steady growth {over} ({fmt_bytes(recent[0])} -> {fmt_bytes(recent[-1])})"
    else:
        reason = (
            f"no sustained growth: the figure moves within {fmt_bytes(min(recent))}.."
            f"{fmt_bytes(max(recent))} {over} (trend {fmt_bytes(trend, signed=True)}/s)"
        )
    return Growth(
        g.leaking,
        rate,
        g.confidence,
        g.method,
        g.samples,
        reason,
        g.verdict,
        trend,
        g.min_bytes_per_step / dt if g.leaking else min_bytes_per_second,
    )


def timeline_report(
    points: Sequence[tuple[float, int]],
    growth: Growth,
    *,
    device: str,
    source: str,
    culprits: Sequence[Culprit] = (),
    notes: Sequence[str] = (),
) -> LeakReport:
    """The :class:`LeakReport` of a run with no repeating step, from its sampled ``(seconds, bytes)``
    timeline and :func:`timeline_growth`'s verdict: figures per second (``unit="s"``), ``steps`` the seconds
    the timeline covers, ``series`` ``(seconds, bytes)`` (about 256 readings)."""
    pts = list(points)
    return LeakReport(
        device=device,
        source=source,
        mode="light",
        steps=round(pts[-1][0] - pts[0][0]) if pts else 0,
        warmup=0,
        leaking=growth.leaking,
        bytes_per_step=growth.bytes_per_step,
        confidence=growth.confidence,
        detected_at=None,
        stopped_at=None,
        reason=growth.reason,
        culprits=tuple(culprits),
        series=tuple((round(t), v) for t, v in pts[:: max(1, len(pts) // 256)]),
        notes=tuple(notes),
        verdict="leak" if growth.leaking else growth.verdict,
        trend_per_step=growth.trend_per_step,
        min_bytes_per_step=int(TIMELINE_MIN_BYTES_PER_SECOND),
        boundary="second",
        unit="s",
    )


# --------------------------------------------------------------------------------------------------
# Attribution
# --------------------------------------------------------------------------------------------------
def site_growth(series: Sequence[Mapping[Any, tuple[int, int]]]) -> dict[Any, tuple[float, float]]:
    """Per-site growth from per-boundary ``{site: (live bytes, live storages)}`` maps of one window.

    Returns ``{site: (bytes per step, storages per step)}`` for sites whose live bytes rose at every boundary
    but at most one (a least-squares slope over the boundaries), ignoring sites that did not grow.

    Example:
        >>> site_growth([{"a": (0, 0)}, {"a": (10, 1)}, {"a": (20, 2)}, {"a": (30, 3)}])
        {'a': (10.0, 1.0)}
    """
    if len(series) < 2:
        return {}
    sites = {s for m in series for s in m}
    out: dict[Any, tuple[float, float]] = {}
    n = len(series)
    xs = list(range(n))
    mx = sum(xs) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    for s in sites:
        b = [float(m.get(s, (0, 0))[0]) for m in series]
        c = [float(m.get(s, (0, 0))[1]) for m in series]
        rises = sum(1 for i in range(1, n) if b[i] > b[i - 1])
        if rises < max(1, n - 2) or b[-1] <= b[0]:
            continue
        mb, mc = sum(b) / n, sum(c) / n
        slope_b = sum((x - mx) * (y - mb) for x, y in zip(xs, b)) / sxx
        slope_c = sum((x - mx) * (y - mc) for x, y in zip(xs, c)) / sxx
        if slope_b > 0:
            out[s] = (slope_b, slope_c)
    return out


# Steps that go into an autograd graph: the holder of the memory is what comes before them.
_GRAPH_HOPS = frozenset({StepKind.GRAD_FN, StepKind.SAVED_TENSOR})
# Steps into a container: an index or key (generalised to ``[*]`` in a holder pattern).
_CONTAINER_ITEMS = frozenset({StepKind.ITEM, StepKind.HOOK})
# Steps that name an attribute-like member: ``.name`` after a module, a class or an object.
_MEMBERS = frozenset({StepKind.MODULE_GLOBAL, StepKind.CLASS_ATTRIBUTE, StepKind.ATTRIBUTE})


def _before(path: HolderPath, kinds: frozenset[StepKind]) -> tuple[HolderStep, ...]:
    """The steps of ``path`` before the first step of one of ``kinds`` (all of them when there is none)."""
    for i, s in enumerate(path.typed_steps):
        if s.kind in kinds:
            return path.typed_steps[:i]
    return path.typed_steps


def _holder_steps(path: HolderPath) -> tuple[HolderStep, ...]:
    """The path up to the holder: autograd hops (``.grad_fn``, ``saved tensor of``) and what follows cut."""
    return _before(path, _GRAPH_HOPS)


def _has_item(steps: Sequence[HolderStep]) -> bool:
    return any(s.kind in _CONTAINER_ITEMS for s in steps)


def _member_names(steps: Sequence[HolderStep]) -> list[str]:
    """The names of the attribute-like steps at the start of ``steps`` (``trainer.cache``), up to the first
    step of another kind or a name that is not an identifier."""
    names: list[str] = []
    for s in steps:
        if s.kind not in _MEMBERS or not s.name.isidentifier():
            break
        names.append(s.name)
    return names


def holder_pattern(path: HolderPath) -> str:
    """The holder a path goes through, with item indices and keys generalised and autograd hops cut.

    Sites whose memory the same holder keeps (``losses[3]``, ``losses[4]``) share one pattern.

    Example:
        >>> from torchmem.results.holders import HolderStep as S, StepKind as K
        >>> p = HolderPath.of("module", (S(K.ROOT, "__main__", "__main__"),
        ...     S(K.MODULE_GLOBAL, ".losses", "losses"), S(K.ITEM, "[17]", "17", "list", "int"),
        ...     S(K.GRAD_FN, ".grad_fn", "MeanBackward0"),
        ...     S(K.SAVED_TENSOR, " -> saved tensor of AddmmBackward0 (_saved_mat1)", "_saved_mat1")), 4)
        >>> holder_pattern(p)
        '__main__.losses[*]'
    """
    parts: list[str] = []
    for s in _holder_steps(path):
        key = f"[{s.name}]"
        if s.kind in _CONTAINER_ITEMS and s.text.endswith(key):
            parts.append(s.text[: len(s.text) - len(key)] + "[*]")
        else:
            parts.append(s.text)
    return "".join(parts)


def _exception_holder_name(path: HolderPath) -> str | None:
    """What keeps the exception (``errors`` in ``errors[3].__traceback__ -> frame ... local 'x'``): the path
    before its traceback hop, ``None`` where the path starts at the traceback (``sys.last_traceback``)."""
    steps = list(path.typed_steps)
    cut = next((i for i, st in enumerate(steps) if st.kind is StepKind.TRACEBACK), None)
    if cut is None:
        cut = next((i for i, st in enumerate(steps) if st.text.startswith(".__traceback__")), None)
    if not cut:
        return None
    head = HolderPath.of(path.root, tuple(steps[:cut]), cut - 1)
    return holder_name(head)


def holder_name(path: HolderPath) -> str:
    """The variable a person would recognise in a holder path (``losses``, ``acts``, ``trainer.cache``).

    The last closure variable before the autograd hops; else the last frame local with the attributes after
    it; else the module global (or class, or other root) with the attributes after it.

    Example:
        >>> from torchmem.results.holders import HolderStep as S, StepKind as K
        >>> p = HolderPath.of("frame", (S(K.ROOT, "train.py:40 in run()"),
        ...     S(K.FRAME_LOCAL, ", local 'trainer'", "trainer"), S(K.ATTRIBUTE, ".cache", "cache"),
        ...     S(K.ITEM, "['k3']", "'k3'", "dict", "str")), 3)
        >>> holder_name(p)
        'trainer.cache'
    """
    steps = _holder_steps(path)
    closures = [s.name for s in steps if s.kind is StepKind.CLOSURE_CELL and s.name]
    if closures:
        return closures[-1]
    locals_ = [i for i, s in enumerate(steps) if s.kind is StepKind.FRAME_LOCAL]
    if locals_:
        i = locals_[-1]
        return ".".join([steps[i].name, *_member_names(steps[i + 1 :])])
    if not steps:
        return str(path)
    first, rest = steps[0], steps[1:]
    members = _member_names(rest)
    if path.root == "module" and members:  # the module's name is not what a person calls the variable
        return ".".join(members)
    return ".".join([first.name or first.text, *members])


def _through_exception(path: HolderPath) -> bool:
    """The path starts at a stored exception (``sys.last_traceback``, one being handled) or follows one's
    traceback to the frames it keeps."""
    return path.root in ("traceback", "exception") or StepKind.TRACEBACK in path.kinds


def _through_hook(path: HolderPath) -> bool:
    """The path goes through a hook dict's entry (``model._forward_hooks[3] -> closure 'acts'``). A variable a
    plain function closes over (a ``nonlocal`` total, a collector's list) is not a hook: its kind is what it
    keeps (a graph chain, a container of tensors)."""
    return any(s.kind is StepKind.HOOK for s in path.typed_steps)


def _in_frame(path: HolderPath, steps: Sequence[HolderStep]) -> bool:
    return path.root in ("frame", "thread") or any(s.kind is StepKind.FRAME_LOCAL for s in steps)


def _module_level_container(path: HolderPath, steps: Sequence[HolderStep]) -> bool:
    """The first container on the path is a global of an imported module (``pkg.mod.REGISTRY[...]``): not
    one of the running script (``__main__``: there every variable is a global), nor an attribute of a
    global object."""
    if path.root != "module" or not steps or steps[0].name == "__main__":
        return False
    between: list[StepKind] = []
    for s in steps[1:]:
        if s.kind in _CONTAINER_ITEMS:
            return bool(between) and all(k is StepKind.MODULE_GLOBAL for k in between)
        between.append(s.kind)
    return False


def _cycle_fix() -> str:
    from torchmem.analysis.holders.cycles import grad_cycle_fix

    return grad_cycle_fix()


def _autograd_cycle(paths: Sequence[HolderPath]) -> bool:
    """A holder path round a ``.grad`` cycle (a create_graph=True gradient whose graph keeps its tensor)."""
    from torchmem.analysis.holders.cycles import AUTOGRAD, classify_cycle

    return any(p.root == "cycle" and classify_cycle(p)[0] == AUTOGRAD for p in paths)


def _kind(g: SiteGrowth) -> str:
    paths = g.paths
    if g.in_cycle or _autograd_cycle(paths):
        return CYCLE
    if any(_through_exception(p) for p in paths):
        return EXCEPTION
    graph = g.saved_bytes > 0 or any(_GRAPH_HOPS.intersection(p.kinds) for p in paths)
    if any(_through_hook(p) for p in paths):
        return HOOK
    if graph:
        # One variable whose graph grows (no container item before the grad_fn hop), or a container.
        holders = [_before(p, frozenset({StepKind.GRAD_FN})) for p in paths if StepKind.GRAD_FN in p.kinds]
        if holders and not any(_has_item(h) for h in holders):
            return GRAPH_CHAIN
        return RETAINED_GRAPH
    if g.storages_per_step < 0.5 and g.bytes_per_step > 0:
        return GROWING_TENSOR
    indexed = [(p, h) for p, h in ((p, _holder_steps(p)) for p in paths) if _has_item(h)]
    if not indexed:
        return UNKNOWN
    path, head = indexed[0]
    if any(_through_kept_optimizer(p) for p in paths):
        return KEPT_OPTIMIZER
    keyed = any(s.kind in _CONTAINER_ITEMS and s.key_type == "str" for s in head)
    if not _in_frame(path, head) and _module_level_container(path, head):
        return GLOBAL
    return CACHE if keyed else ACCUMULATION


def _through_kept_optimizer(path: HolderPath) -> bool:
    """The path reaches an optimizer's per-parameter state (``.state[<Parameter>]``) through a container's
    item before it: a list or dict of optimizers, each keeping the state its ``step()`` made."""
    steps = path.typed_steps
    for i, (a, b) in enumerate(itertools.pairwise(steps)):
        if (
            a.kind is StepKind.ATTRIBUTE
            and a.name == "state"
            and b.kind in _CONTAINER_ITEMS
            and b.key_type in ("Parameter", "Tensor")
        ):
            return any(s.kind in _CONTAINER_ITEMS for s in steps[:i])
    return False


def _mib(b: float) -> str:
    if b >= 1 << 20:
        return f"{b / (1 << 20):.1f} MiB"
    if b >= 1 << 10:
        return f"{b / (1 << 10):.1f} KiB"
    return f"{b:.0f} B"


def _grad_graph(path: HolderPath) -> bool:
    """Whether the path reaches the graph through a tensor's ``.grad`` (a gradient made with
    ``create_graph=True``, stored in ``.grad``)."""
    steps = path.typed_steps
    return any(
        a.kind is StepKind.ATTRIBUTE and a.name == "grad" and b.kind is StepKind.GRAD_FN
        for a, b in itertools.pairwise(steps)
    )


def _grad_graph_fix(path: HolderPath, per_step: float, unit: str = "step") -> str:
    steps = path.typed_steps
    i = next(
        i
        for i, (a, b) in enumerate(itertools.pairwise(steps))
        if a.kind is StepKind.ATTRIBUTE and a.name == "grad" and b.kind is StepKind.GRAD_FN
    )
    head = steps[: i + 1]
    start = max((j for j, st in enumerate(head) if st.kind is StepKind.FRAME_LOCAL), default=None)
    if start is not None:
        owner = head[start].name + "".join(st.text for st in head[start + 1 :])
    elif path.root == "module" and len(head) > 1:
        owner = "".join(st.text for st in head[1:]).lstrip(".")
    else:
        owner = holder_name(HolderPath.of(path.root, head, path.depth))
    return (
        f"`{owner}` holds a gradient made with create_graph=True, with the graph of every earlier step "
        f"(+{_mib(per_step)}/{unit}): set `.grad = None` each step "
        "(`optimizer.zero_grad(set_to_none=True)`), or take second-order gradients with "
        "`torch.autograd.grad(..., create_graph=True)` instead of "
        "storing them in `.grad`"
    )


def _on_cpu(device: str | None) -> bool:
    return bool(device) and str(device).split(":")[0] == "cpu"


def fix_for(
    kind: str,
    name: str,
    per_step: float,
    cycle_types: Sequence[str] = (),
    *,
    unit: str = "step",
    device: str | None = None,
) -> str:
    """The one-line fix for a culprit kind, naming the holder.

    ``unit`` is ``"step"``, or ``"s"`` for a rate per second of a timeline (no repeating step): the rate is
    written with it and no fix speaks of steps then. ``device`` is the watched device: on the CPU the fix
    speaks of CPU tensors and memory, and never suggests ``.cpu()`` copies (they would be the same tensors).

    Example:
        >>> fix_for("device_accumulation", "keep", 2**20, unit="s", device="cpu")
        '`keep` accumulates CPU tensors (+1.0 MiB/s): keep numbers (`.item()`) or a running sum instead'
    """
    size = _mib(per_step)
    rate = f"+{size}/{unit}"
    per_step_unit = unit == "step"
    cpu = _on_cpu(device)
    tensors = "CPU tensors" if cpu else "device tensors"
    if kind == RETAINED_GRAPH:
        kept = f"one autograd graph per step ({size} each)" if per_step_unit else f"autograd graphs ({rate})"
        return f"`{name}` keeps {kept}: store `loss.item()` for logging, " + (
            "or `.detach()` what you keep" if cpu else "or `.detach()` (`.cpu()`) what you keep"
        )
    if kind == GRAPH_CHAIN:
        carries = "from step to step" if per_step_unit else "from one iteration to the next"
        return (
            f"`{name}` carries its autograd graph {carries} ({rate}): accumulate a number "
            f"(`{name} += loss.item()`) or detach the state you carry over (`{name} = {name}.detach()`)"
        )
    if kind == EXCEPTION:
        return (
            f"`{name}` keeps exceptions whose tracebacks hold the frames' tensors ({rate}): store "
            "`repr(e)` / `traceback.format_exc()`, or call `traceback.clear_frames(e.__traceback__)`"
        )
    if kind == CYCLE:
        kinds = ", ".join(cycle_types[:3]) or "objects"
        return (
            f"a reference cycle ({kinds}) keeps {tensors} until the garbage collector runs "
            f"({rate}): break it (a `weakref`, or drop the back-reference when done)"
        )
    if kind == HOOK:
        copies = "`.detach()` copies" if cpu else "`.detach().cpu()` copies"
        return (
            f"a hook's closure `{name}` keeps tensors ({rate}): keep {copies} or a "
            "bounded number, and call `handle.remove()` when done"
        )
    if kind == GROWING_TENSOR:
        larger = "re-allocated larger every step" if per_step_unit else "re-allocated larger again and again"
        return (
            f"`{name}` is {larger} ({rate}, e.g. `torch.cat` onto it): bound it "
            "(a sliding window, a preallocated buffer) or reset it per sequence"
        )
    if kind == GLOBAL:
        keep = "evict entries, or hold them" if cpu else "evict entries, store `.cpu()` copies, or hold them"
        return f"the module-level `{name}` collects {tensors} ({rate}): {keep} through `weakref`"
    if kind == CACHE:
        return f"the cache `{name}` never evicts ({rate}): bound it (LRU with a maximum size) or clear it"
    if kind == KEPT_OPTIMIZER:
        return (
            f"`{name}` keeps optimizers, each with the state its `step()` made (moment buffers the size of "
            f"the model; {rate}): keep the numbers you need (`scheduler.get_last_lr()`, `.item()`), not "
            "the optimizer or scheduler, or reuse one optimizer"
        )
    if kind == ACCUMULATION:
        every = " every step" if per_step_unit else ""
        instead = (
            "keep numbers (`.item()`) or a running sum"
            if cpu
            else ("keep numbers (`.item()`), `.cpu()` copies, or a running sum")
        )
        return f"`{name}` accumulates {tensors}{every} ({rate}): {instead} instead"
    memory = "memory" if cpu else "device memory"
    return f"{memory} born here is never freed ({rate}): find who keeps it with torchmem.holders()"


def _main_pattern(paths: Sequence[HolderPath]) -> str:
    """The holder most sampled storages share (a container beats the loop variable of the last step; of
    holders equally shared, one that reaches them through a list of per-step objects — ``outputs[2]`` over
    the loop variable ``out`` holding the same last output — then the one with the shortest path: the
    variable that carries a graph from step to step, not the step's output whose graph reaches it one node
    later)."""
    counts: dict[str, int] = {}
    hops: dict[str, int] = {}
    seq: dict[str, bool] = {}
    for p in paths:
        k = holder_pattern(p)
        counts[k] = counts.get(k, 0) + 1
        hops[k] = min(hops.get(k, len(p.steps)), len(p.steps))
        seq[k] = seq.get(k, False) or _through_a_sequence(p)
    return max(counts, key=lambda k: (counts[k], "[*]" in k, seq[k], -hops[k]))


def _through_a_sequence(path: HolderPath) -> bool:
    """Whether the path's first container step is an index into a list, deque or tuple (``outputs[2]...``):
    a collection of per-step objects, where a variable (``out['cache']...``) holds one step's object."""
    for s in path.typed_steps:
        if s.kind in _CONTAINER_ITEMS:
            return s.key_type == "int" and s.holder_type in ("list", "deque", "tuple")
    return False


def attribute(
    growth: Sequence[SiteGrowth],
    *,
    min_bytes_per_step: float = 0.0,
    total_per_step: float | None = None,
    unit: str = "step",
    device: str | None = None,
) -> tuple[Culprit, ...]:
    """Group growing sites by the holder that keeps their memory, classify each group, and give its fix.

    Sites kept by the same holder (``losses[*]`` keeps both the loss and the activations its graph saved)
    become one culprit, largest first. The kind comes from the step kinds of the typed holder paths; the
    culprit carries the readable path of its holder. ``unit`` (``"step"``, or ``"s"`` when the rates are per
    second of a timeline) and ``device`` (the watched device) word the fix (:func:`fix_for`).
    """
    groups: dict[str, list[SiteGrowth]] = {}
    for g in growth:
        if g.bytes_per_step < min_bytes_per_step:
            continue
        key = _main_pattern(g.paths) if g.paths else f"<unheld {g.site}>"
        groups.setdefault(key, []).append(g)
    culprits: list[Culprit] = []
    for key, gs in groups.items():
        gs.sort(key=lambda g: -g.bytes_per_step)
        merged = SiteGrowth(
            site=gs[0].site,
            bytes_per_step=sum(g.bytes_per_step for g in gs),
            live_bytes=sum(g.live_bytes for g in gs),
            storages=sum(g.storages for g in gs),
            storages_per_step=sum(g.storages_per_step for g in gs),
            paths=tuple(p for g in gs for p in g.paths),
            saved_bytes=sum(g.saved_bytes for g in gs),
            in_cycle=any(g.in_cycle for g in gs),
            cycle_types=tuple(t for g in gs for t in g.cycle_types),
        )
        kind = _kind(merged)
        holder = next((p for p in merged.paths if holder_pattern(p) == key), None)
        name = holder_name(holder) if holder else (merged.site or "?")
        if kind == EXCEPTION and holder is not None:
            name = _exception_holder_name(holder) or name
        per_step = merged.bytes_per_step
        graph = per_step * merged.saved_bytes / merged.live_bytes if merged.live_bytes else 0.0
        culprits.append(
            Culprit(
                kind=kind,
                site=merged.site,
                sites=tuple((g.site or "?", g.bytes_per_step) for g in gs),
                holder=str(holder)
                if holder
                else (
                    f"unreachable cycle of {', '.join(merged.cycle_types[:3])}" if merged.in_cycle else None
                ),
                bytes=merged.live_bytes,
                bytes_per_step=per_step,
                graph_bytes=graph,
                fix=_grad_graph_fix(holder, per_step, unit)
                if kind in (GRAPH_CHAIN, RETAINED_GRAPH) and holder is not None and _grad_graph(holder)
                else _cycle_fix()
                if kind == CYCLE and _autograd_cycle(merged.paths)
                else fix_for(kind, name, per_step, merged.cycle_types, unit=unit, device=device),
            )
        )
    culprits.sort(key=lambda c: -c.bytes_per_step)
    return tuple(culprits)


__all__ = [
    "KINDS",
    "Culprit",
    "Growth",
    "GrowthStream",
    "LeakReport",
    "SiteGrowth",
    "attribute",
    "detect_growth",
    "detect_run_growth",
    "fix_for",
    "holder_name",
    "holder_pattern",
    "large_total",
    "site_growth",
    "suggested_threshold",
    "timeline_growth",
    "timeline_report",
    "total_words",
]
