"""A capture file's contents: its records, :class:`Capture`, the views every renderer shares, and the
terminal summary (``str(capture)``, ``torchmem report CAPTURE``).

The capture is the contract between recording (``torchmem run``) and reporting: the writer and reader live in
:mod:`torchmem.capture.file`; the record types (:mod:`torchmem.results.capture_records`, re-exported here)
keep each stored result as the dict its ``to_dict()`` wrote, and turn it back into the result type with
``from_dict()`` on demand (``as_stats()``, ``as_report()``, ``as_diagnosis()``), so a record written by
another torchmem version is kept even when it cannot be read.

:data:`RECORDS` is the one table of record kinds: each kind's ``"type"``, its record type (``to_dict()`` /
``from_dict()``) and its :class:`Capture` attribute, which is also its key in ``torchmem report --json``.
"""

from __future__ import annotations

import datetime as _dt
import os
import types
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any

from torchmem._format import fmt_bytes, text_table
from torchmem.results.capture_records import (
    MODULE_COLUMNS,
    BoundaryRecord,
    DeviceRecord,
    End,
    ForecastRecord,
    GpusRecord,
    HostLeakRecord,
    LeakRecord,
    ModulesRecord,
    Note,
    OOMRecord,
    OverheadRecord,
    RankRecord,
    RankStateRecord,
    Sample,
    StatsRecord,
    StepMark,
    SurvivorsRecord,
    _float,
    _int,
    _Record,
)
from torchmem.results.gpus import GpusReport

if TYPE_CHECKING:
    from torchmem.results.leaks import LeakReport

FORMAT = "torchmem-capture"
"""The value of the header's ``"format"`` field."""

VERSION = 1
"""The capture version this torchmem writes and the newest it reads."""

END_REASONS = ("exit", "exception", "keyboard_interrupt", "oom", "signal")


def _max(vals: Sequence[int | None]) -> int | None:
    known = [v for v in vals if v is not None]
    return max(known) if known else None


