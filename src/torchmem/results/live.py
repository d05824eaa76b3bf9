"""Every live tensor on a device: :class:`LiveTensorReport` (``torchmem.live_tensors()``), its categories,
and its plain-text rendering."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from torchmem._format import count, fmt_bytes
from torchmem.results._dicts import from_mapping

PARAMETER = "parameter"
GRADIENT = "gradient"
OPTIMIZER_STATE = "optimizer state"
BUFFER = "buffer"
SAVED = "saved for backward"
OTHER = "other"
CATEGORIES = (PARAMETER, GRADIENT, OPTIMIZER_STATE, BUFFER, SAVED, OTHER)


@dataclass(frozen=True)
class LiveTensor:
    """One live storage on the device (views share it and are counted once)."""

    bytes: int
    shape: tuple[int, ...]
    dtype: str
    category: str
    name: str | None  # parameter/buffer path, or what autograd saved it for
    holder: str | None  # shortest readable holder path
    views: int  # Python tensors sharing the storage
    layout: str = "strided"  # "sparse_coo", "sparse_csr", ...: the storage is one part of a sparse tensor
    part: str | None = None  # which part of a sparse tensor: "values", "indices", "crow_indices", ...

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LiveTensor:
        return from_mapping(cls, d)


@dataclass(frozen=True)
class LiveTensorReport:
    """The device's live tensors, largest first, with totals that reconcile with the allocator.

    Attributes:
        device: The device.
        tensors: One entry per storage, largest first.
        by_category: Bytes per category (parameter, gradient, optimizer state, buffer, saved for
            backward, other).
        by_module: Bytes of parameters, buffers and gradients per top-level module, by its holder path.
        total: Sum of the storages' bytes.
        allocated: The allocator's allocated bytes at the same moment (``None`` where unknown).
        unexplained: ``allocated - total``: memory no live tensor explains (cuBLAS workspaces, allocator
            rounding, tensors only C++ code holds). Never hidden; ``None`` where ``allocated`` is unknown.
        rounding: Part of ``unexplained`` that is the allocator's 512-byte block rounding (CUDA).
        truncated: The holder search hit a limit (some ``holder`` fields are ``None``).
        unreadable: Live tensors on the device whose memory torchmem cannot read (a layout without a
            storage it knows, e.g. MKL-DNN), one line per layout with a count. They are not in ``total``:
            their bytes stay in ``unexplained``.

    Sparse tensors (COO, CSR, CSC, BSR, BSC) are counted by their parts: one entry per storage of their
    indices and values, with ``layout`` and ``part`` set, the sparse tensor's shape, and its holder.
    """

    device: str
    tensors: tuple[LiveTensor, ...]
    by_category: dict[str, int] = field(default_factory=dict)
    by_module: dict[str, int] = field(default_factory=dict)
    total: int = 0
    allocated: int | None = None
    unexplained: int | None = None
    rounding: int | None = None
    truncated: bool = False
    unreadable: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        return render_live(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LiveTensorReport:
        """The report stored as :meth:`to_dict` wrote it."""
        return from_mapping(cls, d)


def render_live(r: LiveTensorReport, top: int = 20) -> str:
    lines = [f"{r.device}: {count(len(r.tensors), 'live tensor storage')}, {fmt_bytes(r.total)}"]
    for cat, n in r.by_category.items():
        lines.append(f"  {cat:<20} {fmt_bytes(n):>12}")
    if r.allocated is not None:
        lines.append(f"  {'allocator allocated':<20} {fmt_bytes(r.allocated):>12}")
        extra = f" (of which block rounding {fmt_bytes(r.rounding)})" if r.rounding else ""
        lines.append(f"  {'not a live tensor':<20} {fmt_bytes(r.unexplained):>12}{extra}")
    for m, n in sorted(r.by_module.items(), key=lambda kv: -kv[1]):
        lines.append(f"  module {m}: {fmt_bytes(n)}")
    for t in r.tensors[:top]:
        shape = "x".join(str(d) for d in t.shape) or "scalar"
        who = t.name or t.holder or "?"
        lines.append(f"  {fmt_bytes(t.bytes):>12}  {t.category:<18} {shape:<16} {t.dtype:<9} {who}")
        if t.name and t.holder:
            lines.append(f"  {'':>12}  held by {t.holder}")
    if len(r.tensors) > top:
        lines.append(f"  ... {len(r.tensors) - top} more")
    if r.truncated:
        lines.append("  note: the holder search hit its limit; some holders are missing")
    return "\n".join(lines)


__all__ = [
    "BUFFER",
    "CATEGORIES",
    "GRADIENT",
    "OPTIMIZER_STATE",
    "OTHER",
    "PARAMETER",
    "SAVED",
    "LiveTensor",
    "LiveTensorReport",
    "render_live",
]
