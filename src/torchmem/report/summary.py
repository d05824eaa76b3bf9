"""The terminal summary of a capture file (``torchmem report CAPTURE``, and ``str(capture)``).

Also the small views of a capture that every renderer shares (final leak verdict, module table, run
facts), so the summary, the HTML report and the plot agree.
"""

from __future__ import annotations

import datetime as _dt
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

from torchmem._format import fmt_bytes
from torchmem.report._rebuild import breakdown_of, diagnosis_of, leak_report_of

if TYPE_CHECKING:
    from torchmem.analysis.leaks import LeakReport
    from torchmem.capture.file import Capture, StatsRecord

MODULE_COLUMNS = (
    ("params", "params"),
    ("grads", "grads"),
    ("optimizer_state", "optimizer state"),
    ("activations", "activations"),
    ("forward_peak", "forward peak"),
    ("backward_peak", "backward peak"),
)


@dataclass(frozen=True)
class RunFacts:
    """What a reader wants first: what ran, where, how long, how it ended."""

    program: str
    device: str
    source: str
    started: str
    seconds: float | None
    steps: int | None
    ended: str
    finished: bool
    versions: str


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def run_facts(cap: Capture) -> RunFacts:
    h = cap.header
    argv = h.get("argv") or []
    program = " ".join(str(a) for a in argv) if isinstance(argv, list) and argv else "(unknown)"
    device = str(h.get("device") or "?")
    if h.get("device_name"):
        device += f" ({h['device_name']})"
    started = "n/a"
    if isinstance(h.get("started"), (int, float)):
        started = _dt.datetime.fromtimestamp(float(h["started"])).strftime("%Y-%m-%d %H:%M:%S")
    if cap.end is None:
        ended = "not finished: no end record (the run was killed, or is still running)"
    else:
        code = "n/a" if cap.end.exit_code is None else str(cap.end.exit_code)
        ended = f"{cap.end.reason.replace('_', ' ')} (exit code {code})"
    versions = ", ".join(f"{k} {h[k]}" for k in ("torchmem", "torch", "python") if h.get(k) is not None)
    return RunFacts(
        program=program,
        device=device,
        source=str(h.get("source") or "?"),
        started=started,
        seconds=cap.duration,
        steps=cap.step_count,
        ended=ended,
        finished=cap.finished,
        versions=versions,
    )


def final_leak(cap: Capture) -> LeakReport | None:
    """The last leak verdict the run recorded (``None``: none recorded, or not readable)."""
    for rec in reversed(cap.leaks):
        r = leak_report_of(rec.report)
        if r is not None:
            return r
    return None


def stats_record(cap: Capture, when: str = "end") -> StatsRecord | None:
    """The stats record taken at ``when`` (``"end"`` falls back to the latest one)."""
    for rec in reversed(cap.stats):
        if rec.when == when:
            return rec
    return cap.stats[-1] if cap.stats else None


def module_rows(cap: Capture) -> tuple[list[Mapping[str, Any]], tuple[str, ...]]:
    """The last per-module profile's rows (file order) and notes."""
    if not cap.modules:
        return [], ()
    rec = cap.modules[-1]
    return list(rec.rows), rec.notes


def row_total(row: Mapping[str, Any]) -> int:
    """Bytes a module holds between steps: params + grads + optimizer state + activations."""
    return sum(_int(row.get(k)) or 0 for k in ("params", "grads", "optimizer_state", "activations"))


def step_time(cap: Capture, step: int | None) -> float | None:
    """The time of the step marker ``step`` (or of the first sample at that step)."""
    if step is None:
        return None
    for s in cap.steps:
        if s.step == step:
            return s.t
    for smp in cap.samples:
        if smp.step is not None and smp.step >= step:
            return smp.t
    return None


