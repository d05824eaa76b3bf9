"""Leak analysis: is memory growing step over step, and which allocation site and holder make it grow.

Pure functions over numbers and strings captured by :mod:`torchmem.capture.watch`: nothing here reads a
device or changes an object, so every rule is testable with plain data.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from torchmem._format import fmt_bytes

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
    UNKNOWN,
)


# --------------------------------------------------------------------------------------------------
# Growth detection
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Growth:
    """The verdict of :func:`detect_growth` on a series of per-step figures.

    Attributes:
        leaking: Steady growth per step was found.
        bytes_per_step: Estimated steady-state growth (0 when not leaking).
        confidence: 0..1: how consistently the figure rises over the window (Kendall's concordance).
        method: ``"steady"`` (every recent step grew by a similar amount), ``"robust"`` (a long window whose
            floors rise in each third, beyond the noise), or ``"none"``.
        samples: Samples after the warm-up that were considered.
        reason: Why it is or is not a leak, in words, with what to do next when nothing was found.
        verdict: ``"leak"``; or why nothing was reported: ``"below_threshold"`` (real, steady growth, smaller
            than ``min_bytes_per_step``), ``"too_few"`` (not enough readings to judge), ``"flat"``,
            ``"shrinking"``, ``"noisy"`` (the figure moves, with no sustained upward trend); ``""`` where the
            series was not explained (``explain=False``).
        trend_per_step: The growth per step that was measured, also when it is below the threshold
            (``bytes_per_step`` stays 0 unless leaking).
        min_bytes_per_step: The reporting threshold the series was judged against.
    """

    leaking: bool
    bytes_per_step: float
    confidence: float
    method: str
    samples: int
    reason: str
    verdict: str = ""
    trend_per_step: float = 0.0
    min_bytes_per_step: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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
    # Cheap pre-check: the last reading must be above the first quarter's floor by the minimum rate.
    if ys[-1] - floors[0] < threshold * (xs[-1] - xs[0]) / 2:
        return None
    slope = _theil_sen(xs, ys)
    span = (xs[-1] - xs[0]) / 4
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
    med = _steady_rate(xs, ys, steady_samples)
    if med is not None and med >= thr:
        return Growth(
            True,
            med,
            _concordance(xs[-steady_samples:], ys[-steady_samples:]),
            "steady",
            n,
            f"grew by {med:.0f} B/step on each of the last {steady_samples - 1} readings",
            "leak",
            med,
            thr,
        )
    if n < ROBUST_SAMPLES:
        return not_leaking(f"{n} readings after warm-up, no steady growth yet")
    found = _robust_rate(xs, ys, thr)
    if found is not None:
        slope, conf = found
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
    return not_leaking("no sustained growth")


# --------------------------------------------------------------------------------------------------
# Attribution
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Culprit:
    """One reason memory grows: an allocation site and the object that keeps what it allocates.

    Attributes:
        kind: One of ``retained_graph`` (a container keeps tensors with their autograd graphs),
            ``graph_chain`` (one variable's graph grows from step to step: ``total += loss``, a
            recurrent state not detached), ``exception`` (stored exceptions keep their frames' tensors),
            ``cycle`` (a reference cycle that only ``gc`` frees), ``hook`` (a hook's closure keeps
            outputs), ``growing_tensor`` (one tensor re-allocated larger every step, such as ``torch.cat``
            onto a cache), ``global_registry`` (a module-level container), ``cache`` (a dict that never
            evicts), ``device_accumulation`` (a list of device tensors), ``unknown``.
        site: The allocation site that grows most, ``"file.py:42"`` (the user's line, not torch internals).
        sites: Every growing site of this culprit with its bytes per step.
        holder: The readable path of the object that keeps the memory (from :func:`torchmem.holders`).
        bytes: Bytes this culprit retained over the attribution window.
        bytes_per_step: Growth per step attributed to it.
        graph_bytes: Bytes of autograd-saved tensors among them (retained graphs), per step.
        fix: The one-line fix.
    """

    kind: str
    site: str | None
    sites: tuple[tuple[str, float], ...]
    holder: str | None
    bytes: int
    bytes_per_step: float
    graph_bytes: float
    fix: str

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["sites"] = [{"site": s, "bytes_per_step": b} for s, b in self.sites]
        return d


@dataclass(frozen=True)
class SiteGrowth:
    """Captured facts about one growing allocation site (input of :func:`attribute`)."""

    site: str | None
    bytes_per_step: float
    live_bytes: int
    storages: int
    storages_per_step: float
    paths: tuple[str, ...]
    saved_bytes: int = 0  # bytes of its live storages that autograd saved for backward
    in_cycle: bool = False
    cycle_types: tuple[str, ...] = ()


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


_INDEX = re.compile(r"\[(?:\d+|'[^']*'|\"[^\"]*\"|<[^>]*>|\.\.\.)\]")
_LOCAL = re.compile(r"local '([^']+)'")
_CLOSURE = re.compile(r"closure '([^']+)'")


def _cut(path: str) -> str:
    """The path up to the holder: autograd hops (``.grad_fn ->``, ``saved tensor of``) removed."""
    return path.split(".grad_fn")[0].split(" -> saved tensor")[0]


def holder_pattern(path: str) -> str:
    """The holder a path goes through, with item indices generalised and autograd hops cut.

    Example:
        >>> holder_pattern("__main__.losses[17].grad_fn -> saved tensor of AddmmBackward0 (_saved_mat1)")
        '__main__.losses[*]'
        >>> holder_pattern("train.py:40 in run(), local 'cache'['k3']")
        "train.py:40 in run(), local 'cache'[*]"
    """
    return _INDEX.sub("[*]", _cut(path))


def holder_name(path: str) -> str:
    """The variable a person would recognise in a holder path (``losses``, ``acts``, ``trainer.cache``).

    Example:
        >>> holder_name("train.py:40 in run(), local 'trainer'.cache['k3']")
        'trainer.cache'
        >>> holder_name("__main__.model._forward_hooks[0] -> closure 'acts'[3]")
        'acts'
    """
    head = _cut(path)
    closures = _CLOSURE.findall(head)
    if closures:
        return str(closures[-1])
    locals_ = list(_LOCAL.finditer(head))
    if locals_:
        m = locals_[-1]
        attrs = re.match(r"((?:\.[A-Za-z_]\w*)*)", head[m.end() :])
        return m.group(1) + (attrs.group(1) if attrs else "")
    head = _INDEX.split(head.split(" -> ")[0])[0]
    glob = _module_global(head)
    if glob is not None:
        return glob
    for mod in sorted((m for m in sys.modules if head.startswith(m + ".")), key=len, reverse=True)[:1]:
        head = head[len(mod) + 1 :]
    return head.split(" ")[-1] or path


def _module_global(container: str, *, scripts: bool = True) -> str | None:
    """``"REGISTRY"`` when ``container`` (``"pkg.mod.REGISTRY"``) names a global of an imported module.

    With ``scripts=False`` the running script's own globals (``__main__``) do not count: there every variable
    is a global, and a list there is a variable, not a module-level registry.
    """
    mod, _, name = container.rpartition(".")
    if mod and name.isidentifier() and mod in sys.modules and (scripts or mod != "__main__"):
        return name
    return None


def _kind(g: SiteGrowth) -> str:
    paths = g.paths
    if g.in_cycle:
        return CYCLE
    if any("__traceback__" in p or p.startswith(("sys.last_", "exception ")) for p in paths):
        return EXCEPTION
    graph = g.saved_bytes > 0 or any(".grad_fn" in p or "saved tensor of" in p for p in paths)
    if any(("_hooks[" in p or "closure '" in p) for p in paths):
        return HOOK
    if graph:
        # One variable whose graph grows (no container index before the autograd hop), or a container.
        holders = [p.split(".grad_fn")[0] for p in paths if ".grad_fn" in p]
        if holders and not any(_INDEX.search(h) for h in holders):
            return GRAPH_CHAIN
        return RETAINED_GRAPH
    if g.storages_per_step < 0.5 and g.bytes_per_step > 0:
        return GROWING_TENSOR
    indexed = [_cut(p) for p in paths if _INDEX.search(_cut(p))]
    if not indexed:
        return UNKNOWN
    head = indexed[0]
    keyed = bool(re.search(r"\[(?:'|\")", head))
    in_frame = "local '" in head or re.match(r"^\S+:\d+ in ", head)
    if not in_frame and _module_global(_INDEX.split(head)[0], scripts=False) is not None:  # not `obj.x[...]`
        return GLOBAL
    return CACHE if keyed else ACCUMULATION


def _mib(b: float) -> str:
    if b >= 1 << 20:
        return f"{b / (1 << 20):.1f} MiB"
    if b >= 1 << 10:
        return f"{b / (1 << 10):.1f} KiB"
    return f"{b:.0f} B"


def fix_for(kind: str, name: str, per_step: float, cycle_types: Sequence[str] = ()) -> str:
    """The one-line fix for a culprit kind, naming the holder."""
    size = _mib(per_step)
    if kind == RETAINED_GRAPH:
        return (
            f"`{name}` keeps one autograd graph per step ({size} each): store `loss.item()` for logging, "
            "or `.detach()` (`.cpu()`) what you keep"
        )
    if kind == GRAPH_CHAIN:
        return (
            f"`{name}` carries its autograd graph from step to step (+{size}/step): accumulate a number "
            f"(`{name} += loss.item()`) or detach the state you carry over (`{name} = {name}.detach()`)"
        )
    if kind == EXCEPTION:
        return (
            f"`{name}` keeps exceptions whose tracebacks hold the frames' tensors (+{size}/step): store "
            "`repr(e)` / `traceback.format_exc()`, or call `traceback.clear_frames(e.__traceback__)`"
        )
    if kind == CYCLE:
        kinds = ", ".join(cycle_types[:3]) or "objects"
        return (
            f"a reference cycle ({kinds}) keeps device tensors until the garbage collector runs "
            f"(+{size}/step): break it (a `weakref`, or drop the back-reference when done)"
        )
    if kind == HOOK:
        return (
            f"a hook's closure `{name}` keeps tensors (+{size}/step): keep `.detach().cpu()` copies or a "
            "bounded number, and call `handle.remove()` when done"
        )
    if kind == GROWING_TENSOR:
        return (
            f"`{name}` is re-allocated larger every step (+{size}/step, e.g. `torch.cat` onto it): bound it "
            "(a sliding window, a preallocated buffer) or reset it per sequence"
        )
    if kind == GLOBAL:
        return (
            f"the module-level `{name}` collects device tensors (+{size}/step): evict entries, store "
            "`.cpu()` copies, or hold them through `weakref`"
        )
    if kind == CACHE:
        return (
            f"the cache `{name}` never evicts (+{size}/step): bound it (LRU with a maximum size) or clear it"
        )
    if kind == ACCUMULATION:
        return (
            f"`{name}` accumulates device tensors every step (+{size}/step): keep numbers (`.item()`), "
            "`.cpu()` copies, or a running sum instead"
        )
    return f"device memory born here is never freed (+{size}/step): find who keeps it with torchmem.holders()"


def _main_pattern(paths: Sequence[str]) -> str:
    """The holder most sampled storages share (a container beats the loop variable of the last step)."""
    counts: dict[str, int] = {}
    for p in paths:
        k = holder_pattern(p)
        counts[k] = counts.get(k, 0) + 1
    return max(counts, key=lambda k: (counts[k], "[*]" in k))


def attribute(
    growth: Sequence[SiteGrowth], *, min_bytes_per_step: float = 0.0, total_per_step: float | None = None
) -> tuple[Culprit, ...]:
    """Group growing sites by the holder that keeps their memory, classify each group, and give its fix.

    Sites kept by the same holder (``losses[*]`` keeps both the loss and the activations its graph saved)
    become one culprit, largest first.
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
        per_step = merged.bytes_per_step
        graph = per_step * merged.saved_bytes / merged.live_bytes if merged.live_bytes else 0.0
        culprits.append(
            Culprit(
                kind=kind,
                site=merged.site,
                sites=tuple((g.site or "?", g.bytes_per_step) for g in gs),
                holder=holder
                if holder
                else (
                    f"unreachable cycle of {', '.join(merged.cycle_types[:3])}" if merged.in_cycle else None
                ),
                bytes=merged.live_bytes,
                bytes_per_step=per_step,
                graph_bytes=graph,
                fix=fix_for(kind, name, per_step, merged.cycle_types),
            )
        )
    culprits.sort(key=lambda c: -c.bytes_per_step)
    return tuple(culprits)


# --------------------------------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LeakReport:
    """What :func:`torchmem.watch` found.

    Attributes:
        device: The device watched.
        source: Where the per-step figure comes from: ``"allocator"`` (the caching allocator's allocated
            bytes) or ``"ledger"`` (torchmem's exact tensor accounting, used where the device has no
            allocator statistics, such as the CPU).
        mode: ``"light"`` or ``"deep"``.
        steps: Steps seen.
        warmup: Steps ignored at the start.
        leaking: Memory grows steadily (as of the last reading).
        bytes_per_step: Growth per step (0 when not leaking).
        confidence: 0..1 (see :class:`Growth`).
        detected_at: The step at which growth was first detected, if ever.
        stopped_at: The step at which growth detected earlier was no longer seen (a cache that filled up).
        reason: The detector's verdict in words; when nothing was reported, why (growth below the threshold,
            too few steps, flat, shrinking, noisy) and what to do next.
        culprits: Who makes it grow, largest first (filled once growth is found, or in deep mode).
        series: ``(step, bytes)`` readings.
        cycles: Reference cycles holding device tensors found by the scan (type names and bytes).
        notes: Anything the user should know about the figures (sampling stride, errors in hooks).
        verdict: ``"leak"``, ``"stopped"`` (growth seen earlier stopped), or why nothing is reported:
            ``"below_threshold"``, ``"no_steps"``, ``"too_few"``, ``"flat"``, ``"shrinking"``, ``"noisy"``
            (see :class:`Growth`); ``""`` in reports written before it existed.
        trend_per_step: The measured growth per step, also below the threshold (``bytes_per_step`` stays 0
            unless leaking).
        min_bytes_per_step: The reporting threshold the watch used (0: unknown).
    """

    device: str
    source: str
    mode: str
    steps: int
    warmup: int
    leaking: bool
    bytes_per_step: float
    confidence: float
    detected_at: int | None
    stopped_at: int | None
    reason: str
    culprits: tuple[Culprit, ...]
    series: tuple[tuple[int, int], ...]
    notes: tuple[str, ...] = field(default=())
    verdict: str = ""
    trend_per_step: float = 0.0
    min_bytes_per_step: int = 0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["culprits"] = [c.to_dict() for c in self.culprits]
        d["series"] = [list(p) for p in self.series]
        return d

    def __str__(self) -> str:
        from torchmem.report.leaks import render_leak_report

        return render_leak_report(self)


__all__ = [
    "KINDS",
    "Culprit",
    "Growth",
    "LeakReport",
    "SiteGrowth",
    "attribute",
    "detect_growth",
    "fix_for",
    "holder_name",
    "holder_pattern",
    "site_growth",
    "suggested_threshold",
]
