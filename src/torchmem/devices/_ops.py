"""Device operations used when freeing memory: synchronise, flush the cache, drop library caches.

All of them are no-ops where the device kind has nothing to do, and none initialises a device that the
process has not used yet.
"""

from __future__ import annotations

import sys
from typing import Any

import torch


def synchronize(device: torch.device) -> None:
    if device.type == "cuda" and torch.cuda.is_initialized():
        torch.cuda.synchronize(device)
    elif device.type == "xpu":
        xpu: Any = getattr(torch, "xpu", None)
        if xpu is not None and xpu.is_initialized():
            xpu.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def empty_cache(device: torch.device) -> bool:
    """Return cached free blocks of ``device`` to the driver. Returns whether there was a cache to empty."""
    if device.type == "cuda" and torch.cuda.is_initialized():
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
