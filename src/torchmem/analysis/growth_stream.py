"""Growth judged one reading at a time: :class:`GrowthStream` gives
:func:`~torchmem.analysis.growth.detect_growth`'s verdict at O(1) per reading for the series that are not
leaks (what a watcher calls at every step), with the periodic test over the jumps of the whole run;
:meth:`GrowthStream.stairs` is the verdict on a figure that grows in stairs, and :func:`periodic_growth`
that verdict over a finished series. Pure
functions over numbers (re-exported by :mod:`torchmem.analysis.leaks`).
"""

from __future__ import annotations

import collections
import itertools
import math
from collections.abc import Sequence

from torchmem.analysis.growth import (
    PERIODIC_JUMPS,
    PERIODIC_LAST,
    ROBUST_SAMPLES,
    _median,
    _periodic_growth,
    _regular_tail,
    _robust_growth,
    _steady_growth,
    periodic_rate,
    read_between,
)
from torchmem.results.leaks import Growth

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
    :func:`detect_growth`'s verdict at every reading), and that where neither test finds a leak the periodic
    test (:func:`periodic_rate`) judges the last jumps of the threshold or more between two readings, kept
    over the whole run (:data:`PERIODIC_LAST` at most), not only the window's: a validation pass every 25
    steps that keeps its outputs rises once per 25 steps, and a window of 32 readings may hold only three of
    its jumps.
    ``leaking`` is an attribute (O(1)).

    Example:
        >>> g = GrowthStream(min_bytes_per_step=1024)
        >>> for step in range(1, 9):
        ...     _ = g.add(step, 10_000 + 4096 * step)
        >>> g.leaking, g.growth.method, g.growth.bytes_per_step
        (True, 'steady', 4096.0)
    """

    __slots__ = (
        "_cached",
        "_jumps",
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
        # (step, rise, value before, step of the reading before) of each rise of the threshold or more
        # between two readings, since the figure last fell by as much (the periodic test's evidence; bounded)
        self._jumps: collections.deque[tuple[int, int, int, int]] = collections.deque(maxlen=PERIODIC_LAST)

    def periodic(self) -> tuple[float, int, float] | None:
        """:func:`periodic_rate` of this stream's jumps at its newest reading, whatever the threshold."""
        if not self.values:
            return None
        return periodic_rate(self._jumps, self.steps[-1], self.values[-1])

    @property
    def jumps(self) -> tuple[tuple[int, int, int, int], ...]:
        """The jumps the periodic test judges (``(step, rise, value before, step of the reading before)``)."""
        return tuple(self._jumps)

    @property
    def rose(self) -> bool:
        """Whether the newest reading rose at 0.8x the threshold's rate or more since the one before."""
        return self._rises > 0

    def stairs(self) -> Growth | None:
        """The periodic test's leak verdict at the newest reading where the figure grows in stairs (the
        regular run of the last jumps, most of them with a reading between them and the one before: a
        validation pass every N steps that keeps its outputs), or None: growth seen at every reading is the
        window's tests' to judge (a call's inner climb read every few steps looks regular too). The one
        stairs verdict of a figure, taken during the run and at its end."""
        if not self.values:
            return None
        step, value = self.steps[-1], self.values[-1]
        use = _regular_tail(self._jumps, step, value)
        if use is None or not flat_between(use):
            return None
        return _periodic_growth(use, step, value, self.min_bytes_per_step)

    def add(self, step: int, value: int) -> Growth:
        """Add the reading ``value`` taken at ``step`` (steps strictly increasing); return the verdict (also
        kept in ``growth``; ``leaking`` is its ``leaking``)."""
        dx = step - self._last_step
        if dx > 0 and (value - self._last_value) / dx >= self._steady_rise:  # (first reading: 0 / inf)
            self._rises += 1
        else:
            self._rises = 0
        rise = value - self._last_value
        if self.added and abs(rise) >= self.min_bytes_per_step:
            # a rise or fall under 4 thresholds and under a quarter of the jumps seen so far is noise beside
            # them (a low threshold meets the program's small allocations): it neither adds a jump nor clears
            jumps = self._jumps
            noise = 0.0
            if len(jumps) >= 3:
                noise = min(0.25 * _median([j[1] for j in jumps]), 4 * self.min_bytes_per_step)
            if rise >= max(self.min_bytes_per_step, noise):
                jumps.append((step, rise, self._last_value, int(self._last_step)))
            elif -rise >= max(self.min_bytes_per_step, noise):
                jumps.clear()  # memory given back: the jumps before are no evidence of a leak
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
        if not growth.leaking and len(self._jumps) >= PERIODIC_JUMPS:
            growth = _periodic_growth(self._jumps, step, value, thr) or growth
        self.growth = growth
        self.leaking = growth.leaking
        return growth


def periodic_growth(
    steps: Sequence[int], values: Sequence[int], *, min_bytes_per_step: float
) -> Growth | None:
    """The periodic test's leak verdict over a whole series (its jumps as a :class:`GrowthStream` fed every
    reading keeps them), or None: the end-of-run check of a figure whose window-based verdict missed growth
    that comes every N steps (a validation pass that keeps its outputs, read densely after each rise: the
    window sees a long flat tail).

    Example:
        >>> xs = list(range(0, 200, 4))
        >>> ys = [(x // 20) * (4 << 20) for x in xs]  # 4 MiB every 20 steps
        >>> g = periodic_growth(xs, ys, min_bytes_per_step=4096)
        >>> g.leaking, g.method, round(g.bytes_per_step)
        (True, 'periodic', 209715)
    """
    stream = GrowthStream(min_bytes_per_step)
    for x, y in zip(steps, values):
        stream.add(x, y)
    return stream.stairs()


def stair_spacing(jumps: Sequence[tuple[int, ...]]) -> float | None:
    """Steps between the rises of a figure that grows in stairs, from its last two to four ``jumps`` (a
    :class:`GrowthStream`'s: rises of the threshold or more between two readings) when a reading between
    them stayed flat (a validation pass every N steps that keeps its outputs); None when the figure does not
    grow that way (fewer than two jumps, or growth at every reading).

    What compares the program's objects at two moments (the host watcher's scans) must look further apart
    than that: two scans between two rises see nothing grow.

    Example:
        >>> s = GrowthStream(min_bytes_per_step=4096)
        >>> for x in range(0, 100, 4):
        ...     _ = s.add(x, (x // 20) * (4 << 20))  # 4 MiB every 20 steps
        >>> stair_spacing(s.jumps)
        20.0
    """
    use = list(jumps)[-4:]
    if len(use) < 2 or not flat_between(use):
        return None
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(use)]
    return float(_median(gaps))


def flat_between(use: Sequence[tuple[int, ...]]) -> bool:
    """Most of the jumps ``use`` have a reading between them and the one before (flat stairs, not growth seen
    at every reading)."""
    pairs = list(itertools.pairwise(use))
    return bool(pairs) and 2 * sum(read_between(a, b) for a, b in pairs) >= len(pairs)


__all__ = [
    "ROBUST_EVERY",
    "GrowthStream",
    "flat_between",
    "periodic_growth",
    "stair_spacing",
]
