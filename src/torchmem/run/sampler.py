"""The session's background sampler: a thread that ticks every ``interval`` (spaced out so that its work
stays under :data:`SAMPLER_SHARE` of the run once steps are counted), and the figure it reads."""

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
        self._thread = threading.Thread(target=self._loop, name="torchmem-sampler", daemon=True)
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
            # Without steps the verdict comes from this timeline: its readings keep their pace then.
            if self._ticks >= 20 and self._steps() > 0:
                wait = max(self.interval, min(_SAMPLER_MAX_INTERVAL, tick / SAMPLER_SHARE))
            else:
                wait = self.interval


class Figure:
    """The session's figure: the allocator's counters, or on the CPU the C heap in use (the exact ledger is
    off outside attribution windows), with the peak of what was read (the steps' readings included)."""

    def __init__(self) -> None:
        self._peak = 0

    def observe(self, value: int | None) -> None:
        """A reading taken elsewhere (a step's): it counts towards the peak."""
        if value is not None and value > self._peak:
            self._peak = int(value)

    def read(self, device: torch.device) -> Any:
        """A reading now (a ``HotReading``)."""
        if device.type != "cpu":
            return counters(device)
        from torchmem.devices import HotReading
        from torchmem.devices._host import heap_in_use, process_rss

        v = heap_in_use()
        if v is None:
            v = process_rss()
        if v is not None and v > self._peak:
            self._peak = v
        return HotReading(v, None, None, self._peak or v, None)