def _int_or_none(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


@dataclass(frozen=True)
class RecordKind:
    """One kind of capture record: its ``"type"`` in the file, the type it reads as, and where it goes.

    Attributes:
        kind: The record's ``"type"`` on its line.
        type: The record type (``to_dict()`` is the line without its ``"type"``, ``from_dict()`` reads it).
        group: The :class:`Capture` attribute holding these records, also their key in ``Capture.to_dict()``
            (``torchmem report --json``).
        many: The capture keeps every such record, in file order (``False``: only the last, ``end``).
    """

    kind: str
    type: type[_Record]
    group: str
    many: bool = True


RECORDS: Mapping[str, RecordKind] = types.MappingProxyType(
    {
        r.kind: r
        for r in (
            RecordKind("sample", Sample, "samples"),
            RecordKind("step", StepMark, "steps"),
            RecordKind("stats", StatsRecord, "stats"),
            RecordKind("leak", LeakRecord, "leaks"),
            RecordKind("oom", OOMRecord, "ooms"),
            RecordKind("modules", ModulesRecord, "modules"),
            RecordKind("note", Note, "notes"),
            RecordKind("boundary", BoundaryRecord, "boundaries"),
            RecordKind("host_leak", HostLeakRecord, "host_leaks"),
            RecordKind("survivors", SurvivorsRecord, "survivors"),
            RecordKind("overhead", OverheadRecord, "overheads"),
            RecordKind("rank", RankRecord, "ranks"),
            RecordKind("rank_state", RankStateRecord, "rank_states"),
            RecordKind("device", DeviceRecord, "devices"),
            RecordKind("gpus", GpusRecord, "gpus"),
            RecordKind("forecast", ForecastRecord, "forecasts"),
            RecordKind("end", End, "end", many=False),
        )
    }
)
"""The capture's record kinds, the one table: ``"type"`` -> :class:`RecordKind`. The writer
(:class:`~torchmem.capture.file.CaptureWriter`) writes only these kinds, the reader reads every line through
it (``RECORDS[type].type.from_dict(line)``), :class:`Capture` has one attribute per kind and
``Capture.to_dict()`` (``torchmem report --json``) one key per kind; ``tests/test_architecture.py`` checks
that they agree. Within version 1 a reader keeps the lines of kinds it does not know in ``Capture.unknown``
(later additions: ``boundary``, ``host_leak``, ``survivors`` and ``overhead`` came with torchmem 0.1's
zero-config runs; ``rank`` and ``rank_state`` with distributed runs; ``device`` (the run began watching the
GPU the program works on) and ``gpus`` (every GPU the process used) with multi-GPU runs; ``forecast`` (when
the memory runs out at the leak's rate) with the leak's forecast)."""

RECORD_TYPES: tuple[str, ...] = tuple(RECORDS)
"""The record kinds of version 1, in the table's order (the keys of :data:`RECORDS`)."""

_KIND_OF: Mapping[type, RecordKind] = types.MappingProxyType({r.type: r for r in RECORDS.values()})


@dataclass(frozen=True)
class Capture:
    """Everything readable in a capture file: one attribute per record kind of :data:`RECORDS` (its
    ``group``), and the file's own facts.

    Attributes:
        path: The file read.
        header: Line 1 as written (format, version, torchmem, torch, python, device, device_name, argv, pid,
            started, source, and any extra fields).
        samples: The timeline, in file order.
        steps: Step markers.
        stats: Full stats readings (``when`` is ``"start"`` or ``"end"``).
        leaks: Leak verdicts, in file order (the last is the final one).
        ooms: OOM diagnoses.
        modules: Per-module profiles (usually one).
        notes: Notes.
        boundaries: What a step was (the last is the final choice).
        host_leaks: Host-memory verdicts (the last is the final one).
        survivors: What the loop allocated and is still alive at the end.
        overheads: What torchmem's own work added to the run (one, at the end).
        ranks: The process group as this rank saw it (distributed runs).
        rank_states: This process's state when a rank of its job ran out of memory.
        devices: When the run began watching the GPU the program works on (at most one, in its first steps).
        gpus: Every GPU the process used, and what their figures show (one, at the end).
        forecasts: When the memory runs out at the leak's rate (the last is the final one).
        end: How the run ended; ``None`` when the file has no end record (the run was killed).
        truncated: ``None``, or where the readable part stops and why.
        unknown: Records of types this torchmem does not know (kept as written, otherwise ignored).
        lines: Lines read, header included.
    """

    path: str
    header: Mapping[str, Any]
    samples: tuple[Sample, ...] = ()
    steps: tuple[StepMark, ...] = ()
    stats: tuple[StatsRecord, ...] = ()
    leaks: tuple[LeakRecord, ...] = ()
    ooms: tuple[OOMRecord, ...] = ()
    modules: tuple[ModulesRecord, ...] = ()
    notes: tuple[Note, ...] = ()
    boundaries: tuple[BoundaryRecord, ...] = ()
    host_leaks: tuple[HostLeakRecord, ...] = ()
    survivors: tuple[SurvivorsRecord, ...] = ()
    overheads: tuple[OverheadRecord, ...] = ()
    end: End | None = None
    ranks: tuple[RankRecord, ...] = ()
    rank_states: tuple[RankStateRecord, ...] = ()
    devices: tuple[DeviceRecord, ...] = ()
    gpus: tuple[GpusRecord, ...] = ()
    forecasts: tuple[ForecastRecord, ...] = ()
    truncated: str | None = None
    unknown: tuple[Mapping[str, Any], ...] = field(default=())
    lines: int = 0

    @property
    def version(self) -> int:
        return int(self.header.get("version", VERSION))

    @property
    def device(self) -> str | None:
        """The device the timeline and verdicts are of: the last ``device`` record's (the GPU the program
        was found working on), else the header's."""
        if self.devices:
            return self.devices[-1].device
        d = self.header.get("device")
        return None if d is None else str(d)

    @property
    def device_name(self) -> str | None:
        if self.devices and self.devices[-1].name:
            return self.devices[-1].name
        n = self.header.get("device_name")
        return None if n is None else str(n)

    @property
    def gpus_report(self) -> GpusReport | None:
        """The last ``gpus`` record's report, ``None`` when there is none or it cannot be read."""
        return self.gpus[-1].as_report() if self.gpus else None

    @property
    def source(self) -> str | None:
        s = self.header.get("source")
        return None if s is None else str(s)

    @property
    def rank(self) -> Mapping[str, Any] | None:
        """The header's ``rank`` field (launcher, rank, local_rank, world_size, host, job), if any."""
        r = self.header.get("rank")
        return r if isinstance(r, Mapping) else None

    @property
    def started(self) -> float | None:
        """The wall-clock time the run started (seconds since the epoch), from the header."""
        return _float(self.header.get("started"))

    @property
    def finished(self) -> bool:
        """The run wrote its end record (it was not killed)."""
        return self.end is not None

    @property
    def duration(self) -> float | None:
        """Seconds the run lasted: the end record's figure, else the last record's time."""
        if self.end is not None and self.end.seconds is not None:
            return self.end.seconds
        times = [r.t for group in self._groups() for r in group]
        if self.end is not None:
            times.append(self.end.t)
        return max(times) if times else None

    @property
    def step_count(self) -> int | None:
        """Steps the run made: the end record's figure, else the highest step marker."""
        if self.end is not None and self.end.steps is not None:
            return self.end.steps
        if self.steps:
            return max(s.step for s in self.steps)
        known = [s.step for s in self.samples if s.step is not None]
        return max(known) if known else None

    @property
    def peak_allocated(self) -> int | None:
        """The highest allocated figure any sample, step marker or stats record shows."""
        return _max(
            [s.allocated for s in self.steps]
            + [s.allocated for s in self.samples]
            + [s.peak_allocated for s in self.samples]
            + [_int(r.stats.get("peak_allocated")) for r in self.stats]
            + [_int(r.stats.get("allocated")) for r in self.stats]
        )

    @property
    def peak_reserved(self) -> int | None:
        """The highest reserved figure any sample or stats record shows."""
        return _max(
            [s.reserved for s in self.samples]
            + [s.peak_reserved for s in self.samples]
            + [_int(r.stats.get("peak_reserved")) for r in self.stats]
            + [_int(r.stats.get("reserved")) for r in self.stats]
        )

    def _groups(self) -> list[Sequence[Any]]:
        return [getattr(self, r.group) for r in RECORDS.values() if r.many]

    def records(self, kind: str) -> tuple[Any, ...]:
        """The records of ``kind`` (a key of :data:`RECORDS`), in file order (``end``: none or one)."""
        r = RECORDS[kind]
        got = getattr(self, r.group)
        return tuple(got) if r.many else (() if got is None else (got,))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (``torchmem report --json``): ``path``, ``header``, ``summary``, then one key per
        record kind of :data:`RECORDS` (its ``group``: a list of the records' ``to_dict()``, ``end`` one or
        ``null``), ``truncated``, ``unknown`` and ``lines``. Every kind's key is there, empty or not."""
        out: dict[str, Any] = {
            "path": self.path,
            "header": dict(self.header),
            "summary": {
                "finished": self.finished,
                "seconds": self.duration,
                "steps": self.step_count,
                "peak_allocated": self.peak_allocated,
                "peak_reserved": self.peak_reserved,
            },
        }
        for r in RECORDS.values():
            got = getattr(self, r.group)
            if r.many:
                out[r.group] = [x.to_dict() for x in got]
            else:
                out[r.group] = None if got is None else got.to_dict()
        out["truncated"] = self.truncated
        out["unknown"] = [dict(u) for u in self.unknown]
        out["lines"] = self.lines
        return out

    def __str__(self) -> str:
        return render_summary(self)

    @classmethod
    def from_records(
        cls,
        path: str,
        header: Mapping[str, Any],
        records: Iterable[Any],
        *,
        unknown: Iterable[Mapping[str, Any]] = (),
        truncated: str | None = None,
        lines: int = 0,
    ) -> Capture:
        """A capture from records in file order (instances of the types in :data:`RECORDS`), each put in
        its kind's group (of ``end``, the last one is kept).

        Raises:
            TypeError: a record of a type that is not in :data:`RECORDS`.
        """
        groups: dict[str, list[Any]] = {r.group: [] for r in RECORDS.values()}
        for rec in records:
            kind = _KIND_OF.get(type(rec))
            if kind is None:
                raise TypeError(f"{type(rec).__name__} is not a capture record type (see RECORDS)")
            groups[kind.group].append(rec)
        fields: dict[str, Any] = {}
        for r in RECORDS.values():
            got = groups[r.group]
            fields[r.group] = tuple(got) if r.many else (got[-1] if got else None)
        return cls(
            path=path,
            header=header,
            truncated=truncated,
            unknown=tuple(unknown),
            lines=lines,
            **fields,
        )

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Capture:
        """A capture from its :meth:`to_dict` (``summary`` is derived, not read).

        Raises:
            ResultFormatError: a record in it cannot be read.
        """
        fields: dict[str, Any] = {}
        for r in RECORDS.values():
            got = d.get(r.group)
            if r.many:
                fields[r.group] = tuple(r.type.from_dict(x) for x in got or ())
            else:
                fields[r.group] = None if got is None else r.type.from_dict(got)
        return cls(
            path=str(d.get("path") or ""),
            header=dict(d.get("header") or {}),
            truncated=d.get("truncated"),
            unknown=tuple(dict(u) for u in d.get("unknown") or ()),
            lines=int(d.get("lines") or 0),
            **fields,
        )


# ---------------------------------------------------------------------------------------------------------
# views shared by the summary, the HTML page and the plot

MODULE_LABELS = (
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


_SOURCE_WORDS = {
    "allocator": "the caching allocator",
    "heap": "the C heap in use (glibc mallinfo2: tensors, autograd graphs and other native allocations)",
    "ledger": "torchmem's exact tensor ledger",
    "rss": "the process's resident memory (RSS)",
}


def source_words(source: str) -> str:
    """What a capture's ``source`` is, in words: ``"heap"`` -> ``"the C heap in use (glibc ...)"``."""
    return _SOURCE_WORDS.get(source, f"the {source}")


def run_facts(cap: Capture) -> RunFacts:
    h = cap.header
    argv = h.get("argv") or []
    program = " ".join(str(a) for a in argv) if isinstance(argv, list) and argv else "(unknown)"
    device = str(cap.device or "?")
    if cap.device_name:
        device += f" ({cap.device_name})"
    if cap.devices and cap.devices[-1].previous and cap.devices[-1].previous != cap.device:
        device += f" (followed from {cap.devices[-1].previous}: {cap.devices[-1].reason})"
    started = "n/a"
    if isinstance(h.get("started"), (int, float)):
        started = _dt.datetime.fromtimestamp(float(h["started"])).strftime("%Y-%m-%d %H:%M:%S")
    if cap.end is None:
        ended = "not finished: no end record (the run was killed, or is still running)"
    else:
        from torchmem.results.ranks import end_words

        code = "n/a" if cap.end.exit_code is None else str(cap.end.exit_code)
        ended = f"{end_words(cap.end.reason, cap.end.exit_code)} (exit code {code})"
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
        r = rec.as_report()
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


def render_summary(cap: Capture, *, max_modules: int = 10) -> str:
    """The terminal summary: run facts, peaks, reconciliation, leak verdict, OOM, module table, warnings."""
    f = run_facts(cap)
    lines = [f"torchmem capture {os.path.basename(cap.path)}"]
    if cap.truncated:
        lines.append(f"WARNING: {cap.truncated}; what follows is what was recorded before that.")
    lines += [
        f"  program   {f.program}",
        f"  device    {f.device}, figures from {source_words(f.source)}",
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
    bd = rec.as_breakdown() if rec is not None else None
    if bd is not None and rec is not None:
        lines.append("")
        lines.append(f"Reconciliation at the {rec.when} of the run:")
        lines += ["  " + x for x in str(bd).splitlines()]

    lines.append("")
    leak = final_leak(cap)
    if leak is not None:
        lines += str(leak).splitlines()
        fc = cap.forecasts[-1].as_forecast() if cap.forecasts and leak.leaking else None
        if fc is not None:
            lines.append(f"  forecast: {fc}")
    elif cap.leaks:
        lines.append("Leak verdict: recorded, but not in a form this torchmem reads (see --json).")
    else:
        lines.append("Leak verdict: none recorded.")

    if leak is not None and leak.leaking:
        pass
    elif cap.survivors:
        surv = cap.survivors[-1].as_report()
        if surv is not None and surv.leaking:
            lines.append("")
            lines += str(surv).splitlines()
    if cap.host_leaks:
        host = cap.host_leaks[-1].as_report()
        if host is not None and (host.leaking or host.stopped_at is not None):
            lines.append("")
            lines += str(host).splitlines()

    for o in cap.ooms:
        lines.append("")
        d = o.as_diagnosis()
        at = f" at step {o.step}" if o.step is not None else ""
        how = " caught by the program" if o.caught else ""
        where = f" raised at {o.site}" if o.site else ""
        lines.append(f"OOM{at}{where}{how} ({o.t:.2f} s into the run):")
        if d is not None:
            lines += ["  " + x for x in str(d).splitlines()]
        else:
            lines.append("  diagnosis recorded, but not in a form this torchmem reads (see --json).")

    gpus = cap.gpus_report
    if gpus is not None and (gpus.several or gpus.findings or gpus.children):
        lines.append("")
        lines += gpus.lines()

    rows, notes = module_rows(cap)
    if rows:
        lines.append("")
        top = sorted(rows, key=row_total, reverse=True)[:max_modules]
        head = ["module"] + [label for _, label in MODULE_LABELS]
        table = [head] + [
            [str(r.get("module", "?"))] + [fmt_bytes(_int_or_none(r.get(k))) for k, _ in MODULE_LABELS]
            for r in top
        ]
        more = f", top {len(top)} of {len(rows)} by held bytes" if len(rows) > len(top) else ""
        lines.append(f"Per-module memory{more}:")
        lines += text_table(table, set(range(1, len(head))))
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
    "END_REASONS",
    "FORMAT",
    "MODULE_COLUMNS",
    "MODULE_LABELS",
    "RECORDS",
    "RECORD_TYPES",
    "VERSION",
    "BoundaryRecord",
    "Capture",
    "DeviceRecord",
    "End",
    "ForecastRecord",
    "GpusRecord",
    "HostLeakRecord",
    "LeakRecord",
    "ModulesRecord",
    "Note",
    "OOMRecord",
    "OverheadRecord",
    "RankRecord",
    "RankStateRecord",
    "RecordKind",
    "RunFacts",
    "Sample",
    "StatsRecord",
    "StepMark",
    "SurvivorsRecord",
    "final_leak",
    "fmt_seconds",
    "module_rows",
    "render_summary",
    "row_total",
    "run_facts",
    "source_words",
    "stats_record",
    "step_time",
    "write_summary",
]
