"""Report objects rebuilt from the dicts a capture file stores, so captures render like live objects.

Each function returns ``None`` when the dict does not have the shape it expects (a capture from another
version, or a damaged record): the caller then shows the raw figures it can find instead of failing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torchmem.analysis.leaks import Culprit, LeakReport
from torchmem.analysis.oom import Cause, Fix, OOMDiagnosis, ParsedOOM
from torchmem.analysis.stats import Breakdown, BreakdownRow, MemoryStats, ProcessMemory


def _tuple(v: Any) -> tuple[Any, ...]:
    return tuple(v) if isinstance(v, (list, tuple)) else ()


def _opt_int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _procs(v: Any) -> tuple[ProcessMemory, ...] | None:
    if v is None:
        return None
    return tuple(ProcessMemory(int(p["pid"]), p.get("name"), _opt_int(p.get("used"))) for p in v)


def _row(d: Mapping[str, Any]) -> BreakdownRow:
    return BreakdownRow(
        str(d["label"]),
        _opt_int(d.get("bytes")),
        str(d.get("note") or ""),
        tuple(_row(c) for c in d.get("children") or ()),
    )


def breakdown_of(d: Mapping[str, Any] | None) -> Breakdown | None:
    """The :class:`Breakdown` stored as ``Breakdown.to_dict()``."""
    if not d:
        return None
    try:
        return Breakdown(
            device=str(d["device"]),
            platform=str(d.get("platform") or ""),
            process_used=_opt_int(d.get("process_used")),
            process=tuple(_row(r) for r in d.get("process") or ()),
            device_used=_opt_int(d.get("device_used")),
            device_total=_opt_int(d.get("device_total")),
            other_processes=_procs(d.get("other_processes")),
            unattributed=_opt_int(d.get("unattributed")),
            notes=tuple(str(n) for n in d.get("notes") or ()),
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def stats_of(d: Mapping[str, Any] | None) -> MemoryStats | None:
    """The :class:`MemoryStats` stored as ``MemoryStats.to_dict()`` (unknown keys are ignored)."""
    if not d:
        return None
    try:
        fields = {k: d[k] for k in MemoryStats.__dataclass_fields__ if k in d}
        fields["other_processes"] = _procs(d.get("other_processes"))
        fields["other_allocators"] = dict(d.get("other_allocators") or {})
        fields["notes"] = tuple(str(n) for n in d.get("notes") or ())
        return MemoryStats(**fields)
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def leak_report_of(d: Mapping[str, Any] | None) -> LeakReport | None:
    """The :class:`LeakReport` stored as ``LeakReport.to_dict()``."""
    if not d:
        return None
    try:
        culprits = tuple(
            Culprit(
                kind=str(c.get("kind") or "unknown"),
                site=c.get("site"),
                sites=tuple((str(s["site"]), float(s["bytes_per_step"])) for s in c.get("sites") or ()),
                holder=c.get("holder"),
                bytes=int(c.get("bytes") or 0),
                bytes_per_step=float(c.get("bytes_per_step") or 0.0),
                graph_bytes=float(c.get("graph_bytes") or 0.0),
                fix=str(c.get("fix") or ""),
            )
            for c in d.get("culprits") or ()
        )
        return LeakReport(
            device=str(d.get("device") or "?"),
            source=str(d.get("source") or "?"),
            mode=str(d.get("mode") or "light"),
            steps=int(d.get("steps") or 0),
            warmup=int(d.get("warmup") or 0),
            leaking=bool(d["leaking"]),
            bytes_per_step=float(d.get("bytes_per_step") or 0.0),
            confidence=float(d.get("confidence") or 0.0),
            detected_at=_opt_int(d.get("detected_at")),
            stopped_at=_opt_int(d.get("stopped_at")),
            reason=str(d.get("reason") or ""),
            culprits=culprits,
            series=tuple((int(s), int(b)) for s, b in d.get("series") or ()),
            notes=tuple(str(n) for n in d.get("notes") or ()),
            verdict=str(d.get("verdict") or ""),
            trend_per_step=float(d.get("trend_per_step") or 0.0),
            min_bytes_per_step=int(d.get("min_bytes_per_step") or 0),
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def _fix(f: Mapping[str, Any]) -> Fix:
    return Fix(str(f.get("kind") or ""), str(f.get("text") or ""), f.get("setting"))


def diagnosis_of(d: Mapping[str, Any] | None) -> OOMDiagnosis | None:
    """The :class:`OOMDiagnosis` stored as ``OOMDiagnosis.to_dict()`` (without the allocator state)."""
    if not d:
        return None
    try:
        p = d.get("parsed")
        parsed = None
        if p:
            fields = {k: p[k] for k in ParsedOOM.__dataclass_fields__ if k in p}
            fields["other_processes"] = tuple(
                (int(o["pid"]), int(o["used"])) for o in p.get("other_processes") or ()
            )
            fields["precision"] = dict(p.get("precision") or {})
            fields["notes"] = tuple(p.get("notes") or ())
            parsed = ParsedOOM(**fields)
        causes = tuple(
            Cause(
                kind=str(c.get("kind") or ""),
                summary=str(c.get("summary") or ""),
                evidence=tuple(str(e) for e in c.get("evidence") or ()),
                bytes=_opt_int(c.get("bytes")),
                confidence=str(c.get("confidence") or ""),
                fixes=tuple(_fix(f) for f in c.get("fixes") or ()),
            )
            for c in d.get("causes") or ()
        )
        return OOMDiagnosis(
            is_oom=bool(d.get("is_oom")),
            parsed=parsed,
            causes=causes,
            fixes=tuple(_fix(f) for f in d.get("fixes") or ()),
            settings=dict(d.get("settings") or {}),
            notes=tuple(str(n) for n in d.get("notes") or ()),
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


__all__ = ["breakdown_of", "diagnosis_of", "leak_report_of", "stats_of"]
