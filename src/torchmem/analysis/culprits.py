"""Culprit attribution: which allocation sites keep growing, which holder keeps their memory, and what kind of
leak that is.

- :func:`site_growth` finds the allocation sites whose live bytes keep rising over an attribution window.
- :func:`attribute` groups growing sites by the holder that keeps them (:func:`holder_pattern`) and decides
  each group's kind from the *kinds of the steps* of its holder paths (a ``grad_fn`` or ``saved_tensor``
  step: a retained graph; a ``hook`` entry: a hook; a ``traceback`` step: stored exceptions; items of a
  module global: a registry; ...), never from the rendered text; the fix is worded by
  :mod:`torchmem.analysis.leak_fixes`.
- :func:`holder_name` is the variable a person would recognise in a holder path.

Pure functions over typed holder paths (re-exported by :mod:`torchmem.analysis.leaks`); linear in the paths.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from torchmem.analysis.leak_fixes import (
    ACCUMULATION,
    CACHE,
    CYCLE,
    EXCEPTION,
    GLOBAL,
    GRAPH_CHAIN,
    GROWING_TENSOR,
    HOOK,
    KEPT_OPTIMIZER,
    METRIC_STATE,
    RETAINED_GRAPH,
    UNKNOWN,
    cycle_fix,
    fix_for,
    grad_graph_fix,
    metric_state_fix,
)
from torchmem.results.holders import GRAPH_NODES, GRAPH_SAVED, HolderPath, HolderStep, StepKind
from torchmem.results.leaks import Culprit, SiteGrowth


def site_growth(series: Sequence[Mapping[Any, tuple[int, int]]]) -> dict[Any, tuple[float, float]]:
    """Per-site growth from per-boundary ``{site: (live bytes, live storages)}`` maps of one window.

    Returns ``{site: (bytes per step, storages per step)}`` for sites whose live bytes rose at every boundary
    but at most one (a least-squares slope over the boundaries), ignoring sites that did not grow.

    Example:
        >>> site_growth([{"a": (0, 0)}, {"a": (10, 1)}, {"a": (20, 2)}, {"a": (30, 3)}])
        {'a': (10.0, 1.0)}
    """
    if len(series) < 2:
        return {}
    sites = {s for m in series for s in m}
    out: dict[Any, tuple[float, float]] = {}
    n = len(series)
    xs = list(range(n))
    mx = sum(xs) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    for s in sites:
        b = [float(m.get(s, (0, 0))[0]) for m in series]
        c = [float(m.get(s, (0, 0))[1]) for m in series]
        rises = sum(1 for i in range(1, n) if b[i] > b[i - 1])
        if rises < max(1, n - 2) or b[-1] <= b[0]:
            continue
        mb, mc = sum(b) / n, sum(c) / n
        slope_b = sum((x - mx) * (y - mb) for x, y in zip(xs, b)) / sxx
        slope_c = sum((x - mx) * (y - mc) for x, y in zip(xs, c)) / sxx
        if slope_b > 0:
            out[s] = (slope_b, slope_c)
    return out


# Steps that go into an autograd graph: the holder of the memory is what comes before them.
_GRAPH_HOPS = frozenset({StepKind.GRAD_FN, StepKind.SAVED_TENSOR})
# Steps into a container: an index or key (generalised to ``[*]`` in a holder pattern).
_CONTAINER_ITEMS = frozenset({StepKind.ITEM, StepKind.HOOK})
# Steps that name an attribute-like member: ``.name`` after a module, a class or an object.
_MEMBERS = frozenset({StepKind.MODULE_GLOBAL, StepKind.CLASS_ATTRIBUTE, StepKind.ATTRIBUTE})


def _before(path: HolderPath, kinds: frozenset[StepKind]) -> tuple[HolderStep, ...]:
    """The steps of ``path`` before the first step of one of ``kinds`` (all of them when there is none)."""
    for i, s in enumerate(path.typed_steps):
        if s.kind in kinds:
            return path.typed_steps[:i]
    return path.typed_steps


def _holder_steps(path: HolderPath) -> tuple[HolderStep, ...]:
    """The path up to the holder: autograd hops (``.grad_fn``, ``saved tensor of``) and what follows cut."""
    return _before(path, _GRAPH_HOPS)


def _has_item(steps: Sequence[HolderStep]) -> bool:
    return any(s.kind in _CONTAINER_ITEMS for s in steps)


def _member_names(steps: Sequence[HolderStep]) -> list[str]:
    """The names of the attribute-like steps at the start of ``steps`` (``trainer.cache``), up to the first
    step of another kind or a name that is not an identifier."""
    names: list[str] = []
    for s in steps:
        if s.kind not in _MEMBERS or not s.name.isidentifier():
            break
        names.append(s.name)
    return names


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _past_internals(steps: Sequence[HolderStep], names: list[str]) -> list[str]:
    """``names`` (the attribute chain of ``steps``), or where the chain reaches the last attribute through a
    private one (``tr._data_connector._datahook_selector.model.validation_step_outputs``: a framework's
    internals), the last attribute named on the class of its object (``M.validation_step_outputs``): the
    line a person changes is in that class. The path itself, which a report prints too, is unchanged."""
    n = len(names)
    if n < 2 or not any(_private(x) for x in names[:-1]):
        return names
    last = n - 1
    owner = steps[last].holder_type
    if steps[last].kind is not StepKind.ATTRIBUTE or not owner.isidentifier() or _private(owner):
        return names
    return [owner, names[last]]


def holder_pattern(path: HolderPath) -> str:
    """The holder a path goes through, with item indices and keys generalised and autograd hops cut.

    Sites whose memory the same holder keeps (``losses[3]``, ``losses[4]``) share one pattern.

    Example:
        >>> from torchmem.results.holders import HolderStep as S, StepKind as K
        >>> p = HolderPath.of("module", (S(K.ROOT, "__main__", "__main__"),
        ...     S(K.MODULE_GLOBAL, ".losses", "losses"), S(K.ITEM, "[17]", "17", "list", "int"),
        ...     S(K.GRAD_FN, ".grad_fn", "MeanBackward0"),
        ...     S(K.SAVED_TENSOR, " -> saved tensor of AddmmBackward0 (_saved_mat1)", "_saved_mat1")), 4)
        >>> holder_pattern(p)
        '__main__.losses[*]'
    """
    parts: list[str] = []
    for s in _holder_steps(path):
        key = f"[{s.name}]"
        if s.kind in _CONTAINER_ITEMS and s.text.endswith(key):
            parts.append(s.text[: len(s.text) - len(key)] + "[*]")
        else:
            parts.append(s.text)
    return "".join(parts)


def _exception_holder_name(path: HolderPath) -> str | None:
    """What keeps the exception (``errors`` in ``errors[3].__traceback__ -> frame ... local 'x'``): the path
    before its traceback hop, ``None`` where the path starts at the traceback (``sys.last_traceback``)."""
    steps = list(path.typed_steps)
    cut = next((i for i, st in enumerate(steps) if st.kind is StepKind.TRACEBACK), None)
    if cut is None:
        cut = next((i for i, st in enumerate(steps) if st.text.startswith(".__traceback__")), None)
    if not cut:
        return None
    head = HolderPath.of(path.root, tuple(steps[:cut]), cut - 1)
    return holder_name(head)


def holder_name(path: HolderPath) -> str:
    """The variable a person would recognise in a holder path (``losses``, ``acts``, ``trainer.cache``).

    The last closure variable before the autograd hops; else the last frame local with the attributes after
    it; else the module global (or class, or other root) with the attributes after it.

    Example:
        >>> from torchmem.results.holders import HolderStep as S, StepKind as K
        >>> p = HolderPath.of("frame", (S(K.ROOT, "train.py:40 in run()"),
        ...     S(K.FRAME_LOCAL, ", local 'trainer'", "trainer"), S(K.ATTRIBUTE, ".cache", "cache"),
        ...     S(K.ITEM, "['k3']", "'k3'", "dict", "str")), 3)
        >>> holder_name(p)
        'trainer.cache'
    """
    steps = _holder_steps(path)
    closures = [s.name for s in steps if s.kind is StepKind.CLOSURE_CELL and s.name]
    if closures:
        return closures[-1]
    locals_ = [i for i, s in enumerate(steps) if s.kind is StepKind.FRAME_LOCAL]
    if locals_:
        i = locals_[-1]
        return ".".join(_past_internals(steps[i:], [steps[i].name, *_member_names(steps[i + 1 :])]))
    if not steps:
        return str(path)
    first, rest = steps[0], steps[1:]
    members = _member_names(rest)
    if path.root == "module" and members:  # the module's name is not what a person calls the variable
        return ".".join(_past_internals(rest, members))
    return ".".join(_past_internals(steps, [first.name or first.text, *members]))


def _through_exception(path: HolderPath) -> bool:
    """The path starts at a stored exception (``sys.last_traceback``, one being handled) or follows one's
    traceback to the frames it keeps."""
    return path.root in ("traceback", "exception") or StepKind.TRACEBACK in path.kinds


def through_hook(path: HolderPath) -> bool:
    """The path goes through a hook dict's entry (``model._forward_hooks[3] -> closure 'acts'``). A variable a
    plain function closes over (a ``nonlocal`` total, a collector's list) is not a hook: its kind is what it
    keeps (a graph chain, a container of tensors)."""
    return any(s.kind is StepKind.HOOK for s in path.typed_steps)


def _in_frame(path: HolderPath, steps: Sequence[HolderStep]) -> bool:
    return path.root in ("frame", "thread") or any(s.kind is StepKind.FRAME_LOCAL for s in steps)


def _module_level_container(path: HolderPath, steps: Sequence[HolderStep]) -> bool:
    """The first container on the path is a global of an imported module (``pkg.mod.REGISTRY[...]``): not
    one of the running script (``__main__``: there every variable is a global), nor an attribute of a
    global object."""
    if path.root != "module" or not steps or steps[0].name == "__main__":
        return False
    between: list[StepKind] = []
    for s in steps[1:]:
        if s.kind in _CONTAINER_ITEMS:
            return bool(between) and all(k is StepKind.MODULE_GLOBAL for k in between)
        between.append(s.kind)
    return False


def _autograd_cycle(paths: Sequence[HolderPath]) -> bool:
    """A holder path round a ``.grad`` cycle (a create_graph=True gradient whose graph keeps its tensor)."""
    from torchmem.analysis.holders.cycles import AUTOGRAD, classify_cycle

    return any(p.root == "cycle" and classify_cycle(p)[0] == AUTOGRAD for p in paths)


def _variable_at(steps: Sequence[HolderStep]) -> int | None:
    """The index of the last variable (a module global or a frame local) among a holder's steps."""
    found = [i for i, s in enumerate(steps) if s.kind in (StepKind.MODULE_GLOBAL, StepKind.FRAME_LOCAL)]
    return found[-1] if found else None


def _carried_root(path: HolderPath, carried: Collection[str]) -> str | None:
    """The variable the loop carries that the path's holder starts at (``past`` of
    ``past.layers[0].keys``), ``None`` where it starts elsewhere."""
    steps = _holder_steps(path)
    at = _variable_at(steps)
    return steps[at].name if at is not None and steps[at].name in carried else None


def _carried_state(paths: Sequence[HolderPath], carried: Collection[str]) -> bool:
    """The holder is state the loop hands from one iteration to the next (``past`` in ``out = model(tok,
    past_key_values=past); past = out.past_key_values``): every path's holder starts at a variable the loop
    carries, and no list grows on it — the paths do not reach different items of a list or deque that is the
    carried variable itself (``history = history + [loss]`` reaches ``history[3]``, ``history[7]``). Items
    inside the state (``past.layers[0].keys``, ``past.layers[1].keys``; ``hidden[0]`` of an LSTM's tuple)
    are its fixed structure, re-made each iteration."""
    if not carried or not paths:
        return False
    if any(_carried_root(p, carried) is None for p in paths):
        return False
    firsts: list[HolderStep] = []
    for p in paths:
        steps = _holder_steps(p)
        at = _variable_at(steps)
        if at is not None and at + 1 < len(steps) and steps[at + 1].kind in _CONTAINER_ITEMS:
            firsts.append(steps[at + 1])
    # (one sampled item of such a list says nothing of the others: a list still)
    grows = (
        bool(firsts)
        and (len({s.name for s in firsts}) > 1 or len(firsts) == 1)
        and all(s.key_type == "int" and s.holder_type in ("list", "deque") for s in firsts)
    )
    return not grows


def _kind(g: SiteGrowth, main: Sequence[HolderPath] = (), carried: Collection[str] = ()) -> str:
    paths = g.paths
    if g.in_cycle or _autograd_cycle(paths):
        return CYCLE
    if any(_through_exception(p) for p in paths):
        return EXCEPTION
    # A tensor held with its graph: a hop into the graph, or a kept output whose graph still holds the
    # tensors it saved for backward (the path ends at the output; the activations hang from it).
    graph = (
        g.saved_bytes > 0
        or any(_GRAPH_HOPS.intersection(p.kinds) for p in paths)
        or any(p.graph == GRAPH_SAVED for p in paths)
    )
    if any(through_hook(p) for p in paths):
        return HOOK
    if graph:
        # One variable whose graph grows (no container item before the grad_fn hop), or a container.
        holders = [_before(p, frozenset({StepKind.GRAD_FN})) for p in paths if _holds_graph(p)]
        if holders and not any(_has_item(h) for h in holders):
            return GRAPH_CHAIN
        if _carried_state([p for p in main if _holds_graph(p)], carried):
            return GRAPH_CHAIN
        return RETAINED_GRAPH
    if g.storages_per_step < 0.5 and g.bytes_per_step > 0:
        return GROWING_TENSOR
    indexed = [(p, h) for p, h in ((p, _holder_steps(p)) for p in paths) if _has_item(h)]
    if not indexed:
        return UNKNOWN
    path, head = indexed[0]
    if any(_through_kept_optimizer(p) for p in paths):
        return KEPT_OPTIMIZER
    if _metric_state(path) is not None:
        return METRIC_STATE
    growing = _growing_key_type(paths)
    keyed = (
        growing == "str"
        if growing is not None
        else any(s.kind in _CONTAINER_ITEMS and s.key_type == "str" for s in head)
    )
    if not _in_frame(path, head) and _module_level_container(path, head):
        return GLOBAL
    return CACHE if keyed else ACCUMULATION


def _holds_graph(p: HolderPath) -> bool:
    """The path reaches a graph: through a ``.grad_fn`` hop, or it ends at a tensor whose graph keeps what
    it saved for backward."""
    return StepKind.GRAD_FN in p.kinds or p.graph == GRAPH_SAVED


def _growing_key_type(paths: Sequence[HolderPath]) -> str | None:
    """The key type of the container that grows: the first container step (in path order) whose key differs
    between the sampled paths — ``int`` for ``history[9]['dists']`` (a list of per-step records), ``str``
    for ``cache['epoch3-batch7']`` (a cache keyed by input). ``None`` where no key differs (one path)."""
    columns: list[list[HolderStep]] = []
    for p in paths:
        items = [s for s in _holder_steps(p) if s.kind in _CONTAINER_ITEMS]
        for j, s in enumerate(items):
            if j == len(columns):
                columns.append([])
            columns[j].append(s)
    for column in columns:
        if len({s.name for s in column}) > 1:
            return column[0].key_type
    return None


def _metric_state(path: HolderPath) -> tuple[str, str, str] | None:
    """``(owner, state, reset)`` where the path's first container is an attribute of a metric-like object:
    its class computes a result from what it collects (``compute``) and empties it (``reset``, or
    ``clear``) — a torchmetrics ``Metric``'s list state, a hand-written metric's list. ``None`` otherwise."""
    steps = _holder_steps(path)
    i = next((i for i, s in enumerate(steps) if s.kind in _CONTAINER_ITEMS), None)
    if not i:
        return None
    attr = steps[i - 1]
    methods = set(attr.methods.split(",")) if attr.methods else set()
    if attr.kind is not StepKind.ATTRIBUTE or "compute" not in methods:
        return None
    reset = "reset" if "reset" in methods else "clear" if "clear" in methods else None
    if reset is None:
        return None
    owner = holder_name(HolderPath.of(path.root, steps[: i - 1], max(i - 2, 0)))
    state = holder_name(HolderPath.of(path.root, steps[:i], i - 1))
    return owner, state, reset


def _through_kept_optimizer(path: HolderPath) -> bool:
    """The path reaches an optimizer's per-parameter state (``.state[<Parameter>]``) through a container's
    item before it: a list or dict of optimizers, each keeping the state its ``step()`` made."""
    steps = path.typed_steps
    for i, (a, b) in enumerate(itertools.pairwise(steps)):
        if (
            a.kind is StepKind.ATTRIBUTE
            and a.name == "state"
            and b.kind in _CONTAINER_ITEMS
            and b.key_type in ("Parameter", "Tensor")
        ):
            return any(s.kind in _CONTAINER_ITEMS for s in steps[:i])
    return False


def _grad_graph(path: HolderPath) -> bool:
    """Whether the path reaches the graph through a tensor's ``.grad`` (a gradient made with
    ``create_graph=True``, stored in ``.grad``)."""
    steps = path.typed_steps
    return any(
        a.kind is StepKind.ATTRIBUTE and a.name == "grad" and b.kind is StepKind.GRAD_FN
        for a, b in itertools.pairwise(steps)
    )


def _grad_graph_owner(path: HolderPath) -> str:
    """Who holds the gradient made with ``create_graph=True``: the path up to its ``.grad``, as a person
    writes it (``model.weight``)."""
    steps = path.typed_steps
    i = next(
        i
        for i, (a, b) in enumerate(itertools.pairwise(steps))
        if a.kind is StepKind.ATTRIBUTE and a.name == "grad" and b.kind is StepKind.GRAD_FN
    )
    head = steps[: i + 1]
    start = max((j for j, st in enumerate(head) if st.kind is StepKind.FRAME_LOCAL), default=None)
    if start is not None:
        owner = head[start].name + "".join(st.text for st in head[start + 1 :])
    elif path.root == "module" and len(head) > 1:
        owner = "".join(st.text for st in head[1:]).lstrip(".")
    else:
        owner = holder_name(HolderPath.of(path.root, head, path.depth))
    return owner


def _main_pattern(paths: Sequence[HolderPath], carried: Collection[str] = ()) -> str:
    """The holder most sampled storages share (a container beats the loop variable of the last step; of
    holders equally shared, one that reaches them through a list of per-step objects — ``outputs[2]`` over
    the loop variable ``out`` holding the same last output — then a variable the program's loop carries from
    iteration to iteration (``carried``: read before it is written, as ``hidden`` in ``logits, hidden =
    model(tokens, hidden)``) over the step's output whose graph reaches the same tensors, then the one with
    the shortest path)."""
    counts: dict[str, int] = {}
    hops: dict[str, int] = {}
    seq: dict[str, bool] = {}
    loop: dict[str, bool] = {}
    for p in paths:
        k = holder_pattern(p)
        counts[k] = counts.get(k, 0) + 1
        hops[k] = min(hops.get(k, len(p.steps)), len(p.steps))
        seq[k] = seq.get(k, False) or _through_a_sequence(p)
        loop[k] = loop.get(k, False) or (bool(carried) and _carried_variable(p, carried))
    best = max(counts, key=lambda k: (counts[k], "[*]" in k, seq[k], loop[k], -hops[k]))
    if loop[best] or "[*]" in best or seq[best]:
        return best
    # A variable the loop carries reaches the same tensors as the step's output that beat it by a sample or
    # two (the output reaches the newest one first): the carried state is the holder to fix.
    near = [k for k in counts if loop[k] and counts[k] >= counts[best] - max(1, counts[best] // 4)]
    return max(near, key=lambda k: (counts[k], -hops[k])) if near else best


def _carried_variable(path: HolderPath, carried: Collection[str]) -> bool:
    """Whether the path's holder is a variable itself (a module global or a frame local, no attribute or
    item after it before the autograd hops) that the loop carries."""
    steps = _holder_steps(path)
    at = _variable_at(steps)
    return at is not None and at == len(steps) - 1 and steps[at].name in carried


def _through_a_sequence(path: HolderPath) -> bool:
    """Whether the path's first container step is an index into a list, deque or tuple (``outputs[2]...``):
    a collection of per-step objects, where a variable (``out['cache']...``) holds one step's object."""
    for s in path.typed_steps:
        if s.kind in _CONTAINER_ITEMS:
            return s.key_type == "int" and s.holder_type in ("list", "deque", "tuple")
    return False


def _metric_fix(holder: HolderPath, per_step: float, unit: str) -> str:
    owner, state, reset = _metric_state(holder) or ("?", "?", "reset")
    return metric_state_fix(owner, state, reset, per_step, unit)


def attribute(
    growth: Sequence[SiteGrowth],
    *,
    min_bytes_per_step: float = 0.0,
    total_per_step: float | None = None,
    unit: str = "step",
    device: str | None = None,
    carried: Collection[str] = (),
    backward: bool | None = None,
) -> tuple[Culprit, ...]:
    """Group growing sites by the holder that keeps their memory, classify each group, and give its fix.

    Sites kept by the same holder (``losses[*]`` keeps both the loss and the activations its graph saved)
    become one culprit, largest first. The kind comes from the step kinds of the typed holder paths; the
    culprit carries the readable path of its holder. ``unit`` (``"step"``, or ``"s"`` when the rates are per
    second of a timeline) and ``device`` (the watched device) word the fix (:func:`fix_for`). ``carried``:
    the variables the program's loop hands from iteration to iteration (read before written), preferred
    among holders that share the same tensors equally, and named as state carried over (a graph chain)
    when they hold a graph. ``backward``: whether the program ran a backward (``False``: the fix of a graph
    kept is ``torch.no_grad()``; ``None``: not known).
    """
    groups: dict[str, list[SiteGrowth]] = {}
    for g in growth:
        if g.bytes_per_step < min_bytes_per_step:
            continue
        key = _main_pattern(g.paths, carried) if g.paths else f"<unheld {g.site}>"
        groups.setdefault(key, []).append(g)
    culprits: list[Culprit] = []
    metrics: dict[int, tuple[str, str, str]] = {}  # id(culprit) -> its metric's (owner, state, reset)
    for key, gs in groups.items():
        gs.sort(key=lambda g: -g.bytes_per_step)
        merged = SiteGrowth(
            site=gs[0].site,
            bytes_per_step=sum(g.bytes_per_step for g in gs),
            live_bytes=sum(g.live_bytes for g in gs),
            storages=sum(g.storages for g in gs),
            storages_per_step=sum(g.storages_per_step for g in gs),
            paths=tuple(p for g in gs for p in g.paths),
            saved_bytes=sum(g.saved_bytes for g in gs),
            in_cycle=any(g.in_cycle for g in gs),
            cycle_types=tuple(t for g in gs for t in g.cycle_types),
        )
        main = [p for p in merged.paths if holder_pattern(p) == key]
        kind = _kind(merged, main, carried)
        holder = main[0] if main else None
        name = holder_name(holder) if holder else (merged.site or "?")
        if kind == EXCEPTION and holder is not None:
            name = _exception_holder_name(holder) or name
        state = False
        if kind == GRAPH_CHAIN and holder is not None:
            var = _carried_root(holder, carried)
            if var is not None and var != name:
                name, state = var, True  # `past`, not `past.layers`: the variable the loop carries
        per_step = merged.bytes_per_step
        graph = per_step * merged.saved_bytes / merged.live_bytes if merged.live_bytes else 0.0
        culprits.append(
            Culprit(
                kind=kind,
                site=merged.site,
                sites=tuple((g.site or "?", g.bytes_per_step) for g in gs),
                holder=str(holder)
                if holder
                else (
                    f"unreachable cycle of {', '.join(merged.cycle_types[:3])}" if merged.in_cycle else None
                ),
                bytes=merged.live_bytes,
                bytes_per_step=per_step,
                graph_bytes=graph,
                fix=grad_graph_fix(_grad_graph_owner(holder), per_step, unit)
                if kind in (GRAPH_CHAIN, RETAINED_GRAPH) and holder is not None and _grad_graph(holder)
                else cycle_fix()
                if kind == CYCLE and _autograd_cycle(merged.paths)
                else _metric_fix(holder, per_step, unit)
                if kind == METRIC_STATE and holder is not None and _metric_state(holder) is not None
                else fix_for(
                    kind,
                    name,
                    per_step,
                    merged.cycle_types,
                    unit=unit,
                    device=device,
                    backward=backward,
                    state=state,
                    entry_bytes=per_step / merged.storages_per_step
                    if unit == "step" and merged.storages_per_step >= 0.5
                    else None,
                    nodes=any(p.graph == GRAPH_NODES for p in main),
                ),
            )
        )
        metric = _metric_state(holder) if kind == METRIC_STATE and holder is not None else None
        if metric is not None:
            metrics[id(culprits[-1])] = metric
    culprits = _merge_metric_states(culprits, metrics, unit)
    culprits.sort(key=lambda c: -c.bytes_per_step)
    return tuple(culprits)


def _merge_metric_states(
    culprits: list[Culprit], metrics: dict[int, tuple[str, str, str]], unit: str
) -> list[Culprit]:
    """One culprit per metric: the states of one object (``auroc.preds``, ``auroc.target``) are one fix.
    ``metrics``: ``id(culprit) -> (owner, state, reset)`` of the metric-state culprits."""
    by_owner: dict[str, list[Culprit]] = {}
    rest: list[Culprit] = []
    for c in culprits:
        m = metrics.get(id(c))
        if m is None:
            rest.append(c)
        else:
            by_owner.setdefault(m[0], []).append(c)
    for owner, cs in by_owner.items():
        if len(cs) == 1:
            rest.append(cs[0])
            continue
        cs.sort(key=lambda c: -c.bytes_per_step)
        per_step = sum(c.bytes_per_step for c in cs)
        states = [metrics[id(c)][1] for c in cs]
        rest.append(
            Culprit(
                kind=METRIC_STATE,
                site=cs[0].site,
                sites=tuple(s for c in cs for s in c.sites),
                holder=cs[0].holder,
                bytes=sum(c.bytes for c in cs),
                bytes_per_step=per_step,
                graph_bytes=sum(c.graph_bytes for c in cs),
                fix=metric_state_fix(owner, states, metrics[id(cs[0])][2], per_step, unit),
            )
        )
    return rest


__all__ = ["attribute", "holder_name", "holder_pattern", "site_growth"]
