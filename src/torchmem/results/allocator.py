"""The allocator state an out-of-memory diagnosis reads, as plain data, and what it says about fragmentation.

* :class:`AllocatorState` — the allocator and the device at one moment, what the OOM observer captures:
  ``torch.cuda.memory_snapshot()``'s :class:`Segment` s and their :class:`Block` s, the counters, the
  driver's figures, the :class:`OtherProcess` es on the device.
* :class:`FragmentationReport` — what the free cache looks like (per pool and stream: :class:`PoolFree`) and
  whether a request fits, as :func:`torchmem.analysis.fragmentation.analyze_fragmentation` finds it.

Frozen dataclasses with ``to_dict()`` / ``from_dict()`` and a plain-text ``str()``; re-exported by
:mod:`torchmem.results.oom`. Nothing here touches torch or a device.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torchmem._format import fmt_bytes
from torchmem.results._dicts import ResultFormatError, from_mapping

# ---------------------------------------------------------------------------------------------------------
# the allocator state (torch.cuda.memory_snapshot() as plain data)

#: A block free in the cache.
FREE = "inactive"
#: A block a tensor uses.
ALLOCATED = "active_allocated"
#: A block freed but awaiting another stream.
PENDING = ("active_awaiting_free", "active_pending_free")


def _optional_int(raw: Mapping[str, Any], key: str) -> int | None:
    value = raw.get(key)
    return None if value is None else int(value)


@dataclass(frozen=True)
class Block:
    """One block of a segment (``memory_snapshot()`` block).

    Attributes:
        size: Bytes of the block.
        state: ``"active_allocated"`` (a tensor uses it), ``"active_awaiting_free"`` (freed, waiting for
            another stream) or ``"inactive"`` (free in the cache).
        requested_size: What the caller asked for (``None`` if not recorded); ``size - requested_size`` is
            rounding waste.
        address: Device address, when recorded.
    """

    size: int
    state: str
    requested_size: int | None = None
    address: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "size": self.size,
            "state": self.state,
            "requested_size": self.requested_size,
            "address": self.address,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Block:
        """A block as ``to_dict()`` writes it, or as ``torch.cuda.memory_snapshot()`` gives it (extra keys
        such as ``frames`` are ignored; a block without a state is free)."""
        try:
            return cls(
                size=int(d["size"]),
                state=str(d.get("state", FREE)),
                requested_size=_optional_int(d, "requested_size"),
                address=_optional_int(d, "address"),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ResultFormatError(f"a stored Block is not readable: {type(e).__name__}: {e}") from e

    def __str__(self) -> str:
        return f"{fmt_bytes(self.size)} {self.state}"


@dataclass(frozen=True)
class Segment:
    """One segment the allocator obtained from the driver (``memory_snapshot()`` segment).

    Attributes:
        total_size: Bytes of the segment.
        allocated_size: Bytes of its blocks in use by tensors.
        active_size: Bytes in use or awaiting free.
        stream: The stream the segment belongs to (blocks are reused only on their stream).
        segment_type: ``"large"`` or ``"small"`` (the pool).
        blocks: Its blocks, in address order.
        device: Device index.
        address: Device address.
        is_expandable: The segment is an expandable segment (``expandable_segments:True``).
        pool_id: The private pool owning it (CUDA graphs, mempools), ``None`` for the default pool.
    """

    total_size: int
    allocated_size: int
    active_size: int
    stream: int
    segment_type: str
    blocks: tuple[Block, ...]
    device: int | None = None
    address: int | None = None
    is_expandable: bool = False
    pool_id: tuple[int, int] | None = None

    @property
    def free_bytes(self) -> int:
        return sum(b.size for b in self.blocks if b.state == FREE)

    @property
    def largest_free(self) -> int:
        return max((b.size for b in self.blocks if b.state == FREE), default=0)

    @property
    def whole_free(self) -> bool:
        """Every block is free: ``empty_cache()`` returns this segment to the driver."""
        return self.active_size == 0 and all(b.state == FREE for b in self.blocks)

    @property
    def private(self) -> bool:
        return self.pool_id is not None and tuple(self.pool_id) != (0, 0)

    def to_dict(self) -> dict[str, Any]:
        """The segment in ``torch.cuda.memory_snapshot()``'s shape (``segment_pool_id`` for ``pool_id``)."""
        return {
            "device": self.device,
            "address": self.address,
            "total_size": self.total_size,
            "allocated_size": self.allocated_size,
            "active_size": self.active_size,
            "stream": self.stream,
            "segment_type": self.segment_type,
            "is_expandable": self.is_expandable,
            "segment_pool_id": None if self.pool_id is None else list(self.pool_id),
            "blocks": [b.to_dict() for b in self.blocks],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Segment:
        """A segment as ``to_dict()`` writes it, or as ``torch.cuda.memory_snapshot()`` gives it: missing
        sizes are summed from the blocks, a missing stream is 0 and a missing type ``"large"``."""
        try:
            blocks = tuple(Block.from_dict(b) for b in d.get("blocks", ()))
            allocated = d.get("allocated_size")
            active = d.get("active_size")
            pool = d.get("segment_pool_id")
            return cls(
                total_size=int(d["total_size"]),
                allocated_size=int(allocated)
                if allocated is not None
                else sum(b.size for b in blocks if b.state == ALLOCATED),
                active_size=int(active)
                if active is not None
                else sum(b.size for b in blocks if b.state != FREE),
                stream=int(d.get("stream", 0)),
                segment_type=str(d.get("segment_type", "large")),
                blocks=blocks,
                device=_optional_int(d, "device"),
                address=_optional_int(d, "address"),
                is_expandable=bool(d.get("is_expandable", False)),
                pool_id=None if pool is None else (int(pool[0]), int(pool[1])),
            )
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
            raise ResultFormatError(f"a stored Segment is not readable: {type(e).__name__}: {e}") from e

    def __str__(self) -> str:
        return (
            f"{self.segment_type} segment of {fmt_bytes(self.total_size)} on stream {self.stream}: "
            f"{fmt_bytes(self.allocated_size)} allocated, {fmt_bytes(self.free_bytes)} free in "
            f"{len(self.blocks)} block(s)"
        )


@dataclass(frozen=True)
class OtherProcess:
    """Another process using the device (NVML)."""

    pid: int
    used: int | None
    name: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"pid": self.pid, "used": self.used, "name": self.name}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> OtherProcess:
        return from_mapping(cls, d)

    def __str__(self) -> str:
        return f"process {self.pid}" + (f" ({self.name})" if self.name else "") + f": {fmt_bytes(self.used)}"


