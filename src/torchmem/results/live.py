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
    # a holder path: the name itself for a parameter, buffer, gradient or optimizer state of a module or
    # optimizer the program reaches; else the shortest path found
    holder: str | None
    views: int  # Python tensors sharing the storage
    layout: str = "strided"  # "sparse_coo", "sparse_csr", ...: the storage is one part of a sparse tensor
    part: str | None = None  # which part of a sparse tensor: "values", "indices", "crow_indices", ...

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LiveTensor:
        return from_mapping(cls, d)


@dataclass(frozen=True)
class OwnerGroup:
    """The live tensors one object owns, for the report's summary.

    Attributes:
        owner: The module or optimizer that names them, or the variable their holder paths start from
            (``__main__.metric``; a frame's local); ``"?"`` for tensors whose holder was not found.
        type: The owner's type (``Adam``, ``BinaryAUROC``); ``"Tensor"`` for a variable that is a tensor.
        bytes: Their storages' bytes.
        counts: Storages per category.
    """

    owner: str
    type: str
    bytes: int
    counts: dict[str, int] = field(default_factory=dict)

    def line(self) -> str:
        parts = ", ".join(_count_category(n, c) for c, n in self.counts.items())
        what = f" ({self.type})" if self.type and self.type != "Tensor" else ""
        return f"{fmt_bytes(self.bytes):>12}  {self.owner}{what}: {parts}"


def _head(path: str) -> str:
    """``"__main__.opt.state[...]"`` -> ``"__main__.opt"``: the variable a path starts from."""
    cut = len(path)
    dots = 0
    for i, ch in enumerate(path):
        if ch == "[" or (ch == "." and dots == 1):
            cut = i
            break
        if ch == ".":
            dots += 1
    return path[:cut]


def _count_category(n: int, category: str) -> str:
    plural = {"parameter": "parameters", "gradient": "gradients", "buffer": "buffers"}
    return f"{n} {plural.get(category, category) if n != 1 else category}"


@dataclass(frozen=True)
class TensorCycle:
    """Tensors a reference cycle keeps alive, grouped by the kind of cycle (an autograd cycle: one per
    connected second-order graph).

    Attributes:
        kind: ``"autograd"`` (the cycle runs through autograd's C++ graph: a gradient made with
            ``create_graph=True`` stored in ``.grad``, whose graph saved the tensor itself) or ``"python"``
            (Python references only).
        collectable: Whether ``gc.collect()`` frees it. A cycle through autograd's C++ graph is invisible to
            the garbage collector: it stays until a reference in it is dropped.
        tensors: How many storages it keeps: the tensors on it, their gradients and what the gradients'
            graphs saved.
        bytes: Their bytes.
        paths: Up to three paths round the cycle, from a tensor round to itself
            (``__main__.x.grad.grad_fn -> saved tensor of MulBackward0 (_saved_other) -> the same tensor``),
            or for a Python cycle its members' holder paths.
        fix: What to change.
        held_by: Where the program still reaches an autograd cycle (its tensors' holder paths; empty: only the
            cycle keeps it, a leak). Dropping those references frees nothing: the cycle must be broken.
        cycles: How many separate autograd cycles this entry sums (one per connected second-order graph).
    """

    kind: str
    collectable: bool
    tensors: int
    bytes: int
    paths: tuple[str, ...]
    fix: str
    held_by: tuple[str, ...] = ()
    cycles: int = 1

    def line(self) -> str:
        gc_word = "gc.collect() frees it" if self.collectable else "gc.collect() cannot free it"
        what = "autograd's graph" if self.kind == "autograd" else "Python references"
        n = count(self.tensors, "tensor storage")
        cycle = "a reference cycle" if self.cycles <= 1 else f"{self.cycles} reference cycles"
        if self.held_by:
            return (
                f"{n}, {fmt_bytes(self.bytes)} in {cycle} through {what}, still reached from "
                f"{self.held_by[0]}: dropping that reference will not free them ({gc_word})"
            )
        return f"{n}, {fmt_bytes(self.bytes)} kept only by {cycle} through {what} ({gc_word})"


