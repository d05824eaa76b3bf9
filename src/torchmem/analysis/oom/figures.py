"""What is known at the moment of an OOM: the message's figures and the allocator state's, merged into one
:class:`Figures`, and the allocator settings in effect.

The state's figures are exact and win over the message's rounded ones; the message's printing precision
becomes a tolerance the cause rules allow for. A process the message lists that is probably this one (process
IDs differ inside containers) is taken out of the other processes. Pure: a few arithmetic steps, no device.
"""

from __future__ import annotations

from dataclasses import dataclass

from torchmem.results.oom import AllocatorState, MachineMemory, ParsedOOM


def parse_alloc_conf(conf: str | None) -> dict[str, str]:
    """``"expandable_segments:True,max_split_size_mb:128" -> {"expandable_segments": "True", ...}``.

    Example:
        >>> parse_alloc_conf("expandable_segments:True, max_split_size_mb:512")
        {'expandable_segments': 'True', 'max_split_size_mb': '512'}
    """
    out: dict[str, str] = {}
    if not conf:
        return out
    for item in conf.split(","):
        if ":" in item:
            k, v = item.split(":", 1)
            out[k.strip().lower()] = v.strip()
        elif item.strip():
            out[item.strip().lower()] = ""
    return out


@dataclass
class Figures:
    """What is known about the moment of the OOM, message and state merged (state wins where both).

    Attributes:
        requested: The request that failed.
        total: The device's total memory (for a CPU allocator OOM: the host's ceiling).
        ceiling: What this process may use: the limit, else the total.
        limit: A per-process limit (memory fraction, MPS watermark, torchmem's cap).
        free: Free device memory when the request failed.
        allocated: Bytes allocated to tensors.
        reserved: Bytes PyTorch's allocator held.
        cached: Reserved but unallocated: the cache's free bytes.
        process_used: This process's device memory, PyTorch or not.
        others: ``(pid, bytes)`` of the other processes.
        others_known: The other processes were listed in full (NVML, or torch 2's message).
        self_guessed: A listed pid taken to be this process (containers hide our pid).
        tol: Bytes the message's printed figures may be off by, allowed for in comparisons.
        backend: The device kind.
        source: Who raised the error (``ParsedOOM.source``).
        cap_owner: For torchmem's cap: who set it.
        machine: The host's memory, for a CPU allocator OOM judged against it.
    """

    requested: int | None = None
    total: int | None = None
    ceiling: int | None = None
    limit: int | None = None
    free: int | None = None
    allocated: int | None = None
    reserved: int | None = None
    cached: int | None = None
    process_used: int | None = None
    others: tuple[tuple[int, int], ...] = ()
    others_known: bool = False
    self_guessed: int | None = None
    tol: int = 0
    backend: str | None = None
    source: str | None = None
    cap_owner: str | None = None
    machine: MachineMemory | None = None


