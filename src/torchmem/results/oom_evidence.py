"""The evidence a caller hands to an out-of-memory diagnosis, beside the message and the allocator state.

* :class:`MachineMemory` — the host memory a CPU out-of-memory is judged against (its message gives none).
* :class:`PinnedTensor` — memory held by an old exception's frames or a notebook's output.
* :class:`WorkingSetItem` — a holder (or category, or allocation site) of the working set.
* :class:`LeakEvidence` — the growth a watcher measured, with the :class:`LeakSite` s it named, reduced to
  what the ``leak`` cause quotes (not a leak report).

Frozen dataclasses with ``to_dict()`` / ``from_dict()`` and a plain-text ``str()``; re-exported by
:mod:`torchmem.results.oom`. Nothing here touches torch or a device.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torchmem._format import fmt_bytes
from torchmem.results._dicts import from_mapping

# ---------------------------------------------------------------------------------------------------------
# the host's memory, for a CPU out-of-memory


@dataclass(frozen=True)
class MachineMemory:
    """The host memory a CPU out-of-memory is judged against (the CPU allocator's message gives none).

    Attributes:
        physical: Total RAM of the machine, ``None`` when unknown.
        physical_source: Where ``physical`` was read (``"MemTotal in /proc/meminfo"``).
        cgroup_limit: The container's (cgroup's) memory limit, ``None`` when none is set.
        cgroup_source: The file ``cgroup_limit`` was read from (``.../memory.max``).
        available: Memory available (``MemAvailable``) when it was read.
        read_here: The figures were read on this machine for a pasted message, which may come from another.
    """

    physical: int | None
    physical_source: str | None = None
    cgroup_limit: int | None = None
    cgroup_source: str | None = None
    available: int | None = None
    read_here: bool = False

    @property
    def limited_by_cgroup(self) -> bool:
        """The cgroup limit binds: it is below the RAM (or the RAM is unknown)."""
        if self.cgroup_limit is None:
            return False
        return self.physical is None or self.cgroup_limit < self.physical

    @property
    def total(self) -> int | None:
        """The most this process can have: the cgroup limit where it binds, else the RAM."""
        return self.cgroup_limit if self.limited_by_cgroup else self.physical

    @property
    def what(self) -> str:
        """The ceiling in words."""
        if self.limited_by_cgroup:
            return "the container's memory limit (cgroup)"
        return "the machine's memory (total RAM)"

    def evidence(self) -> list[str]:
        """One line per figure, each with where it was read."""
        out: list[str] = []
        if self.physical is not None:
            where = f", {self.physical_source}" if self.physical_source else ""
            out.append(f"total RAM: {fmt_bytes(self.physical)} ({self.physical} bytes{where})")
        if self.cgroup_limit is not None:
            where = f", {self.cgroup_source}" if self.cgroup_source else ""
            size = f"{fmt_bytes(self.cgroup_limit)} ({self.cgroup_limit} bytes{where})"
            if self.limited_by_cgroup:
                out.append(f"container memory limit: {size}: below the RAM, so it is the ceiling")
            else:
                out.append(f"container memory limit: {size}: not below the RAM, so the RAM is the ceiling")
        else:
            out.append("container memory limit: none set (no cgroup memory limit)")
        return out

    def to_dict(self) -> dict[str, Any]:
        """The figures, plus ``total`` (the ceiling, derived: ``from_dict()`` ignores it)."""
        return {
            "physical": self.physical,
            "physical_source": self.physical_source,
            "cgroup_limit": self.cgroup_limit,
            "cgroup_source": self.cgroup_source,
            "available": self.available,
            "read_here": self.read_here,
            "total": self.total,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> MachineMemory:
        return from_mapping(cls, d)

    def __str__(self) -> str:
        return "\n".join(self.evidence())


# ---------------------------------------------------------------------------------------------------------
# the evidence a caller hands to the diagnosis


@dataclass(frozen=True)
class PinnedTensor:
    """Device memory held by a finished exception's frames or by notebook output history."""

    where: str
    bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {"where": self.where, "bytes": self.bytes}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PinnedTensor:
        return from_mapping(cls, d)

    def __str__(self) -> str:
        return f"{self.where}: {fmt_bytes(self.bytes)}"


@dataclass(frozen=True)
class WorkingSetItem:
    """A holder (or category, or allocation site) of the working set at the moment of the OOM.

    ``kind`` is one of torchmem's tensor categories when known: ``"parameter"``, ``"gradient"``,
    ``"optimizer_state"``, ``"activation"`` (saved for backward), ``"other"``.
    """

    label: str
    bytes: int
    kind: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, "bytes": self.bytes, "kind": self.kind}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> WorkingSetItem:
        return from_mapping(cls, d)

    def __str__(self) -> str:
        return f"{self.label}: {fmt_bytes(self.bytes)}" + (f" ({self.kind})" if self.kind else "")


@dataclass(frozen=True)
class LeakSite:
    """One leaking site a watcher named, as the diagnosis's ``leak`` cause quotes it (normalised from
    whatever object or dict the watcher gave; the full record is the leak report's ``Culprit``)."""

    site: str | None
    holder: str | None
    bytes: int | None
    fix: str | None
    kind: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "site": self.site,
            "holder": self.holder,
            "bytes": self.bytes,
            "fix": self.fix,
            "kind": self.kind,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LeakSite:
        return from_mapping(cls, d)

    def __str__(self) -> str:
        where = " ".join(x for x in (self.site, f"held by {self.holder}" if self.holder else None) if x)
        return f"{where or 'unknown site'}: {fmt_bytes(self.bytes)}" + (
            f" ({self.kind})" if self.kind else ""
        )


@dataclass(frozen=True)
class LeakEvidence:
    """The growth a running watcher measured, as evidence for the diagnosis's ``leak`` cause: bytes per
    step and the sites it named. Not a leak report: :func:`torchmem.watch` returns that
    (``LeakReport``); this keeps only what the diagnosis quotes."""

    bytes_per_step: float
    culprits: tuple[LeakSite, ...] = ()
    leaking: bool | None = None
    steps: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "bytes_per_step": self.bytes_per_step,
            "culprits": [c.to_dict() for c in self.culprits],
            "leaking": self.leaking,
            "steps": self.steps,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LeakEvidence:
        return from_mapping(cls, d)

    def __str__(self) -> str:
        head = f"memory grows by {fmt_bytes(int(self.bytes_per_step))} per step" + (
            f" over {self.steps} steps" if self.steps else ""
        )
        return "\n".join([head] + [f"  {c}" for c in self.culprits])


__all__ = ["LeakEvidence", "LeakSite", "MachineMemory", "PinnedTensor", "WorkingSetItem"]
