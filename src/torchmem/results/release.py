"""What ``torchmem.release()`` and ``torchmem.scope()`` freed and what survived: :class:`ReleaseReport`,
:class:`ScopeReport`, and their plain-text rendering."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from torchmem._format import count, fmt_bytes
from torchmem.results._dicts import from_mapping


@dataclass(frozen=True)
class DeviceFigures:
    """Allocator and driver figures of one device before and after a release, in bytes."""

    device: str
    allocated_before: int | None
    allocated_after: int | None
    reserved_before: int | None
    reserved_after: int | None
    process_before: int | None
    process_after: int | None

    @property
    def allocated_freed(self) -> int | None:
        if self.allocated_before is None or self.allocated_after is None:
            return None
        return self.allocated_before - self.allocated_after

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DeviceFigures:
        return from_mapping(cls, d)


@dataclass(frozen=True)
class Remaining:
    """A tensor storage the released objects used that is still alive, and who holds it."""

    name: str
    device: str
    bytes: int
    reason: str
    paths: tuple[str, ...]

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Remaining:
        return from_mapping(cls, d)


@dataclass(frozen=True)
class ReleaseReport:
    """What :func:`release` did and what it achieved.

    Attributes:
        freed_bytes: Bytes of tensor storages the objects held that are now freed (exact, every device).
        released_tensors: Tensors emptied (or moved, with ``offload``).
        offloaded_bytes: Bytes copied to the offload device.
        devices: Allocator/driver figures per device, before and after.
        actions: What was done, in order.
        remaining: Storages the objects used that are still alive, each with its holder paths.
        skipped: Arguments that hold nothing, tensors on other devices.
        errors: Steps that failed (the report says exactly what was done before them).
        seconds: Wall time.
    """

    freed_bytes: int
    released_tensors: int
    offloaded_bytes: int
    devices: tuple[DeviceFigures, ...]
    actions: tuple[str, ...]
    remaining: tuple[Remaining, ...]
    skipped: tuple[str, ...]
    errors: tuple[str, ...]
    seconds: float

    @property
    def remaining_bytes(self) -> int:
        return sum(r.bytes for r in self.remaining)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["remaining_bytes"] = self.remaining_bytes
        return d

    def __str__(self) -> str:
        return render_release(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ReleaseReport:
        """The report stored as :meth:`to_dict` wrote it (``remaining_bytes`` is derived, not read)."""
        return from_mapping(cls, d)


_RELEASED_ATTR = "_torchmem_released"


def render_release(r: ReleaseReport) -> str:
    lines = [
        f"released {count(r.released_tensors, 'tensor')}: freed {fmt_bytes(r.freed_bytes)} of tensor storage"
        + (f", moved {fmt_bytes(r.offloaded_bytes)}" if r.offloaded_bytes else "")
        + f" in {r.seconds * 1000:.0f} ms"
    ]
    for d in r.devices:
        lines.append(
            f"  {d.device}: allocated {fmt_bytes(d.allocated_before)} -> {fmt_bytes(d.allocated_after)}, "
            f"reserved {fmt_bytes(d.reserved_before)} -> {fmt_bytes(d.reserved_after)}, "
            f"process {fmt_bytes(d.process_before)} -> {fmt_bytes(d.process_after)}"
        )
    for a in r.actions:
        lines.append(f"  done: {a}")
    if r.remaining:
        lines.append(f"  still alive: {fmt_bytes(r.remaining_bytes)} in {count(len(r.remaining), 'storage')}")
        for rem in r.remaining:
            lines.append(f"    {rem.name} ({fmt_bytes(rem.bytes)} on {rem.device}): {rem.reason}")
            for p in rem.paths:
                lines.append(f"      held by {p}")
            if not rem.paths:
                lines.append("      held by no path torchmem can name (C++ code, or a limit was hit)")
    for s in r.skipped:
        lines.append(f"  skipped: {s}")
    for e in r.errors:
        lines.append(f"  error: {e}")
    return "\n".join(lines)


@dataclass(frozen=True)
class ScopeReport:
    """What a :func:`scope` block allocated, what was freed at its end, and who holds the rest.

    Attributes:
        born_bytes: Bytes of tensor storages created inside the block.
        kept_bytes: Bytes still alive that belong to objects passed to :meth:`Scope.keep` — their tensors,
            and the tensors their autograd graphs saved for backward.
        survived_bytes: Bytes still alive that were *not* kept — each listed in ``survivors`` with holders.
        collected: Objects ``gc.collect()`` found unreachable at the end of the block.
        survivors: The storages that outlived the block without being kept.
        seconds: Time spent in the end-of-block work.
        devices: Every device the block allocated on (whether or not anything survived there); each was
            synchronised and its cache emptied.
        errors: End-of-block steps that failed (the block's own exception, if any, is never caught); the
            figures of the other steps are still given.
    """

    born_bytes: int
    kept_bytes: int
    survived_bytes: int
    collected: int
    survivors: tuple[Remaining, ...]
    seconds: float
    devices: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ScopeReport:
        """The report stored as :meth:`to_dict` wrote it."""
        return from_mapping(cls, d)

    def __str__(self) -> str:
        lines = [
            f"scope: {fmt_bytes(self.born_bytes)} allocated inside, {fmt_bytes(self.kept_bytes)} kept, "
            f"{fmt_bytes(self.survived_bytes)} still alive without being kept"
        ]
        for r in self.survivors:
            lines.append(f"  {r.name} ({fmt_bytes(r.bytes)} on {r.device})")
            lines += [f"    held by {p}" for p in r.paths] or ["    held by no path torchmem can name"]
        lines += [f"  error: {e}" for e in self.errors]
        return "\n".join(lines)


__all__ = ["DeviceFigures", "ReleaseReport", "Remaining", "ScopeReport", "render_release"]
