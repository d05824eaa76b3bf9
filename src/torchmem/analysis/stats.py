"""Deriving a :class:`~torchmem.results.stats.MemoryStats` from the device layer's raw numbers (pure).

Nothing here touches a device: :func:`build_stats` takes the numbers the device layer read and derives the
rest, so every rule is testable with plain numbers. A figure that cannot be known stays ``None``.
"""

from __future__ import annotations

from collections.abc import Mapping

from torchmem.results.stats import (
    Breakdown,
    BreakdownRow,
    MemoryStats,
    ProcessMemory,
    _sub,
    build_breakdown,
)


def build_stats(
    *,
    device: str,
    platform: str,
    name: str | None,
    timestamp: float,
    allocator: Mapping[str, int] | None,
    hot: tuple[int | None, int | None, int | None, int | None, int | None] | None = None,
    mem_info: tuple[int, int] | None = None,
    nvml_total: int | None = None,
    nvml_used: int | None = None,
    process_used: int | None = None,
    context: int | None = None,
    context_method: str | None = None,
    other_allocators: Mapping[str, int] | None = None,
    other_processes: tuple[ProcessMemory, ...] | None = None,
    pinned_host: int | None = None,
    limit: int | None = None,
    notes: tuple[str, ...] = (),
    pinned_host_active: int | None = None,
    host_rss: int | None = None,
    private_pools: int | None = None,
    nccl_buffers: int | None = None,
    nccl_communicators: int | None = None,
    nccl_method: str | None = None,
) -> MemoryStats:
    """Derive a :class:`MemoryStats` from raw readings.

    ``allocator`` is the flat ``memory_stats()``-style dict (``None`` where the backend has none, in which
    case ``hot`` gives what is known). ``mem_info`` is ``(free, total)`` from the runtime and wins over
    NVML's device figures, which are used when the runtime cannot be asked.
    """
    allocated: int | None
    reserved: int | None
    active: int | None
    peak_allocated: int | None
    peak_reserved: int | None
    requested: int | None
    fragmented: int | None
    num_ooms: int | None
    alloc_retries: int | None
    if allocator is not None:

        def g(key: str) -> int | None:
            v = allocator.get(key)
            return None if v is None else int(v)

        allocated = g("allocated_bytes.all.current")
        reserved = g("reserved_bytes.all.current")
        active = g("active_bytes.all.current")
        requested = g("requested_bytes.all.current")
        fragmented = g("inactive_split_bytes.all.current")
        peak_allocated = g("allocated_bytes.all.peak")
        peak_reserved = g("reserved_bytes.all.peak")
        num_ooms = g("num_ooms")
        alloc_retries = g("num_alloc_retries")
        if not allocator:  # an initialised-nothing allocator: everything is genuinely zero
            allocated = reserved = active = requested = fragmented = 0
            peak_allocated = peak_reserved = num_ooms = alloc_retries = 0
    else:
        h = hot or (None, None, None, None, None)
        allocated, reserved, active, peak_allocated, peak_reserved = h
        requested = fragmented = num_ooms = alloc_retries = None

    cached = _sub(reserved, allocated)
    fragmentation: float | None = None
    if fragmented is not None and cached is not None:
        fragmentation = (fragmented / cached) if cached > 0 else 0.0

    device_total: int | None
    device_free: int | None
    device_used: int | None
    if mem_info is not None:
        device_free, device_total = mem_info
        device_used = device_total - device_free
    elif nvml_total is not None and nvml_used is not None:
        device_total, device_used = nvml_total, nvml_used
        device_free = nvml_total - nvml_used
    else:
        device_total = device_free = device_used = None

    others = dict(other_allocators or {})
    non_torch = _sub(process_used, reserved) if platform != "cpu" else None
    unexplained = None
    if platform != "cpu":
        unexplained = _sub(process_used, context, reserved, sum(others.values()))

    return MemoryStats(
        device=device,
        platform=platform,
        name=name,
        timestamp=timestamp,
        allocated=allocated,
        reserved=reserved,
        active=active,
        requested=requested,
        cached=cached,
        fragmented=fragmented,
        fragmentation=fragmentation,
        peak_allocated=peak_allocated,
        peak_reserved=peak_reserved,
        num_ooms=num_ooms,
        alloc_retries=alloc_retries,
        device_total=device_total,
        device_free=device_free,
        device_used=device_used,
        process_used=process_used,
        context=context,
        context_method=context_method,
        other_allocators=others,
        non_torch=non_torch,
        unexplained=unexplained,
        other_processes=other_processes,
        pinned_host=pinned_host,
        pinned_host_active=pinned_host_active,
        host_rss=host_rss,
        private_pools=private_pools,
        nccl_buffers=nccl_buffers,
        nccl_communicators=nccl_communicators,
        nccl_method=nccl_method if nccl_buffers is not None else None,
        limit=limit,
        notes=notes,
    )


__all__ = ["Breakdown", "BreakdownRow", "MemoryStats", "ProcessMemory", "build_breakdown", "build_stats"]
