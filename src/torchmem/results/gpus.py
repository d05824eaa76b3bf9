"""Every GPU one process used: :class:`GpusReport` (``torchmem run``'s ``gpus`` record).

One row per CUDA device on which the process had a context, with the caching allocator's figures on that
device (current and peak, read from the allocator's own counters: a peak between two readings is not
missed) and NVML's figure for the process there; then what those figures show, each with its evidence and
its fix: a context on a GPU the process keeps no tensors on and how it got there, ``nn.DataParallel``'s
first GPU holding the gathered outputs, a full state dict gathered on the GPU of every rank.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from torchmem._format import fmt_bytes
from torchmem.results._dicts import from_mapping

FINDING_KINDS = ("stray_context", "data_parallel", "state_dict", "child_context")
"""What a :class:`GpuFinding` can say: a context with no tensors on a GPU the process does not work on
(``stray_context``), ``nn.DataParallel``'s imbalance (``data_parallel``), a full state dict gathered on the
GPU (``state_dict``), a child process (not a DataLoader worker) with a context on a second GPU
(``child_context``)."""


@dataclass(frozen=True)
class GpuRow:
    """One GPU the process had a context on.

    Attributes:
        device: ``"cuda:1"``.
        name: The GPU's model, ``None`` when unknown.
        allocated / reserved: The caching allocator's figures at the last reading.
        peak_allocated / peak_reserved: The allocator's own peaks (since the process started or the
            program's last ``reset_peak_memory_stats``).
        process_used: NVML's figure for this process on this GPU (context included), ``None`` without NVML.
        watched: Whether this is the device the run's timeline and leak verdict are of.
    """

    device: str
    name: str | None = None
    allocated: int | None = None
    reserved: int | None = None
    peak_allocated: int | None = None
    peak_reserved: int | None = None
    process_used: int | None = None
    watched: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> GpuRow:
        return from_mapping(cls, d)


@dataclass(frozen=True)
class GpuFinding:
    """One statement about the GPUs, with what it rests on.

    Attributes:
        kind: One of :data:`FINDING_KINDS`.
        device: The GPU it is about.
        text: What was seen, with the figures and the program's lines.
        fix: What to change.
        bytes: The memory at stake (what the fix saves), ``None`` when unknown.
    """

    kind: str
    device: str
    text: str
    fix: str
    bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> GpuFinding:
        return from_mapping(cls, d)

    def __str__(self) -> str:
        return f"{self.text}. Fix: {self.fix}"


@dataclass(frozen=True)
class GpusReport:
    """The GPUs one process used and what their figures show.

    Attributes:
        watched: The device the run's timeline and verdicts are of.
        rows: One per GPU with a context, in index order.
        findings: What the figures show, most memory first.
        children: Processes this one started that hold memory on a GPU (not DataLoader workers, not
            children that record their own capture): ``"pid 812 (python3 child.py, started at
            launch.py:14): cuda:0 518.00 MiB, cuda:1 3.10 GiB"``.

    Example:
        >>> r = GpusReport("cuda:1", (GpuRow("cuda:1", peak_allocated=1 << 30, watched=True),))
        >>> print(r)  # doctest: +NORMALIZE_WHITESPACE
        GPUs this process used (timeline of cuda:1):
          cuda:1 (watched)   allocated n/a   peak 1.00 GiB   reserved n/a   process n/a
    """

    watched: str
    rows: tuple[GpuRow, ...] = ()
    findings: tuple[GpuFinding, ...] = ()
    children: tuple[str, ...] = ()

    @property
    def several(self) -> bool:
        """Whether the process used more than one GPU (the table is worth showing)."""
        return len(self.rows) > 1

    def row(self, device: str) -> GpuRow | None:
        return next((r for r in self.rows if r.device == device), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "watched": self.watched,
            "rows": [r.to_dict() for r in self.rows],
            "findings": [f.to_dict() for f in self.findings],
            "children": list(self.children),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> GpusReport:
        return from_mapping(cls, d)

    def lines(self) -> list[str]:
        out = [f"GPUs this process used (timeline of {self.watched}):"]
        for r in self.rows:
            label = f"{r.device}{' (watched)' if r.watched else ''}"
            out.append(
                f"  {label:<18} allocated {fmt_bytes(r.allocated)}   peak {fmt_bytes(r.peak_allocated)}   "
                f"reserved {fmt_bytes(r.reserved)}   process {fmt_bytes(r.process_used)}"
            )
        for f in self.findings:
            out.append(f"  {f}")
        for c in self.children:
            out.append(f"  child process {c}")
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())


__all__ = ["FINDING_KINDS", "GpuFinding", "GpuRow", "GpusReport"]
