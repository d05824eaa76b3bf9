"""The trial runner of the batch-size search: one call of the step, measured, its OOM caught and freed.

:class:`TrialMeter` runs ``fn(batch_size)`` under a :class:`~torchmem.capture.track.Tracker` (CUDA: the
caching allocator's reserved and allocated peaks, torch's peak counters reset for the call; CPU: the exact
ledger's watermark) and turns the call into an :class:`Outcome`: ran, ran out of memory (by type, through
:func:`torchmem.analysis.oom.is_oom`) or failed otherwise. After a call, :func:`release_memory` collects
garbage and empties the device cache (between trials :func:`release_after_trial`: the full collection only
where the trial's tensors are not all gone), and an out-of-memory error's frames are cleared
(:func:`torchmem._exceptions.clear_exception_frames`) so its tensors do not stay pinned;
:func:`diagnose_oom` explains the one that ends a search. Decorator probes stop a call after a few
optimizer steps (:func:`run_probe`). A trial costs the step itself, three hot readings of the device, a
young-generation ``gc.collect(1)`` (a full one where the device still holds bytes the trial made) and one
cache flush.
"""

from __future__ import annotations

import gc
import importlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from torchmem.analysis.oom import is_oom as _is_oom
from torchmem.capture.track import Tracker
from torchmem.devices import Backend, CpuBackend, backend
from torchmem.devices import _ops as ops

if TYPE_CHECKING:
    from torchmem.analysis.oom import OOMDiagnosis

NOISE_BYTES = 1 << 16  # bytes left behind below this are allocator rounding, not state


class StopProbe(BaseException):
    """Raised from an optimizer step hook to stop a decorator probe once its step peak has been seen."""


def is_oom(exc: BaseException | None) -> bool:
    """Whether ``exc`` is, or was caused by, an out-of-memory error (:func:`torchmem.analysis.oom.is_oom`:
    ``torch.OutOfMemoryError`` by type anywhere in the cause/context chain); ``False`` for ``None``."""
    return exc is not None and _is_oom(exc)


def diagnose_oom(exc: BaseException, device: torch.device, batch_size: int) -> OOMDiagnosis | None:
    """The diagnosis of the out-of-memory error ``exc`` (:func:`torchmem.capture.oom.explain_oom`), or
    ``None`` when it cannot be built: a diagnosis that fails must not hide the search's own error."""
    from torchmem.capture.oom import explain_oom

    try:
        return explain_oom(
            exc, device=device, batch_size=batch_size, holders=False
        )  # a trial needs no holders
    except Exception:
        return None


def release_memory(device: torch.device) -> None:
    """Collect garbage, wait for the device, and return its cached free blocks (between trials)."""
    gc.collect()
    ops.synchronize(device)
    ops.empty_cache(device)


def release_after_trial(meter: TrialMeter, live_before: int | None) -> None:
    """:func:`release_memory` after one trial whose call started with ``live_before`` live bytes (the
    meter's :meth:`TrialMeter.live`): the objects the trial made are young, so a young-generation
    collection frees what it left unreachable; the full collection, which walks every object of the
    process (~0.15 s with torch imported), runs only where the device still holds more live bytes than
    before the call (state it created, tensors pinned in an old reference cycle) or cannot say. Either way
    the next trial starts from the device memory a full collection would leave."""
    gc.collect(1)
    now = meter.live()
    if live_before is None or now is None or now > live_before:
        gc.collect()
    ops.synchronize(meter.device)
    ops.empty_cache(meter.device)


@dataclass
class Outcome:
    """What one call did: its status, the figures around it and, for an error, the exception."""

    status: str  # "ok" | "oom" | "error"
    peak: int | None  # peak of the modelled figure (reserved on CUDA, the ledger on the CPU)
    before: int | None  # the modelled figure before and after the call
    after: int | None
    seconds: float
    exc: BaseException | None = None
    finished: bool = True  # the call returned (not stopped by a probe)
    allocated_peak: int | None = None  # CUDA: peak of allocated (live tensor) bytes; None on the CPU
    allocated_before: int | None = None  # live tensor bytes before and after the call
    allocated_after: int | None = None


