"""NCCL's device memory, measured: what this process used on each GPU outside PyTorch's caching allocator
just before its first process group was created (the *baseline*).

NCCL allocates its buffers, its channels' state and its kernels' code with the driver, outside the caching
allocator: they show in NVML's per-process figure and nowhere in ``torch.cuda.memory_stats()``. What they
come to depends on the topology (24 channels between two NVLink-connected H100s), the protocols and the
NCCL version: no formula from the environment gets it right (``NCCL_BUFFSIZE`` x channels gave 32 MiB where
NVML showed 1.3 GiB). What can be measured is the growth of this process's memory outside the allocator
since the baseline: ``torchmem run`` takes the baseline in a wrapper of ``init_process_group``
(:func:`take_baseline`), and :func:`measured` gives the growth. Kernels the program loads for the first time
after the baseline count in it too: it is an upper bound of NCCL's share, within a few percent on a
training step (docs/distributed.md).
"""

from __future__ import annotations

import os
import threading

import torch

from torchmem.devices import _nvml
from torchmem.devices._allocator import has_context

_lock = threading.Lock()
_state: dict[str, object] = {"taken": False}
_baselines: dict[int, int] = {}  # CUDA index -> bytes outside the allocator at the baseline


def _outside_allocator(index: int) -> int | None:
    """This process's device memory on ``index`` outside the caching allocator (NVML - reserved)."""
    nv = _nvml.device(index, with_processes=True)
    if nv is None or nv.processes is None:
        return None
    me = os.getpid()
    used = [p.used for p in nv.processes if p.pid == me and p.used is not None]
    if not used:
        return None
    reserved = int(torch.cuda.memory_reserved(index))
    return int(sum(used)) - reserved


def take_baseline() -> None:
    """Note this process's memory outside the allocator on every GPU it has a context on, once (the first
    call wins: later process groups add their communicators to the same growth). Never creates a context;
    before CUDA is initialised there is nothing to note (the baseline is then the context alone)."""
    with _lock:
        if _state["taken"]:
            return
        _state["taken"] = True
    try:
        if not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return
        for index in range(torch.cuda.device_count()):
            if has_context(index):
                figure = _outside_allocator(index)
                if figure is not None:
                    _baselines[index] = figure
    except Exception:  # never in the way of the program's init_process_group
        return


def baseline(index: int) -> tuple[bool, int | None]:
    """``(taken, bytes)``: whether a baseline was taken, and this device's figure then (``None``: the
    process had no context on it then, so its baseline is the CUDA context alone)."""
    return bool(_state["taken"]), _baselines.get(index)


def reset() -> None:
    """Forget the baseline (a new session)."""
    with _lock:
        _state["taken"] = False
        _baselines.clear()


__all__ = ["baseline", "reset", "take_baseline"]
