"""What a tracked block did to a device's memory: :class:`TrackResult` (``torchmem.track()``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from torchmem._format import count, fmt_bytes
from torchmem.results._dicts import from_mapping


@dataclass(frozen=True)
class TrackResult:
    """What one tracked block did to a device's memory, in bytes.

    Attributes:
        device: The device measured.
        allocated_before / allocated_after: allocated bytes at entry and exit.
        delta: ``allocated_after - allocated_before``.
        peak: Highest allocated bytes while the block ran (absolute), ``None`` if the device has no peaks.
        peak_delta: ``peak - allocated_before``: the extra memory the block needed at its worst.
        reserved_before / reserved_after: the allocator's reserved bytes (``None`` on CPU).
        born: Bytes of tensor storages created inside the block (``None`` with ``survivors=False``).
        survived: Bytes of those storages still alive at exit — what the block left behind.
        survived_tensors: How many storages survived.
        seconds: Wall time of the block.
    """

    device: str
    allocated_before: int | None
    allocated_after: int | None
    delta: int | None
    peak: int | None
    peak_delta: int | None
    reserved_before: int | None
    reserved_after: int | None
    born: int | None
    survived: int | None
    survived_tensors: int | None
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        return render_track(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TrackResult:
        """The result stored as :meth:`to_dict` wrote it."""
        return from_mapping(cls, d)


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


__all__ = ["TrackResult", "render_track"]
