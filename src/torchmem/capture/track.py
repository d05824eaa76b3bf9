"""``torchmem.track()``: the memory a block of code used — delta, peak, and what survived it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any, TypeVar, cast

from torchmem._decorate import ContextDecorator
from torchmem._errors import TrackingError
from torchmem.devices import Backend, CpuBackend, DeviceLike, backend, ledger
from torchmem.devices._ledger import Cohort, Watermark
from torchmem.results.track import TrackResult

F = TypeVar("F", bound=Callable[..., Any])


class _Frame:
    __slots__ = ("carried", "cohort", "hot0", "mark", "stack", "t0", "token")

    def __init__(self) -> None:
        self.carried = 0
        self.cohort: Cohort | None = None
        self.mark: Watermark | None = None
        self.hot0: Any = None
        self.stack = ExitStack()
        self.t0 = 0.0
        self.token: int | None = None


# Active frames per device that reset the allocator's peak: an inner reset must not lose an outer peak.
_open: dict[str, list[_Frame]] = {}
_open_lock = threading.Lock()


class Tracker(ContextDecorator):
    """Context manager and decorator returned by :func:`track`.

    After a block ends, :attr:`result` holds its :class:`TrackResult`, and the attributes ``delta``,
    ``peak``, ``survived`` ... read through to it. Used as a decorator, each call is one block and
    :attr:`results` keeps every call's result.

    One tracker may be used by several threads at once (a decorated function called from a thread pool):
    each thread has its own stack of open blocks, so each call's result is built from its own entry
    figures. Device figures (allocated, peak, survivors) are the device's, not the thread's: blocks that
    run at the same time see each other's allocations.
    """

    def __init__(
        self,
        device: DeviceLike = None,
        *,
        survivors: bool = True,
        peak: bool = True,
        on_exit: Callable[[TrackResult], None] | None = None,
    ) -> None:
        self._spec = device
        self._be: Backend | None = None
        self._survivors = survivors
        self._peak = peak
        self._on_exit = on_exit
        self._local = threading.local()  # per thread: the open blocks, the last result
        self._lock = threading.Lock()
        self._last: TrackResult | None = None
        self.results: list[TrackResult] = []

    @property
    def _frames(self) -> list[_Frame]:
        frames: list[_Frame] | None = getattr(self._local, "frames", None)
        if frames is None:
            frames = self._local.frames = []
        return frames

    @property
    def result(self) -> TrackResult | None:
        """The result of the block that ended last on this thread (else on any thread); ``None`` before."""
        mine: TrackResult | None = getattr(self._local, "result", None)
        return mine if mine is not None else self._last

    # -- result read-through -------------------------------------------------------------------
    def _res(self) -> TrackResult:
        if self.result is None:
            raise TrackingError(
                "The tracked block has not finished yet.", "Read the figures after the block."
            )
        return self.result

    @property
    def delta(self) -> int | None:
        return self._res().delta

    @property
    def peak(self) -> int | None:
        return self._res().peak

    @property
    def peak_delta(self) -> int | None:
        return self._res().peak_delta

    @property
    def survived(self) -> int | None:
        return self._res().survived

    def __str__(self) -> str:
        return str(self.result) if self.result is not None else "<torchmem.track: running>"

    # -- context manager -----------------------------------------------------------------------
    def __enter__(self) -> Tracker:
        if self._be is None:
            self._be = backend(self._spec)
        be = self._be
        dev = be.label
        f = _Frame()
        cpu = isinstance(be, CpuBackend)
        led = ledger()
        if cpu or self._survivors:
            f.stack.enter_context(led.enabled())
        if self._survivors:
            f.cohort = led.open_cohort(dev)
        if cpu:
            f.mark = led.open_watermark(dev)
        elif self._peak and be.is_initialized() and (token := be.open_peak()) is not None:
            f.token = token  # an exact peak that leaves the program's own peak counters as they were
        elif self._peak and be.is_initialized():
            with _open_lock:
                prior = be.hot().peak_allocated or 0
                for other in _open.get(dev, ()):
                    other.carried = max(other.carried, prior)
                be.reset_peak()
                _open.setdefault(dev, []).append(f)
        f.hot0 = be.hot()
        f.t0 = time.perf_counter()
        self._frames.append(f)
        return self

    def peaks_now(self) -> tuple[int | None, int | None]:
        """``(allocated, reserved)`` peaks of the innermost open block so far (exact on CUDA); the allocator's
        peak counters where this device kind cannot share them (the block reset them at entry)."""
        if not self._frames or self._be is None:
            return None, None
        f = self._frames[-1]
        if f.token is not None:
            got = self._be.peak_since(f.token)
            if got is not None:
                return got
        hot = self._be.hot()
        return hot.peak_allocated, hot.peak_reserved

    def __exit__(self, *exc: object) -> None:
        if not self._frames:
            raise TrackingError("track() exited more often than it was entered.", "")
        f = self._frames.pop()
        be = cast(Backend, self._be)
        dev = be.label
        seconds = time.perf_counter() - f.t0
        hot1 = be.hot()
        peak: int | None = None
        if f.mark is not None:
            peak = f.mark.peak
            ledger().close_watermark(f.mark)
        elif f.token is not None:
            closed = be.close_peak(f.token)
            peak = None if closed is None else closed[0]
        else:
            with _open_lock:
                frames = _open.get(dev, [])
                if f in frames:
                    frames.remove(f)
                    now = hot1.peak_allocated
                    peak = None if now is None else max(now, f.carried)
                    for other in frames:  # an enclosing block also saw this peak
                        other.carried = max(other.carried, peak or 0)
        born = survived = count = None
        if f.cohort is not None:
            ledger().close_cohort(f.cohort)
            born, survived, count = f.cohort.born_bytes, f.cohort.live_bytes, f.cohort.live_count
        f.stack.close()
        a0, a1 = f.hot0.allocated, hot1.allocated
        delta = None if a0 is None or a1 is None else a1 - a0
        if peak is not None and a0 is not None and a1 is not None:
            peak = max(peak, a0, a1)
        result = TrackResult(
            device=dev,
            allocated_before=a0,
            allocated_after=a1,
            delta=delta,
            peak=peak,
            peak_delta=None if peak is None or a0 is None else peak - a0,
            reserved_before=f.hot0.reserved,
            reserved_after=hot1.reserved,
            born=born,
            survived=survived,
            survived_tensors=count,
            seconds=seconds,
        )
        self._local.result = result
        with self._lock:
            self._last = result
            self.results.append(result)
        if self._on_exit is not None:
            self._on_exit(result)


def track(
    device: DeviceLike = None,
    *,
    survivors: bool = True,
    peak: bool = True,
    on_exit: Callable[[TrackResult], None] | None = None,
) -> Tracker:
    """Measure the memory a block of code uses: delta, peak inside the block, and what survived it.

    Works as a context manager and as a decorator. Nested blocks each get their own correct peak.

    Args:
        device: The device to measure (default: the current accelerator, else CPU).
        survivors: Record the tensor storages created inside the block, to report how many bytes of them
            are still alive at exit (``survived``). Costs ~15 µs per op inside the block; pass ``False`` in a
            hot loop (``born``/``survived`` are then ``None``).
        peak: Measure the peak inside the block. On CUDA the peak is exact and the program's own view of its
            peaks does not change: ``max_memory_allocated()``, ``memory_stats()`` and the program's own
            ``reset_peak_memory_stats()`` calls give what they would without torchmem (torchmem shares torch's
            one peak counter between its blocks and the program; see docs/api.md). On XPU this resets torch's
            peak counters at block entry. Pass ``False`` to leave torch untouched (``peak`` is then ``None``).
            On CPU torchmem keeps its own peak and nothing in torch changes.
        on_exit: Called with the :class:`TrackResult` of each block.

    Example:
        >>> import torch, torchmem
        >>> with torchmem.track("cpu") as t:
        ...     x = torch.ones(1024, 1024)          # 4 MiB that outlives the block
        ...     tmp = torch.ones(2048, 1024); del tmp  # 8 MiB only at the peak
        >>> t.delta, t.survived, t.peak_delta
        (4194304, 4194304, 12582912)
    """
    return Tracker(device, survivors=survivors, peak=peak, on_exit=on_exit)