@dataclass(frozen=True)
class LiveTensorReport:
    """The device's live tensors, largest first, with totals that reconcile with the allocator.

    Attributes:
        device: The device.
        tensors: One entry per storage, largest first.
        by_category: Bytes per category (parameter, gradient, optimizer state, buffer, saved for
            backward, other).
        by_module: Bytes of parameters, buffers and gradients per top-level module, by its holder path.
        total: The bytes of the storages' memory, memory that several storages share (``aliased``) counted
            once.
        allocated: The allocator's allocated bytes at the same moment (``None`` where unknown).
        unexplained: ``allocated - total``: memory no live tensor explains (cuBLAS workspaces, allocator
            rounding, tensors only C++ code holds). Never hidden, never negative (see ``excess``); ``None``
            where ``allocated`` is unknown.
        excess: ``total - allocated`` when the live tensors add up to more than the allocator counts (the
            two readings disagree: storages over memory the allocator does not count as allocated, such as
            CUDA-graph pool memory torch.compile reuses, or memory from another allocator); else 0.
        aliased: Bytes counted in more than one storage's ``bytes`` because separate storages share that
            memory (CUDA-graph outputs of torch.compile, ``from_blob``/DLPack views); ``total`` counts them
            once.
        rounding: Part of ``unexplained`` that is the allocator's 512-byte block rounding (CUDA).
        truncated: The holder search hit a limit (some ``holder`` fields are ``None``).
        unreadable: Live tensors on the device whose memory torchmem cannot read (a layout without a
            storage it knows, e.g. MKL-DNN), one line per layout with a count. They are not in ``total``:
            their bytes stay in ``unexplained``.
        cycles: Tensors only a reference cycle keeps alive, by kind of cycle, with the fix.
        frozen: Objects the program moved out of the collector's reach with ``gc.freeze()`` since torchmem
            was imported (the interpreter's own frozen objects left out): the heap walk cannot see them
            (CPython lists no frozen object), so tensors among them are missing from ``tensors`` (on a
            GPU their memory is in ``unexplained``); ``str()`` says so.
        owners: The tensors grouped by the object that owns them, most bytes first (what ``str()`` shows
            before the largest tensors).

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
    cycles: tuple[TensorCycle, ...] = ()
    excess: int = 0
    aliased: int = 0
    owners: tuple[OwnerGroup, ...] = ()
    frozen: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        return render_live(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LiveTensorReport:
        """The report stored as :meth:`to_dict` wrote it."""
        return from_mapping(cls, d)


def render_live(r: LiveTensorReport, top: int = 10, owners: int = 8) -> str:
    """The report as text: totals, the owners (``owners`` of them), then the ``top`` largest tensors."""
    lines = [f"{r.device}: {count(len(r.tensors), 'live tensor storage')}, {fmt_bytes(r.total)}"]
    for cat, n in r.by_category.items():
        lines.append(f"  {cat:<20} {fmt_bytes(n):>12}")
    if r.allocated is not None:
        lines.append(f"  {'allocator allocated':<20} {fmt_bytes(r.allocated):>12}")
        extra = f" (of which block rounding {fmt_bytes(r.rounding)})" if r.rounding else ""
        lines.append(f"  {'not a live tensor':<20} {fmt_bytes(r.unexplained):>12}{extra}")
        if r.excess:
            lines.append(
                f"  note: the live tensors add up to {fmt_bytes(r.excess)} more than the allocator counts as "
                "allocated: the two readings disagree (storages over memory the allocator does not count, "
                "such as torch.compile's CUDA-graph pools, or memory from another allocator)"
            )
    if r.aliased:
        lines.append(
            f"  note: {fmt_bytes(r.aliased)} are shared by several storages (counted once in the total)"
        )
    if r.frozen:
        lines.append(
            f"  note: {r.frozen:,} objects were frozen by gc.freeze(): the walk cannot see them, so tensors "
            "among them are not listed"
            + (" (their memory is in 'not a live tensor')" if r.allocated is not None else "")
            + "; call gc.unfreeze() before asking, or ask before gc.freeze()"
        )
    for m, n in sorted(r.by_module.items(), key=lambda kv: -kv[1]):
        lines.append(f"  module {m}: {fmt_bytes(n)}")
    if r.owners:
        lines.append("  held by:")
        lines += [f"  {g.line()}" for g in r.owners[:owners]]
        if len(r.owners) > owners:
            rest = sum(g.bytes for g in r.owners[owners:])
            lines.append(f"  {fmt_bytes(rest):>12}  ... {len(r.owners) - owners} more owners")
        lines.append(f"  largest {min(top, len(r.tensors))} of {len(r.tensors)}:")
    for t in r.tensors[:top]:
        shape = "x".join(str(d) for d in t.shape) or "scalar"
        who = t.name or t.holder or "?"
        lines.append(f"  {fmt_bytes(t.bytes):>12}  {t.category:<18} {shape:<16} {t.dtype:<9} {who}")
        if t.name and t.holder and _head(t.holder) != _head(t.name):
            lines.append(f"  {'':>12}  held by {t.holder}")
    if len(r.tensors) > top:
        lines.append(f"  ... {len(r.tensors) - top} more")
    for c in r.cycles:
        lines.append(f"  cycle: {c.line()}")
        lines += [f"    {p}" for p in c.paths]
        lines.append(f"    fix: {c.fix}")
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
    "OwnerGroup",
    "TensorCycle",
    "render_live",
]
