"""The reading schedule of :class:`torchmem.capture.host.HostWatcher`: which steps are read (every
``stride``-th), how often the C heap is read among them (every ``heap_every``-th reading), how long a step
takes, and what the readings cost, so that they take ``share`` of the run at most."""

from __future__ import annotations

import collections
import math
import time
from collections.abc import Callable
from typing import Any

from torchmem.capture.schedule import LongRunSchedule
from torchmem.devices._host import process_rss

_MAX_STRIDE = 1024
_MAX_HEAP_EVERY = 64
_READ_OVERHEAD = 1.5e-6  # the Python work around one reading, verdicts amortized (measured: 1-2 µs)
# The run so far has at least this many readings of each figure per doubling of its length: a short run
# (150 steps ended before a stride of 44 gave it the readings of a verdict) is judged, at ~8 readings more per
# doubling than its budget allows until the budget's stride is reached (~120 readings in all, a few ms).
READINGS_PER_DOUBLING = 8


def _within(m: int, a: int, limit: int) -> int:
    """The largest count up to ``m`` whose multiple of ``a`` is within ``limit`` (0: not even one)."""
    return min(m, limit // a) if a >= 1 else 0


def cost(fn: Any) -> float:
    """The least time of five calls of ``fn``."""
    costs = []
    for _ in range(5):
        t0 = time.perf_counter()
        fn()
        costs.append(time.perf_counter() - t0)
    return min(costs)


class HostSchedule(LongRunSchedule):
    """Every how many steps the host figures are read, from the steps' time and the readings' cost.

    Args:
        warmup: Steps read at every step (stride 1 until the first reading after them).
        max_stride: The most steps between two readings of each figure (``None``: as the cost demands).
        share: The largest share of a step the readings may take.
        ramp: The strides at most double at each choice, from 1.
        short_runs: The run so far keeps 8 readings per doubling of its length (a short run is judged).
    """

    def __init__(
        self, *, warmup: int, max_stride: int | None, share: float, ramp: bool, short_runs: bool = True
    ) -> None:
        super().__init__(share)
        self._stride = 1
        self._multiple = 0  # aligned: the stride is this multiple of align()'s, up to _limit
        self._limit = 0
        self.short_runs = short_runs
        self.heap_every = 1  # with the heap as the figure, it is read every m-th reading
        self.first_post = warmup + 1  # the first reading after the warm-up (stride 1 until then)
        self.share = share  # the readings' share of a step (torchmem run: less)
        self.why = (0.0, 0.0)  # (step time, reading cost) the stride was chosen from
        self._max_stride = max_stride
        self._ramp = ramp
        self._secondary = False
        # What readings cost: the figure's reads (timed every 4th), the RSS's (at the start), all included.
        self._figure_costs: collections.deque[float] = collections.deque(maxlen=16)
        self._figure_reads = 0
        self._rss_cost = 0.0
        # What each reading cost, all included (the last 16): their median, so that one reading the OS
        # preempted (milliseconds on a loaded machine) does not set the stride for the next 16 readings.
        self._spent: collections.deque[float] = collections.deque(maxlen=16)
        # The same of the readings that did not read the figure (the heap read every m-th reading): the
        # median of the mixed ones is a plain reading's or a heap reading's, by the proportion of each.
        self._plain: collections.deque[float] = collections.deque(maxlen=16)
        self._figure_now = False  # the reading being charged read the figure
        self._last_t: float | None = None
        self._last_n = 0
        self.floor = 1  # the short-run floor's stride at the last choice (the run's steps so far / 8)
        self._step_times: collections.deque[float] = collections.deque(maxlen=16)
        self.share_now = share  # the share the stride was last chosen for
        self._before_alert = (1, 0, 0)  # (stride, multiple, limit) to return to when an alert ends
        self.align: Callable[[], int] | None = None
        """Another watcher's stride to read in step with (``torchmem run``: the device watcher's): the
        stride chosen is a multiple of it where the budget and the short-run floor allow, so that both read
        at the same steps and the steps between are the caller's quiet steps (one reading step, not two)."""

    @property
    def stride(self) -> int:
        """Every how many steps the host figures are read: chosen from the budget, or (aligned) a multiple
        of the other watcher's stride as it stands now (it is chosen again as the readings' cost changes:
        the two stay in step)."""
        m = self._multiple
        if m and self.align is not None:
            a = self.align()
            m = _within(m, a, self._limit)  # a wider other stride: fewer multiples of it
            if m >= 1:
                return m * a
        return self._stride

    @stride.setter
    def stride(self, k: int) -> None:
        self._stride = k
        self._multiple = 0

    def start(self, read: Callable[[], Any], *, secondary: bool) -> None:
        """Time one reading of the figure (``read``) and, with ``secondary``, of the RSS read beside it."""
        self._secondary = secondary
        self._figure_costs.append(cost(read))
        self._rss_cost = cost(process_rss) if secondary else 0.0

    def read(self, read: Callable[[], int | None]) -> int | None:
        """One reading of the figure; every 4th is timed (mallinfo2 walks the heap's free chunks: its cost
        depends on the program)."""
        self._figure_reads = m = self._figure_reads + 1
        t0 = time.perf_counter() if m % 4 == 0 else 0.0
        v = read()
        if t0:
            self._figure_costs.append(time.perf_counter() - t0)
        self._figure_now = True
        return v

    def took(self, value: int) -> int:
        """A reading of the figure taken from another watcher that read it at this step (see
        :meth:`HostWatcher.figure_from`): nothing to time, and the reading's cost is not the rest's."""
        self._figure_now = True
        return value

    def charge(self, seconds: float) -> None:
        """What one reading cost, all included but the scans and node counts."""
        self._spent.append(seconds)
        if not self._figure_now:  # the RSS and the Python around it: what a reading costs besides the figure
            self._plain.append(seconds)
        self._figure_now = False
        self._count_reading()  # (an alert's last reading returns to the stride of before)

    def _narrow(self, k: int) -> None:
        self._before_alert = (self._stride, self._multiple, self._limit)
        self.stride = k  # (on its own steps while alerted, not the other watcher's)

    def _alert_ended(self) -> None:
        # the stride of before, aligned as it was (the step times a choice here would use are those of the
        # last full verdict, up to 16 readings old: the short-run floor taken from them could break the
        # alignment); the next choice comes with the next full verdict
        self._stride, self._multiple, self._limit = self._before_alert

    def time(self, n: int, now: float) -> None:
        """A step boundary at ``now``: the steps' time since the last one timed."""
        if self._last_t is not None and n > self._last_n:
            self._step_times.append((now - self._last_t) / (n - self._last_n))
        self._last_t, self._last_n = now, n

    def untimed(self) -> None:
        """This step's time is not the program's (torchmem traced it): the next is timed afresh."""
        self._last_t = None

    def step_time(self) -> float:
        """The median time of the last steps timed (0 when none was)."""
        times = self._step_times
        return sorted(times)[len(times) // 2] if times else 0.0

    def choose(self) -> None:
        """Read every step, or every k-th step, so that readings take 0.5 % of the run at most: with the heap
        as the figure, half for the RSS (read at each reading) and the Python around it, half for the heap
        (read every m-th reading: mallinfo2's cost varies with the heap, from 0.5 µs to hundreds)."""
        if not self._step_times or self._alert_left:  # (alerted: chosen when the alert ends)
            return
        step_time = sorted(self._step_times)[len(self._step_times) // 2]
        if step_time <= 0:
            return
        figure = sorted(self._figure_costs)[len(self._figure_costs) // 2]
        every = self.heap_every if self._secondary else 1
        # All a reading costs (the lower median of the last 16 readings), the figure's share aside. The median
        # leaves out the verdicts' occasional cost (1-2 µs a reading, amortized) with the preempted readings.
        spent = sorted(self._spent)
        plain = sorted(self._plain)
        if self._secondary and len(plain) >= 3:
            # the readings without the heap's: their lower median is the rest (the RSS, the Python). With
            # the heap read every 2nd-4th reading the median of all of them is either kind's, by chance
            # (H100: the heap's 218 µs taken for the rest's, or the rest taken for nothing: a stride of 1)
            rest = plain[(len(plain) - 1) // 2]
        elif len(spent) >= 3:
            # the lower median: a reading's cost is its least noisy one
            rest = max(0.0, spent[(len(spent) - 1) // 2] - figure / every)
        else:
            rest = self._rss_cost + _READ_OVERHEAD if self._secondary else _READ_OVERHEAD
        cap = self._max_stride or _MAX_STRIDE
        share = self.share_now = self.relaxed_share if self.relaxed else self.share
        # The strides at most double at each choice (every 16 readings): a short run of fast steps still
        # gets readings enough for a verdict (30 steps: ~16 readings), and the readings' cost, a few ms in
        # all before the strides reach the budget's, stays the same share of a long run.
        old_k, old_heap = self._stride, self._stride * self.heap_every
        if not self._ramp:
            old_k = old_heap = cap
        if self._secondary:
            k = min(cap, max(1, math.ceil(rest / (share / 2 * step_time))))
            m = max(1, math.ceil(figure / (share / 2 * step_time * k)))
            heap = k * min(m, _MAX_HEAP_EVERY, max(1, cap // k))  # steps between two heap readings
            k = min(k, 2 * old_k)
            self.heap_every = max(1, min(heap, 2 * old_heap) // k)
        else:
            k = min(cap, max(1, math.ceil((rest + figure) / (share * step_time))), 2 * old_k)
        # Never so sparse that the run so far would have had fewer than 8 readings since its first half.
        young = self.floor = max(1, self._last_n // READINGS_PER_DOUBLING)
        if self.short_runs and k * (self.heap_every if self._secondary else 1) > young:
            k = min(k, young)
            if self._secondary:
                self.heap_every = max(1, young // k)
        self.stride = k
        if self.align is not None:
            self._align(young if self.short_runs else cap, cap)
        self.why = (step_time, rest + figure / (self.heap_every if self._secondary else 1))

    def _align(self, young: int, cap: int) -> None:
        """The stride chosen moved to the nearest multiple of the one :attr:`align` gives (the heap's own
        interval kept about the same), where that multiple is within the short-run floor (``young``) and
        ``cap``: a lower multiple where the nearest is over them (more readings, never fewer than the
        floor asks); not aligned where even the other's stride is over them."""
        assert self.align is not None
        k, a, limit = self._stride, self.align(), min(young, cap)
        if a <= 1:
            return
        m = _within(max(1, round(k / a)), a, limit)
        if m < 1:
            return  # the other watcher reads too rarely for this run's floor: on its own stride
        if self._secondary:
            self.heap_every = max(1, round(k * self.heap_every / (a * m)))
        self._multiple, self._limit = m, limit

    def note(self) -> str:
        """What the schedule is, for the report (``""`` when every step is read)."""
        if not (self.stride > 1 or self.heap_every > 1):
            return ""
        step_time, read_cost = self.why
        every = f" (the C heap every {self.heap_every * self.stride})" if self.heap_every > 1 else ""
        return (
            f"a step takes {step_time * 1e6:.1f} µs and a reading {read_cost * 1e6:.1f} µs: the host "
            f"figures are read every {self.stride} steps{every}, to stay under {self.share_now * 100:g} % "
            "of the run"
        )
