"""A capture file's contents: its records, :class:`Capture`, the views every renderer shares, and the
terminal summary (``str(capture)``, ``torchmem report CAPTURE``).

The capture is the contract between recording (``torchmem run``) and reporting: the writer and reader live in
:mod:`torchmem.capture.file`; the records here keep each stored result as the dict its ``to_dict()`` wrote,
and turn it back into the result type with ``from_dict()`` on demand (``as_stats()``, ``as_report()``,
``as_diagnosis()``), so a record written by another torchmem version is kept even when it cannot be read.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any, TypeVar

from torchmem._format import fmt_bytes, text_table
from torchmem.results._dicts import ResultFormatError, from_mapping
from torchmem.results.forecast import Forecast
from torchmem.results.gpus import GpusReport
from torchmem.results.stats import Breakdown, MemoryStats

if TYPE_CHECKING:
    from torchmem.results.leaks import LeakReport
    from torchmem.results.oom import OOMDiagnosis

_T = TypeVar("_T")

FORMAT = "torchmem-capture"
"""The value of the header's ``"format"`` field."""

VERSION = 1
"""The capture version this torchmem writes and the newest it reads."""

RECORD_TYPES = (
    "sample",
    "step",
    "stats",
    "leak",
    "oom",
    "modules",
    "note",
    "boundary",
    "host_leak",
    "survivors",
    "overhead",
    "rank",
    "rank_state",
    "device",
    "gpus",
    "forecast",
    "end",
)
"""Record types of version 1. A reader skips types it does not know (later minor additions: ``boundary``,
``host_leak``, ``survivors`` and ``overhead`` came with torchmem 0.1's zero-config runs; older readers keep
them as unknown; ``rank`` and ``rank_state`` came with distributed runs; ``device`` (the run began watching
the GPU the program works on) and ``gpus`` (every GPU the process used) with multi-GPU runs; ``forecast``
(when the memory runs out at the leak's rate) with the leak's forecast)."""

END_REASONS = ("exit", "exception", "keyboard_interrupt", "oom", "signal")

MODULE_COLUMNS = (
    "params",
    "grads",
    "optimizer_state",
    "activations",
    "forward_peak",
    "backward_peak",
)
"""Byte columns of a ``modules`` row, besides its ``"module"`` name."""


def _read(kind: type[_T], d: Mapping[str, Any] | None) -> _T | None:
    """``kind.from_dict(d)``, or ``None`` when ``d`` is missing or not in a form this torchmem reads."""
    if not d:
        return None
    try:
        return kind.from_dict(d)  # type: ignore[attr-defined,no-any-return]
    except (ResultFormatError, KeyError, TypeError, ValueError, AttributeError):
        return None


def _int(v: Any) -> int | None:
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and math.isfinite(v):
        return int(v)
    return None


def _float(v: Any) -> float | None:
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, (int, float)) and math.isfinite(float(v)):
        return float(v)
    return None


def _max(vals: Sequence[int | None]) -> int | None:
    known = [v for v in vals if v is not None]
    return max(known) if known else None


