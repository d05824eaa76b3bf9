"""The session's background sampler: a thread that ticks every ``interval`` (spaced out so that its work
stays under :data:`SAMPLER_SHARE` of the run once steps are counted), and the figure it reads.

What a tick costs a Python-heavy program is mostly the GIL: the thread takes it from the loop at every
wake-up (``benchmarks/sampler_cost.py``). So once steps are counted (the verdict then comes from the steps'
readings, the timeline is only the plot's) the ticks are at least :data:`_SAMPLER_STEP_INTERVAL` apart, and
on the CPU a tick takes the figure a step read a moment ago rather than reading the C heap again
(``mallinfo2`` walks every arena's free lists with their locks held: tens of µs on a fragmented heap, the
loop's ``malloc`` waiting meanwhile)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from torchmem.capture.read import counters

# The share of the run the sampler thread's ticks may take (their CPU time: a host-bound loop waits for the
# GIL while a tick runs), and the longest gap between two ticks that this spacing may reach.
SAMPLER_SHARE = 0.003
_SAMPLER_MAX_INTERVAL = 0.5
# Once steps are counted: the shortest gap between two ticks (the status line is redrawn 4 times a second at
# most anyway), and the age up to which a step's reading stands for the figure now (CPU).
_SAMPLER_STEP_INTERVAL = 0.25
_FRESH_S = 0.25
SAMPLER_THREAD = "torchmem-sampler"


class Sampler:
    """Calls ``tick`` on its own thread until :meth:`stop`, and accounts for the thread's CPU time.

    ``tick`` does one tick's work and returns the seconds of it spent on the DataLoader checks, or ``None``
    when it skipped its reading (torchmem's own step work is running); an error in it stops the sampler,
    with a note. ``steps`` is the step count (the ticks keep their pace while there is none), ``disabled``
    whether this process records at all (a forked child does not).
    """

    def __init__(
        self,
        interval: float,
        tick: Callable[[], float | None],
        steps: Callable[[], int],
        disabled: Callable[[], bool],
        note: Callable[[str], None],
    ) -> None:
        self.interval = interval
        self._tick = tick
        self._steps = steps
        self._disabled = disabled
        self._note = note
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._cpu_s = 0.0
        self._workers_s = 0.0
        self._ticks = 0
        self._tick_s: float | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=SAMPLER_THREAD, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout)

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    @property
    def cpu_s(self) -> float:
        """The thread's CPU time in its ticks (it holds the GIL while it works)."""
        return self._cpu_s

    @property
    def workers_s(self) -> float:
        """Of it, the DataLoader checks'."""
        return self._workers_s

    @property
    def ticks(self) -> int:
        return self._ticks

    def _loop(self) -> None:
        wait = self.interval
        while not self._stop.wait(wait):
            if self._disabled():
                return
            # The thread's CPU time, not the wall clock: time spent waiting for the GIL costs the program
            # nothing (it is the program running).
            t_s = time.thread_time()
            try:
                t_w = self._tick()
            except Exception as exc:
                self._note(f"sampler stopped: {type(exc).__name__}: {exc}")
                return
            if t_w is None:
                self._cpu_s += time.thread_time() - t_s
                continue
            spent = time.thread_time() - t_s
            self._cpu_s += spent
            self._workers_s += t_w
            self._ticks += 1
            # Holding the GIL for its ticks costs a host-bound program their time: the ticks are spaced so
            # that the sampler keeps under SAMPLER_SHARE of the run (a tick is ~0.1-1 ms: every 50 ms or
            # more), judged on a moving average of the ticks (the first ones write the first 1000 step
            # records, a one-off).
            tick = spent if self._tick_s is None else 0.8 * self._tick_s + 0.2 * spent
            self._tick_s = tick
            wait = spacing(self.interval, self._ticks, tick, self._steps())


def spacing(interval: float, ticks: int, tick_s: float, steps: int) -> float:
    """Seconds to the next tick, after ``ticks`` ticks of ``tick_s`` seconds each (a moving average) with
    ``steps`` steps counted: ``interval`` while there is no step (the verdict then comes from the timeline:
    its readings keep their pace) and for the first 20 ticks; then at least :data:`_SAMPLER_STEP_INTERVAL`,
    and as far apart as keeps the ticks under :data:`SAMPLER_SHARE` of the run, up to
    :data:`_SAMPLER_MAX_INTERVAL`."""
    if ticks < 20 or steps <= 0:
        return interval
    floor = max(interval, _SAMPLER_STEP_INTERVAL)
    return max(floor, min(_SAMPLER_MAX_INTERVAL, tick_s / SAMPLER_SHARE))


class Figure:
    """The session's figure: the allocator's counters, or on the CPU the C heap in use (the exact ledger is
    off outside attribution windows), with the peak of what was read (the steps' readings included)."""

    def __init__(self) -> None:
        self._peak = 0
        self._last: tuple[float, int] | None = None  # (time, value) of the last step's reading

    def observe(self, value: int | None) -> None:
        """A reading taken elsewhere (a step's): it counts towards the peak, and stands for the figure for
        :data:`_FRESH_S` seconds."""
        if value is not None:
            v = int(value)
            self._last = (time.perf_counter(), v)
            if v > self._peak:
                self._peak = v

    def read(self, device: torch.device) -> Any:
        """A reading now (a ``HotReading``). On the CPU a tick (on the sampler's thread) takes a step's
        reading of the last :data:`_FRESH_S` seconds when there is one; every other read (the end's, a
        forecast's) reads the heap."""
        if device.type != "cpu":
            return counters(device)
        from torchmem.devices import HotReading
        from torchmem.devices._host import heap_in_use, process_rss

        last = self._last
        if (
            last is not None
            and time.perf_counter() - last[0] < _FRESH_S
            and threading.current_thread().name == SAMPLER_THREAD
        ):
            return HotReading(last[1], None, None, self._peak or last[1], None)
        v = heap_in_use()
        if v is None:
            v = process_rss()
        if v is not None and v > self._peak:
            self._peak = v
        return HotReading(v, None, None, self._peak or v, None)