def left_behind(out: Outcome) -> int:
    """Bytes of live tensors a call that ran left behind (state it created, e.g. optimizer state), or 0.

    Measured on *allocated* bytes, never on reserved ones: the caching allocator keeps the segments of a
    step's freed temporaries until the cache is emptied, so reserved after a step sits near its peak
    whether or not anything survived (that retained cache was once mistaken for state, which doubled the
    fitted slope on CUDA).
    """
    if out.status != "ok" or out.allocated_before is None or out.allocated_after is None:
        return 0
    left = out.allocated_after - out.allocated_before
    return left if left >= NOISE_BYTES else 0


class TrialMeter:
    """Runs one call under a peak measurement of the modelled figure and turns OOM into an outcome."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.backend: Backend = backend(device)
        self.cpu = isinstance(self.backend, CpuBackend)
        self.metric = "ledger" if self.cpu else "reserved"

    def figure(self) -> int | None:
        """The modelled figure now: the ledger on the CPU, the allocator's reserved bytes elsewhere."""
        hot = self.backend.hot()
        if self.cpu:
            return hot.allocated
        return hot.reserved if hot.reserved is not None else hot.allocated

    def allocated(self) -> int | None:
        """Live tensor bytes where they differ from the modelled figure (CUDA); ``None`` on the CPU."""
        return None if self.cpu else self.backend.hot().allocated

    def live(self) -> int | None:
        """Live tensor bytes now (CUDA: allocated; CPU: the ledger), as ``Outcome.allocated_before``."""
        return self.backend.hot().allocated

    def capacity(self, given: int | None) -> int | None:
        """Bytes the modelled figure may reach: ``given``, else the device's free memory plus what this
        process holds, capped by the :func:`torchmem.limit` in force; ``None`` if unknown."""
        if given is not None:
            return given
        limit = ops.memory_limit(self.device)
        now = self.figure() or 0
        info = self.backend.mem_info()
        hardware = None if info is None else now + info[0]
        if limit is None:
            return hardware
        return limit if hardware is None else min(limit, hardware)

    def call(self, fn: Callable[[int], Any], bs: int) -> Outcome:
        """Run ``fn(bs)`` once, measured; its return value is dropped at once (it may hold memory)."""
        tracker = Tracker(self.device, survivors=False)
        exc: BaseException | None = None
        finished = True
        t0 = time.perf_counter()
        tracker.__enter__()
        peak_reserved: int | None = None
        try:
            try:
                fn(bs)
            except StopProbe:
                finished = False
            except Exception as e:
                exc = e
            if not self.cpu:
                peak_reserved = tracker.peaks_now()[1]  # this call's reserved peak (exact on CUDA)
        finally:
            tracker.__exit__(None, None, None)
        seconds = time.perf_counter() - t0
        res = tracker.result
        assert res is not None
        a0, a1 = res.allocated_before, res.allocated_after
        low: int | None = None
        if self.cpu:
            before, after, peak = a0, a1, res.peak
        else:
            before, after = res.reserved_before, res.reserved_after
            peak = peak_reserved if peak_reserved is not None else res.peak
            if peak is not None and before is not None:
                peak = max(peak, before)
            low = res.peak
        status = "ok" if exc is None else ("oom" if is_oom(exc) else "error")
        return Outcome(
            status,
            peak if status == "ok" else None,
            before,
            after,
            seconds,
            exc=exc,
            finished=finished,
            allocated_peak=low if status == "ok" else None,
            allocated_before=a0,
            allocated_after=a1,
        )


def run_probe(full: Callable[[int], Any], bs: int, steps: int) -> Any:
    """Run ``full(bs)`` but stop it (raise :class:`StopProbe`) after ``steps`` optimizer steps."""
    try:
        hooks_module: Any = importlib.import_module("torch.optim.optimizer")
    except ImportError:  # pragma: no cover - present in every supported torch
        hooks_module = None
    register = getattr(hooks_module, "register_optimizer_step_post_hook", None)
    if register is None:
        return full(bs)
    count = [0]

    def hook(_opt: Any, _args: Any, _kwargs: Any) -> None:
        count[0] += 1
        if count[0] >= steps:
            raise StopProbe()

    handle = register(hook)
    try:
        return full(bs)
    finally:
        handle.remove()


__all__ = [
    "NOISE_BYTES",
    "Outcome",
    "StopProbe",
    "TrialMeter",
    "diagnose_oom",
    "is_oom",
    "left_behind",
    "release_after_trial",
    "release_memory",
    "run_probe",
]