def merge_figures(
    parsed: ParsedOOM | None, state: AllocatorState | None, machine: MachineMemory | None = None
) -> Figures:
    """The figures of the message and the state, merged (the state's win)."""
    f = Figures()
    if parsed is not None:
        f.requested = parsed.requested
        f.total = parsed.device_total
        f.limit = parsed.allowed
        f.free = parsed.device_free
        f.allocated = parsed.allocated
        f.reserved = parsed.reserved
        f.cached = parsed.reserved_unallocated
        f.process_used = parsed.process_used
        f.others = parsed.other_processes
        f.others_known = parsed.source == "allocator" and parsed.format == "torch2"
        f.tol = sum(parsed.precision.values()) // max(1, len(parsed.precision)) * 2 if parsed.precision else 0
        f.backend = parsed.backend
        f.source = parsed.source
        f.cap_owner = parsed.cap_owner
        if parsed.source == "mps_allocator":
            f.limit = parsed.allowed
            f.total = parsed.allowed
            f.reserved = parsed.allocated
            f.cached = None
            if parsed.allocated is not None and parsed.other_allocations is not None:
                f.process_used = parsed.allocated + parsed.other_allocations
    if state is not None:
        f.requested = state.requested if state.requested is not None else f.requested
        f.total = state.device_total if state.device_total is not None else f.total
        f.limit = state.limit if state.limit is not None else f.limit
        f.free = state.device_free if state.device_free is not None else f.free
        f.allocated = state.allocated if state.allocated is not None else f.allocated
        f.reserved = state.reserved if state.reserved is not None else f.reserved
        f.cached = state.cached_free if state.cached_free is not None else f.cached
        f.process_used = state.process_used if state.process_used is not None else f.process_used
        if state.other_processes is not None:
            f.others = tuple((p.pid, p.used or 0) for p in state.other_processes)
            f.others_known = True
        f.backend = f.backend or state.platform
        f.tol = 0 if parsed is None else f.tol
    if f.cached is None and f.reserved is not None and f.allocated is not None:
        f.cached = max(0, f.reserved - f.allocated)
    if f.source == "cpu_allocator" and f.total is None and machine is not None and machine.total is not None:
        # the CPU allocator's message gives only the request: the host's memory is the device total
        f.total = machine.total
        f.machine = machine
    # a process in the list that is probably this one (containers hide our pid from NVML)
    if f.process_used is None and f.others and f.reserved is not None:
        cands = [(pid, b) for pid, b in f.others if b + f.tol >= f.reserved]
        if len(cands) == 1:
            f.self_guessed = cands[0][0]
            f.process_used = cands[0][1]
            f.others = tuple(p for p in f.others if p[0] != cands[0][0])
    f.ceiling = f.limit if f.limit is not None else f.total
    return f


def used_outside(f: Figures) -> tuple[int, str] | None:
    """Device memory in use that is neither PyTorch's cache nor (when known) this process's own overhead:
    ``(bytes, who)``, or ``None`` when the figures are missing."""
    if f.total is None or f.free is None or f.reserved is None:
        return None
    used = f.total - f.free
    if f.process_used is not None:
        out = used - f.process_used
        return (out, "other processes") if out > 0 else None
    out = used - f.reserved
    return (out, "other processes, or this process's CUDA context and libraries") if out > 0 else None


def limited(f: Figures) -> bool:
    """A per-process limit below the device's total is in effect (a memory fraction, MPS's watermark)."""
    return f.limit is not None and f.total is not None and f.limit < f.total


def non_torch(f: Figures) -> int | None:
    """This process's device memory outside PyTorch's allocator (CUDA context, libraries), when known."""
    if f.process_used is None or f.reserved is None:
        return None
    return max(0, f.process_used - f.reserved)


def torch_room(f: Figures, others: int = 0) -> int | None:
    """The most PyTorch's allocator can hold on the device: the limit where one is set (a memory fraction
    counts the allocator's reserved memory only, not the CUDA context), but never more than the device less
    what this process uses outside the allocator and ``others`` use; ``None`` when the ceiling is unknown.

    Example:
        >>> GiB = 1 << 30
        >>> f = Figures(total=80 * GiB, limit=GiB, ceiling=GiB, process_used=2 * GiB, reserved=GiB)
        >>> torch_room(f) == GiB   # the 1 GiB outside the allocator does not count against the fraction
        True
    """
    if f.ceiling is None:
        return None
    if f.source == "torchmem_cap":
        return f.ceiling  # the cap counts tensors only
    outside = (non_torch(f) or 0) + others
    if limited(f):
        assert f.limit is not None and f.total is not None
        return min(f.limit, f.total - outside)
    return f.ceiling - outside


def room_left(f: Figures) -> int | None:
    """What the allocator could still have given at the OOM without freeing a tensor: free memory under the
    limit (or on the device) plus the cache's free bytes; ``None`` when the figures do not say."""
    if f.source == "torchmem_cap":
        return f.free  # free under the cap
    cached = f.cached or 0
    if limited(f) and f.reserved is not None:
        assert f.limit is not None
        left = max(0, f.limit - f.reserved)
        if f.free is not None:
            left = min(left, f.free)
        return left + cached
    if f.free is not None:
        return f.free + cached
    return None


__all__ = [
    "Figures",
    "limited",
    "merge_figures",
    "non_torch",
    "parse_alloc_conf",
    "room_left",
    "torch_room",
    "used_outside",
]
