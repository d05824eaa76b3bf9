"""Plain-text rendering of torchmem's report objects (what ``str()`` gives)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchmem._format import fmt_bytes, fmt_ratio

if TYPE_CHECKING:
    from torchmem.actions.release import ReleaseReport
    from torchmem.analysis.live import LiveTensorReport
    from torchmem.analysis.stats import Breakdown, BreakdownRow, MemoryStats
    from torchmem.capture.track import TrackResult


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
        ("pinned host memory", fmt_bytes(s.pinned_host)),
        ("limit (per process)", "none" if s.limit is None else fmt_bytes(s.limit)),
    ]
    return rows


def _n(v: int | None) -> str:
    return "n/a" if v is None else str(v)


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and the noun agreeing with it: ``count(1, "tensor")`` is ``"1 tensor"``, 2 gives ``"2 tensors"``.

    Example:
        >>> count(1, "storage"), count(3, "storage"), count(0, "live tensor storage")
        ('1 storage', '3 storages', '0 live tensor storages')
    """
    return f"{n} {noun if n == 1 else (plural or noun + 's')}"


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
            lines.append(f"  {label:<{width}}  {fmt_bytes(p.used):>12}")
    lines.append(f"  {'+ not attributed to any process':<{width}}  {fmt_bytes(b.unattributed):>12}")
    lines.append(f"  {'= device used (nvidia-smi Memory-Usage)':<{width}}  {fmt_bytes(b.device_used):>12}")
    lines.append(f"  {'  of device total':<{width}}  {fmt_bytes(b.device_total):>12}")
    lines += [f"  note: {n}" for n in b.notes]
    return "\n".join(lines)


def render_track(r: TrackResult) -> str:
    parts = [
        f"{r.device}: delta {fmt_bytes(r.delta, signed=True)}",
        f"peak {fmt_bytes(r.peak)} ({fmt_bytes(r.peak_delta, signed=True)} over start)",
    ]
    if r.survived is not None:
        n = r.survived_tensors
        parts.append(f"survived {fmt_bytes(r.survived)}" + ("" if n is None else f" in {count(n, 'tensor')}"))
    parts.append(f"{r.seconds * 1000:.1f} ms")
    return ", ".join(parts)


def render_release(r: ReleaseReport) -> str:
    lines = [
        f"released {count(r.released_tensors, 'tensor')}: freed {fmt_bytes(r.freed_bytes)} of tensor storage"
        + (f", moved {fmt_bytes(r.offloaded_bytes)}" if r.offloaded_bytes else "")
        + f" in {r.seconds * 1000:.0f} ms"
    ]
    for d in r.devices:
        lines.append(
            f"  {d.device}: allocated {fmt_bytes(d.allocated_before)} -> {fmt_bytes(d.allocated_after)}, "
            f"reserved {fmt_bytes(d.reserved_before)} -> {fmt_bytes(d.reserved_after)}, "
            f"process {fmt_bytes(d.process_before)} -> {fmt_bytes(d.process_after)}"
        )
    for a in r.actions:
        lines.append(f"  done: {a}")
    if r.remaining:
        lines.append(f"  still alive: {fmt_bytes(r.remaining_bytes)} in {count(len(r.remaining), 'storage')}")
        for rem in r.remaining:
            lines.append(f"    {rem.name} ({fmt_bytes(rem.bytes)} on {rem.device}): {rem.reason}")
            for p in rem.paths:
                lines.append(f"      held by {p}")
            if not rem.paths:
                lines.append("      held by no path torchmem can name (C++ code, or a limit was hit)")
    for s in r.skipped:
        lines.append(f"  skipped: {s}")
    for e in r.errors:
        lines.append(f"  error: {e}")
    return "\n".join(lines)


def render_live(r: LiveTensorReport, top: int = 20) -> str:
    lines = [f"{r.device}: {count(len(r.tensors), 'live tensor storage')}, {fmt_bytes(r.total)}"]
    for cat, n in r.by_category.items():
        lines.append(f"  {cat:<20} {fmt_bytes(n):>12}")
    if r.allocated is not None:
        lines.append(f"  {'allocator allocated':<20} {fmt_bytes(r.allocated):>12}")
        extra = f" (of which block rounding {fmt_bytes(r.rounding)})" if r.rounding else ""
        lines.append(f"  {'not a live tensor':<20} {fmt_bytes(r.unexplained):>12}{extra}")
    for m, n in sorted(r.by_module.items(), key=lambda kv: -kv[1]):
        lines.append(f"  module {m}: {fmt_bytes(n)}")
    for t in r.tensors[:top]:
        shape = "x".join(str(d) for d in t.shape) or "scalar"
        who = t.name or t.holder or "?"
        lines.append(f"  {fmt_bytes(t.bytes):>12}  {t.category:<18} {shape:<16} {t.dtype:<9} {who}")
        if t.name and t.holder:
            lines.append(f"  {'':>12}  held by {t.holder}")
    if len(r.tensors) > top:
        lines.append(f"  ... {len(r.tensors) - top} more")
    if r.truncated:
        lines.append("  note: the holder search hit its limit; some holders are missing")
    return "\n".join(lines)
