"""What is read of the device and the host for an out-of-memory diagnosis: the CUDA allocator's state (its
segments and blocks, counters, driver figures and other processes) and this machine's memory.

Every read goes through the device layer (:mod:`torchmem.devices._allocator` for the caching allocator,
:mod:`torchmem.devices._nvml` for other processes, :mod:`torchmem.devices._host` for the host's memory) and
never initialises CUDA. Re-exported by :mod:`torchmem.capture.oom`.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch

from torchmem.devices import DeviceLike, resolve
from torchmem.devices import _allocator as al
from torchmem.results.oom import AllocatorState, MachineMemory, OtherProcess


def capture_state(
    device: DeviceLike = None,
    *,
    requested: int | None = None,
    device_free: int | None = None,
    limit: int | None = None,
    snapshot_file: str | None = None,
) -> AllocatorState:
    """Read the CUDA allocator's state of ``device`` now: segments and blocks, counters, driver figures
    and other processes (NVML, when available). Cheap: no history, no stack frames.

    A device that is not CUDA, or CUDA not yet used by this process, gives a state with ``None`` figures
    and a note (nothing is initialised).

    Example:
        >>> s = capture_state("cpu")
        >>> s.segments is None
        True
    """
    dev = resolve(device)
    notes: list[str] = []
    if dev.type != "cuda":
        return AllocatorState(
            device=str(dev), platform=dev.type, notes=(f"No allocator segments on {dev.type}.",)
        )
    idx = dev.index or 0
    if not al.cuda_ready():
        return AllocatorState(
            device=str(dev),
            platform=al.platform(),
            alloc_conf=al.alloc_conf(),
            notes=("CUDA is not initialised in this process: nothing is allocated yet.",),
        )
    segs: list[dict[str, Any]] | None
    try:
        segs = al.segments(idx)
    except Exception as exc:  # a torch without snapshots, or one that fails: degrade
        segs = None
        notes.append(f"Segments could not be read ({type(exc).__name__}: {exc}).")
    info = al.mem_info(idx) if device_free is None else None
    free = device_free if device_free is not None else (info[0] if info else None)
    total = al.device_total(idx)
    process_used, others = _processes(idx)
    if others is None:
        from torchmem.devices import _nvml

        problem = _nvml.nvml_problem()
        if problem:
            notes.append(problem)
    kw: dict[str, Any] = {
        "device": f"cuda:{idx}",
        "stats": al.flat_stats(idx),
        "device_total": total,
        "device_free": free,
        "limit": limit if limit is not None and (total is None or limit < total) else None,
        "process_used": process_used,
        "other_processes": others,
        "requested": requested,
        "alloc_conf": al.alloc_conf(),
        "platform": al.platform(),
        "timestamp": time.time(),
        "snapshot_file": snapshot_file,
        "grad_enabled": torch.is_grad_enabled(),
        "notes": tuple(notes),
    }
    if segs is None:
        return AllocatorState(**kw)
    return AllocatorState.from_snapshot(segs, **kw)


def _processes(idx: int) -> tuple[int | None, tuple[OtherProcess, ...] | None]:
    from torchmem.devices import _nvml

    nv = _nvml.device(idx, al.device_uuid(idx))
    if nv is None or nv.processes is None:
        return None, None
    me = os.getpid()
    used = next((p.used for p in nv.processes if p.pid == me), None)
    others = tuple(OtherProcess(p.pid, p.used, p.name) for p in nv.processes if p.pid != me)
    return used, others


def machine_memory(*, read_here: bool = False) -> MachineMemory | None:
    """This machine's memory as :func:`~torchmem.analysis.oom.diagnose` takes it: total RAM, the cgroup
    (container) limit when one is set, what is available; ``None`` when none of it can be read.

    ``read_here``: the figures are for a pasted message, which may come from another machine (a note says
    so in the diagnosis).

    Example:
        >>> m = machine_memory()
        >>> m is None or (m.total or 1) > 0
        True
    """
    from torchmem.devices._host import host_memory

    try:
        h = host_memory()
    except Exception:  # reading the OS must never turn an OOM explanation into another error
        return None
    if h.physical is None and h.cgroup_limit is None:
        return None
    return MachineMemory(
        physical=h.physical,
        physical_source=h.physical_source,
        cgroup_limit=h.cgroup_limit,
        cgroup_source=h.cgroup_source,
        available=h.available,
        read_here=read_here,
    )


__all__ = ["capture_state", "machine_memory"]
