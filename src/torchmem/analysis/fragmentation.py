"""What the caching allocator's free cache says about fragmentation — pure functions.

:func:`analyze_fragmentation` answers "would N bytes fit?" for an :class:`AllocatorState`'s segments: the
largest free block per pool and stream, free bytes in split segments (external waste), rounding waste inside
allocated blocks (internal waste), and whether the request fits now, after ``empty_cache()``, or with
``expandable_segments``. One pass over the segments and their blocks; nothing touches a device.

The state itself (:class:`AllocatorState`, :class:`Segment`, :class:`Block`, :class:`OtherProcess`) and the
answer (:class:`FragmentationReport`, :class:`PoolFree`) are result types in :mod:`torchmem.results.oom`,
re-exported here for the old import path. The rules torch's allocator follows (512-byte rounding, the
1 MiB small-pool boundary, 2 MiB expandable pages) are the constants below.
"""

from __future__ import annotations

from collections.abc import Sequence

from torchmem.results.oom import (
    ALLOCATED,
    FREE,
    PENDING,
    AllocatorState,
    Block,
    FragmentationReport,
    OtherProcess,
    PoolFree,
    Segment,
)

#: The caching allocator rounds every request up to a multiple of this many bytes.
MIN_BLOCK = 512
#: Requests up to this size come from the small pool (2 MiB segments); larger ones from the large pool.
SMALL_REQUEST = 1 << 20
#: Granularity at which expandable segments map physical memory.
PAGE = 2 << 20


def round_request(size: int) -> int:
    """The size the caching allocator actually looks for: ``size`` rounded up to 512 bytes."""
    if size < MIN_BLOCK:
        return MIN_BLOCK
    return -(-size // MIN_BLOCK) * MIN_BLOCK


def pool_of(size: int) -> str:
    """``"small"`` for requests up to 1 MiB, ``"large"`` otherwise (the pool the allocator searches)."""
    return "small" if size <= SMALL_REQUEST else "large"


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


__all__ = [
    "ALLOCATED",
    "FREE",
    "MIN_BLOCK",
    "PAGE",
    "PENDING",
    "SMALL_REQUEST",
    "AllocatorState",
    "Block",
    "FragmentationReport",
    "OtherProcess",
    "PoolFree",
    "Segment",
    "analyze_fragmentation",
    "pool_of",
    "round_request",
]
