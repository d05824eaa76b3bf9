"""``torchmem.live_tensors()``: every live tensor on a device, by storage, with category and holder."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

PARAMETER = "parameter"
GRADIENT = "gradient"
OPTIMIZER_STATE = "optimizer state"
BUFFER = "buffer"
SAVED = "saved for backward"
OTHER = "other"
CATEGORIES = (PARAMETER, GRADIENT, OPTIMIZER_STATE, BUFFER, SAVED, OTHER)
# When one storage plays several roles, the first wins: a parameter that autograd saved is a parameter, an
# input the program holds and autograd saved is "saved for backward" (its holder path names the program's
# reference).
_PRECEDENCE = (PARAMETER, GRADIENT, OPTIMIZER_STATE, BUFFER, SAVED, OTHER)


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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        from torchmem.report.text import render_live

        return render_live(self)


def _saved_tensors(fn: Any) -> Iterator[tuple[str, torch.Tensor]]:
    for attr in dir(fn):
        if attr.startswith("_saved_") and not attr.startswith("_saved_raw"):
            try:
                v = getattr(fn, attr)
            except RuntimeError:  # freed after backward
                continue
            if isinstance(v, torch.Tensor):
                yield attr, v
            elif isinstance(v, (tuple, list)):
                for i, x in enumerate(v):
                    if isinstance(x, torch.Tensor):
                        yield f"{attr}[{i}]", x


def _storage_key(t: torch.Tensor) -> int | None:
    try:
        return int(t.untyped_storage()._cdata)
    except (RuntimeError, NotImplementedError):
        return None


def collect_live(device: torch.device, allocated: int | None, with_holders: bool = True) -> LiveTensorReport:
    """Build the report for ``device`` (the public wrapper reads ``allocated`` from the device layer)."""
    tensor_type, module_type, opt_type = torch.Tensor, torch.nn.Module, torch.optim.Optimizer
    tensors: list[torch.Tensor] = []
    modules: list[torch.nn.Module] = []
    optimizers: list[torch.optim.Optimizer] = []
    for o in gc.get_objects():
        kind = type(o)
        if issubclass(kind, tensor_type):
            tensors.append(o)
        elif issubclass(kind, module_type):
            modules.append(o)
        elif issubclass(kind, opt_type):
            optimizers.append(o)

    # storage key -> [representative tensor, category, name, views]
    store: dict[int, list[Any]] = {}

    def note(t: torch.Tensor, category: str, name: Any) -> None:
        if t.device != device:
            return
        k = _storage_key(t)
        if k is None:
            return
        e = store.get(k)
        if e is None:
            store[k] = [t, category, name, 0]
        elif _PRECEDENCE.index(category) < _PRECEDENCE.index(e[1]):
            e[1], e[2] = category, name

    # Names and roles from modules and optimizers first, then every tensor object.
    child_ids = {id(c) for m in modules for c in m.children()}
    roots = [m for m in modules if id(m) not in child_ids]
    module_of: dict[int, int] = {}  # storage key -> index of root module
    for ri, m in enumerate(roots):
        for name, p in m.named_parameters(remove_duplicate=True):
            note(p, PARAMETER, (ri, name))
            k = _storage_key(p)
            if k is not None:
                module_of.setdefault(k, ri)
            if p.grad is not None:
                note(p.grad, GRADIENT, (ri, f"{name}.grad"))
                kg = _storage_key(p.grad)
                if kg is not None:
                    module_of.setdefault(kg, ri)
        for name, b in m.named_buffers(remove_duplicate=True):
            note(b, BUFFER, (ri, name))
            kb = _storage_key(b)
            if kb is not None:
                module_of.setdefault(kb, ri)
    for opt in optimizers:
        for state in list(opt.state.values()):
            if isinstance(state, dict):
                for key, v in list(state.items()):
                    if isinstance(v, torch.Tensor):
                        note(v, OPTIMIZER_STATE, f"{type(opt).__name__}.state[...][{key!r}]")
    for t in tensors:
        if isinstance(t, torch.nn.Parameter):
            note(t, PARAMETER, None)
        else:
            note(t, OTHER, None)
    # Tensors only autograd holds: walk every graph reachable from a live tensor.
    seen_fn: set[int] = set()
    for t in tensors:
        fn = t.grad_fn
        stack = [fn] if fn is not None else []
        while stack:
            f = stack.pop()
            if f is None or id(f) in seen_fn:
                continue
            seen_fn.add(id(f))
            for attr, v in _saved_tensors(f):
                note(v, SAVED, f"{type(f).__name__}.{attr}")
            for nxt, _ in getattr(f, "next_functions", ()):
                if nxt is not None:
                    stack.append(nxt)
    for tv in tensors:  # count views per storage
        k = _storage_key(tv) if tv.device == device else None
        if k is not None and k in store:
            store[k][3] += 1

    holders: list[str | None] = [None] * len(store)
    truncated = False
    entries = list(store.values())
    if with_holders and entries:
        from torchmem.analysis.holders import find_holders

        targets = [e[0] for e in entries] + roots
        search = find_holders(
            targets, max_paths=1, time_limit=5.0, exclude=[tensors, modules, optimizers, store]
        )
        # One path per tensor is all we ask for: hitting max_paths is success, not truncation.
        limits = {r.strip() for r in (search.reason or "").split(",") if r.strip()} - {"max_paths"}
        truncated = search.truncated and bool(limits)
        holders = [str(p[0]) if p else None for p in search.paths[: len(entries)]]
        root_names = [
            str(p[0]) if p else type(m).__name__ for p, m in zip(search.paths[len(entries) :], roots)
        ]
    else:
        root_names = [type(m).__name__ for m in roots]

    out: list[LiveTensor] = []
    by_category = dict.fromkeys(CATEGORIES, 0)
    by_module: dict[str, int] = {}
    rounding = 0
    for (k, e), holder in zip(store.items(), holders):
        t, category, name, views = e
        if isinstance(name, tuple):
            name = f"{root_names[name[0]]}.{name[1]}"
        nbytes = int(t.untyped_storage().nbytes())
        out.append(
            LiveTensor(
                nbytes, tuple(t.shape), str(t.dtype).replace("torch.", ""), category, name, holder, views
            )
        )
        by_category[category] += nbytes
        if k in module_of:
            mname = root_names[module_of[k]]
            by_module[mname] = by_module.get(mname, 0) + nbytes
        if device.type == "cuda":
            rounding += (-nbytes) % 512 if nbytes else 0
    out.sort(key=lambda x: -x.bytes)
    total = sum(x.bytes for x in out)
    tensors.clear()
    store.clear()
    return LiveTensorReport(
        device=str(device),
        tensors=tuple(out),
        by_category={k: v for k, v in by_category.items() if v},
        by_module=by_module,
        total=total,
        allocated=allocated,
        unexplained=None if allocated is None else allocated - total,
        rounding=rounding if device.type == "cuda" else None,
        truncated=truncated,
    )
