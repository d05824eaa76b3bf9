"""``torchmem.live_tensors()``: every live tensor on a device, by storage, with category and holder."""

from __future__ import annotations

import gc
import time
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from torchmem._gc import frozen_since_import
from torchmem.analysis.holders.autograd import grad_cycles
from torchmem.analysis.holders.cycles import (
    AUTOGRAD,
    classify_cycle,
    expression,
    fix_rank,
    grad_cycle_fix,
    is_cycle,
    loop_text,
)
from torchmem.devices._storage import storage_id
from torchmem.results.holders import HolderPath, HolderStep, StepKind
from torchmem.results.live import (
    BUFFER,
    CATEGORIES,
    GRADIENT,
    OPTIMIZER_STATE,
    OTHER,
    PARAMETER,
    SAVED,
    LiveTensor,
    LiveTensorReport,
    OwnerGroup,
    TensorCycle,
)

# When one storage plays several roles, the first wins: a parameter that autograd saved is a parameter, an
# input the program holds and autograd saved is "saved for backward" (its holder path names the program's
# reference).
_PRECEDENCE = (PARAMETER, GRADIENT, OPTIMIZER_STATE, BUFFER, SAVED, OTHER)


def saved_tensors(fn: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors one autograd node saved for backward, as ``(attribute, tensor)``.

    Reading a saved tensor runs the unpack hook of any ``saved_tensors_hooks`` it was saved under.
    """
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


def graph_tensors(roots: Iterable[torch.Tensor]) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor the autograd graphs of ``roots`` keep alive, as ``(what holds it, tensor)``.

    Walks each root's ``grad_fn`` through ``next_functions``: the tensors every node saved for backward
    (``MmBackward0._saved_self``) and the leaves ``AccumulateGrad`` nodes hold (``AccumulateGrad.variable``).
    Each node is visited once across all roots.

    Example:
        >>> import torch
        >>> w = torch.randn(4, 4, requires_grad=True)
        >>> out = (torch.randn(2, 4) @ w).relu().sum()
        >>> sorted({name.split(".")[0] for name, _ in graph_tensors([out])})
        ['AccumulateGrad', 'MmBackward0', 'ReluBackward0']
    """
    # Visited nodes are kept (not only their ids): some torch versions (2.11) free a C++ node's Python
    # wrapper as soon as nobody holds it, and a later wrapper may then reuse the id of one already seen.
    seen: dict[int, Any] = {}
    for root in roots:
        fn = root.grad_fn
        stack = [fn] if fn is not None else []
        while stack:
            f = stack.pop()
            if f is None or id(f) in seen:
                continue
            seen[id(f)] = f
            node = type(f).__name__
            for attr, v in saved_tensors(f):
                yield f"{node}.{attr}", v
            leaf = getattr(f, "variable", None)
            if isinstance(leaf, torch.Tensor):
                yield f"{node}.variable", leaf
            for nxt, _ in getattr(f, "next_functions", ()):
                if nxt is not None:
                    stack.append(nxt)


# The dense tensors a sparse tensor is made of, by layout: (part name, accessor).
_SPARSE_PARTS: dict[Any, tuple[tuple[str, str], ...]] = {
    torch.sparse_coo: (("indices", "_indices"), ("values", "_values")),
    torch.sparse_csr: (
        ("crow_indices", "crow_indices"),
        ("col_indices", "col_indices"),
        ("values", "values"),
    ),
    torch.sparse_bsr: (
        ("crow_indices", "crow_indices"),
        ("col_indices", "col_indices"),
        ("values", "values"),
    ),
    torch.sparse_csc: (
        ("ccol_indices", "ccol_indices"),
        ("row_indices", "row_indices"),
        ("values", "values"),
    ),
    torch.sparse_bsc: (
        ("ccol_indices", "ccol_indices"),
        ("row_indices", "row_indices"),
        ("values", "values"),
    ),
}


def tensor_parts(t: torch.Tensor) -> list[tuple[str | None, torch.Tensor, int]] | None:
    """The storages behind ``t`` as ``(part, dense tensor, storage key)``; ``None`` where none is readable.

    A strided tensor is one part (``part`` is ``None``); a sparse tensor is its indices and values.
    """
    parts = _SPARSE_PARTS.get(t.layout)
    if parts is None:
        k = _storage_key(t)
        return None if k is None else [(None, t, k)]
    out: list[tuple[str | None, torch.Tensor, int]] = []
    for part, accessor in parts:
        try:
            dense = getattr(t, accessor)()
        except (RuntimeError, NotImplementedError, AttributeError):
            continue
        k = _storage_key(dense)
        if k is not None:
            out.append((part, dense, k))
    return out or None


_OWNER_STEPS = (StepKind.MODULE_GLOBAL, StepKind.FRAME_LOCAL, StepKind.CLASS_ATTRIBUTE)


def _owner(name: Any, path: Any, owner_names: list[str], owner_types: list[str]) -> tuple[str, str]:
    """``(owner, its type)``: the object a tensor belongs to, for the report's summary. A module or
    optimizer that names it; else the variable its holder path starts from (``__main__.metric``, a frame's
    local); else the path itself, or ``"?"`` when no holder was found."""
    if isinstance(name, tuple):
        return owner_names[name[0]], owner_types[name[0]]
    if path is None:
        return "?", ""
    steps = path.typed_steps
    if path.root != "cycle" and len(steps) >= 3 and steps[1].kind in _OWNER_STEPS:
        kind = steps[2].holder_type or "?"
        return f"{steps[0].text}{steps[1].text}", kind.rsplit("<locals>.", 1)[-1]
    return str(path), "Tensor" if path.root != "cycle" else "cycle"


def _union_bytes(ranges: list[tuple[int, int]]) -> int:
    """Bytes covered by the ``[start, end)`` ranges, overlaps counted once."""
    total, reach = 0, -1
    for start, end in sorted(ranges):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


def _storage_key(t: torch.Tensor) -> int | None:
    return storage_id(t)


# Tensor subclasses that describe memory without holding any (torch.compile's fake and functional tensors):
# their storages report a size but no allocation backs them.
_NO_MEMORY = frozenset({"FakeTensor", "FunctionalTensor"})
_no_memory_cache: dict[type, bool] = {}


def _no_memory(kind: type) -> bool:
    v = _no_memory_cache.get(kind)
    if v is None:
        v = any(c.__name__ in _NO_MEMORY for c in kind.__mro__)
        _no_memory_cache[kind] = v
    return v


def _private_pools(device: torch.device) -> list[Any]:
    """The private pools (CUDA graphs) of a CUDA device, when any segment is in one."""
    if device.type != "cuda":
        return []
    try:
        from torchmem.analysis.holders.compiled import compiled_pools

        return compiled_pools(device.index or 0)
    except Exception:
        return []


def _pool_of(dense: torch.Tensor, path: Any, pools: list[Any]) -> Any:
    """The private pool a tensor's memory is in, or whose CUDA-graph tree its holder path goes through."""
    from torchmem.analysis.holders.compiled import through_tree

    try:
        ptr = int(dense.untyped_storage().data_ptr())
    except (RuntimeError, NotImplementedError):
        ptr = 0
    if ptr:
        for pool in pools:
            if pool.holds(ptr):
                return pool
    if path is not None and through_tree(path):
        return next((p for p in pools if p.compiled), None)
    return None


class Storage:
    """One live storage of a :class:`LiveCensus` (live analysis data, not a result: it names, never holds).

    Attributes:
        key: The storage's identity (``untyped_storage()._cdata``).
        bytes: Its size.
        category: parameter, gradient, optimizer state, buffer, saved for backward or other.
        name: The parameter path, or the autograd node and attribute that saved it.
        path: Its first holder path (``None``: not found within the search's limits).
        owner: The object it belongs to in the report's summary, and that object's type.
        owned_by: Index into :attr:`LiveCensus.owners` of the module or optimizer that names it (or
            ``None``).
        cycle: Index into :attr:`LiveCensus.cycles` of the autograd cycle that keeps it, else ``None``.
    """

    __slots__ = ("bytes", "category", "cycle", "key", "name", "owned_by", "owner", "path")

    def __init__(
        self, key: int, nbytes: int, category: str, name: str | None, path: HolderPath | None
    ) -> None:
        self.key = key
        self.bytes = nbytes
        self.category = category
        self.name = name
        self.path = path
        self.owner: tuple[str, str] = ("?", "")
        self.owned_by: int | None = None
        self.cycle: int | None = None


class Owner:
    """A root module or an optimizer of a :class:`LiveCensus`: its holder path, type, for a module whether it
    is in training mode, and for an optimizer whether the parameters it steps belong to no live module any
    more (its model was deleted)."""

    __slots__ = ("kind", "label", "orphaned", "path", "training", "type")

    def __init__(
        self,
        kind: str,
        label: str,
        type_: str,
        path: HolderPath | None,
        orphaned: bool,
        training: bool | None = None,
    ) -> None:
        self.kind = kind  # "module" | "optimizer"
        self.label = label
        self.type = type_
        self.path = path
        self.orphaned = orphaned
        self.training = training


class CycleInfo:
    """One autograd cycle of a :class:`LiveCensus` (see
    :func:`~torchmem.analysis.holders.autograd.grad_cycles`): the storages it keeps, what still reaches it,
    the path round the loop and the fix."""

    __slots__ = ("bytes", "fix", "held_by", "keys", "loops")

    def __init__(self) -> None:
        self.keys: set[int] = set()
        self.bytes = 0
        self.held_by: list[str] = []
        self.loops: list[str] = []
        self.fix = grad_cycle_fix()


class LiveCensus:
    """Every live storage of a device with its holder, the modules and optimizers that name them and the
    autograd cycles that keep them: what :func:`census` found, and the :class:`LiveTensorReport` made of it.

    The OOM diagnosis reads the storages and owners; :func:`collect_live` returns only the report. It names
    objects and holds none of them.
    """

    __slots__ = (
        "allocated",
        "cycles",
        "device",
        "owners",
        "reason",
        "report",
        "seconds",
        "storages",
        "truncated",
        "visited",
    )

    def __init__(self, device: torch.device, allocated: int | None) -> None:
        self.device = device
        self.allocated = allocated
        self.storages: list[Storage] = []
        self.owners: list[Owner] = []
        self.cycles: list[CycleInfo] = []
        self.report: LiveTensorReport | None = None
        self.truncated = False
        self.reason: str | None = None
        self.seconds = 0.0
        self.visited = 0


def _label(t: torch.Tensor) -> str:
    kind = "Parameter" if isinstance(t, torch.nn.Parameter) else type(t).__name__
    return f"<{kind} {tuple(t.shape)} {str(t.dtype).replace('torch.', '')}>"


def _same_scope(owner: str, inner: str) -> str:
    """``inner`` (a parameter's name inside an optimizer state's name) without the scope it shares with
    ``owner``: ``opt.state[model.0.weight]`` for two locals of one frame (``main() in train.py, local 'opt'``
    and ``main() in train.py, local 'model'.0.weight``) or two globals of ``__main__``; else as it is."""
    mark = ", local '"
    if mark in owner and mark in inner:
        scope, _, rest = inner.partition(mark)
        if owner.partition(mark)[0] == scope:
            return rest.replace("'", "", 1)
    elif owner.startswith("__main__.") and inner.startswith("__main__."):
        return inner[len("__main__.") :]
    return inner


def collect_live(device: torch.device, allocated: int | None, with_holders: bool = True) -> LiveTensorReport:
    """Build the report for ``device`` (the public wrapper reads ``allocated`` from the device layer)."""
    report = census(device, allocated, with_holders).report
    assert report is not None
    return report


def census(
    device: torch.device,
    allocated: int | None,
    with_holders: bool = True,
    *,
    time_limit: float = 5.0,
    max_objects: int = 500_000,
    only: set[int] | None = None,
    exclude: Iterable[Any] = (),
) -> LiveCensus:
    """Every live storage on ``device``, its category, name and holder path (one search for all of them).

    Args:
        device: The device.
        allocated: The allocator's figure at the same moment, to reconcile with (``None``: unknown).
        with_holders: Run the holder search (without it, paths and owners are the modules' and optimizers').
        time_limit: Seconds the census may take, its holder search included (which gets what is left, 50 ms
            at least); ``truncated``/``reason`` say when the search stopped.
        max_objects: Most objects the holder search explores.
        only: Count only these storage keys (the ones torchmem's CPU ledger counts, for a CPU cap).
        exclude: Objects that are not holders (the caller's own containers).
    """
    started = time.thread_time()  # the limit is CPU time of this thread, as the holder search's
    out = LiveCensus(device, allocated)
    tensor_type, module_type, opt_type = torch.Tensor, torch.nn.Module, torch.optim.Optimizer
    tensors: list[torch.Tensor] = []
    modules: list[torch.nn.Module] = []
    optimizers: list[torch.optim.Optimizer] = []
    kinds: dict[type, int] = {}  # type -> 0 other, 1 tensor, 2 module, 3 optimizer (one issubclass each)
    for o in gc.get_objects():
        kind = type(o)
        k = kinds.get(kind)
        if k is None:
            if issubclass(kind, tensor_type):
                k = 0 if _no_memory(kind) else 1
            elif issubclass(kind, module_type):
                k = 2
            elif issubclass(kind, opt_type):
                k = 3
            else:
                k = 0
            kinds[kind] = k
        if k == 1:
            tensors.append(o)
        elif k == 2:
            modules.append(o)
        elif k == 3:
            optimizers.append(o)

    # storage key -> [tensor the program holds, category, name, views, dense part, part name]
    store: dict[int, list[Any]] = {}
    unreadable: dict[str, set[int]] = {}  # layout -> ids of live tensors whose memory cannot be read

    def note(t: torch.Tensor, category: str, name: Any) -> list[int]:
        if t.device != device:
            return []
        parts = tensor_parts(t)
        if parts is None:
            unreadable.setdefault(str(t.layout).replace("torch.", ""), set()).add(id(t))
            return []
        for part, dense, k in parts:
            if only is not None and k not in only:
                continue
            e = store.get(k)
            if e is None:
                store[k] = [t, category, name, 0, dense, part]
            elif _PRECEDENCE.index(category) < _PRECEDENCE.index(e[1]):
                e[1], e[2] = category, name
        return [k for _, _, k in parts]

    # Names and roles from modules and optimizers first, then every tensor object.
    child_ids = {id(c) for m in modules for c in m.children()}
    roots = [m for m in modules if id(m) not in child_ids]
    module_of: dict[int, int] = {}  # storage key -> index of root module
    # A name is a string, None, or (owner index, suffix[, the name of the parameter that replaces "{p}"]):
    # owners (root modules, then optimizers) are named by the holder search.
    param_name: dict[int, Any] = {}  # id(parameter) -> its name
    for ri, m in enumerate(roots):
        for name, p in m.named_parameters(remove_duplicate=True):
            param_name.setdefault(id(p), (ri, f".{name}"))
            for k in note(p, PARAMETER, (ri, name)):
                module_of.setdefault(k, ri)
            if p.grad is not None:
                for k in note(p.grad, GRADIENT, (ri, f"{name}.grad")):
                    module_of.setdefault(k, ri)
        for name, b in m.named_buffers(remove_duplicate=True):
            for k in note(b, BUFFER, (ri, name)):
                module_of.setdefault(k, ri)
    orphaned: list[bool] = []  # per optimizer: it steps parameters and none of them is in a live module
    for oj, opt in enumerate(optimizers):
        oi = len(roots) + oj
        stepped = outside = 0
        # Parameters an optimizer keeps after their module is gone are still parameters and gradients.
        for gi, group in enumerate(opt.param_groups):
            for pi, gp in enumerate(group.get("params", ())):
                if not isinstance(gp, torch.Tensor):
                    continue
                where = f".param_groups[{gi}]['params'][{pi}]"
                stepped += 1
                named = param_name.setdefault(id(gp), (oi, where))
                outside += isinstance(gp, torch.nn.Parameter) and named[0] >= len(roots)
                note(gp, PARAMETER, (oi, where))
                if gp.grad is not None:
                    note(gp.grad, GRADIENT, (oi, f"{where}.grad"))
        orphaned.append(stepped > 0 and outside == stepped)
        for sp, state in list(opt.state.items()):
            if isinstance(state, dict):
                ref = param_name.get(id(sp))
                for key, v in list(state.items()):
                    if isinstance(v, torch.Tensor):
                        inner = "{p}" if ref is not None else "..."
                        note(v, OPTIMIZER_STATE, (oi, f".state[{inner}][{key!r}]", ref))
    for t in tensors:
        if isinstance(t, torch.nn.Parameter):
            note(t, PARAMETER, None)
        else:
            note(t, OTHER, None)
    # Tensors only autograd holds: walk every graph reachable from a live tensor.
    for what, v in graph_tensors(tensors):
        if what.endswith(".variable"):  # a leaf: the program's own tensor, noted above if it is alive
            note(v, PARAMETER if isinstance(v, torch.nn.Parameter) else OTHER, None)
        else:
            note(v, SAVED, what)
    for tv in tensors:  # count views per storage
        if tv.device != device:
            continue
        for _, _, k in tensor_parts(tv) or ():
            if k in store:
                store[k][3] += 1
    # Autograd cycles (x.grad's graph saved x): the storages each keeps, and its tensors, whose holder paths
    # say whether the program still reaches it.
    gcycles = grad_cycles([t for t in tensors if t.device == device])
    members: list[tuple[int, torch.Tensor, HolderStep]] = []  # (cycle index, x, how x.grad's graph keeps x)
    cycle_of: dict[int, int] = {}  # storage key -> cycle index
    for ci, cyc in enumerate(gcycles):
        info = CycleInfo()
        out.cycles.append(info)
        for x, g, step in cyc.members:
            members.append((ci, x, step))
            for t in (x, g):
                for _, _, k in tensor_parts(t) or ():
                    info.keys.add(k)
        for v in cyc.saved():
            if v.device == device:
                for _, _, k in tensor_parts(v) or ():
                    info.keys.add(k)
        info.keys &= store.keys()
        for k in info.keys:
            cycle_of.setdefault(k, ci)
        cyc.members.clear()
        cyc.nodes.clear()
    gcycles.clear()

    holders: list[str | None] = [None] * len(store)
    paths: list[Any] = [None] * len(store)  # each storage's first holder path (HolderPath)
    member_paths: list[HolderPath | None] = [None] * len(members)
    owner_paths: list[HolderPath | None] = [None] * (len(roots) + len(optimizers))
    truncated = False
    entries = list(store.values())
    if with_holders and entries:
        from torchmem.analysis.holders import find_holders

        # One target per Python tensor: the parts of a sparse tensor share their holder.
        index: dict[int, int] = {}
        targets: list[Any] = []
        for e in entries:
            if id(e[0]) not in index:
                index[id(e[0])] = len(targets)
                targets.append(e[0])
        n_targets = len(targets)
        targets += roots
        targets += optimizers
        targets += [x for _, x, _ in members]
        search = find_holders(
            targets,
            max_paths=1,
            time_limit=max(0.05, time_limit - (time.thread_time() - started)),
            max_objects=max_objects,
            exclude=[tensors, modules, optimizers, store, targets, entries, members, *entries, *exclude],
        )
        # One path per tensor is all we ask for: hitting max_paths is success, not truncation.
        limits = {r.strip() for r in (search.reason or "").split(",") if r.strip()} - {"max_paths"}
        truncated = search.truncated and bool(limits)
        out.truncated, out.reason = truncated, ", ".join(sorted(limits)) or None
        out.seconds, out.visited = search.seconds, search.visited
        first = [p[0] if p else None for p in search.paths]
        paths = [first[index[id(e[0])]] for e in entries]
        holders = [None if p is None else str(p) for p in paths]
        n_owners = len(roots) + len(optimizers)
        owner_paths = first[n_targets : n_targets + n_owners]
        member_paths = first[n_targets + n_owners :]
        owners = [*roots, *optimizers]
        root_names = [str(p) if p is not None else type(m).__name__ for p, m in zip(owner_paths, owners)]
        targets.clear()
        index.clear()
    else:
        root_names = [type(m).__name__ for m in [*roots, *optimizers]]
    for i, o in enumerate([*roots, *optimizers]):
        is_opt = i >= len(roots)
        out.owners.append(
            Owner(
                "optimizer" if is_opt else "module",
                root_names[i],
                type(o).__name__,
                owner_paths[i],
                orphaned[i - len(roots)] if is_opt else False,
                None if is_opt else bool(getattr(o, "training", True)),
            )
        )
    for (ci, x, step), mp in zip(members, member_paths):
        info = out.cycles[ci]
        reached = mp is not None and mp.root not in ("cycle", "gc-orphan")
        if reached:
            info.held_by.append(str(mp))
        start = str(mp) if reached else _label(x)
        if len(info.loops) < 3:
            info.loops.append(loop_text(start, (step,)))
        if len(info.loops) == 1:
            info.fix = grad_cycle_fix(expression(mp) if reached else None)
    members.clear()

    def resolve(name: Any) -> str:
        if not isinstance(name, tuple):
            return str(name)
        owner = root_names[name[0]]
        text = f"{owner}{name[1] if name[1][:1] in '.[' else '.' + name[1]}"
        if len(name) > 2 and name[2] is not None:
            inner = resolve(name[2])
            if inner.startswith(owner + ".") or inner.startswith(owner + "["):  # the owner's own parameter
                inner = inner[len(owner) :].lstrip(".")
            else:
                inner = _same_scope(owner, inner)
            text = text.replace("{p}", inner)
        return text

    owner_types = [type(o).__name__ for o in [*roots, *optimizers]]
    pools = _private_pools(device) if with_holders else []

    tensors_out: list[LiveTensor] = []
    by_category = dict.fromkeys(CATEGORIES, 0)
    by_module: dict[str, int] = {}
    rounding = 0
    ranges: list[tuple[int, int]] = []  # the storages' memory, to count memory they share once
    # (kind, collectable) -> [storages, bytes, paths, fix] for cycles found by their holder paths
    cycles: dict[tuple[str, bool], list[Any]] = {}
    # owner -> [type, bytes, {category: storages}]
    groups: dict[str, list[Any]] = {}
    for (k, e), holder, hp in zip(store.items(), holders, paths):
        t, category, name, views, dense, part = e
        owner_index = name[0] if isinstance(name, tuple) else None
        owner = _owner(name, hp, root_names, owner_types)
        cyc_i = cycle_of.get(k)
        if cyc_i is not None and not out.cycles[cyc_i].held_by:  # kept only by an autograd cycle: one owner
            loops = out.cycles[cyc_i].loops
            owner = (loops[0] if loops else "autograd cycle", "cycle")
        if pools:
            pool = _pool_of(dense, hp, pools)
            if pool is not None:  # a compiled graph's pool: its one description, not a path through torch
                holder, hp = f"{pool.label} (fix: {pool.fix})", None
                owner = (pool.label, "CUDA graphs")
        if isinstance(name, tuple):
            name = resolve(name)
            reached = owner_index is not None and owner_paths[owner_index] is not None
            if holder is not None and hp is not None and reached:
                # A parameter, buffer, gradient or optimizer state of a module or optimizer the program
                # reaches: its name is a holder path. The search's shortest path can be another (a kept
                # loss's graph leaf, the optimizer's state keys): true, but printed beside the name it reads
                # as if that were what keeps the tensor alive.
                holder = name
        layout = str(t.layout).replace("torch.", "")
        if part is not None:  # a part of a sparse tensor: say so in the name people read
            name = f"{name} ({layout} {part})" if name else f"{layout} {part}"
        storage = dense.untyped_storage()
        nbytes = int(storage.nbytes())
        try:
            ptr = int(storage.data_ptr())
        except (RuntimeError, NotImplementedError):
            ptr = 0
        if ptr and nbytes:
            ranges.append((ptr, ptr + nbytes))
        tensors_out.append(
            LiveTensor(
                nbytes,
                tuple(t.shape),
                str(dense.dtype).replace("torch.", ""),
                category,
                name,
                holder,
                views,
                layout,
                part,
            )
        )
        st = Storage(k, nbytes, category, name, hp)
        st.owner, st.owned_by, st.cycle = owner, owner_index, cyc_i
        out.storages.append(st)
        by_category[category] += nbytes
        g = groups.setdefault(owner[0], [owner[1], 0, {}])
        g[1] += nbytes
        g[2][category] = g[2].get(category, 0) + 1
        if cyc_i is not None:
            out.cycles[cyc_i].bytes += nbytes
        elif hp is not None and is_cycle(hp):
            cycle_kind, collectable, fix = classify_cycle(hp)
            c = cycles.setdefault((cycle_kind, collectable), [0, 0, [], fix])
            c[0] += 1
            c[1] += nbytes
            if len(c[2]) < 3:
                c[2].append(str(hp))
            if fix_rank(fix) < fix_rank(c[3]):
                c[3] = fix
        if k in module_of:
            mname = root_names[module_of[k]]
            by_module[mname] = by_module.get(mname, 0) + nbytes
        if device.type == "cuda":
            rounding += (-nbytes) % 512 if nbytes else 0
    tensors_out.sort(key=lambda x: -x.bytes)
    summed = sum(x.bytes for x in tensors_out)
    total = _union_bytes(ranges) if ranges else summed
    diff = None if allocated is None else allocated - total
    tensors.clear()
    modules.clear()
    optimizers.clear()
    roots.clear()
    store.clear()
    entries.clear()
    # Autograd cycles: the ones only the cycle keeps (a leak) together, the ones the program still reaches
    # together; each with up to three loops and the fix of the largest.
    found_cycles: list[TensorCycle] = []
    for reached in (False, True):
        same = sorted(
            (c for c in out.cycles if c.keys and bool(c.held_by) == reached), key=lambda c: -c.bytes
        )
        if same:
            found_cycles.append(
                TensorCycle(
                    AUTOGRAD,
                    False,
                    sum(len(c.keys) for c in same),
                    sum(c.bytes for c in same),
                    tuple(loop for c in same for loop in c.loops)[:3],
                    same[0].fix,
                    tuple(h for c in same for h in c.held_by)[:3],
                    len(same),
                )
            )
    found_cycles += [
        TensorCycle(kind, coll, n, b, tuple(paths), fix)
        for (kind, coll), (n, b, paths, fix) in cycles.items()
    ]
    out.report = LiveTensorReport(
        device=str(device),
        tensors=tuple(tensors_out),
        by_category={k: v for k, v in by_category.items() if v},
        by_module=by_module,
        total=total,
        allocated=allocated,
        unexplained=None if diff is None else max(diff, 0),
        excess=0 if diff is None else max(-diff, 0),
        aliased=max(summed - total, 0),
        owners=tuple(
            OwnerGroup(owner, kind, nbytes, dict(cats))
            for owner, (kind, nbytes, cats) in sorted(groups.items(), key=lambda kv: -kv[1][1])
        ),
        cycles=tuple(sorted(found_cycles, key=lambda c: -c.bytes)),
        rounding=rounding if device.type == "cuda" else None,
        truncated=truncated,
        frozen=frozen_since_import(),
        unreadable=tuple(
            f"{len(ids)} {layout} {'tensor' if len(ids) == 1 else 'tensors'}: memory not readable, "
            "not counted in total"
            for layout, ids in sorted(unreadable.items())
        ),
    )
    return out