@dataclass(frozen=True)
class AllocatorState:
    """The allocator and device at one moment, as plain data (what the OOM observer captures).

    Attributes:
        device: ``"cuda:0"`` and the like.
        segments: The segment list (``None`` when it could not be read).
        stats: Flat ``memory_stats()`` counters (``"allocated_bytes.all.current"``...), or ``None``.
        device_total: Device memory in all (or the per-process limit when one is set, see ``limit``).
        device_free: Free device memory as the driver reports it.
        limit: The per-process limit (``set_per_process_memory_fraction``), ``None`` when none is set.
        process_used: This process's device usage as the driver sees it.
        other_processes: Other processes on the device, ``None`` when unknown.
        requested: The request that failed, when captured at an OOM.
        alloc_conf: ``PYTORCH_CUDA_ALLOC_CONF`` (or the HIP one) in effect, ``None`` if unset.
        platform: ``"cuda"`` or ``"rocm"``.
        timestamp: ``time.time()`` of the capture.
        snapshot_file: A memory_viz snapshot written at the same moment, if any.
        grad_enabled: Whether autograd was recording on the thread that hit the OOM.
        notes: What could not be read, and why.
    """

    device: str = "cuda:0"
    segments: tuple[Segment, ...] | None = None
    stats: Mapping[str, int] | None = None
    device_total: int | None = None
    device_free: int | None = None
    limit: int | None = None
    process_used: int | None = None
    other_processes: tuple[OtherProcess, ...] | None = None
    requested: int | None = None
    alloc_conf: str | None = None
    platform: str = "cuda"
    timestamp: float | None = None
    snapshot_file: str | None = None
    grad_enabled: bool | None = None
    notes: tuple[str, ...] = field(default=())

    @classmethod
    def from_snapshot(
        cls, segments: Iterable[Mapping[str, Any]], *, device_index: int | None = None, **kw: Any
    ) -> AllocatorState:
        """Build from ``torch.cuda.memory_snapshot()`` output (segments of every device; filtered by
        ``device_index`` when given) plus any other field as a keyword.

        Example:
            >>> s = AllocatorState.from_snapshot(
            ...     [{"device": 0, "total_size": 2097152, "allocated_size": 0, "active_size": 0,
            ...       "stream": 0, "segment_type": "small",
            ...       "blocks": [{"size": 2097152, "state": "inactive"}]}])
            >>> s.cached_free
            2097152
        """
        segs = tuple(
            Segment.from_dict(s)
            for s in segments
            if device_index is None or s.get("device") is None or int(s["device"]) == device_index
        )
        if device_index is not None and "device" not in kw:
            kw["device"] = f"cuda:{device_index}"
        return cls(segments=segs, **kw)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> AllocatorState:
        """Inverse of :meth:`to_dict` (also reads the JSON the GPU fixture script writes)."""
        return from_mapping(cls, d)

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "platform": self.platform,
            "segments": None if self.segments is None else [s.to_dict() for s in self.segments],
            "stats": None if self.stats is None else dict(self.stats),
            "device_total": self.device_total,
            "device_free": self.device_free,
            "limit": self.limit,
            "process_used": self.process_used,
            "other_processes": None
            if self.other_processes is None
            else [p.to_dict() for p in self.other_processes],
            "requested": self.requested,
            "alloc_conf": self.alloc_conf,
            "timestamp": self.timestamp,
            "snapshot_file": self.snapshot_file,
            "grad_enabled": self.grad_enabled,
            "notes": list(self.notes),
        }

    def summary_dict(self) -> dict[str, Any]:
        """The figures a diagnosis stores of its state, without the segments (``OOMDiagnosis.to_dict()``)."""
        return {
            "device": self.device,
            "reserved": self.reserved,
            "allocated": self.allocated,
            "cached_free": self.cached_free,
            "device_total": self.device_total,
            "device_free": self.device_free,
            "limit": self.limit,
            "process_used": self.process_used,
            "others_used": self.others_used,
            "segments": None if self.segments is None else len(self.segments),
            "snapshot_file": self.snapshot_file,
        }

    def _stat(self, key: str) -> int | None:
        if self.stats is None or key not in self.stats:
            return None
        return int(self.stats[key])

    @property
    def reserved(self) -> int | None:
        """Reserved bytes: the segments' total, else ``reserved_bytes.all.current``."""
        if self.segments is not None:
            return sum(s.total_size for s in self.segments)
        return self._stat("reserved_bytes.all.current")

    @property
    def allocated(self) -> int | None:
        """Allocated bytes: the segments' allocated total, else ``allocated_bytes.all.current``."""
        if self.segments is not None:
            return sum(s.allocated_size for s in self.segments)
        return self._stat("allocated_bytes.all.current")

    @property
    def cached_free(self) -> int | None:
        """Bytes of free (inactive) blocks in the cache."""
        if self.segments is not None:
            return sum(s.free_bytes for s in self.segments)
        r, a = self.reserved, self._stat("active_bytes.all.current")
        return None if r is None or a is None else r - a

    @property
    def ceiling(self) -> int | None:
        """What this process may use in all: the limit when one is set, else the device total."""
        return self.limit if self.limit is not None else self.device_total

    @property
    def others_used(self) -> int | None:
        if self.other_processes is None:
            return None
        return sum(p.used or 0 for p in self.other_processes)

    def __str__(self) -> str:
        segments = "segments unknown" if self.segments is None else f"{len(self.segments)} segment(s)"
        lines = [
            f"allocator state of {self.device}: reserved {fmt_bytes(self.reserved)}, allocated "
            f"{fmt_bytes(self.allocated)}, cached free {fmt_bytes(self.cached_free)} ({segments})",
            f"  device total {fmt_bytes(self.device_total)}, free {fmt_bytes(self.device_free)}"
            + (f", limit {fmt_bytes(self.limit)}" if self.limit is not None else ""),
        ]
        if self.requested is not None:
            lines.append(f"  requested {fmt_bytes(self.requested)}")
        lines += [f"  {p}" for p in self.other_processes or ()]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


