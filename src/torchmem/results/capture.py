"""A capture file's contents: its records, :class:`Capture`, the views every renderer shares, and the
terminal summary (``str(capture)``, ``torchmem report CAPTURE``).

The capture is the contract between recording (``torchmem run``) and reporting: the writer and reader live in
:mod:`torchmem.capture.file`; the records here keep each stored result as the dict its ``to_dict()`` wrote,
and turn it back into the result type with ``from_dict()`` on demand (``as_stats()``, ``as_report()``,
``as_diagnosis()``), so a record written by another torchmem version is kept even when it cannot be read.

:data:`RECORDS` is the one table of record kinds: each kind's ``"type"``, its record type (``to_dict()`` /
``from_dict()``) and its :class:`Capture` attribute, which is also its key in ``torchmem report --json``.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import math
import os
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any, TypeVar, Union

from torchmem._format import fmt_bytes, text_table
from torchmem.results._dicts import ResultFormatError
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


# ---------------------------------------------------------------------------------------------------------
# records: one (de)serialisation for every kind, driven by the record type's annotations

_R = TypeVar("_R", bound="_Record")
_HINTS: dict[type, dict[str, Any]] = {}


def _split_optional(tp: Any) -> tuple[Any, bool]:
    """``(X, True)`` for ``X | None``, ``(tp, False)`` otherwise."""
    if typing.get_origin(tp) in (Union, types.UnionType):
        args = typing.get_args(tp)
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return rest[0], len(rest) < len(args)
    return tp, False


def _record_field(cls: type, f: dataclasses.Field[Any], tp: Any, d: Mapping[str, Any]) -> Any:
    """One field of a stored record, read leniently (as the reader always has):

    - a missing or ``null`` value takes the field's ``metadata["missing"]``, else its default, else ``None``
      where the type allows it, ``""`` for text and ``()`` for a list; a required number or object that is
      missing makes the record unreadable;
    - an optional figure (``int | None``, ``float | None``, ``bool | None``, ``str | None``) of another
      shape is ``None`` (unknown), never an error; a required one must be a finite number;
    - an object (``Mapping``) must be a JSON object (``Mapping[str, float]`` keeps its numeric values only);
      a list of objects must be a list of objects; a required text field is ``str()`` of what was stored.

    Raises:
        ResultFormatError: the record cannot be read (a required field missing, an object that is not one).
    """
    where = f"{cls.__name__}.{f.name}"
    base, optional = _split_optional(tp)
    origin = typing.get_origin(base) or base
    args = typing.get_args(base)
    v = d.get(f.name)
    if v is None:
        if "missing" in f.metadata:
            m = f.metadata["missing"]
            return dict(m) if isinstance(m, Mapping) else m
        if f.default is not dataclasses.MISSING:
            return f.default
        if optional:
            return None
        if base is str:
            return ""
        if origin is tuple:
            return ()
        raise ResultFormatError(f"{where}: missing")
    if base in (int, float):
        r = _int(v) if base is int else _float(v)
        if r is None and not optional:
            raise ResultFormatError(f"{where}: expected a number, got {v!r}")
        return r
    if base is bool:
        if isinstance(v, bool):
            return v
        if optional:
            return None
        raise ResultFormatError(f"{where}: expected true/false, got {v!r}")
    if base is str:
        if optional:
            return v if isinstance(v, str) else None
        return str(v)
    if origin in (Mapping, dict):
        if not isinstance(v, Mapping):
            raise ResultFormatError(f"{where}: expected an object, got {type(v).__name__}")
        if args == (str, float):
            return {
                str(k): float(x)
                for k, x in v.items()
                if isinstance(x, (int, float)) and not isinstance(x, bool)
            }
        return v
    if origin is tuple:
        if not isinstance(v, (list, tuple)):
            raise ResultFormatError(f"{where}: expected a list, got {type(v).__name__}")
        item = args[0] if args else Any
        if typing.get_origin(item) in (Mapping, dict) or item in (Mapping, dict):
            if not all(isinstance(x, Mapping) for x in v):
                raise ResultFormatError(f"{where}: expected a list of objects")
            return tuple(v)
        if item is str:
            return tuple(str(x) for x in v)
        return tuple(v)
    return v


class _Record:
    """Base of the capture's record types: ``to_dict()`` is the record as stored (without its ``"type"``),
    ``from_dict()`` reads one back, from any version of this capture format (:func:`_record_field`)."""

    def to_dict(self) -> dict[str, Any]:
        """The record's fields, JSON-ready (tuples as lists, objects as dicts), ``t`` included."""
        d: dict[str, Any] = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            v = getattr(self, f.name)
            if isinstance(v, tuple):
                v = [dict(x) if isinstance(x, Mapping) else x for x in v]
            elif isinstance(v, Mapping):
                v = dict(v)
            d[f.name] = v
        return d

    @classmethod
    def from_dict(cls: type[_R], d: Mapping[str, Any]) -> _R:
        """The record from a stored line (or its :meth:`to_dict`): unknown keys are ignored.

        Raises:
            ResultFormatError: the record cannot be read (not an object, a required field missing or of
                another shape).
        """
        if not isinstance(d, Mapping):
            raise ResultFormatError(f"a stored {cls.__name__} must be an object, got {type(d).__name__}")
        hints = _HINTS.get(cls)
        if hints is None:
            hints = _HINTS[cls] = typing.get_type_hints(cls)
        kwargs = {f.name: _record_field(cls, f, hints[f.name], d) for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        return cls(**kwargs)


@dataclass(frozen=True)
class Sample(_Record):
    """One reading of the timeline. Byte figures are ``None`` when the source cannot give them."""

    t: float
    step: int | None
    allocated: int | None
    reserved: int | None
    peak_allocated: int | None
    peak_reserved: int | None


@dataclass(frozen=True)
class StepMark(_Record):
    """The end of one training step (found from optimizer steps or a step marker)."""

    t: float
    step: int
    allocated: int | None


@dataclass(frozen=True)
class StatsRecord(_Record):
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
class LeakRecord(_Record):
    """A leak verdict: ``LeakReport.to_dict()``. ``final``: the verdict made at the end of the run (``None``
    on the verdicts written as the run went, and in captures written before this was recorded)."""

    t: float
    report: Mapping[str, Any]
    final: bool | None = None

    def as_report(self) -> LeakReport | None:
        """The verdict as a :class:`~torchmem.results.leaks.LeakReport` (``None``: not readable)."""
        from torchmem.results.leaks import LeakReport

        return _read(LeakReport, self.report)


@dataclass(frozen=True)
class OOMRecord(_Record):
    """An out-of-memory error and its diagnosis: ``OOMDiagnosis.to_dict()``.

    ``caught``: the program caught it and went on (``None`` in captures written before this was recorded:
    those recorded only the error that ended the run); ``site``: the user's line that raised it; ``event``:
    the OOM event as it was observed (``OOMEvent.to_dict()`` without its diagnosis; ``None`` in older
    captures).
    """

    t: float
    diagnosis: Mapping[str, Any]
    step: int | None
    caught: bool | None = None
    site: str | None = None
    event: Mapping[str, Any] | None = None

    def as_diagnosis(self) -> OOMDiagnosis | None:
        """The diagnosis as an :class:`~torchmem.results.oom.OOMDiagnosis` (``None``: not readable)."""
        from torchmem.results.oom import OOMDiagnosis

        return _read(OOMDiagnosis, self.diagnosis)


@dataclass(frozen=True)
class BoundaryRecord(_Record):
    """What one step of the run was: ``kind`` (``optimizer``, ``backward``, ``module``, ``dataloader``,
    ``generate``, ``marker``, ``timeline`` or ``none``), its label, and the steps counted (0 when chosen)."""

    t: float
    kind: str
    label: str
    count: int | None


@dataclass(frozen=True)
class HostLeakRecord(_Record):
    """The host-memory verdict (``LeakReport.to_dict()`` with device ``"host"``); ``final`` as in
    :class:`LeakRecord`."""

    t: float
    report: Mapping[str, Any]
    final: bool | None = None

    def as_report(self) -> LeakReport | None:
        from torchmem.results.leaks import LeakReport

        return _read(LeakReport, self.report)


@dataclass(frozen=True)
class SurvivorsRecord(_Record):
    """What was allocated inside the loop and is still alive at the end (``SurvivorReport.to_dict()``)."""

    t: float
    report: Mapping[str, Any]

    def as_report(self) -> Any:
        from torchmem.results.survivors import SurvivorReport

        return _read(SurvivorReport, self.report)


@dataclass(frozen=True)
class OverheadRecord(_Record):
    """What torchmem's own work added to the program's run (an estimate, measured as it ran).

    Attributes:
        wall_s: The program's run under torchmem, in seconds (to its end, before the final reports).
        own_s: torchmem's own time within it.
        ratio: ``wall_s / (wall_s - own_s)``: how many times as long the run took as it would without it.
        parts: ``own_s`` by part: ``steps`` (step bookkeeping), ``sampler`` (the background thread),
            ``ledger`` (the exact accounting's per-op cost in the steps it was on).
        detail: The parts split further (``steps.reading``, ``steps.survivors``, ``steps.host``,
            ``steps.other``, ``sampler.workers``, ``sampler.other``), in seconds.
        sampler_ticks: The sampler's readings.
        steps: Steps counted.
        ledger_steps: Steps the exact accounting was on.
        ledger_known: Steps without the exact accounting were there to compare with (``False``: every step
            had it, so its cost could not be told apart).

    The fields after ``parts`` are ``None`` in captures written before they were recorded.
    """

    t: float
    wall_s: float
    own_s: float
    ratio: float
    parts: Mapping[str, float]
    detail: Mapping[str, float] | None = None
    sampler_ticks: int | None = None
    steps: int | None = None
    ledger_steps: int | None = None
    ledger_known: bool | None = None


@dataclass(frozen=True)
class RankRecord(_Record):
    """The default process group as the rank saw it (no collective): its rank, the world size, the backend,
    the NCCL communicators and their estimated buffers (``NcclEstimate.to_dict()`` or ``None``)."""

    t: float
    rank: int | None
    world_size: int | None
    backend: str
    nccl_communicators: int | None = None
    nccl: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class RankStateRecord(_Record):
    """What this process held when a rank of its job ran out of memory (written once, when the job's OOM
    flag was seen). ``trigger`` is the flag's content (``rank``, ``wall``, ``site``, ``step``...); ``wall``
    the wall-clock time of this reading; ``stats`` a ``MemoryStats.to_dict()`` or ``None``."""

    t: float
    trigger: Mapping[str, Any] = field(metadata={"missing": {}})
    wall: float | None
    step: int | None
    allocated: int | None
    reserved: int | None
    peak_allocated: int | None
    peak_reserved: int | None
    stats: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class DeviceRecord(_Record):
    """From here on the run watches ``device`` (the GPU the program works on, found as it ran): the
    timeline's samples after ``t`` are of it; ``previous`` is what was watched before."""

    t: float
    device: str
    name: str | None = None
    previous: str | None = None
    reason: str = ""


@dataclass(frozen=True)
class GpusRecord(_Record):
    """Every GPU the process had a context on, and what their figures show (a ``GpusReport.to_dict()``)."""

    t: float
    report: Mapping[str, Any]

    def as_report(self) -> GpusReport | None:
        return _read(GpusReport, self.report)


@dataclass(frozen=True)
class ForecastRecord(_Record):
    """When the memory runs out at the leak's rate (a ``Forecast.to_dict()``), written with the final
    verdict."""

    t: float
    forecast: Mapping[str, Any]

    def as_forecast(self) -> Forecast | None:
        return _read(Forecast, self.forecast)


@dataclass(frozen=True)
class ModulesRecord(_Record):
    """The per-module profile: one row per module, byte columns named in :data:`MODULE_COLUMNS`."""

    t: float
    rows: tuple[Mapping[str, Any], ...]
    notes: tuple[str, ...]


@dataclass(frozen=True)
class Note(_Record):
    """Free text the recorder wanted the reader to see."""

    t: float
    text: str


@dataclass(frozen=True)
class End(_Record):
    """How the run ended. Missing from a capture whose run was killed."""

    t: float
    exit_code: int | None
    reason: str = field(metadata={"missing": "exit"})
    steps: int | None
    seconds: float | None


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
