"""The fields of an out-of-memory message (:class:`ParsedOOM`), with what each means, as the diagnosis and
``torchmem explain`` print them (:func:`field_lines`, :func:`render_fields`).

The parser that fills them is :mod:`torchmem.analysis.oom.messages`; re-exported by
:mod:`torchmem.results.oom`. Nothing here touches torch or a device.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from torchmem._format import fmt_bytes
from torchmem.results._dicts import ResultFormatError, from_mapping

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


__all__ = [
    "ALLOCATOR_SOURCES",
    "FORMAT_WORDS",
    "SOURCE_WORDS",
    "ParsedOOM",
    "field_lines",
    "render_fields",
]
