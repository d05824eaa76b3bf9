"""NCCL's device memory, measured through NVML around the calls that create NCCL communicators.

NCCL allocates its buffers, its channels' state and its kernels' code with the driver, outside the caching
allocator: they show in NVML's per-process figure and nowhere in ``torch.cuda.memory_stats()``. What they
come to depends on the topology (24 channels between two NVLink-connected H100s), the protocols and the
NCCL version: no formula from the environment gets it right (``NCCL_BUFFSIZE`` x channels gave 32 MiB where
NVML showed 1.3 GiB on two H100s). So it is measured:

* **windows** (:func:`window`): a communicator is created inside the first collective on its group (or
  inside ``init_process_group``/``new_group`` when a device is bound, or inside DDP's constructor, whose
  first broadcast creates it). ``torchmem run`` wraps those calls; while a group created with NCCL has not
  shown its communicator yet, each such call is a window: this process's memory outside the allocator
  (NVML's figure less the allocator's reserved bytes) is read before and after it, and the growth is
  NCCL's. Each window costs two NVML reads (~1 ms); once every group has shown its communicator (or after
  :data:`MAX_WINDOWS` windows) a call costs one integer test.
* **growth** (:func:`baseline`): where no window saw the communicator (a collective torch issues from C++
  or a compiled graph), the growth outside the allocator since just before the first process group: an
  upper bound (kernels loaded since count too).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

import torch

from torchmem.devices import _nvml
from torchmem.devices._allocator import has_context

MAX_WINDOWS = 64
"""Calls measured at most in one run (a group that never shows a communicator stops costing after them)."""
_GROWTH = 1 << 20  # a window that grew less than this created no communicator

_lock = threading.Lock()
_local = threading.local()
_state: dict[str, int] = {"taken": 0, "pending": 0, "windows": 0}
_baselines: dict[int, int] = {}  # CUDA index -> bytes outside the allocator at the baseline
_measured: dict[int, int] = {}  # CUDA index -> bytes the windows saw NCCL take there


def _outside_allocator(index: int) -> int | None:
    """This process's device memory on ``index`` outside the caching allocator (NVML - reserved)."""
    nv = _nvml.device(index, with_processes=True)
    if nv is None or nv.processes is None:
        return None
    me = os.getpid()
    used = [p.used for p in nv.processes if p.pid == me and p.used is not None]
    if not used:
        return None
    return int(sum(used)) - int(torch.cuda.memory_reserved(index))


def _outside_everywhere() -> dict[int, int]:
    """:func:`_outside_allocator` for every GPU this process has a context on (never creates one)."""
    out: dict[int, int] = {}
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return out
    for index in range(torch.cuda.device_count()):
        if has_context(index):
            figure = _outside_allocator(index)
            if figure is not None:
                out[index] = figure
    return out


def take_baseline() -> None:
    """Note this process's memory outside the allocator on every GPU it has a context on, once (the first
    process group's; later ones add to the same growth)."""
    with _lock:
        if _state["taken"]:
            return
        _state["taken"] = 1
    try:
        _baselines.update(_outside_everywhere())
    except Exception:  # never in the way of the program's init_process_group
        return


def group_created() -> None:
    """A process group using NCCL was created: its communicator is still to be seen in a window."""
    with _lock:
        _state["pending"] += 1


def watching() -> bool:
    """Whether a call is still measured: a group waits for its communicator, windows are left, or a first
    process group may still come (cheap: a few integer tests)."""
    return (_state["pending"] > 0 or not _state["taken"]) and _state["windows"] < MAX_WINDOWS


@contextlib.contextmanager
def window(always: bool = False) -> Iterator[None]:
    """Measure the call inside as a possible communicator creation (see the module's doc): while a group
    waits for its communicator, or ``always`` (a group's creation, which creates it where a device is bound).
    A window inside another is not measured again."""
    wanted = always or _state["pending"] > 0
    if not wanted or _state["windows"] >= MAX_WINDOWS or getattr(_local, "inside", False):
        yield
        return
    _local.inside = True
    try:
        before = _outside_everywhere()
    except Exception:
        before = {}
    try:
        yield
    finally:
        _local.inside = False
        try:
            after = _outside_everywhere()
            growth = {i: after[i] - b for i, b in before.items() if i in after and after[i] - b >= _GROWTH}
        except Exception:
            growth = {}
        with _lock:
            _state["windows"] += 1
            if growth:
                for i, g in growth.items():
                    _measured[i] = _measured.get(i, 0) + g
                _state["pending"] = max(_state["pending"] - 1, 0)


def measured(index: int) -> int | None:
    """What the windows saw NCCL's communicators take on device ``index`` (``None``: none seen there)."""
    return _measured.get(index)


def baseline(index: int) -> tuple[bool, int | None]:
    """``(taken, bytes)``: whether a baseline was taken, and this device's figure then (``None``: the
    process had no context on it then, so its baseline is the CUDA context alone)."""
    return bool(_state["taken"]), _baselines.get(index)


def reset() -> None:
    """Forget what was measured (a new session)."""
    with _lock:
        for k in _state:
            _state[k] = 0
        _baselines.clear()
        _measured.clear()


__all__ = [
    "MAX_WINDOWS",
    "baseline",
    "group_created",
    "measured",
    "reset",
    "take_baseline",
    "watching",
    "window",
]
