"""Memory readings and the reconciliation of ``nvidia-smi``: :class:`MemoryStats`, :class:`Breakdown`.

Frozen data with its arithmetic and its plain-text rendering; nothing here touches a device
(``torchmem.analysis.stats.build_stats`` derives a reading from the device layer's numbers). A figure that
cannot be known is ``None`` and prints as ``n/a``; it never means 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from torchmem._format import fmt_bytes, fmt_ratio
from torchmem.results._dicts import from_mapping


@dataclass(frozen=True)
class ProcessMemory:
    """One process's use of a device, as NVML reports it."""

    pid: int
    name: str | None
    used: int | None
    relation: str = ""
    """``"child"``/``"descendant"`` (started by this process: DataLoader workers), ``"orphan"`` (its parent
    exited), or ``""`` (unrelated, or unknown)."""
    parent: int | None = None
    """Its parent's PID, where ``/proc`` shows it."""

    @property
    def role(self) -> str:
        """What it is, in words: ``"DataLoader worker of this process"``, ``"child of this process"``,
        ``"orphan: its parent exited"``, or ``""``."""
        worker = (self.name or "").startswith("pt_data_worker")
        if self.relation in ("child", "descendant"):
            return "DataLoader worker of this process" if worker else f"{self.relation} of this process"
        if self.relation == "orphan":
            return ("DataLoader worker" if worker else "process") + " whose parent exited (an orphan)"
        return ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ProcessMemory:
        return from_mapping(cls, d)


