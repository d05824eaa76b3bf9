"""The public read functions: ``stats()``, the fast ``counters()`` and ``reset_peak()``."""

from __future__ import annotations

from typing import Any

import torch

from torchmem.analysis.stats import MemoryStats
from torchmem.capture.snapshot import read_stats
from torchmem.devices import Backend, DeviceLike, HotReading, backend

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
        key: Any = ("default", torch.cuda.current_device() if torch.cuda.is_initialized() else None)
    elif isinstance(device, (str, int, torch.device)):
        key = device
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
