"""The capture file's record types: one frozen dataclass per kind of line, and the lenient reader they share.

Each record keeps a stored result as the dict its ``to_dict()`` wrote and turns it back into the result type
with ``from_dict()`` on demand (``as_stats()``, ``as_report()``, ``as_diagnosis()``), so a record written by
another torchmem version is kept even when it cannot be read. Which ``"type"`` each is, and where a capture
keeps it, is the one table :data:`torchmem.results.capture.RECORDS`; the types are re-exported there.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar, Union

from torchmem.results._dicts import ResultFormatError
from torchmem.results.forecast import Forecast
from torchmem.results.gpus import GpusReport
from torchmem.results.stats import Breakdown, MemoryStats

if TYPE_CHECKING:
    from torchmem.results.leaks import LeakReport
    from torchmem.results.oom import OOMDiagnosis

_T = TypeVar("_T")

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
    """A stored figure as an integer: ``None`` for a missing, boolean, non-finite or non-numeric value."""
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and math.isfinite(v):
        return int(v)
    return None


def _float(v: Any) -> float | None:
    """A stored figure as a float: ``None`` for a missing, boolean, non-finite or non-numeric value."""
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, (int, float)) and math.isfinite(float(v)):
        return float(v)
    return None


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


__all__ = [
    "MODULE_COLUMNS",
    "BoundaryRecord",
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
    "Sample",
    "StatsRecord",
    "StepMark",
    "SurvivorsRecord",
]