@dataclass(frozen=True)
class PoolFree:
    """Free cache of one pool on one stream."""

    pool: str
    stream: int
    segments: int
    reserved: int
    free: int
    largest_free: int
    private: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "pool": self.pool,
            "stream": self.stream,
            "segments": self.segments,
            "reserved": self.reserved,
            "free": self.free,
            "largest_free": self.largest_free,
            "private": self.private,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PoolFree:
        return from_mapping(cls, d)

    def __str__(self) -> str:
        return (
            f"{self.pool} pool, stream {self.stream}{' (private pool)' if self.private else ''}: "
            f"{self.segments} segment(s), {fmt_bytes(self.free)} free, largest free block "
            f"{fmt_bytes(self.largest_free)}"
        )


@dataclass(frozen=True)
class FragmentationReport:
    """What the free cache looks like, and whether a request of ``request`` bytes fits.

    Attributes:
        request: The request examined (``None``: no request, figures only).
        rounded: The request as the allocator rounds it.
        pool: The pool it is served from (``"small"``/``"large"``).
        cached_free: Free bytes in the cache (all pools, all streams).
        largest_free: Largest single free block anywhere.
        largest_free_in_pool: Largest free block in the request's pool (default pools only).
        pools: Free cache per pool and stream.
        external_waste: Free bytes inside segments that also hold allocated blocks: pieces
            ``empty_cache()`` cannot return and only smaller requests can use.
        internal_waste: Rounding waste inside allocated blocks (``size - requested_size``), when recorded.
        whole_free: Bytes of entirely free segments (``empty_cache()`` returns them).
        pending_free: Bytes freed but awaiting another stream.
        fits_now: A free block of the request's pool is large enough.
        fits_after_empty_cache: Device free + whole free segments cover the request.
        fits_with_expandable: Device free + every free byte of the cache (page-rounded) cover it.
        expandable_in_use: Some segment already is expandable.
    """

    request: int | None
    rounded: int | None
    pool: str | None
    cached_free: int
    largest_free: int
    largest_free_in_pool: int | None
    pools: tuple[PoolFree, ...]
    external_waste: int
    internal_waste: int | None
    whole_free: int
    pending_free: int
    fits_now: bool | None
    fits_after_empty_cache: bool | None
    fits_with_expandable: bool | None
    expandable_in_use: bool

    def to_dict(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "pools"}
        out["pools"] = [p.to_dict() for p in self.pools]
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> FragmentationReport:
        return from_mapping(cls, d)

    def __str__(self) -> str:
        lines = [
            f"free in the cache: {fmt_bytes(self.cached_free)}, largest free block "
            f"{fmt_bytes(self.largest_free)}; external waste {fmt_bytes(self.external_waste)}, "
            f"whole free segments {fmt_bytes(self.whole_free)}"
        ]
        if self.request is not None:
            lines.append(
                f"request {fmt_bytes(self.request)} ({self.pool} pool): fits now {self.fits_now}, after "
                f"empty_cache() {self.fits_after_empty_cache}, with expandable segments "
                f"{self.fits_with_expandable}"
            )
        lines += [f"  {p}" for p in self.pools]
        return "\n".join(lines)


__all__ = [
    "ALLOCATED",
    "FREE",
    "PENDING",
    "AllocatorState",
    "Block",
    "FragmentationReport",
    "OtherProcess",
    "PoolFree",
    "Segment",
]
