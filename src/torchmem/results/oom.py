"""What an out-of-memory diagnosis returns, and its plain-text rendering.

* :class:`OOMEvent` — one out-of-memory error at the moment it was raised, caught by the program or not: the
  device, the request, the user's line, the OOM being handled when it was raised, and its diagnosis.
* :class:`OOMDiagnosis` — the ranked :class:`Cause` s, each with its evidence and :class:`Fix` es, the fields
  of the message (:class:`ParsedOOM`), the allocator state it used (:class:`AllocatorState`, its segments and
  blocks) and what that state says about fragmentation (:class:`FragmentationReport`), and the host memory a
  CPU out-of-memory was judged against (:class:`MachineMemory`).
* The evidence a caller hands to the diagnosis: :class:`PinnedTensor` (memory held by an old exception or a
  notebook's output), :class:`WorkingSetItem` (a holder of the working set) and :class:`LeakEvidence` (the
  growth a watcher measured, reduced to what the ``leak`` cause needs — not a leak report).

Every type is a frozen dataclass with ``to_dict()`` and a classmethod ``from_dict()`` (its inverse, through
:func:`torchmem.results._dicts.from_mapping`), and ``str()`` gives its plain text: ``str(diagnosis)`` is
what ``torchmem explain`` prints, :func:`render_diagnosis` with ``fields=True`` adds the message's fields.
The stored form of a diagnosis keeps a summary of its allocator state, not the segments: ``from_dict()``
gives ``state=None``. Nothing here touches torch or a device; rendering costs one pass over the causes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torchmem._format import fmt_bytes
from torchmem.results._dicts import ResultFormatError, from_mapping
from torchmem.results.oom_holders import HolderFix, MemoryHolder, OOMHolders, Situation

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


# ---------------------------------------------------------------------------------------------------------
# the parsed message

#: Who raised the error, in words (``ParsedOOM.source``).
SOURCE_WORDS = {
    "allocator": "PyTorch's caching allocator",
    "cuda_malloc_async": "PyTorch's cudaMallocAsync allocator backend",
    "mps_allocator": "PyTorch's MPS allocator (Apple GPU)",
    "xpu_allocator": "PyTorch's XPU allocator (Intel GPU)",
    "cpu_allocator": "PyTorch's CPU allocator (host RAM)",
    "torchmem_cap": "a cap set by torchmem (limit() or a hard budget) on its exact tensor ledger",
    "driver": "a CUDA/HIP call outside PyTorch's allocator",
    "cublas": "cuBLAS (outside PyTorch's allocator)",
    "cudnn": "cuDNN (outside PyTorch's allocator)",
    "nccl": "NCCL (outside PyTorch's allocator)",
}

#: The message layouts, in words (``ParsedOOM.format``).
FORMAT_WORDS = {
    "torch2": "torch 2.1+ sentences",
    "torch1": "torch 1.4–2.0 parenthesised list",
    "torch1_cached": "torch 1.0–1.3 ('cached')",
    "cuda_malloc_async": "backend:cudaMallocAsync table",
    "mps": "MPS allocator",
    "cpu": "CPU allocator",
    "torchmem": "torchmem's cap (limit() / budget(hard=True))",
    "library": "a library or driver status",
    "bare": "no figures",
    "observer": "the allocator's OOM observer, at the moment of the OOM (figures, no message yet)",
}

#: The sources that are one of PyTorch's allocators (or torchmem's cap), not the driver or a library.
ALLOCATOR_SOURCES = (
    "allocator",
    "cuda_malloc_async",
    "mps_allocator",
    "xpu_allocator",
    "cpu_allocator",
    "torchmem_cap",
)


@dataclass(frozen=True)
class ParsedOOM:
    """The fields of one OOM (or memory-error) message. ``None``: the message does not give the field.
    ``str()`` lists every field the message gave, with what it means.

    Attributes:
        text: The message as found (whitespace kept).
        is_oom: The message reports that memory ran out (in the allocator or elsewhere).
        source: Who ran out: ``"allocator"`` (PyTorch's caching allocator), ``"cuda_malloc_async"``,
            ``"mps_allocator"``, ``"xpu_allocator"``, ``"cpu_allocator"``, ``"torchmem_cap"`` (a cap set by
            :func:`torchmem.limit` or ``torchmem.budget(hard=True)``), ``"driver"`` (a CUDA/HIP call outside
            the allocator), ``"cublas"``, ``"cudnn"``, ``"nccl"``; ``None`` when not an OOM.
        backend: ``"cuda"``, ``"rocm"``, ``"mps"``, ``"xpu"`` or ``"cpu"``.
        format: Which message layout matched: ``"torch2"`` (2.1+ sentences), ``"torch1"`` (the
            parenthesised list of 1.x–2.0), ``"torch1_cached"`` (1.0–1.3: "cached"), ``"cuda_malloc_async"``,
            ``"mps"``, ``"cpu"``, ``"torchmem"`` (torchmem's cap), ``"library"`` (a library's status code),
            ``"bare"`` (no figures).
        exception_type: The exception name written before the message (``"torch.OutOfMemoryError"``).
        requested: Bytes of the request that failed.
        device_index: The GPU index in the message.
        device_total: The device's total memory.
        device_free: Free device memory when the request failed (all processes); for ``"torchmem_cap"``,
            what was left under the cap.
        allowed: The per-process limit, when ``set_per_process_memory_fraction`` (or MPS's watermark) set one;
            for ``"torchmem_cap"``, the cap.
        process_used: This process's device memory, PyTorch or not ("Including non-PyTorch memory...").
        other_processes: ``(pid, bytes)`` of every other process the message lists.
        allocated: Bytes PyTorch had allocated to tensors (private pools included).
        private_pools: Of ``allocated``, bytes in private pools (CUDA graphs).
        reserved: Bytes PyTorch's allocator held (allocated + cached).
        reserved_unallocated: Reserved by PyTorch but unallocated: the cache's free bytes.
        other_allocations: MPS: memory allocated outside PyTorch's MPS heaps.
        pool: MPS: the pool of the failed request.
        suggested_setting: The allocator setting the message itself suggests.
        error_code: The library's status or error code (``CUBLAS_STATUS_ALLOC_FAILED``, errno 12...).
        cap_owner: For ``"torchmem_cap"``: who set the cap (``"torchmem.limit()"``,
            ``"torchmem.budget(16.00 MiB)"``).
        precision: Bytes a printed figure may be off by (half its last digit), by field name.
        truncated: The message stops before fields its format always has.
        notes: What the parser noticed (e.g. this process is not named in the process list).
    """

    text: str
    is_oom: bool
    source: str | None = None
    backend: str | None = None
    format: str | None = None
    exception_type: str | None = None
    requested: int | None = None
    device_index: int | None = None
    device_total: int | None = None
    device_free: int | None = None
    allowed: int | None = None
    process_used: int | None = None
    other_processes: tuple[tuple[int, int], ...] = ()
    allocated: int | None = None
    private_pools: int | None = None
    reserved: int | None = None
    reserved_unallocated: int | None = None
    other_allocations: int | None = None
    pool: str | None = None
    suggested_setting: str | None = None
    error_code: str | None = None
    cap_owner: str | None = None
    precision: Mapping[str, int] = field(default_factory=dict)
    truncated: bool = False
    notes: tuple[str, ...] = ()

    @property
    def allocator_oom(self) -> bool:
        """The OOM was raised by a PyTorch allocator (not the driver or a library)."""
        return self.is_oom and self.source in ALLOCATOR_SOURCES

    @property
    def others_used(self) -> int:
        return sum(b for _, b in self.other_processes)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["other_processes"] = [{"pid": p, "used": b} for p, b in self.other_processes]
        out["precision"] = dict(self.precision)
        out["notes"] = list(self.notes)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ParsedOOM:
        """Inverse of :meth:`to_dict` (``other_processes`` is stored as ``{"pid", "used"}`` objects)."""
        try:
            others = tuple((int(p["pid"]), int(p["used"])) for p in d.get("other_processes") or ())
        except (KeyError, TypeError, ValueError) as e:
            raise ResultFormatError(f"ParsedOOM.other_processes: {type(e).__name__}: {e}") from e
        return from_mapping(cls, d, other_processes=others)

    def __str__(self) -> str:
        return render_fields(self)


def field_lines(p: ParsedOOM) -> list[tuple[str, str, str]]:
    """(field, value, meaning) for every field the message gave, in reading order."""
    rows: list[tuple[str, str, str]] = []

    def add(name: str, value: int | None, meaning: str) -> None:
        if value is not None:
            rows.append((name, fmt_bytes(value), meaning))

    if p.source:
        rows.append(("raised by", p.source, SOURCE_WORDS.get(p.source, p.source)))
    if p.backend:
        rows.append(("backend", p.backend, "the device kind"))
    if p.format:
        rows.append(("message format", p.format, FORMAT_WORDS.get(p.format, "")))
    if p.device_index is not None:
        rows.append(("GPU", str(p.device_index), "the device index as this process numbers it"))
    add(
        "requested",
        p.requested,
        "the block the allocator tried to get: the tensor's size rounded up (to 2 MiB; 20 MiB under 10 MiB)"
        if p.source == "allocator"
        else "the single allocation that failed",
    )
    cap = p.source == "torchmem_cap"
    add("device total", p.device_total, "the device's memory in all")
    add(
        "free under the cap" if cap else "device free",
        p.device_free,
        "what the cap left when the request failed"
        if cap
        else "free on the device, all processes, when the request failed",
    )
    add(
        "cap" if cap else "allowed",
        p.allowed,
        f"the cap set by {p.cap_owner}"
        if cap
        else "a per-process limit set by set_per_process_memory_fraction (or MPS's watermark)",
    )
    add("this process", p.process_used, "this process's device memory, PyTorch or not (nvidia-smi's row)")
    for pid, used in p.other_processes:
        rows.append(
            (f"process {pid}", fmt_bytes(used), "another process on the device (or this one, in a container)")
        )
    add(
        "allocated",
        p.allocated,
        "held by live tensors torchmem's ledger counts" if cap else "held by live tensors",
    )
    add("in private pools", p.private_pools, "of that, in private pools (CUDA graphs)")
    add("reserved", p.reserved, "held by PyTorch's cache from the driver: allocated + cached free")
    add(
        "reserved, unallocated",
        p.reserved_unallocated,
        "cached free pieces no tensor uses; too fragmented to serve the request",
    )
    add("other allocations", p.other_allocations, "MPS memory allocated outside PyTorch's heaps")
    if p.pool:
        rows.append(("pool", p.pool, "the MPS heap pool of the request"))
    if p.process_used is not None and p.reserved is not None:
        rows.append(
            (
                "outside PyTorch (derived)",
                fmt_bytes(max(0, p.process_used - p.reserved)),
                "this process minus reserved: CUDA context, cuBLAS/cuDNN workspaces, NCCL, other libraries",
            )
        )
    if p.suggested_setting:
        rows.append(("message suggests", p.suggested_setting, "torch's generic hint (judged below)"))
    if p.error_code:
        rows.append(("error code", p.error_code, "the library's status"))
    return rows


def render_fields(p: ParsedOOM) -> str:
    """The message's fields as an aligned table: field, value, what it means (``""`` when it gave none)."""
    rows = field_lines(p)
    if not rows:
        return ""
    w1 = max(len(r[0]) for r in rows)
    w2 = max((len(r[1]) for r in rows if len(r[1]) <= 16), default=8)
    return "\n".join(f"  {a:<{w1}}  {b:>{w2}}  {c}" for a, b, c in rows)


# ---------------------------------------------------------------------------------------------------------
# causes and fixes


@dataclass(frozen=True)
class Fix:
    """One concrete change, with the exact setting or code where there is one.

    Attributes:
        kind: ``"alloc_conf"``, ``"batch_size"``, ``"dtype"``, ``"checkpointing"``, ``"no_grad"``,
            ``"zero_grad"``, ``"item"``, ``"release"``, ``"processes"``, ``"limit"``, ``"chunk"``,
            ``"empty_cache"``, ``"leak"``.
        text: What to do and why, in a sentence.
        setting: The exact environment variable or code
            (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``).
    """

    kind: str
    text: str
    setting: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "text": self.text, "setting": self.setting}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Fix:
        return from_mapping(cls, d)

    def __str__(self) -> str:
        return "\n".join(_fix_lines(self, ""))


#: Every kind of cause, in the order the documentation lists them.
CAUSE_KINDS = (
    "too_large",
    "fragmentation",
    "other_processes",
    "leak",
    "pinned_by_exception",
    "working_set",
    "outside_allocator",
    "training_graph",
    "previous_outputs",
    "orphaned_optimizer",
    "autograd_cycle",
)

#: A cause's kind, in words.
CAUSE_TITLES = {
    "too_large": "request too large",
    "fragmentation": "fragmentation",
    "other_processes": "other processes",
    "leak": "leak",
    "pinned_by_exception": "memory pinned by an exception's frames / notebook output",
    "working_set": "working set",
    "outside_allocator": "memory error outside PyTorch's allocator",
    "training_graph": "a training graph kept alive during evaluation",
    "previous_outputs": "the previous batch's outputs kept",
    "orphaned_optimizer": "an optimizer of a deleted model",
    "autograd_cycle": "a cycle through autograd",
}


@dataclass(frozen=True)
class Cause:
    """One cause of the OOM with its evidence.

    Attributes:
        kind: ``"too_large"``, ``"fragmentation"``, ``"other_processes"``, ``"leak"``,
            ``"pinned_by_exception"``, ``"working_set"``, ``"outside_allocator"``, or a situation the
            holders of the memory show (:data:`~torchmem.results.oom_holders.SITUATION_KINDS`):
            ``"training_graph"``, ``"previous_outputs"``, ``"orphaned_optimizer"``, ``"autograd_cycle"``.
        summary: One sentence.
        evidence: The figures behind it, one per line.
        bytes: The bytes this cause accounts for (shortfall, free cache, other processes' use...).
        confidence: ``"high"``, ``"medium"`` or ``"low"``.
        fixes: The fixes this evidence supports.
        score: How strongly the evidence points at this cause; the diagnosis ranks causes by it.
    """

    kind: str
    summary: str
    evidence: tuple[str, ...]
    bytes: int | None
    confidence: str
    fixes: tuple[Fix, ...] = ()
    score: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "summary": self.summary,
            "evidence": list(self.evidence),
            "bytes": self.bytes,
            "confidence": self.confidence,
            "fixes": [f.to_dict() for f in self.fixes],
            "score": self.score,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Cause:
        return from_mapping(cls, d)

    def __str__(self) -> str:
        return "\n".join(_cause_lines(self))


def _cause_lines(c: Cause) -> list[str]:
    return [f"[{c.confidence}] {CAUSE_TITLES.get(c.kind, c.kind)}: {c.summary}"] + [
        f"     {e}" for e in c.evidence
    ]


def _fix_lines(f: Fix, indent: str) -> list[str]:
    return [f"{indent}- {f.text}"] + ([f"{indent}    {f.setting}"] if f.setting else [])


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


# ---------------------------------------------------------------------------------------------------------
# the diagnosis


@dataclass(frozen=True)
class OOMDiagnosis:
    """Why an allocation failed, ranked, with evidence and fixes. ``str()`` explains it in plain words.

    Attributes:
        is_oom: The input was an out-of-memory error.
        parsed: The fields of the message (``None`` when no message was given or found).
        causes: Causes, most likely first.
        fixes: Every cause's fixes, deduplicated, in rank order.
        state: The allocator state the diagnosis used (``None``: the message alone, or a diagnosis read back
            from its stored form, which keeps only a summary of the state).
        fragmentation: Fragmentation figures from the state, when there was one.
        settings: Allocator settings in effect (parsed ``PYTORCH_CUDA_ALLOC_CONF``).
        notes: What could not be known, and why.
        machine: The host memory a CPU OOM was judged against (``None``: not a CPU OOM, or unknown).
        holders: Who held the memory of the OOM's device (:class:`~torchmem.results.oom_holders.OOMHolders`:
            the largest holders with their bytes, what has no holder, what no live tensor explains, and the
            situations behind them); ``None`` for a pasted message or where they could not be read.
    """

    is_oom: bool
    parsed: ParsedOOM | None
    causes: tuple[Cause, ...]
    fixes: tuple[Fix, ...]
    state: AllocatorState | None = None
    fragmentation: FragmentationReport | None = None
    settings: Mapping[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    machine: MachineMemory | None = None
    holders: OOMHolders | None = None

    @property
    def cause(self) -> Cause | None:
        """The most likely cause."""
        return self.causes[0] if self.causes else None

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(c.kind for c in self.causes)

    def __str__(self) -> str:
        return render_diagnosis(self)

    def to_dict(self) -> dict[str, Any]:
        """Everything but the state's segments: ``state`` is :meth:`AllocatorState.summary_dict`."""
        return {
            "is_oom": self.is_oom,
            "parsed": None if self.parsed is None else self.parsed.to_dict(),
            "causes": [c.to_dict() for c in self.causes],
            "fixes": [f.to_dict() for f in self.fixes],
            "fragmentation": None if self.fragmentation is None else self.fragmentation.to_dict(),
            "state": None if self.state is None else self.state.summary_dict(),
            "settings": dict(self.settings),
            "notes": list(self.notes),
            "machine": None if self.machine is None else self.machine.to_dict(),
            "holders": None if self.holders is None else self.holders.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> OOMDiagnosis:
        """Inverse of :meth:`to_dict`, but for the allocator state: the stored summary does not hold the
        segments, so ``state`` is ``None``."""
        return from_mapping(cls, d, state=None)


@dataclass(frozen=True)
class OOMEvent:
    """One out-of-memory error, recorded at the moment it was raised — whether the program then caught it
    or not (:func:`torchmem.capture.oom.watch_ooms` delivers these). ``str()`` is two or three lines: where,
    what, and the most likely cause with its first fix.

    Attributes:
        index: The number of this OOM in the process (1, 2, ...), all devices together.
        device: ``"cuda:0"``, ``"cpu"`` (a cap set by ``torchmem.limit()`` / ``budget(hard=True)``)...
        requested: The request that failed, in bytes (the allocator's rounded block on CUDA).
        site: The user's line that raised it, ``"train.py:12"``: the innermost frame outside torch, torchmem
            and the standard library (``None``: no such frame, e.g. autograd's backward thread).
        function: The function of that line.
        filename: The full path of that line's file.
        thread: The name of the thread that raised it.
        timestamp: ``time.time()`` of the OOM.
        while_handling: The type of the out-of-memory error that was being handled on that thread when this
            one was raised (``"torch.OutOfMemoryError"``): a retry inside an ``except`` block, while the
            failed attempt's frames — and their tensors — are still alive. ``None``: none was.
        handling_index: The ``index`` of that earlier OOM, when it was recorded too.
        source: Who raised it: ``"allocator"`` (PyTorch's caching allocator) or ``"torchmem_cap"``.
        detail: ``"full"`` (allocator segments, other processes and pinned memory were read) or ``"brief"``
            (a later OOM of a long run of them: the figures of the moment only, to keep each one cheap).
        diagnosis: The :class:`OOMDiagnosis` made at that moment (``None`` if it could not be made). Who held
            the memory is looked for where the error reached the program (the ``except`` that caught it), not
            at the moment, inside the allocator: the diagnosis is then completed with
            :attr:`OOMDiagnosis.holders` and the causes they show — on this event object, in place (the one
            update a frozen event gets), shortly after its callback ran.
    """

    index: int
    device: str
    requested: int | None = None
    site: str | None = None
    function: str | None = None
    filename: str | None = None
    thread: str | None = None
    timestamp: float | None = None
    while_handling: str | None = None
    handling_index: int | None = None
    source: str | None = None
    detail: str = "full"
    diagnosis: OOMDiagnosis | None = None

    def _complete(self, diagnosis: OOMDiagnosis) -> None:
        """Replace the diagnosis made at the moment by the one completed with the holders of the memory (see
        ``diagnosis``); only :mod:`torchmem.capture.oom` calls this."""
        object.__setattr__(self, "diagnosis", diagnosis)

    @property
    def kind(self) -> str | None:
        """The most likely cause's kind (``"pinned_by_exception"``, ``"fragmentation"``...), if any."""
        d = self.diagnosis
        return d.causes[0].kind if d is not None and d.causes else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "device": self.device,
            "requested": self.requested,
            "site": self.site,
            "function": self.function,
            "filename": self.filename,
            "thread": self.thread,
            "timestamp": self.timestamp,
            "while_handling": self.while_handling,
            "handling_index": self.handling_index,
            "source": self.source,
            "detail": self.detail,
            "diagnosis": None if self.diagnosis is None else self.diagnosis.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> OOMEvent:
        """Inverse of :meth:`to_dict` (the diagnosis comes back without its allocator state's segments)."""
        return from_mapping(cls, d)

    def __str__(self) -> str:
        where = f" at {self.site}" if self.site else ""
        if self.site and self.function:
            where += f" in {self.function}()"
        head = f"OOM #{self.index} on {self.device}{where}"
        if self.requested is not None:
            head += f": {fmt_bytes(self.requested)} requested"
        if self.while_handling:
            earlier = f" (OOM #{self.handling_index})" if self.handling_index is not None else ""
            head += f", raised while handling an earlier {self.while_handling}{earlier}"
        lines = [head]
        d = self.diagnosis
        if d is not None and d.causes:
            lines.append("  " + _cause_lines(d.causes[0])[0])
        if d is not None and d.fixes:
            lines += _fix_lines(d.fixes[0], "  ")
        return "\n".join(lines)


def render_diagnosis(d: OOMDiagnosis, fields: bool = False) -> str:
    """The diagnosis in plain words: the causes ranked with their evidence, then the fixes; with ``fields``,
    every field of the message first (what ``torchmem explain`` prints)."""
    if not d.is_oom:
        lines = ["Not an out-of-memory error."]
        if d.parsed is not None and d.parsed.error_code:
            lines.append(f"  ({d.parsed.error_code})")
        lines += [f"note: {n}" for n in d.notes]
        return "\n".join(lines)
    p = d.parsed
    head = "Out of memory"
    if p is not None:
        where = f" on GPU {p.device_index}" if p.device_index is not None else ""
        if p.source == "torchmem_cap":
            where = f" on {p.backend}" + (f":{p.device_index}" if p.device_index is not None else "")
        req = f": {fmt_bytes(p.requested)} requested" if p.requested is not None else ""
        head += f"{where}{req} ({SOURCE_WORDS.get(p.source or '', p.source or 'unknown')})"
    elif d.state is not None:
        head += f" on {d.state.device}"
        if d.state.requested is not None:
            head += f": {fmt_bytes(d.state.requested)} requested"
    lines = [head]
    if fields and p is not None:
        lines.append("")
        lines.append("What the message says:")
        lines.append(render_fields(p))
    if d.causes:
        lines.append("")
        lines.append("Causes, most likely first:")
        for i, c in enumerate(d.causes, 1):
            first, *evidence = _cause_lines(c)
            lines.append(f"{i}. {first}")
            lines += evidence
    else:
        lines.append("No cause can be judged from what is known.")
    if d.holders is not None:
        lines.append("")
        lines += d.holders.lines()
    if d.fixes:
        lines.append("")
        lines.append("Fixes:")
        for f in d.fixes:
            lines += _fix_lines(f, "  ")
    if d.settings:
        lines.append("")
        lines.append("Allocator settings in effect: " + ",".join(f"{k}:{v}" for k, v in d.settings.items()))
    if d.state is not None and d.state.snapshot_file:
        lines.append(f"Snapshot for https://pytorch.org/memory_viz: {d.state.snapshot_file}")
    for n in d.notes:
        lines.append(f"note: {n}")
    return "\n".join(lines)


@dataclass(frozen=True)
class OOMRecovery:
    """What an OOM handler found and freed.

    Attributes:
        error: ``"OutOfMemoryError: CUDA out of memory. Tried to allocate ..."`` (first line).
        devices: The devices recovered (the OOM's device kind).
        diagnosis: The :class:`OOMDiagnosis` (``None`` if it could not be made).
        freed_bytes: Bytes of tensor storages the cleared frames (and notebook history) held that are now
            freed. Exact: each storage is followed by a weak reference.
        allocated_before / allocated_after: The device's allocated bytes when the handler started and
            ended (first device; ``None`` where unknown, e.g. the CPU without the ledger).
        reserved_before / reserved_after: Likewise for the allocator's reserved bytes.
        frames_cleared: Finished frames of the program (not torch's or torchmem's) whose locals were dropped.
        actions: What was done, in order.
        errors: Steps that failed (recovery goes on after each).
        reraised: Whether the exception was re-raised after recovery.
        seconds: Time the handler took.
    """

    error: str
    devices: tuple[str, ...]
    diagnosis: OOMDiagnosis | None
    freed_bytes: int
    allocated_before: int | None
    allocated_after: int | None
    reserved_before: int | None
    reserved_after: int | None
    frames_cleared: int
    actions: tuple[str, ...]
    errors: tuple[str, ...]
    reraised: bool
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        diag = self.diagnosis
        return {
            "error": self.error,
            "devices": list(self.devices),
            "diagnosis": diag.to_dict() if diag is not None else None,
            "freed_bytes": self.freed_bytes,
            "allocated_before": self.allocated_before,
            "allocated_after": self.allocated_after,
            "reserved_before": self.reserved_before,
            "reserved_after": self.reserved_after,
            "frames_cleared": self.frames_cleared,
            "actions": list(self.actions),
            "errors": list(self.errors),
            "reraised": self.reraised,
            "seconds": self.seconds,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> OOMRecovery:
        """The recovery stored as :meth:`to_dict` wrote it."""
        return from_mapping(cls, d)

    def summary(self) -> str:
        """One line: what came back and how it was measured, or why nothing did."""
        dev = self.devices[0] if self.devices else "the device"
        if self.freed_bytes:
            text = (
                f"torchmem: freed {fmt_bytes(self.freed_bytes)} on {dev}: tensor storages the finished "
                "frames of the error held (each followed by a weak reference)"
            )
        elif self.frames_cleared:
            n = self.frames_cleared
            text = (
                f"torchmem: freed nothing on {dev}: the {n} finished frame{'s' if n > 1 else ''} of the "
                "error held no tensor that nothing else holds"
            )
        else:
            text = (
                f"torchmem: freed nothing on {dev}: the error was raised in a frame still running (the one "
                "with the `with` block), whose variables stay alive; put the work in a function to free them"
            )
        if self.allocated_before is not None and self.allocated_after is not None:
            # On the CPU the figure is torchmem's tensor ledger (on under limit()/cpu_tracking()).
            what = "torchmem's CPU tensor ledger" if dev == "cpu" else "allocated"
            text += (
                f" ({what} {fmt_bytes(self.allocated_before)} -> {fmt_bytes(self.allocated_after)}"
                + (
                    f", reserved {fmt_bytes(self.reserved_before)} -> {fmt_bytes(self.reserved_after)}"
                    if self.reserved_before is not None
                    else ""
                )
                + ")"
            )
        return text + "."

    def __str__(self) -> str:
        lines = []
        if self.diagnosis is not None:
            lines.append(str(self.diagnosis).rstrip())
        else:
            lines.append(self.error)
        lines.append(self.summary())
        lines.extend(f"torchmem: recovery step failed: {e}" for e in self.errors)
        return "\n".join(lines)


__all__ = [
    "ALLOCATED",
    "ALLOCATOR_SOURCES",
    "CAUSE_KINDS",
    "CAUSE_TITLES",
    "FORMAT_WORDS",
    "FREE",
    "PENDING",
    "SOURCE_WORDS",
    "AllocatorState",
    "Block",
    "Cause",
    "Fix",
    "FragmentationReport",
    "HolderFix",
    "LeakEvidence",
    "LeakSite",
    "MachineMemory",
    "MemoryHolder",
    "OOMDiagnosis",
    "OOMEvent",
    "OOMHolders",
    "OOMRecovery",
    "OtherProcess",
    "ParsedOOM",
    "PinnedTensor",
    "PoolFree",
    "Segment",
    "Situation",
    "WorkingSetItem",
    "field_lines",
    "render_diagnosis",
    "render_fields",
]
