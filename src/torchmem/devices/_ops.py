"""Device operations used when freeing memory: synchronise, flush the cache, drop library caches.

All of them are no-ops where the device kind has nothing to do, and none initialises a device that the
process has not used yet.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from torchmem.devices._allocator import has_context


def _cuda_used(device: torch.device) -> bool:
    """CUDA is initialised and this process has a context on ``device``: else there is nothing to
    synchronise or flush there, and doing it would create a context (~500 MiB) on a GPU never used."""
    if not torch.cuda.is_initialized():
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    return has_context(index)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda" and _cuda_used(device):
        torch.cuda.synchronize(device)
    elif device.type == "xpu":
        xpu: Any = getattr(torch, "xpu", None)
        if xpu is not None and xpu.is_initialized():
            xpu.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def empty_cache(device: torch.device) -> bool:
    """Return cached free blocks of ``device`` to the driver. Returns whether there was a cache to empty."""
    if device.type == "cuda" and _cuda_used(device):
        with torch.cuda.device(device):
            torch.cuda.empty_cache()
        return True
    if device.type == "xpu":
        xpu: Any = getattr(torch, "xpu", None)
        if xpu is not None and xpu.is_initialized():
            xpu.empty_cache()
            return True
    if device.type == "mps":
        torch.mps.empty_cache()
        return True
    return False


def clear_blas_workspaces(device: torch.device) -> bool:
    """Free cuBLAS/cuBLASLt workspaces (they live in the caching allocator). Private API, guarded."""
    if device.type != "cuda" or not torch.cuda.is_initialized():
        return False
    fn = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if fn is None:
        return False
    fn()
    return True


def reset_compile_caches() -> bool:
    """Drop torch.compile/dynamo caches, which keep compiled modules' tensors alive. Guarded."""
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is None:
        return False
    reset = getattr(dynamo, "reset", None)
    if reset is None:
        return False
    reset()
    return True


# -- per-process memory caps (torchmem.limit) -------------------------------------------------------------
# What torchmem set, per CUDA device index: (fraction, bytes). The allocator's own getter is newer than
# torch 2.4, so this is also how stats() can report a cap where torch cannot read it back.
_CUDA_CAPS: dict[int, tuple[float, int]] = {}


def cuda_total_memory(device: torch.device) -> int:
    """Total memory of a CUDA device as the allocator sees it (``cudaMemGetInfo``'s total).

    Initialises CUDA: only called when the user asks for a cap.
    """
    index = device.index if device.index is not None else torch.cuda.current_device()
    return int(torch.cuda.mem_get_info(index)[1])


def get_cuda_memory_fraction(device: torch.device) -> float | None:
    """The allocator's per-process fraction, or ``None`` where this torch cannot read it (or CUDA is unused).

    Public ``torch.cuda.get_per_process_memory_fraction`` where it exists, else the private
    ``torch._C._cuda_getMemoryFraction`` (guarded), else what torchmem itself set.
    """
    if device.type != "cuda" or not torch.cuda.is_initialized():
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    getter = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    if getter is not None:
        return float(getter(index))
    raw = getattr(torch._C, "_cuda_getMemoryFraction", None)
    if callable(raw):
        return float(raw(index))
    known = _CUDA_CAPS.get(index)
    return None if known is None else known[0]


def set_cuda_memory_fraction(device: torch.device, fraction: float, nbytes: int | None) -> None:
    """Cap the caching allocator of ``device`` at ``fraction`` of its total (``nbytes`` for the record).

    The allocator compares its reserved bytes plus the new segment with ``int(fraction * total)``.
    ``nbytes=None`` records that the cap was lifted (fraction 1.0).
    """
    index = device.index if device.index is not None else torch.cuda.current_device()
    torch.cuda.set_per_process_memory_fraction(float(fraction), index)
    if nbytes is None:
        _CUDA_CAPS.pop(index, None)
    else:
        _CUDA_CAPS[index] = (float(fraction), int(nbytes))


def memory_limit(device: torch.device) -> int | None:
    """The per-process cap in effect on ``device``, in bytes; ``None`` when there is none (or unknown).

    CUDA: torchmem's own record, else the allocator's fraction times the total when below 1.0 (read only
    when CUDA is already initialised). CPU: the smallest hard cap ``torchmem.limit()``/``budget(hard=True)``
    placed on the exact ledger. Other kinds: ``None``.
    """
    if device.type == "cuda":
        if not torch.cuda.is_initialized():
            return None
        index = device.index if device.index is not None else torch.cuda.current_device()
        known = _CUDA_CAPS.get(index)
        if known is not None:
            return known[1]
        fraction = get_cuda_memory_fraction(device)
        if fraction is None or fraction >= 1.0:
            return None
        return int(fraction * cuda_total_memory(device))
    if device.type == "cpu":
        from torchmem.devices._ledger import ledger

        hard = [c.bytes for c in ledger().caps("cpu") if c.hard]
        return min(hard) if hard else None
    return None


def cpu_total_memory() -> int | None:
    """Physical memory of the machine (what a CPU ``limit()`` fraction is a fraction of)."""
    from torchmem.devices._cpu import physical_memory

    return physical_memory()


def record_history(enabled: bool, max_entries: int = 100_000) -> str | None:
    """Start or stop the CUDA allocator's history recording (private API, guarded).

    Returns ``None`` on success, else why it is not available (no CUDA, an old torch, the cudaMallocAsync
    backend).
    """
    if not torch.cuda.is_available():
        return "allocator history needs CUDA"
    mem: Any = torch.cuda.memory
    rec = getattr(mem, "_record_memory_history", None)
    if rec is None:
        return "this torch has no torch.cuda.memory._record_memory_history"
    try:
        if enabled:
            rec(max_entries=max_entries)
        else:
            rec(enabled=None)
    except (RuntimeError, TypeError) as exc:
        return f"allocator history could not be {'started' if enabled else 'stopped'}: {exc}"
    return None


def dump_history_snapshot(path: str) -> str | None:
    """Write the allocator snapshot with its history as the pickle https://pytorch.org/memory_viz opens.

    Returns ``None`` on success, else why not.
    """
    mem: Any = torch.cuda.memory
    dump = getattr(mem, "_dump_snapshot", None)
    if dump is None:
        return "this torch has no torch.cuda.memory._dump_snapshot"
    try:
        dump(path)
    except (RuntimeError, OSError) as exc:
        return f"the snapshot could not be written: {exc}"
    return None