@dataclass(frozen=True)
class BreakdownRow:
    """One line of the reconciliation: a labelled byte figure, with sub-rows that sum to it."""

    label: str
    bytes: int | None
    note: str = ""
    children: tuple[BreakdownRow, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "bytes": self.bytes,
            "note": self.note,
            "children": [c.to_dict() for c in self.children],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> BreakdownRow:
        return from_mapping(cls, d)


@dataclass(frozen=True)
class Breakdown:
    """Where this process's device memory (what ``nvidia-smi`` shows for its PID) goes.

    ``process`` rows sum exactly to ``process_used`` when it is known: CUDA context + PyTorch reserved
    (allocated + cached free, of which split) + other allocators in this process + unexplained. ``device``
    rows explain the device's used total: this process + other processes + memory no process accounts for.
    """

    device: str
    platform: str
    process_used: int | None
    process: tuple[BreakdownRow, ...]
    device_used: int | None
    device_total: int | None
    other_processes: tuple[ProcessMemory, ...] | None
    unattributed: int | None
    notes: tuple[str, ...] = ()
    host_rss: int | None = None
    pinned_host: int | None = None
    pinned_host_active: int | None = None

    def __str__(self) -> str:
        return render_breakdown(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Breakdown:
        """The breakdown stored as :meth:`to_dict` wrote it."""
        return from_mapping(cls, d)

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "platform": self.platform,
            "process_used": self.process_used,
            "process": [r.to_dict() for r in self.process],
            "device_used": self.device_used,
            "device_total": self.device_total,
            "other_processes": None
            if self.other_processes is None
            else [asdict(p) for p in self.other_processes],
            "unattributed": self.unattributed,
            "notes": list(self.notes),
            "host_rss": self.host_rss,
            "pinned_host": self.pinned_host,
            "pinned_host_active": self.pinned_host_active,
        }


@dataclass(frozen=True)
class MemoryStats:
    """A frozen, timestamped reading of one device's memory.

    Byte figures agree with ``torch.cuda.memory_stats()`` (allocator figures) and NVML (driver figures)
    read at the same moment. ``None`` means "cannot be known here" and prints as ``n/a``; it never means 0.

    Attributes:
        device: ``"cuda:0"``, ``"cpu"``, ...
        platform: ``"cuda"``, ``"rocm"``, ``"mps"``, ``"xpu"`` or ``"cpu"``.
        name: Product name of the device.
        timestamp: ``time.time()`` of the reading.
        allocated: Bytes in blocks handed out to tensors (``allocated_bytes.all.current``). On CPU: bytes of
            live tensor storages counted by :func:`torchmem.cpu_tracking` (``None`` when it is off).
        reserved: Bytes the caching allocator holds from the driver (``reserved_bytes.all.current``).
        active: Bytes in active blocks, including freed blocks still in use by a stream.
        requested: Bytes the callers asked for, before the allocator's rounding.
        cached: Reserved but not allocated: free blocks the cache keeps (``reserved - allocated``).
        fragmented: Bytes of free blocks that are pieces of split segments (``inactive_split_bytes``):
            cached memory that only requests smaller than its pieces can use.
        fragmentation: ``fragmented / cached`` (0..1), the share of the cache that is split.
        peak_allocated: Highest ``allocated`` since the last peak reset.
        peak_reserved: Highest ``reserved`` since the last peak reset.
        num_ooms: Out-of-memory errors the allocator raised.
        alloc_retries: Times the allocator freed its cache and retried a failed cudaMalloc.
        device_total: Device memory in all.
        device_free: Free device memory (all processes).
        device_used: ``device_total - device_free``.
        process_used: This process's device usage as the driver sees it (the ``nvidia-smi`` process row).
            On CPU: the process's resident set size.
        context: Estimated size of this process's CUDA context (see docs/stats.md for how it is measured).
        context_method: How ``context`` was measured.
        other_allocators: Bytes held in this process by other libraries' pools (CuPy), by library.
        non_torch: ``process_used - reserved``: device memory of this process outside PyTorch's allocator
            (the context, library handles and kernels, NCCL, other allocators).
        unexplained: ``process_used - context - reserved - other_allocators``: what no reading explains.
        other_processes: Other processes on this device, with their usage.
        pinned_host: Page-locked host memory held by torch's host allocator (in use and cached).
        pinned_host_active: Of ``pinned_host``, the blocks in use now (the rest is cached for reuse).
        host_rss: This process's resident host memory (RSS), on every device kind (pinned memory is part
            of it).
        private_pools: Of ``reserved``, the segments in private memory pools (CUDA graphs recorded by
            ``torch.cuda.graph`` or torch.compile's ``reduce-overhead`` mode); read by :func:`torchmem.stats`
            (one allocator snapshot), ``None`` where not read.
        nccl_buffers: NCCL's device memory (outside the caching allocator) for ``nccl_communicators``
            communicators of an initialised process group; ``None`` outside torch.distributed with NCCL.
            How it was found is ``nccl_method`` (docs/distributed.md).
        nccl_communicators: The NCCL communicators counted for ``nccl_buffers``.
        nccl_method: ``"measured"``: NVML's figure read around the calls that created the communicators
            (the first collective on each group, DDP's constructor; ``torchmem run`` wraps them).
            ``"growth"``: the growth outside the allocator since just before the first process group
            (no creation was seen; kernels loaded since count too: an upper bound). ``"estimate"``: from
            ``NCCL_BUFFSIZE`` and the channel count, a lower bound (outside ``torchmem run``).
        limit: The per-process cap in effect (:func:`torchmem.limit`, or a memory fraction set another way),
            in bytes; ``None`` when no cap is in effect.
        notes: Why some figures are ``n/a``, and what to do about it.
    """

    device: str
    platform: str
    name: str | None
    timestamp: float
    allocated: int | None = None
    reserved: int | None = None
    active: int | None = None
    requested: int | None = None
    cached: int | None = None
    fragmented: int | None = None
    fragmentation: float | None = None
    peak_allocated: int | None = None
    peak_reserved: int | None = None
    num_ooms: int | None = None
    alloc_retries: int | None = None
    device_total: int | None = None
    device_free: int | None = None
    device_used: int | None = None
    process_used: int | None = None
    context: int | None = None
    context_method: str | None = None
    other_allocators: Mapping[str, int] = field(default_factory=dict)
    non_torch: int | None = None
    unexplained: int | None = None
    other_processes: tuple[ProcessMemory, ...] | None = None
    pinned_host: int | None = None
    limit: int | None = None
    notes: tuple[str, ...] = ()
    pinned_host_active: int | None = None
    host_rss: int | None = None
    private_pools: int | None = None
    nccl_buffers: int | None = None
    nccl_communicators: int | None = None
    nccl_method: str | None = None

    @property
    def other_processes_used(self) -> int | None:
        """Sum of the other processes' usage, ``None`` if unknown for any of them."""
        if self.other_processes is None:
            return None
        total = 0
        for p in self.other_processes:
            if p.used is None:
                return None
            total += p.used
        return total

    def breakdown(self) -> Breakdown:
        """The reconciliation of the ``nvidia-smi`` figures for this device. See :class:`Breakdown`."""
        return build_breakdown(self)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of every field (``None`` stays ``None``)."""
        d = asdict(self)
        d["other_allocators"] = dict(self.other_allocators)
        d["other_processes"] = (
            None if self.other_processes is None else [asdict(p) for p in self.other_processes]
        )
        d["notes"] = list(self.notes)
        return d

    def __str__(self) -> str:
        return render_stats(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> MemoryStats:
        """The reading stored as :meth:`to_dict` wrote it (keys of later versions are ignored)."""
        return from_mapping(cls, d)


def _sub(a: int | None, *bs: int | None) -> int | None:
    if a is None or any(b is None for b in bs):
        return None
    return a - sum(b for b in bs if b is not None)


_CONTEXT_NOTES = {
    "nvml-process": "measured: a fresh process's usage on this GPU (NVML, per PID)",
    "nvml-device-delta": "measured: device usage before/after a fresh process created its context",
}


def build_breakdown(s: MemoryStats) -> Breakdown:
    """The reconciliation rows for ``s`` (pure; see :class:`Breakdown`)."""
    notes = list(s.notes)
    if s.platform == "cpu":
        cpu_rows = (
            BreakdownRow("process resident memory (RSS)", s.process_used),
            BreakdownRow(
                "live tensor storages (cpu_tracking)",
                s.allocated,
                "" if s.allocated is not None else "turn on torchmem.cpu_tracking() to count",
            ),
        )
        return Breakdown(
            s.device,
            s.platform,
            s.process_used,
            cpu_rows,
            s.device_used,
            s.device_total,
            None,
            None,
            tuple(notes),
        )

    split_row = BreakdownRow(
        "of which split (fragmented)",
        s.fragmented,
        "" if s.fragmentation is None else f"{s.fragmentation:.0%} of the cache",
    )
    torch_parts = [
        BreakdownRow("allocated (live tensors, workspaces)", s.allocated),
        BreakdownRow("cached free blocks", s.cached, "", (split_row,)),
    ]
    if s.private_pools:
        torch_parts.append(
            BreakdownRow(
                "of which in private pools",
                s.private_pools,
                "CUDA graphs (torch.compile reduce-overhead, torch.cuda.graph): live_tensors() names them; "
                "torch.compiler.reset() frees torch.compile's",
            )
        )
    torch_row = BreakdownRow("PyTorch reserved", s.reserved, "caching allocator segments", tuple(torch_parts))
    rows: list[BreakdownRow] = [
        BreakdownRow("CUDA context (estimate)", s.context, _CONTEXT_NOTES.get(s.context_method or "", "")),
        torch_row,
    ]
    for lib, n in sorted(s.other_allocators.items()):
        rows.append(BreakdownRow(f"{lib} memory pool", n, "other allocator in this process"))
    rest = (
        s.unexplained
        if s.context is not None
        else _sub(s.process_used, s.reserved, sum(s.other_allocators.values()))
    )
    rest_note = "library handles and lazily loaded kernels (cuBLAS, cuDNN), NCCL buffers, raw cudaMalloc"
    if s.nccl_buffers and rest is not None and rest > 0:
        share = min(s.nccl_buffers, rest)
        comms = f"{s.nccl_communicators or '?'} communicator(s)"
        if s.nccl_method == "measured":
            rest_note = (
                f"of which NCCL ~{fmt_bytes(share)} ({comms}; measured through NVML around the calls that "
                "created them); " + rest_note
            )
        elif s.nccl_method == "growth":
            rest_note = (
                f"of which NCCL at most ~{fmt_bytes(share)} ({comms}; the growth outside the allocator since "
                "the first process group, kernels loaded since included); " + rest_note
            )
        else:
            rest_note = (
                f"of which NCCL buffers ~{fmt_bytes(share)} ({comms}, estimated from NCCL_BUFFSIZE and the "
                "channel count: a lower bound); " + rest_note
            )
    if rest is not None and rest < 0:
        # No figure is ever negative: the rows above add up to more than this process's usage.
        rest_note = (
            f"the readings disagree by {fmt_bytes(-rest)}: the rows above add up to more than this process's "
            "usage (read at different moments, or the context estimate is too high)"
        )
        rest = 0
    rows.append(
        BreakdownRow("unexplained" if s.context is not None else "context + unexplained", rest, rest_note)
    )
    others = s.other_processes_used
    notes += _process_notes(s.other_processes or ())
    unattributed = _sub(s.device_used, s.process_used, others)
    if unattributed is not None and unattributed < 0:
        notes.append(
            f"The device's usage is {fmt_bytes(-unattributed)} below this process's plus the other "
            "processes' (NVML and the process readings were taken at different moments): nothing is left "
            "unattributed."
        )
        unattributed = 0
    if s.process_used is None:
        notes.append("This process's usage is n/a, so the rows above cannot be reconciled.")
    return Breakdown(
        device=s.device,
        platform=s.platform,
        process_used=s.process_used,
        process=tuple(rows),
        device_used=s.device_used,
        device_total=s.device_total,
        other_processes=s.other_processes,
        unattributed=unattributed,
        notes=tuple(notes),
        host_rss=s.host_rss,
        pinned_host=s.pinned_host,
        pinned_host_active=s.pinned_host_active,
    )


# -- plain text ----------------------------------------------------------------------------------------


def stats_rows(s: MemoryStats) -> list[tuple[str, str]]:
    """(label, value) pairs of a stats reading, in reading order; shared by text and terminal output."""
    if s.platform == "cpu":
        return [
            ("tensor storages (cpu_tracking)", fmt_bytes(s.allocated)),
            ("peak (cpu_tracking)", fmt_bytes(s.peak_allocated)),
            ("machine memory", fmt_bytes(s.device_total)),
            ("machine available", fmt_bytes(s.device_free)),
            ("this process (RSS)", fmt_bytes(s.process_used)),
            *([("limit (torchmem.limit)", fmt_bytes(s.limit))] if s.limit is not None else []),
        ]
    rows: list[tuple[str, str]] = [
        ("allocated", fmt_bytes(s.allocated)),
        ("reserved", fmt_bytes(s.reserved)),
        ("active", fmt_bytes(s.active)),
        ("cached free", fmt_bytes(s.cached)),
        ("fragmented (split free)", f"{fmt_bytes(s.fragmented)} ({fmt_ratio(s.fragmentation)} of cache)"),
        ("peak allocated", fmt_bytes(s.peak_allocated)),
        ("peak reserved", fmt_bytes(s.peak_reserved)),
        ("OOMs / alloc retries", f"{_n(s.num_ooms)} / {_n(s.alloc_retries)}"),
        ("device total", fmt_bytes(s.device_total)),
        ("device free", fmt_bytes(s.device_free)),
        ("this process", fmt_bytes(s.process_used)),
    ]
    rows += [
        ("CUDA context (est.)", fmt_bytes(s.context)),
        ("outside PyTorch", fmt_bytes(s.non_torch)),
        ("other processes", fmt_bytes(s.other_processes_used)),
        ("pinned host memory", _pinned(s.pinned_host, s.pinned_host_active)),
        ("host memory (RSS)", fmt_bytes(s.host_rss)),
        ("limit (per process)", "none" if s.limit is None else fmt_bytes(s.limit)),
    ]
    return rows


def _process_notes(procs: tuple[ProcessMemory, ...]) -> list[str]:
    """What to do about this process's children and about orphans on the device."""
    out = []
    kids = [p for p in procs if p.relation in ("child", "descendant")]
    if kids:
        used = sum(p.used or 0 for p in kids)
        pids = ", ".join(str(p.pid) for p in kids[:6])
        out.append(
            f"{len(kids)} process{'es' if len(kids) > 1 else ''} started by this one ({pids}) hold "
            f"{fmt_bytes(used)} on this device, each a CUDA context of its own: a DataLoader worker touched "
            "CUDA (a CUDA tensor in the Dataset, `.cuda()` in `__getitem__`/`collate_fn`). Build batches on "
            "the CPU in workers and move them to the GPU in the main process (`pin_memory=True` + "
            "`.to(device, non_blocking=True)`)."
        )
    for p in procs:
        if p.relation == "orphan":
            out.append(
                f"Process {p.pid} ({p.name or '?'}) holds {fmt_bytes(p.used)} on this device and its parent "
                f"exited: a leftover worker of a trainer that died? `kill {p.pid}` frees it."
            )
    return out


def _pinned(held: int | None, active: int | None) -> str:
    """``"64.00 MiB (in use 16.00 MiB, cached 48.00 MiB)"``."""
    if held is None or active is None or held == 0:
        return fmt_bytes(held)
    return f"{fmt_bytes(held)} (in use {fmt_bytes(active)}, cached {fmt_bytes(max(held - active, 0))})"


def _n(v: int | None) -> str:
    return "n/a" if v is None else str(v)


def render_stats(s: MemoryStats) -> str:
    title = f"{s.device}" + (f" ({s.name})" if s.name else "")
    width = max(len(k) for k, _ in stats_rows(s))
    lines = [title] + [f"  {k:<{width}}  {v}" for k, v in stats_rows(s)]
    lines += [f"  note: {n}" for n in s.notes]
    return "\n".join(lines)


def _row_lines(row: BreakdownRow, depth: int, width: int) -> list[str]:
    pad = "  " * depth
    label = f"{pad}{row.label}"
    text = f"  {label:<{width}}  {fmt_bytes(row.bytes):>12}"
    if row.note:
        text += f"  {row.note}"
    out = [text]
    for c in row.children:
        out += _row_lines(c, depth + 1, width)
    return out


def render_breakdown(b: Breakdown) -> str:
    width = 44
    lines = [f"{b.device}: where this process's memory goes"]
    for r in b.process:
        lines += _row_lines(r, 0, width)
    if b.platform == "cpu":
        lines.append(f"  {'machine memory used (all processes)':<{width}}  {fmt_bytes(b.device_used):>12}")
        lines.append(f"  {'  of machine total':<{width}}  {fmt_bytes(b.device_total):>12}")
        lines += [f"  note: {n}" for n in b.notes]
        return "\n".join(lines)
    lines.append(f"  {'= this process (nvidia-smi process row)':<{width}}  {fmt_bytes(b.process_used):>12}")
    if b.other_processes is not None:
        for p in b.other_processes:
            label = f"+ other process {p.pid}" + (f" ({p.name})" if p.name else "")
            role = f"  {p.role}" if p.role else ""
            lines.append(f"  {label:<{width}}  {fmt_bytes(p.used):>12}{role}")
    lines.append(f"  {'+ not attributed to any process':<{width}}  {fmt_bytes(b.unattributed):>12}")
    lines.append(f"  {'= device used (nvidia-smi Memory-Usage)':<{width}}  {fmt_bytes(b.device_used):>12}")
    lines.append(f"  {'  of device total':<{width}}  {fmt_bytes(b.device_total):>12}")
    lines += _host_lines(b, width)
    lines += [f"  note: {n}" for n in b.notes]
    return "\n".join(lines)


def _host_lines(b: Breakdown, width: int) -> list[str]:
    """The host side: the process's resident memory, and the page-locked part torch's host allocator holds
    (``pin_memory()``, DataLoader ``pin_memory=True``), in use and cached."""
    if b.host_rss is None and not b.pinned_host:
        return []
    out = [f"  {'host: this process resident (RSS)':<{width}}  {fmt_bytes(b.host_rss):>12}"]
    if b.pinned_host:
        out.append(f"  {'  of which pinned (CUDA host allocator)':<{width}}  {fmt_bytes(b.pinned_host):>12}")
        if b.pinned_host_active is not None:
            cached = max(b.pinned_host - b.pinned_host_active, 0)
            out.append(f"  {'    in use':<{width}}  {fmt_bytes(b.pinned_host_active):>12}")
            out.append(
                f"  {'    cached for reuse':<{width}}  {fmt_bytes(cached):>12}"
                + ("  torch.cuda.host_empty_cache() returns it (torch >= 2.5)" if cached else "")
            )
    return out


__all__ = [
    "Breakdown",
    "BreakdownRow",
    "MemoryStats",
    "ProcessMemory",
    "build_breakdown",
    "render_breakdown",
    "render_stats",
    "stats_rows",
]
