"""The boundary model of the batch-size search: sizes, peaks and outcomes in, the next size to try out.

A step's peak is close to linear in the batch size, ``peak(bs) = a + b * bs``. :class:`BoundaryModel`
records each trial (its size, whether it fit, whether it ran out of memory, its measured peaks and the
bytes it left behind), fits lines through the measured points nearest the boundary between the sizes that
fit and those that do not, and decides the next size: the model's prediction verified by a trial, then
regula falsi, a small step down or bisection when a prediction fails. Pure: no torch, no device, no clock;
each decision costs a few passes over the trials recorded so far.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import cast

GROWTH = 32  # largest factor a prediction may jump above the largest size known to fit

Line = tuple[float, float]  # (fixed bytes, bytes per sample)


@dataclass
class FitPoint:
    """A size that fit: its measured peaks (absolute bytes) and the state its call left behind."""

    peak: int | None  # the modelled figure (reserved / ledger)
    low: int | None  # allocated bytes (CUDA only)
    left: int  # bytes left behind (> 0: a warm-up; its steady peak is at most peak + left)

    def value(self, which: str, corrected: bool) -> float | None:
        v = self.peak if which == "peak" else self.low
        if v is None:
            return None
        return float(v + (self.left if corrected else 0))


def line_through(p: tuple[int, float], q: tuple[int, float]) -> Line | None:
    """The line through two (size, bytes) points; ``None`` when they have the same size."""
    (s1, p1), (s2, p2) = p, q
    if s1 == s2:
        return None
    b = (p2 - p1) / (s2 - s1)
    return p1 - b * s1, b


def crossing(line: Line | None, level: float) -> float | None:
    """Where ``line`` reaches ``level`` (``None`` when it never rises)."""
    if line is None or line[1] <= 0:
        return None
    return (level - line[0]) / line[1]


class BoundaryModel:
    """The model-based search state (pure: sizes, peaks and outcomes in, next size out).

    Two figures can be modelled: ``peak``, the figure the budget applies to (CUDA: the caching
    allocator's reserved bytes; CPU: the exact ledger), and, on CUDA, ``low``, the allocated bytes. With
    ``enforce`` (a margin, or ``capacity=``) a size fits when its measured ``peak`` stays within the
    budget, so only ``peak`` matters. Without it a size fits when it runs, and on CUDA what it needs lies
    between the two: a step needs at least its allocated peak, and at most its reserved peak measured
    from an empty cache (under the cap the allocator frees cached segments and retries before it runs
    out of memory; reserved also rises in segment-sized steps and, near the cap, saturates). The models
    then give a band ``[lo, hi]``: ``lo`` where the reserved line reaches the cap, ``hi`` where the
    allocated line does — no size above ``hi`` can fit. The search aims just under ``hi``, stops when
    the largest size that ran is within ``tolerance`` of it (or of the smallest that failed), and
    otherwise verifies every prediction with a real trial.
    """

    def __init__(self, start: int, max_size: int, min_size: int, tolerance: float) -> None:
        self.start = start
        self.max_size = max_size
        self.min_size = min_size
        self.tol = tolerance
        self.good: dict[int, FitPoint] = {}
        self.bad: int | None = None
        self.bad_peak: int | None = None  # the smallest failing size's peaks, when it ran (over budget)
        self.bad_low: int | None = None
        self.oom_min: int | None = None
        self.state = 0  # bytes left behind by warm-up trials: fixed memory in every later step
        self.predicted: int | None = None
        self.line: Line | None = None
        self.low_line: Line | None = None
        self.band: tuple[float | None, float | None] = (None, None)
        self.fails_in_row = 0
        self.note = ""

    def record(
        self, bs: int, ok: bool, oom: bool, peak: int | None, left: int, low: int | None = None
    ) -> None:
        """Record one trial: ``peak``/``low`` its raw peaks, ``left`` the bytes it left behind."""
        if ok:
            self.good[bs] = FitPoint(peak, low, max(left, 0))
            self.state += max(left, 0)
            self.fails_in_row = 0
            return
        self.fails_in_row += 1
        if oom:
            self.oom_min = bs if self.oom_min is None else min(self.oom_min, bs)
        if self.bad is None or bs <= self.bad:
            self.bad_peak = None if oom else peak
            self.bad_low = None if oom else low
            self.bad = bs
        for s in [s for s in self.good if s >= bs]:  # a later failure wins over an earlier success
            del self.good[s]

    # -- models -----------------------------------------------------------------------------------
    def _fit(self, which: str, corrected: bool = True) -> Line | None:
        """The line through the two measured points nearest the boundary (it passes through them)."""
        pts = [(s, p.value(which, corrected)) for s, p in sorted(self.good.items())]
        known = [(s, v) for s, v in pts if v is not None]
        if not known:
            return None
        g, vg = known[-1]
        bad_v = self.bad_peak if which == "peak" else self.bad_low
        if self.bad is not None and bad_v is not None and self.bad > g:
            return line_through((g, vg), (self.bad, float(bad_v)))  # regula falsi
        others = known[:-1]
        steady = [q for q in others if not self.good[q[0]].left] or others
        if not steady:
            return None
        # Reserved bytes move in segment-sized steps: points too close give a noisy slope.
        gap = 0.9 if which == "peak" else 1.0
        far = [q for q in steady if q[0] <= gap * g]
        return line_through(far[-1] if far else steady[0], (g, vg))

    def _proportional(self, which: str, base: int | None, level: float) -> float | None:
        """Where a line through ``(0, base + state)`` and the largest size that fit reaches ``level``."""
        if base is None or not self.good:
            return None
        g = max(self.good)
        v = self.good[g].value(which, True)
        b0 = float(base + self.state)
        if v is None or v <= b0:
            return None
        return g * (level - b0) / (v - b0)

    def _band(
        self, budget: int, enforce: bool, corrected: bool
    ) -> tuple[float | None, float | None, Line | None, Line | None]:
        line = self._fit("peak", corrected)
        lo = hi = crossing(line, budget)
        low_line = None
        if not enforce:
            low_line = self._fit("low", corrected)
            p_low = crossing(low_line, budget)
            if p_low is not None:
                lo, hi = (p_low, p_low) if lo is None else (min(lo, p_low), max(lo, p_low))
        return lo, hi, line, low_line

    # -- the decision -----------------------------------------------------------------------------
    def next_size(
        self,
        budget: int | None,
        baseline: int | None,
        low_baseline: int | None = None,
        enforce: bool = True,
    ) -> int | None:
        """The next size to try, or ``None`` when the search is done.

        Args:
            budget: Bytes the modelled figure may reach (``None``: unknown, no model).
            baseline: The modelled figure before the search.
            low_baseline: Allocated bytes before the search (CUDA), for the allocated model.
            enforce: A size fits only when its measured peak is within ``budget`` (a margin, or
                ``capacity=``); else when it runs, which the allocated model bounds from above.
        """
        if not self.good:
            if self.bad is None:
                return self.start
            if self.bad <= self.min_size:
                return None
            return max(self.min_size, self.bad // 2)
        g = max(self.good)
        if g >= self.max_size:
            self.note = (
                f"ran within the budget up to max_size={self.max_size}; the true maximum may be higher"
            )
            return None
        bad = self.bad
        tol = self.tol

        def step(n: int) -> int:
            return max(1, math.ceil(tol * n))

        if bad is not None and bad - g <= step(bad):
            self.note = f"converged: {g} fits, {bad} does not"
            return None
        upper = bad - 1 if bad is not None else min(self.max_size, g * GROWTH)

        lo = hi = None
        one_point = False
        if budget is not None:
            lo, hi, line, low_line = self._band(budget, enforce, True)
            if hi is not None and hi < g:
                # A warm-up's correction (its peak plus what it left behind) over-counts when the
                # call's peak already held that state: refit through the raw measurements.
                lo, hi, line, low_line = self._band(budget, enforce, False)
            if line is not None:
                self.line = line
            if low_line is not None:
                self.low_line = low_line
            if hi is None:
                # One point (or flat lines): proportional models through the baseline.
                one_point = True
                props = [self._proportional("peak", baseline, budget)]
                if not enforce:
                    props.append(self._proportional("low", low_baseline, budget))
                known = [p for p in props if p is not None]
                if known:
                    lo, hi = min(known), max(known)
                    if self.line is None and baseline is not None:
                        v = cast(float, self.good[g].value("peak", True))
                        b0 = float(baseline + self.state)
                        self.line = (b0, (v - b0) / g)
            if hi is not None:
                self.band = (lo, hi)
                self.predicted = math.floor(hi)

        def clip(n: int) -> int:
            return min(max(n, g + 1), upper)

        if hi is None or lo is None:
            # No model (capacity unknown, or nothing grows): grow 4x, then bisect.
            if bad is None:
                return clip(4 * g)
            return (g + bad) // 2

        if self.fails_in_row == 0:
            if one_point:
                # The proportional model errs large when the step's fixed memory is below the
                # baseline: aim at 90 % of the careful model, and never stop on one point.
                aim = 0.9 * lo if 0.9 * lo > g * (1 + tol) else lo * (1 - tol / 2)
                if len(self.good) > 1:
                    # Two sizes with the same peak: a batch-independent phase (e.g. the optimizer
                    # step) sets it at small sizes, and the proportional model errs small: 4x.
                    aim = max(aim, 4.0 * g)
                return clip(math.floor(aim)) if aim > g else clip(g + step(g))
            if hi < g:
                # The model is contradicted by a size that ran: verify upwards with a small step.
                return clip(g + 2 * step(g))
            if g >= math.floor(hi * (1 - tol)):
                if enforce or self.low_line is None:
                    self.note = f"the model puts the largest size within the budget at {math.floor(hi)}"
                else:
                    self.note = (
                        f"the allocated-peak model bounds the largest size that can run at "
                        f"{math.floor(hi)}; {g} ran"
                    )
                return None
            # Where the measured figure itself decides, aim at the prediction. Nothing above the top
            # of a band runs: aim just under it (a quarter of its width, at least half the tolerance).
            backoff = 0.0 if enforce or self.low_line is None else max(0.5 * tol * hi, 0.25 * (hi - lo))
            aim = hi - backoff
            prop = self._proportional("peak", baseline, cast(int, budget))
            # The proportional model errs small whenever the step's fixed memory is above the baseline:
            # a secant far beyond it (e.g. through a point whose peak a batch-independent phase set)
            # is capped by it, but it may not hold the search below 2x.
            growth = max(prop if prop is not None else 0.0, 2.0 * g)
            n = math.floor(min(aim, growth))
            if bad is not None and not g < n < bad:
                return (g + bad) // 2
            return clip(n)
        b = cast(int, bad)
        if self.bad_peak is not None:
            # Over budget with a known peak: regula falsi (the line runs through it), else bisection.
            n = math.floor(hi)
            return n if g < n < b else (g + b) // 2
        # Out of memory: one step down when close (after the first failure), else the largest of the
        # midpoint and the careful models below the failure: the low end of the band (the reserved
        # line) and the proportional model from the largest size that fit.
        if self.fails_in_row == 1 and b - g <= 3 * step(b):
            return clip(b - step(b))
        prop = self._proportional("peak", baseline, cast(int, budget))
        options = [(g + b) // 2]
        options += [math.floor(x) for x in (lo, prop) if x is not None and g < math.floor(x) < b]
        return clip(max(options))


__all__ = ["GROWTH", "BoundaryModel", "FitPoint", "Line", "crossing", "line_through"]