def fmt_seconds(s: float | None) -> str:
    if s is None:
        return "n/a"
    if s < 120:
        return f"{s:.2f} s"
    m, sec = divmod(round(s), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m{sec:02d}s" if h else f"{m}m{sec:02d}s"


def _table(rows: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for r in rows:
        cells = [c.rjust(widths[i]) if i in right else c.ljust(widths[i]) for i, c in enumerate(r)]
        out.append("  " + "  ".join(cells).rstrip())
    return out


def render_summary(cap: Capture, *, max_modules: int = 10) -> str:
    """The terminal summary: run facts, peaks, reconciliation, leak verdict, OOM, module table, warnings."""
    f = run_facts(cap)
    lines = [f"torchmem capture {os.path.basename(cap.path)}"]
    if cap.truncated:
        lines.append(f"WARNING: {cap.truncated}; what follows is what was recorded before that.")
    lines += [
        f"  program   {f.program}",
        f"  device    {f.device}, figures from the {f.source}",
        f"  started   {f.started}, ran {fmt_seconds(f.seconds)}, {f.steps if f.steps is not None else 'n/a'} "
        "steps",
        f"  ended     {f.ended}",
        f"  recorded  {len(cap.samples)} samples, {len(cap.steps)} step markers ({f.versions})",
    ]
    lines.append(
        f"  peak      allocated {fmt_bytes(cap.peak_allocated)}, reserved {fmt_bytes(cap.peak_reserved)}"
    )
    known = [s for s in cap.samples if s.allocated is not None]
    if known:
        lines.append(
            f"  timeline  allocated {fmt_bytes(known[0].allocated)} at {known[0].t:.2f} s -> "
            f"{fmt_bytes(known[-1].allocated)} at {known[-1].t:.2f} s"
        )

    rec = stats_record(cap, "end")
    bd = breakdown_of(rec.breakdown) if rec is not None else None
    if bd is not None and rec is not None:
        lines.append("")
        lines.append(f"Reconciliation at the {rec.when} of the run:")
        lines += ["  " + x for x in str(bd).splitlines()]

    lines.append("")
    leak = final_leak(cap)
    if leak is not None:
        lines += str(leak).splitlines()
    elif cap.leaks:
        lines.append("Leak verdict: recorded, but not in a form this torchmem reads (see --json).")
    else:
        lines.append("Leak verdict: none recorded.")

    for o in cap.ooms:
        lines.append("")
        d = diagnosis_of(o.diagnosis)
        at = f" at step {o.step}" if o.step is not None else ""
        lines.append(f"OOM{at} ({o.t:.2f} s into the run):")
        if d is not None:
            lines += ["  " + x for x in str(d).splitlines()]
        else:
            lines.append("  diagnosis recorded, but not in a form this torchmem reads (see --json).")

    rows, notes = module_rows(cap)
    if rows:
        lines.append("")
        top = sorted(rows, key=row_total, reverse=True)[:max_modules]
        head = ["module"] + [label for _, label in MODULE_COLUMNS]
        table = [head] + [
            [str(r.get("module", "?"))] + [fmt_bytes(_int(r.get(k))) for k, _ in MODULE_COLUMNS] for r in top
        ]
        more = f", top {len(top)} of {len(rows)} by held bytes" if len(rows) > len(top) else ""
        lines.append(f"Per-module memory{more}:")
        lines += _table(table, set(range(1, len(head))))
        lines += [f"  note: {n}" for n in notes]

    if cap.notes:
        lines.append("")
        lines += [f"note ({n.t:.2f} s): {n.text}" for n in cap.notes]
    if cap.unknown:
        kinds = sorted({str(u.get("type")) for u in cap.unknown})
        lines.append(f"note: {len(cap.unknown)} record(s) of types this torchmem does not know: {kinds}")
    if cap.truncated:
        lines.append("")
        lines.append(f"WARNING: {cap.truncated}.")
    return "\n".join(lines)


def write_summary(cap: Capture, file: IO[str]) -> None:
    """Write :func:`render_summary` and a newline to ``file``."""
    file.write(render_summary(cap))
    file.write("\n")


__all__ = [
    "RunFacts",
    "final_leak",
    "fmt_seconds",
    "module_rows",
    "render_summary",
    "row_total",
    "run_facts",
    "stats_record",
    "step_time",
    "write_summary",
]