def _int_or_none(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


@dataclass(frozen=True)
class Sample:
    """One reading of the timeline. Byte figures are ``None`` when the source cannot give them."""

    t: float
    step: int | None
    allocated: int | None
    reserved: int | None
    peak_allocated: int | None
    peak_reserved: int | None


@dataclass(frozen=True)
class StepMark:
    """The end of one training step (found from optimizer steps or a step marker)."""

    t: float
    step: int
    allocated: int | None


@dataclass(frozen=True)
class StatsRecord:
    """A full stats reading: ``MemoryStats.to_dict()`` and ``Breakdown.to_dict()`` (or ``None``)."""

    t: float
    when: str
    stats: Mapping[str, Any]
    breakdown: Mapping[str, Any] | None

    def as_stats(self) -> MemoryStats | None:
        """The reading as a :class:`MemoryStats` (``None``: not in a form this torchmem reads)."""
        return _read(MemoryStats, self.stats)

    def as_breakdown(self) -> Breakdown | None:
        """The reconciliation as a :class:`Breakdown` (``None``: none recorded, or not readable)."""
        return _read(Breakdown, self.breakdown)


@dataclass(frozen=True)
class LeakRecord:
    """A leak verdict: ``LeakReport.to_dict()``."""

    t: float
    report: Mapping[str, Any]

    def as_report(self) -> LeakReport | None:
        """The verdict as a :class:`~torchmem.results.leaks.LeakReport` (``None``: not readable)."""
        from torchmem.results.leaks import LeakReport

        return _read(LeakReport, self.report)


@dataclass(frozen=True)
class OOMRecord:
    """An out-of-memory error and its diagnosis: ``OOMDiagnosis.to_dict()``.

    ``caught``: the program caught it and went on (``None`` in captures written before this was recorded:
    those recorded only the error that ended the run); ``site``: the user's line that raised it.
    """

    t: float
    diagnosis: Mapping[str, Any]
    step: int | None
    caught: bool | None = None
    site: str | None = None

    def as_diagnosis(self) -> OOMDiagnosis | None:
        """The diagnosis as an :class:`~torchmem.results.oom.OOMDiagnosis` (``None``: not readable)."""
        from torchmem.results.oom import OOMDiagnosis

        return _read(OOMDiagnosis, self.diagnosis)


@dataclass(frozen=True)
class BoundaryRecord:
    """What one step of the run was: ``kind`` (``optimizer``, ``backward``, ``module``, ``dataloader``,
    ``generate``, ``marker``, ``timeline`` or ``none``), its label, and the steps counted (0 when chosen)."""

    t: float
    kind: str
    label: str
    count: int | None


@dataclass(frozen=True)
class HostLeakRecord:
    """The host-memory verdict (``LeakReport.to_dict()`` with device ``"host"``)."""

    t: float
    report: Mapping[str, Any]

    def as_report(self) -> LeakReport | None:
        from torchmem.results.leaks import LeakReport

        return _read(LeakReport, self.report)


@dataclass(frozen=True)
class SurvivorsRecord:
    """What was allocated inside the loop and is still alive at the end (``SurvivorReport.to_dict()``)."""

    t: float
    report: Mapping[str, Any]

    def as_report(self) -> Any:
        from torchmem.results.survivors import SurvivorReport

        return _read(SurvivorReport, self.report)


@dataclass(frozen=True)
class OverheadRecord:
    """What torchmem's own work added to the program's run (an estimate, measured as it ran).

    Attributes:
        wall_s: The program's run under torchmem, in seconds (to its end, before the final reports).
        own_s: torchmem's own time within it.
        ratio: ``wall_s / (wall_s - own_s)``: how many times as long the run took as it would without it.
        parts: ``own_s`` by part: ``steps`` (step bookkeeping), ``sampler`` (the background thread),
            ``ledger`` (the exact accounting's per-op cost in the steps it was on).
    """

    t: float
    wall_s: float
    own_s: float
    ratio: float
    parts: Mapping[str, float]


@dataclass(frozen=True)
class RankRecord:
    """The default process group as the rank saw it (no collective): its rank, the world size, the backend,
    the NCCL communicators and their estimated buffers (``NcclEstimate.to_dict()`` or ``None``)."""

    t: float
    rank: int | None
    world_size: int | None
    backend: str
    nccl_communicators: int | None = None
    nccl: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class RankStateRecord:
    """What this process held when a rank of its job ran out of memory (written once, when the job's OOM
    flag was seen). ``trigger`` is the flag's content (``rank``, ``wall``, ``site``, ``step``...); ``wall``
    the wall-clock time of this reading; ``stats`` a ``MemoryStats.to_dict()`` or ``None``."""

    t: float
    trigger: Mapping[str, Any]
    wall: float | None
    step: int | None
    allocated: int | None
    reserved: int | None
    peak_allocated: int | None
    peak_reserved: int | None
    stats: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class DeviceRecord:
    """From here on the run watches ``device`` (the GPU the program works on, found as it ran): the
    timeline's samples after ``t`` are of it; ``previous`` is what was watched before."""

    t: float
    device: str
    name: str | None = None
    previous: str | None = None
    reason: str = ""


@dataclass(frozen=True)
class GpusRecord:
    """Every GPU the process had a context on, and what their figures show (a ``GpusReport.to_dict()``)."""

    t: float
    report: Mapping[str, Any]

    def as_report(self) -> GpusReport | None:
        return _read(GpusReport, self.report)


@dataclass(frozen=True)
class ForecastRecord:
    """When the memory runs out at the leak's rate (a ``Forecast.to_dict()``), written with the final
    verdict."""

    t: float
    forecast: Mapping[str, Any]

    def as_forecast(self) -> Forecast | None:
        return _read(Forecast, self.forecast)


@dataclass(frozen=True)
class ModulesRecord:
    """The per-module profile: one row per module, byte columns named in :data:`MODULE_COLUMNS`."""

    t: float
    rows: tuple[Mapping[str, Any], ...]
    notes: tuple[str, ...]


@dataclass(frozen=True)
class Note:
    """Free text the recorder wanted the reader to see."""

    t: float
    text: str


@dataclass(frozen=True)
class End:
    """How the run ended. Missing from a capture whose run was killed."""

    t: float
    exit_code: int | None
    reason: str
    steps: int | None
    seconds: float | None


@dataclass(frozen=True)
class Capture:
    """Everything readable in a capture file.

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
        return [self.samples, self.steps, self.stats, self.leaks, self.ooms, self.modules, self.notes]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: the header, every record group as lists of dicts, ``end`` and ``truncated``."""

        def rec(r: Any) -> dict[str, Any]:
            d = {k: getattr(r, k) for k in r.__dataclass_fields__}
            for k, v in d.items():
                if isinstance(v, tuple):
                    d[k] = list(v)
                elif isinstance(v, Mapping):
                    d[k] = dict(v)
            return d

        return {
            "path": self.path,
            "header": dict(self.header),
            "summary": {
                "finished": self.finished,
                "seconds": self.duration,
                "steps": self.step_count,
                "peak_allocated": self.peak_allocated,
                "peak_reserved": self.peak_reserved,
            },
            "samples": [rec(s) for s in self.samples],
            "steps": [rec(s) for s in self.steps],
            "stats": [rec(s) for s in self.stats],
            "leaks": [rec(s) for s in self.leaks],
            "ooms": [rec(s) for s in self.ooms],
            "modules": [rec(s) for s in self.modules],
            "notes": [rec(s) for s in self.notes],
            **({"ranks": [rec(s) for s in self.ranks]} if self.ranks else {}),
            **({"rank_states": [rec(s) for s in self.rank_states]} if self.rank_states else {}),
            **({"devices": [rec(s) for s in self.devices]} if self.devices else {}),
            **({"gpus": [rec(s) for s in self.gpus]} if self.gpus else {}),
            **({"forecasts": [rec(s) for s in self.forecasts]} if self.forecasts else {}),
            "end": None if self.end is None else rec(self.end),
            "truncated": self.truncated,
            "unknown": [dict(u) for u in self.unknown],
            "lines": self.lines,
        }

    def __str__(self) -> str:
        return render_summary(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Capture:
        """A capture from its :meth:`to_dict` (``summary`` is derived, not read)."""

        def many(kind: Any, key: str) -> tuple[Any, ...]:
            return tuple(from_mapping(kind, r) for r in d.get(key) or ())

        end = d.get("end")
        return cls(
            path=str(d.get("path") or ""),
            header=dict(d.get("header") or {}),
            samples=many(Sample, "samples"),
            steps=many(StepMark, "steps"),
            stats=many(StatsRecord, "stats"),
            leaks=many(LeakRecord, "leaks"),
            ooms=many(OOMRecord, "ooms"),
            modules=many(ModulesRecord, "modules"),
            notes=many(Note, "notes"),
            ranks=many(RankRecord, "ranks"),
            rank_states=many(RankStateRecord, "rank_states"),
            devices=many(DeviceRecord, "devices"),
            gpus=many(GpusRecord, "gpus"),
            forecasts=many(ForecastRecord, "forecasts"),
            end=None if end is None else from_mapping(End, end),
            truncated=d.get("truncated"),
            unknown=tuple(dict(u) for u in d.get("unknown") or ()),
            lines=int(d.get("lines") or 0),
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
