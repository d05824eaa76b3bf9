"""The public read functions: ``stats()``, the fast ``counters()`` and ``reset_peak()``."""

from __future__ import annotations

import gc
from typing import Any

import torch

from torchmem.analysis.live import collect_live
from torchmem.capture.snapshot import read_stats
from torchmem.devices import Backend, DeviceLike, HotReading, backend, current_cuda_index, resolve
from torchmem.results.live import LiveTensorReport
from torchmem.results.stats import MemoryStats

_backends: dict[Any, Backend] = {}


def stats(device: DeviceLike = None) -> MemoryStats:
    """Read every memory figure of one device: allocator, driver, this process, other processes.

    Args:
        device: ``None`` (current accelerator, else CPU), ``"cuda:1"``, an index, a ``torch.device``,
            a tensor or a module.

    Returns:
        A frozen :class:`MemoryStats`; ``.breakdown()`` reconciles it with ``nvidia-smi``.

    Raises:
        DeviceError: the device does not exist or is not available (a subclass names which).

    Example:
        >>> import torchmem
        >>> s = torchmem.stats("cpu")
        >>> s.device, s.reserved        # the CPU has no caching allocator: reserved is unknowable
        ('cpu', None)
    """
    return read_stats(device)


def _cached_backend(device: DeviceLike) -> Backend:
    if device is None:
        key: Any = ("default", current_cuda_index())
    elif isinstance(device, (str, int, torch.device)) and not isinstance(device, bool):
        key = (type(device).__name__, device)
    else:
        return backend(device)
    be = _backends.get(key)
    if be is None:
        be = backend(device)
        _backends[key] = be
    return be


def counters(device: DeviceLike = None) -> HotReading:
    """The cheap read for hot loops: ``(allocated, reserved, active, peak_allocated, peak_reserved)``.

    On CUDA this reads the caching allocator's counters directly, several times cheaper than
    ``torch.cuda.memory_allocated()`` (see docs/benchmarks.md). Figures a device cannot give are
    ``None``.

    Example:
        >>> import torchmem
        >>> torchmem.counters("cpu").reserved is None
        True
    """
    return _cached_backend(device).hot()


def reset_peak(device: DeviceLike = None) -> None:
    """Reset the peak figures of ``device`` (torch's peak counters on CUDA/XPU, torchmem's on CPU).

    Example:
        >>> import torchmem
        >>> torchmem.reset_peak("cpu")
    """
    backend(device).reset_peak()


def live_tensors(device: DeviceLike = None, *, holders: bool = True) -> LiveTensorReport:
    """Every live tensor on ``device``, one entry per storage, with category, name and holder path.

    Categories: parameter, gradient, optimizer state, buffer, saved for backward (tensors only an
    autograd graph holds are found by walking every live graph), other. Totals per category and per
    top-level module; ``unexplained`` is the allocator's allocated bytes that no tensor explains.

    Args:
        device: The device (default: the current accelerator, else CPU).
        holders: Find each tensor's shortest holder path (one shared search; pass ``False`` to skip it).

    Example:
        >>> import torch, torchmem
        >>> weights = torch.nn.Linear(256, 256)
        >>> report = torchmem.live_tensors("cpu")
        >>> report.by_category["parameter"] >= 256 * 256 * 4
        True
    """
    # One moment: the allocator's figure and the walk with the cyclic collector paused, so a collection
    # the walk's own allocations trigger cannot free garbage between the two (the report would then name
    # memory the allocated figure no longer has, or the reverse).
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        dev = resolve(device)
        allocated = backend(dev).hot().allocated
        return collect_live(dev, allocated, with_holders=holders)
    finally:
        if was_enabled:
            gc.enable()
