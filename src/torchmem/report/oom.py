"""Plain-text rendering of an :class:`~torchmem.analysis.oom.OOMDiagnosis` (what ``str()`` gives) and the
field-by-field explanation of a parsed OOM message that ``torchmem explain`` prints."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchmem._format import fmt_bytes

if TYPE_CHECKING:
    from torchmem.analysis.oom import OOMDiagnosis, ParsedOOM

_SOURCE = {
    "allocator": "PyTorch's caching allocator",
    "cuda_malloc_async": "PyTorch's cudaMallocAsync allocator backend",
    "mps_allocator": "PyTorch's MPS allocator (Apple GPU)",
    "xpu_allocator": "PyTorch's XPU allocator (Intel GPU)",
    "cpu_allocator": "PyTorch's CPU allocator (host RAM)",
    "torchmem_cap": "a cap set by torchmem (limit() or a hard budget) on its exact tensor ledger",
    "driver": "a CUDA/HIP call outside PyTorch's allocator",
    "cublas": "cuBLAS (outside PyTorch's allocator)",
    "cudnn": "cuDNN (outside PyTorch's allocator)",
    "nccl": "NCCL (outside PyTorch's allocator)",
}

_KIND_TITLE = {
    "too_large": "request too large",
    "fragmentation": "fragmentation",
    "other_processes": "other processes",
    "leak": "leak",
    "pinned_by_exception": "memory pinned by an old exception / notebook output",
    "working_set": "working set",
    "outside_allocator": "memory error outside PyTorch's allocator",
}


def field_lines(p: ParsedOOM) -> list[tuple[str, str, str]]:
    """(field, value, meaning) for every field the message gave, in reading order."""
    rows: list[tuple[str, str, str]] = []

    def add(name: str, value: int | None, meaning: str) -> None:
        if value is not None:
            rows.append((name, fmt_bytes(value), meaning))

    if p.source:
        rows.append(("raised by", p.source, _SOURCE.get(p.source, p.source)))
    if p.backend:
        rows.append(("backend", p.backend, "the device kind"))
    if p.format:
        rows.append(("message format", p.format, _FORMATS.get(p.format, "")))
    if p.device_index is not None:
        rows.append(("GPU", str(p.device_index), "the device index as this process numbers it"))
    add(
        "requested",
        p.requested,
        "the block the allocator tried to get: the tensor's size rounded up (to 2 MiB; 20 MiB under 10 MiB)"
        if p.source == "allocator"
        else "the single allocation that failed",
    )
    cap = p.source == "torchmem_cap"
    add("device total", p.device_total, "the device's memory in all")
    add(
        "free under the cap" if cap else "device free",
        p.device_free,
        "what the cap left when the request failed"
        if cap
        else "free on the device, all processes, when the request failed",
    )
    add(
        "cap" if cap else "allowed",
        p.allowed,
        f"the cap set by {p.cap_owner}"
        if cap
        else "a per-process limit set by set_per_process_memory_fraction (or MPS's watermark)",
    )
    add("this process", p.process_used, "this process's device memory, PyTorch or not (nvidia-smi's row)")
    for pid, used in p.other_processes:
        rows.append(
            (f"process {pid}", fmt_bytes(used), "another process on the device (or this one, in a container)")
        )
    add(
        "allocated",
        p.allocated,
        "held by live tensors torchmem's ledger counts" if cap else "held by live tensors",
    )
    add("in private pools", p.private_pools, "of that, in private pools (CUDA graphs)")
    add("reserved", p.reserved, "held by PyTorch's cache from the driver: allocated + cached free")
    add(
        "reserved, unallocated",
        p.reserved_unallocated,
        "cached free pieces no tensor uses; too fragmented to serve the request",
    )
    add("other allocations", p.other_allocations, "MPS memory allocated outside PyTorch's heaps")
    if p.pool:
        rows.append(("pool", p.pool, "the MPS heap pool of the request"))
    if p.process_used is not None and p.reserved is not None:
        rows.append(
            (
                "outside PyTorch (derived)",
                fmt_bytes(max(0, p.process_used - p.reserved)),
                "this process minus reserved: CUDA context, cuBLAS/cuDNN workspaces, NCCL, other libraries",
            )
        )
    if p.suggested_setting:
        rows.append(("message suggests", p.suggested_setting, "torch's generic hint (judged below)"))
    if p.error_code:
        rows.append(("error code", p.error_code, "the library's status"))
    return rows


_FORMATS = {
    "torch2": "torch 2.1+ sentences",
    "torch1": "torch 1.4–2.0 parenthesised list",
    "torch1_cached": "torch 1.0–1.3 ('cached')",
    "cuda_malloc_async": "backend:cudaMallocAsync table",
    "mps": "MPS allocator",
    "cpu": "CPU allocator",
    "torchmem": "torchmem's cap (limit() / budget(hard=True))",
    "library": "a library or driver status",
    "bare": "no figures",
}


def render_fields(p: ParsedOOM) -> str:
    rows = field_lines(p)
    if not rows:
        return ""
    w1 = max(len(r[0]) for r in rows)
    w2 = max((len(r[1]) for r in rows if len(r[1]) <= 16), default=8)
    return "\n".join(f"  {a:<{w1}}  {b:>{w2}}  {c}" for a, b, c in rows)


def render_diagnosis(d: OOMDiagnosis, fields: bool = False) -> str:
    """The diagnosis in plain words: the causes ranked with their evidence, then the fixes."""
    if not d.is_oom:
        lines = ["Not an out-of-memory error."]
        if d.parsed is not None and d.parsed.error_code:
            lines.append(f"  ({d.parsed.error_code})")
        lines += [f"note: {n}" for n in d.notes]
        return "\n".join(lines)
    p = d.parsed
    head = "Out of memory"
    if p is not None:
        where = f" on GPU {p.device_index}" if p.device_index is not None else ""
        if p.source == "torchmem_cap":
            where = f" on {p.backend}" + (f":{p.device_index}" if p.device_index is not None else "")
        req = f": {fmt_bytes(p.requested)} requested" if p.requested is not None else ""
        head += f"{where}{req} ({_SOURCE.get(p.source or '', p.source or 'unknown')})"
    elif d.state is not None:
        head += f" on {d.state.device}"
        if d.state.requested is not None:
            head += f": {fmt_bytes(d.state.requested)} requested"
    lines = [head]
    if fields and p is not None:
        lines.append("")
        lines.append("What the message says:")
        lines.append(render_fields(p))
    if d.causes:
        lines.append("")
        lines.append("Causes, most likely first:")
        for i, c in enumerate(d.causes, 1):
            lines.append(f"{i}. [{c.confidence}] {_KIND_TITLE.get(c.kind, c.kind)}: {c.summary}")
            lines += [f"     {e}" for e in c.evidence]
    else:
        lines.append("No cause can be judged from what is known.")
    if d.fixes:
        lines.append("")
        lines.append("Fixes:")
        for f in d.fixes:
            lines.append(f"  - {f.text}")
            if f.setting:
                lines.append(f"      {f.setting}")
    if d.settings:
        lines.append("")
        lines.append("Allocator settings in effect: " + ",".join(f"{k}:{v}" for k, v in d.settings.items()))
    if d.state is not None and d.state.snapshot_file:
        lines.append(f"Snapshot for https://pytorch.org/memory_viz: {d.state.snapshot_file}")
    for n in d.notes:
        lines.append(f"note: {n}")
    return "\n".join(lines)
