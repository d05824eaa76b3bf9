"""Take a :class:`~torchmem.analysis.stats.MemoryStats` reading: all device reads batched in one place."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping

from torchmem.analysis.stats import MemoryStats, ProcessMemory, build_stats
from torchmem.devices import Backend, CpuBackend, CudaBackend, DeviceLike, _context, _nvml, _ops, backend
from torchmem.devices._cpu import process_rss
from torchmem.devices._foreign import foreign_pools
from torchmem.devices._host import relation_to

_OTHER_CONTEXT_MAKERS = ("cupy", "jax", "tensorflow", "numba", "pycuda")


def read_stats(spec: DeviceLike = None, *, probe: bool = True) -> MemoryStats:
    """Read every figure of one device (see :func:`torchmem.stats`). ``probe=False``: the CUDA context's
    size only from the cache (no probe process: a few seconds), as ``torchmem run`` reads at its end."""
    be = backend(spec)
    if isinstance(be, CudaBackend):
        return _read_cuda(be, probe)
    if isinstance(be, CpuBackend):
        return _read_cpu(be)
    return _read_generic(be)


def _read_cpu(be: CpuBackend) -> MemoryStats:
    t = time.time()
    hot = be.hot()
    notes: tuple[str, ...] = ()
    if hot.allocated is None:
        notes = (
            "CPU tensor bytes are counted only inside torchmem.cpu_tracking() (it costs ~15 µs per op).",
        )
    return build_stats(
        device=be.label,
        platform="cpu",
        name=be.name(),
        timestamp=t,
        allocator=None,
        hot=tuple(hot),  # type: ignore[arg-type]
        mem_info=be.mem_info(),
        process_used=(rss := process_rss()),
        limit=_limit(be),
        notes=notes,
        host_rss=rss,
    )


def _read_generic(be: Backend) -> MemoryStats:
    t = time.time()
    return build_stats(
        device=be.label,
        platform=be.platform,
        name=be.name(),
        timestamp=t,
        allocator=be.allocator_stats(),
        hot=tuple(be.hot()),  # type: ignore[arg-type]
        mem_info=be.mem_info(),
        limit=_limit(be),
        notes=("Per-process device usage is not available for this device kind.",),
        host_rss=process_rss(),
    )


def _read_cuda(be: CudaBackend, probe: bool = True) -> MemoryStats:
    notes: list[str] = []
    index = be.index or 0
    initialized = be.is_initialized()
    uuid = be.uuid() if initialized else None
    rocm = be.platform == "rocm"

    # The fast reads first and together, so they describe one moment.
    t = time.time()
    allocator = be.allocator_stats()
    mem_info = be.mem_info()
    nv = None if rocm else _nvml.device(index, uuid=uuid)
    pinned, pinned_active = be.pinned_host_figures()
    rss = process_rss()
    pools = foreign_pools(index) if initialized else {}

    if rocm:
        notes.append("ROCm: per-process figures need AMD SMI, which torchmem does not read yet.")
    elif nv is None:
        problem = _nvml.nvml_problem()
        notes.append(problem or "NVML could not be read for this device.")

    process_used: int | None = None
    others: tuple[ProcessMemory, ...] | None = None
    if nv is not None and nv.processes is not None:
        me = os.getpid()
        others = tuple(
            ProcessMemory(p.pid, p.name, p.used, *relation_to(p.pid, me)) for p in nv.processes if p.pid != me
        )
        process_used, note = _own_usage(nv.processes, initialized)
        if note:
            notes.append(note)

    context = context_method = None
    if initialized and nv is not None:
        est = _context.estimate(index, nv.uuid, nv.driver, probe=probe)
        if est is not None:
            context, context_method = est.bytes, est.method
        elif not probe and _context.probe_enabled():
            notes.append(
                "The CUDA context was not measured in this run (it takes a separate process, a few seconds): "
                "`torchmem stats` measures it once per machine, and later runs read it from the cache."
            )
        elif _context.probe_enabled():
            notes.append("The CUDA context could not be measured (the probe process failed).")

    nccl = _nccl(index, process_used, allocator, context, sum(pools.values()))
    return build_stats(
        device=be.label,
        platform=be.platform,
        name=(nv.name if nv is not None else be.name()),
        timestamp=t,
        allocator=allocator,
        mem_info=mem_info,
        nvml_total=None if nv is None else nv.total,
        nvml_used=None if nv is None else nv.used,
        process_used=process_used,
        context=context,
        context_method=context_method,
        other_allocators=pools,
        other_processes=others,
        pinned_host=pinned,
        pinned_host_active=pinned_active,
        host_rss=rss,
        private_pools=_private_pools(index) if (probe and initialized) else None,
        limit=_limit(be),
        notes=tuple(notes),
        nccl_buffers=nccl[0],
        nccl_communicators=nccl[1],
        nccl_method=nccl[2],
    )


def _nccl(
    index: int,
    process_used: int | None,
    allocator: Mapping[str, int] | None,
    context: int | None,
    pools: int,
) -> tuple[int | None, int | None, str | None]:
    """NCCL's device memory for the process group's communicators (no collective; nothing outside
    torch.distributed with NCCL): ``(bytes, communicators, method)``, the method as
    :attr:`MemoryStats.nccl_method` describes it (``"measured"``, ``"growth"``, ``"estimate"``)."""
    try:
        from torchmem.capture.ranks import process_group_facts
        from torchmem.devices import _nccl as nccl_state
        from torchmem.results.ranks import estimate_nccl

        facts = process_group_facts()
        n = int((facts or {}).get("nccl_communicators") or 0)
        if n <= 0:
            return None, None, None
        seen = nccl_state.measured(index)
        if seen is not None:
            return seen, n, "measured"
        taken, base = nccl_state.baseline(index)
        reserved = None if allocator is None else allocator.get("reserved_bytes.all.current")
        if taken and base is None:
            base = context
        if taken and base is not None and process_used is not None and reserved is not None:
            return max(process_used - int(reserved) - pools - base, 0), n, "growth"
        est = estimate_nccl(os.environ, n)
    except Exception:
        return None, None, None
    if est is None:
        return None, None, None
    return est.bytes, est.communicators, "estimate"


def _private_pools(index: int) -> int | None:
    """Bytes of the device's segments in private pools (one allocator snapshot; only for stats() calls)."""
    try:
        from torchmem.devices import _allocator

        segs = _allocator.private_pool_segments(index)
    except Exception:
        return None
    return None if segs is None else sum(size for _, _, size in segs)


