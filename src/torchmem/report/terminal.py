"""Terminal rendering with rich: tables that fit a console, written to any file-like object."""

from __future__ import annotations

from collections.abc import Sequence
from typing import IO

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from torchmem._format import fmt_bytes
from torchmem.results.stats import BreakdownRow, MemoryStats, stats_rows


def console_for(file: IO[str] | None = None, width: int | None = None) -> Console:
    return Console(file=file, width=width, highlight=False, soft_wrap=False)


def _breakdown_table(s: MemoryStats) -> Table:
    b = s.breakdown()
    t = Table(title=f"{s.device}: reconciliation", title_justify="left", show_header=True, expand=False)
    t.add_column("where", no_wrap=True)
    t.add_column("bytes", justify="right", no_wrap=True)
    t.add_column("note", overflow="fold")

    def add(row: BreakdownRow, depth: int) -> None:
        t.add_row("  " * depth + row.label, fmt_bytes(row.bytes), row.note)
        for c in row.children:
            add(c, depth + 1)

    for r in b.process:
        add(r, 0)
    t.add_row(Text("= this process", style="bold"), Text(fmt_bytes(b.process_used), style="bold"), "")
    if s.platform != "cpu":
        for p in b.other_processes or ():
            t.add_row(f"+ process {p.pid} {p.name or ''}".rstrip(), fmt_bytes(p.used), "other process")
        t.add_row(
            "+ not attributed to a process", fmt_bytes(b.unattributed), "driver reservations, hidden PIDs"
        )
    t.add_row(
        Text("= device used", style="bold"),
        Text(fmt_bytes(b.device_used), style="bold"),
        f"of {fmt_bytes(b.device_total)}",
    )
    return t


def stats_renderable(readings: Sequence[MemoryStats], breakdown: bool = True) -> RenderableType:
    parts: list[RenderableType] = []
    for s in readings:
        title = s.device + (f" — {s.name}" if s.name else "")
        t = Table(title=title, title_justify="left", show_header=False, expand=False)
        t.add_column("figure", no_wrap=True)
        t.add_column("value", justify="right", no_wrap=True)
        for k, v in stats_rows(s):
            t.add_row(k, v)
        parts.append(t)
        if breakdown:
            parts.append(_breakdown_table(s))
        for n in s.notes:
            parts.append(Text(f"note: {n}", style="yellow"))
    return Group(*parts)


def render_stats(readings: Sequence[MemoryStats], file: IO[str], width: int | None = None) -> None:
    console_for(file, width).print(stats_renderable(readings))


__all__ = ["console_for", "fmt_bytes", "render_stats", "stats_renderable"]
