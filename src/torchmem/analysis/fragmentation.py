"""The caching allocator's state as plain data, and what it says about fragmentation — pure functions.

:class:`AllocatorState` holds what the device layer read at one moment: the segment list in the format of
``torch.cuda.memory_snapshot()`` (segments with their blocks), the flat ``memory_stats()`` counters, the
device's free/total figures and the other processes on the device. Built from plain dicts
(:meth:`AllocatorState.from_snapshot`, :meth:`AllocatorState.from_dict`), so every rule is testable on the
CPU with recorded data.

:func:`analyze_fragmentation` answers "would N bytes fit?": the largest free block per pool and stream, free
bytes in split segments (external waste), rounding waste inside allocated blocks (internal waste), and
whether the request fits now, after ``empty_cache()``, or with ``expandable_segments``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: The caching allocator rounds every request up to a multiple of this many bytes.
MIN_BLOCK = 512
#: Requests up to this size come from the small pool (2 MiB segments); larger ones from the large pool.
SMALL_REQUEST = 1 << 20
#: Granularity at which expandable segments map physical memory.
PAGE = 2 << 20

FREE = "inactive"
ALLOCATED = "active_allocated"
PENDING = ("active_awaiting_free", "active_pending_free")


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


def _segment(raw: Mapping[str, Any]) -> Segment:
    blocks = tuple(
        Block(
            size=int(b["size"]),
            state=str(b.get("state", FREE)),
            requested_size=None if b.get("requested_size") is None else int(b["requested_size"]),
            address=None if b.get("address") is None else int(b["address"]),
        )
        for b in raw.get("blocks", ())
    )
    allocated = raw.get("allocated_size")
    active = raw.get("active_size")
    pool = raw.get("segment_pool_id")
    return Segment(
        total_size=int(raw["total_size"]),
        allocated_size=int(allocated)
        if allocated is not None
        else sum(b.size for b in blocks if b.state == ALLOCATED),
        active_size=int(active) if active is not None else sum(b.size for b in blocks if b.state != FREE),
        stream=int(raw.get("stream", 0)),
        segment_type=str(raw.get("segment_type", "large")),
        blocks=blocks,
        device=None if raw.get("device") is None else int(raw["device"]),
        address=None if raw.get("address") is None else int(raw["address"]),
        is_expandable=bool(raw.get("is_expandable", False)),
        pool_id=None if pool is None else (int(pool[0]), int(pool[1])),
    )


@dataclass(frozen=True)
class OtherProcess:
    """Another process using the device (NVML)."""

    pid: int
    used: int | None
    name: str | None = None


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
            _segment(s)
            for s in segments
            if device_index is None or s.get("device") is None or int(s["device"]) == device_index
        )
        if device_index is not None and "device" not in kw:
            kw["device"] = f"cuda:{device_index}"
        return cls(segments=segs, **kw)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> AllocatorState:
        """Inverse of :meth:`to_dict` (also reads the JSON the GPU fixture script writes)."""
        others = d.get("other_processes")
        return cls(
            device=str(d.get("device", "cuda:0")),
            segments=None if d.get("segments") is None else tuple(_segment(s) for s in d["segments"]),
            stats=None if d.get("stats") is None else {str(k): int(v) for k, v in d["stats"].items()},
            device_total=d.get("device_total"),
            device_free=d.get("device_free"),
            limit=d.get("limit"),
            process_used=d.get("process_used"),
            other_processes=None
            if others is None
            else tuple(OtherProcess(int(p["pid"]), p.get("used"), p.get("name")) for p in others),
            requested=d.get("requested"),
            alloc_conf=d.get("alloc_conf"),
            platform=str(d.get("platform", "cuda")),
            timestamp=d.get("timestamp"),
            snapshot_file=d.get("snapshot_file"),
            grad_enabled=d.get("grad_enabled"),
            notes=tuple(d.get("notes", ())),
        )

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
            else [{"pid": p.pid, "used": p.used, "name": p.name} for p in self.other_processes],
            "requested": self.requested,
            "alloc_conf": self.alloc_conf,
            "timestamp": self.timestamp,
            "snapshot_file": self.snapshot_file,
            "grad_enabled": self.grad_enabled,
            "notes": list(self.notes),
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


def round_request(size: int) -> int:
    """The size the caching allocator actually looks for: ``size`` rounded up to 512 bytes."""
    if size < MIN_BLOCK:
        return MIN_BLOCK
    return -(-size // MIN_BLOCK) * MIN_BLOCK


def pool_of(size: int) -> str:
    """``"small"`` for requests up to 1 MiB, ``"large"`` otherwise (the pool the allocator searches)."""
    return "small" if size <= SMALL_REQUEST else "large"


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


def analyze_fragmentation(
    segments: Sequence[Segment], request: int | None = None, device_free: int | None = None
) -> FragmentationReport:
    """Fragmentation figures of a segment list and, given a request, whether it fits and how it could.

    Args:
        segments: Segments of one device (:attr:`AllocatorState.segments`).
        request: Bytes of the failed (or planned) request.
        device_free: Free device memory the driver reports, for the after-``empty_cache()`` and
            expandable-segments answers (``None``: those answers are ``None`` too).

    Example:
        >>> seg = Segment(8 << 20, 4 << 20, 4 << 20, 0, "large",
        ...               (Block(2 << 20, "active_allocated"), Block(2 << 20, "inactive"),
        ...                Block(2 << 20, "active_allocated"), Block(2 << 20, "inactive")))
        >>> r = analyze_fragmentation([seg], request=3 << 20, device_free=0)
        >>> r.cached_free >= (3 << 20), r.fits_now
        (True, False)
    """
    groups: dict[tuple[str, int, bool], list[Segment]] = {}
    for s in segments:
        groups.setdefault((s.segment_type, s.stream, s.private), []).append(s)
    pools = tuple(
        PoolFree(
            pool=k[0],
            stream=k[1],
            segments=len(v),
            reserved=sum(s.total_size for s in v),
            free=sum(s.free_bytes for s in v),
            largest_free=max((s.largest_free for s in v), default=0),
            private=k[2],
        )
        for k, v in sorted(groups.items())
    )
    cached_free = sum(s.free_bytes for s in segments)
    largest = max((s.largest_free for s in segments), default=0)
    whole = sum(s.total_size for s in segments if s.whole_free)
    external = sum(s.free_bytes for s in segments if not s.whole_free)
    pending = sum(b.size for s in segments for b in s.blocks if b.state in PENDING)
    alloc_blocks = [b for s in segments for b in s.blocks if b.state == ALLOCATED]
    internal: int | None = None
    if alloc_blocks and all(b.requested_size is not None for b in alloc_blocks):
        internal = sum(b.size - (b.requested_size or 0) for b in alloc_blocks)
    expandable = any(s.is_expandable for s in segments)
    rounded = pool = None
    in_pool: int | None = None
    fits_now = after = with_exp = None
    if request is not None:
        rounded = round_request(request)
        pool = pool_of(rounded)
        in_pool = max(
            (s.largest_free for s in segments if s.segment_type == pool and not s.private), default=0
        )
        fits_now = in_pool >= rounded
        if device_free is not None:
            after = device_free + whole >= rounded
            free_pages = sum((s.free_bytes // PAGE) * PAGE for s in segments if not s.private)
            with_exp = device_free + free_pages >= rounded
    return FragmentationReport(
        request=request,
        rounded=rounded,
        pool=pool,
        cached_free=cached_free,
        largest_free=largest,
        largest_free_in_pool=in_pool,
        pools=pools,
        external_waste=external,
        internal_waste=internal,
        whole_free=whole,
        pending_free=pending,
        fits_now=fits_now,
        fits_after_empty_cache=after,
        fits_with_expandable=with_exp,
        expandable_in_use=expandable,
    )