def _limit(be: Backend) -> int | None:
    """The per-process cap on the device (never initialises it; a failed read is "no cap known")."""
    try:
        return _ops.memory_limit(be.device)
    except Exception:
        return None


def process_usage(be: Backend) -> int | None:
    """This process's usage of the device (NVML for CUDA, RSS for the CPU), ``None`` where unknown."""
    if isinstance(be, CpuBackend):
        return process_rss()
    if not isinstance(be, CudaBackend) or be.platform == "rocm":
        return None
    initialized = be.is_initialized()
    nv = _nvml.device(be.index or 0, uuid=be.uuid() if initialized else None)
    if nv is None or nv.processes is None:
        return None
    return _own_usage(nv.processes, initialized)[0]


def _own_usage(processes: tuple[_nvml.NvmlProcess, ...], initialized: bool) -> tuple[int | None, str | None]:
    """This process's usage from NVML's process list, and a note when it cannot be known."""
    for p in processes:
        if p.pid == os.getpid():
            if p.used is None:
                return (
                    None,
                    "The driver does not report per-process usage here (MIG or a restricted container).",
                )
            return p.used, None
    if not initialized and not any(m in sys.modules for m in _OTHER_CONTEXT_MAKERS):
        return 0, None  # no CUDA context in this process, so it holds nothing on the device
    return None, (
        "NVML does not list this process's PID (a container with its own PID namespace?): "
        "this process's usage is n/a."
    )
