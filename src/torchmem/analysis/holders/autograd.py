"""References the garbage collector cannot see, added to the search as virtual edges with typed steps.

A tensor's ``.grad`` and ``._base`` and every tensor an autograd graph saved for backward are held from C++:
``gc.get_referents`` does not return them. :func:`autograd_edges` finds them for the targets of one search:

- ``.grad`` and ``._base`` of every live tensor (an ``attribute`` step);
- every graph reachable from a live tensor's ``grad_fn`` (a ``grad_fn`` step) or from a Python-defined node
  (``torch.autograd.function.BackwardCFunction``), walked through ``next_functions`` once for all targets:
  each node's ``_saved_*`` attributes and ``saved_tensors`` (a ``saved_tensor`` step), the variable of an
  ``AccumulateGrad`` leaf (an ``autograd_edge`` step) and tensors stored on a custom Function's ``ctx`` (an
  ``attribute`` step). A hop into a graph weighs about as much as one reference whatever the node's depth
  (it reads as one step); each node is reached from the :data:`NEAREST` graph holders closest to it;
- the edge that closes an autograd cycle (:func:`grad_cycles`): ``x.grad = g`` with ``g`` from
  ``create_graph=True``, whose graph saved ``x`` (``x -> .grad -> g.grad_fn -> ... -> x``), into ``x`` even
  when ``x`` is not a target, so that a cycle nothing else holds reads as one.

A saved tensor is matched to a target by identity, or by data pointer, shape, stride and dtype when autograd
unpacks a fresh wrapper (as it does for saved outputs); a different view of the same storage is reported as
sharing it. Cost: at most :data:`NEAREST` visits per graph node however many tensors share a graph, plus
reading each node's saved attributes, which runs any ``saved_tensors_hooks`` unpack hook.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from torchmem.analysis.holders.index import HeapIndex
from torchmem.results.holders import GRAPH_NODES, GRAPH_SAVED, HolderStep, StepKind

# A virtual edge into a target: (the object holding the reference, the steps that name it, its weight).
VirtualEdge = tuple[Any, tuple[HolderStep, ...], int]

NEAREST = 4  # graph roots each autograd node keeps: the ones that reach it in the fewest edges
_TENSOR_BASE: Any = torch._C.TensorBase.__dict__  # C getters, bypassing subclass properties
GRAD_FN = _TENSOR_BASE["grad_fn"].__get__
GRAD = _TENSOR_BASE["grad"].__get__
BASE = _TENSOR_BASE["_base"].__get__
IS_VIEW = torch._C.TensorBase._is_view
DATA_PTR = torch._C.TensorBase.data_ptr
_saved_names: dict[type, tuple[str, ...]] = {}


def saved_attributes(node_type: type) -> tuple[str, ...]:
    """The ``_saved_*`` attributes of an autograd node type (without the symbolic size/stride mirrors)."""
    names = _saved_names.get(node_type)
    if names is None:
        names = tuple(
            a
            for a in dir(node_type)
            if a.startswith("_saved_") and not a.endswith(("_sym_sizes", "_sym_strides"))
        )
        _saved_names[node_type] = names
    return names


def saved_values(node: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors autograd node ``node`` saved for backward and still holds, as ``(attribute, tensor)``
    (``_saved_tensors[1]`` for an element of a saved list); none once a backward freed them."""
    for a in saved_attributes(type(node)):
        try:
            v = getattr(node, a)
        except Exception:  # freed by backward, or unpacking failed
            continue
        if isinstance(v, torch.Tensor):
            yield a, v
        elif isinstance(v, (list, tuple)):
            for j, x in enumerate(v):
                if isinstance(x, torch.Tensor):
                    yield f"{a}[{j}]", x


def graph_state(tensors: Sequence[Any], max_nodes: int = 32) -> str:
    """What the autograd graphs of ``tensors`` keep: ``"saved"`` where a node still holds tensors it saved
    for backward (no backward ran through it: the activations stay with it), ``"nodes"`` where they have a
    ``grad_fn`` whose saved tensors a backward freed (or that saved none: only its nodes stay), ``""`` where
    none has a ``grad_fn``. Looks at the first ``max_nodes`` nodes of each graph (a backward frees all of a
    graph's saved tensors at once, so the nodes nearest the output tell).

    Example:
        >>> import torch
        >>> w = torch.randn(3, 3, requires_grad=True)
        >>> y = (torch.randn(2, 3) @ w).tanh()
        >>> graph_state([y]), graph_state([y.detach()])
        ('saved', '')
        >>> y.sum().backward()
        >>> graph_state([y])
        'nodes'
    """
    state = ""
    seen: set[int] = set()
    for t in tensors:
        try:
            fn = GRAD_FN(t)
        except Exception:
            continue
        if fn is None:
            continue
        state = GRAPH_NODES
        stack = [fn]
        k = 0
        while stack and k < max_nodes:
            node = stack.pop()
            if id(node) in seen:
                continue
            seen.add(id(node))
            k += 1
            for _ in saved_values(node):
                return GRAPH_SAVED
            try:
                stack.extend(c for c, _ in node.next_functions if c is not None)
            except Exception:
                continue
    return state


def subclasses(base: type) -> set[type]:
    """``base`` and every class derived from it, at any depth."""
    out: set[type] = {base}
    todo: list[type] = [base]
    while todo:
        sub: type
        for sub in type.__subclasses__(todo.pop()):
            if sub not in out:
                out.add(sub)
                todo.append(sub)
    return out


class _TargetMatcher:
    """Which targets a tensor is (by identity) or shares a storage with (by data pointer)."""

    def __init__(self, targets: Sequence[Any]) -> None:
        self.targets = targets
        self.index_of: dict[int, int] = {}
        self.by_storage: dict[int, tuple[int, list[int]]] = {}  # storage start -> (end, target indices)
        for i, t in enumerate(targets):
            if isinstance(t, torch.Tensor):
                self.index_of.setdefault(id(t), i)
                try:
                    s = t.untyped_storage()
                    start, size = int(s.data_ptr()), int(s.nbytes())
                except Exception:  # sparse, nested and other storage-less layouts
                    continue
                if start and size:
                    self.by_storage.setdefault(start, (start + size, []))[1].append(i)
        self.starts = sorted(self.by_storage)

    def match(self, v: Any) -> list[tuple[int, str]]:
        """Targets that tensor ``v`` is (``""``) or shares a storage with (``", shares storage"``)."""
        i = self.index_of.get(id(v))
        out: list[tuple[int, str]] = [] if i is None else [(i, "")]
        if not self.starts or not isinstance(v, torch.Tensor):
            return out
        try:
            dp = int(DATA_PTR(v))
        except Exception:
            return out
        k = bisect.bisect_right(self.starts, dp) - 1
        if not dp or k < 0:
            return out
        end, indices = self.by_storage[self.starts[k]]
        if dp >= end:
            return out
        for ti in indices:
            if ti == i:
                continue
            t = self.targets[ti]
            same = (
                dp == int(DATA_PTR(t))
                and v.shape == t.shape
                and v.stride() == t.stride()
                and v.dtype == t.dtype
            )
            out.append((ti, "" if same else ", shares storage"))
        return out


def _saved_by_node(node: Any, match: Callable[[Any], list[tuple[int, str]]]) -> list[tuple[int, HolderStep]]:
    """(target index, step) for every target that autograd node ``node`` itself keeps."""
    name = type(node).__name__
    out: list[tuple[int, HolderStep]] = []

    def saved(a: str, shares: str) -> HolderStep:
        return HolderStep(StepKind.SAVED_TENSOR, f" -> saved tensor of {name} ({a}{shares})", a, name)

    for a, t in saved_values(node):
        out.extend((ti, saved(a, s)) for ti, s in match(t))
    if name == "AccumulateGrad":
        try:
            v = node.variable
        except Exception:
            v = None
        if v is not None:
            out.extend(
                (
                    ti,
                    HolderStep(
                        StepKind.AUTOGRAD_EDGE,
                        f" -> graph leaf (AccumulateGrad.variable{s})",
                        "variable",
                        name,
                    ),
                )
                for ti, s in match(v)
            )
    elif isinstance(node, torch.autograd.function.BackwardCFunction):
        kept: Sequence[Any]
        try:
            kept = node.saved_tensors
        except Exception:
            kept = ()
        for j, x in enumerate(kept):
            out.extend((ti, saved(f"saved_tensors[{j}]", s)) for ti, s in match(x))
        try:
            attrs = dict(object.__getattribute__(node, "__dict__"))
        except Exception:
            attrs = {}
        for k, x in attrs.items():
            if isinstance(x, torch.Tensor):
                out.extend(
                    (ti, HolderStep(StepKind.ATTRIBUTE, f" -> {name} ctx.{k}{s}", k, name))
                    for ti, s in match(x)
                )
    return out


@dataclass
class GradCycle:
    """Tensors that their own gradient's graph keeps: ``x.grad = g`` with ``g`` from ``create_graph=True``
    whose graph saved ``x`` (``x -> .grad -> g -> g.grad_fn -> ... -> x``), one per connected second-order
    graph. Live objects: hold it no longer than the search or report that made it.

    Attributes:
        members: ``(x, g, step)`` per tensor on the cycle: the tensor, its ``.grad`` and the step naming how
            ``g``'s graph keeps ``x`` (a saved tensor, or the graph leaf ``AccumulateGrad.variable``).
        nodes: The graph nodes of the gradients' graphs (their saved tensors are kept by the cycle).
    """

    members: list[tuple[Any, Any, HolderStep]] = field(default_factory=list)
    nodes: list[Any] = field(default_factory=list)

    def saved(self) -> Iterator[Any]:
        """Every tensor the cycle's graph nodes keep (saved for backward, and graph leaves)."""
        for n in self.nodes:
            yield from (t for _, t in saved_values(n))
            if type(n).__name__ == "AccumulateGrad":
                v = getattr(n, "variable", None)
                if isinstance(v, torch.Tensor):
                    yield v


def _children(n: Any, kids: dict[int, list[Any]]) -> list[Any]:
    k = id(n)
    c = kids.get(k)
    if c is None:
        try:
            c = [x for x, _ in n.next_functions if x is not None]
        except Exception:
            c = []
        kids[k] = c
    return c


def grad_cycles(tensors: Sequence[Any], out_of_time: Callable[[], bool] = lambda: False) -> list[GradCycle]:
    """The autograd cycles among ``tensors``: each tensor whose ``.grad`` has a graph (``create_graph=True``)
    that keeps the tensor itself. A plain ``.grad`` from ``backward()`` has no graph and is never a cycle.

    One walk over the graphs of every such gradient, each node once: which gradients reach it (a bit per
    gradient, propagated in topological order), then which of the tensors it saves. Gradients whose graphs
    share nodes (the parameters of one model under a gradient penalty) form one cycle.

    Example:
        >>> import torch
        >>> x = torch.randn(4, requires_grad=True)
        >>> (g,) = torch.autograd.grad((x * x).sum(), x, create_graph=True)
        >>> x.grad = g
        >>> [len(c.members) for c in grad_cycles([x])]
        [1]
        >>> x.grad = g.detach()
        >>> grad_cycles([x])
        []
    """
    pairs: list[tuple[Any, Any]] = []
    for t in tensors:
        try:
            if GRAD_FN(t) is not None:  # not a leaf: autograd never fills its .grad (and reading it warns)
                continue
            g = GRAD(t)
        except Exception:
            continue
        if g is None:
            continue
        try:
            fn = GRAD_FN(g)
        except Exception:
            continue
        if fn is not None:
            pairs.append((t, g))
    if not pairs:
        return []
    kids: dict[int, list[Any]] = {}
    alive: dict[int, Any] = {}  # node wrappers stay alive (and their ids stable) during the walk
    order: list[Any] = []  # post-order: children before parents
    mask: dict[int, int] = {}
    for i, (_, g) in enumerate(pairs):
        fn = GRAD_FN(g)
        mask[id(fn)] = mask.get(id(fn), 0) | (1 << i)
        if id(fn) in alive:
            continue
        alive[id(fn)] = fn
        stack: list[tuple[Any, bool]] = [(fn, False)]
        while stack:
            n, done = stack.pop()
            if done:
                order.append(n)
                continue
            stack.append((n, True))
            for c in _children(n, kids):
                if id(c) not in alive:
                    alive[id(c)] = c
                    stack.append((c, False))
            if len(alive) % 4096 == 0 and out_of_time():
                return []
    for n in reversed(order):  # parents before children: each node's bits are final when it passes them on
        bits = mask.get(id(n), 0)
        if bits:
            for c in kids.get(id(n), ()):
                mask[id(c)] = mask.get(id(c), 0) | bits
    match = _TargetMatcher([t for t, _ in pairs]).match
    found: dict[int, HolderStep] = {}  # pair index -> how its gradient's graph keeps the tensor
    for n in order:
        bits = mask.get(id(n), 0)
        if not bits:
            continue
        for ti, step in _saved_by_node(n, match):
            # a saved tensor says more than the graph leaf (AccumulateGrad.variable) that also holds it
            if bits >> ti & 1 and (ti not in found or found[ti].kind is not StepKind.SAVED_TENSOR):
                found[ti] = step
    if not found:
        return []
    # Cycles whose graphs share a node are one: union the confirmed gradients' bits node by node.
    parent = list(range(len(pairs)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    confirmed = sum(1 << i for i in found)
    node_bits: list[tuple[Any, int]] = []
    for n in order:
        bits = mask.get(id(n), 0) & confirmed
        if not bits:
            continue
        node_bits.append((n, bits))
        first = (bits & -bits).bit_length() - 1
        rest = bits & (bits - 1)
        while rest:
            low = rest & -rest
            parent[root(low.bit_length() - 1)] = root(first)
            rest ^= low
    groups: dict[int, GradCycle] = {}
    for i in sorted(found):
        t, g = pairs[i]
        groups.setdefault(root(i), GradCycle()).members.append((t, g, found[i]))
    for n, bits in node_bits:
        groups[root((bits & -bits).bit_length() - 1)].nodes.append(n)
    return list(groups.values())


class AutogradEdges:
    """What :func:`autograd_edges` found: the virtual edges into objects, by ``id``, and the tensors on an
    autograd cycle (:func:`grad_cycles`), by ``id``, each with the edge that closes its loop."""

    __slots__ = ("cycle_edges", "edges")

    def __init__(self) -> None:
        self.edges: dict[int, list[VirtualEdge]] = {}
        self.cycle_edges: dict[int, VirtualEdge] = {}  # id(x) -> (g, steps, weight): x.grad's graph keeps x

    def add(self, obj_id: int, edge: VirtualEdge) -> None:
        self.edges.setdefault(obj_id, []).append(edge)


def autograd_edges(
    targets: Sequence[Any],
    index: HeapIndex,
    out_of_time: Callable[[], bool],
    ignore: set[int] | None = None,
) -> AutogradEdges:
    """Virtual edges into the targets: ``.grad``, ``._base``, autograd's saved tensors; and the edges that
    close an autograd cycle (a tensor kept by the graph of its own ``.grad``), into any tensor. ``ignore``:
    ids of the caller's containers, which do not make a tensor one that Python code holds."""
    found = AutogradEdges()
    tensor_types = subclasses(torch.Tensor)
    node_types = subclasses(torch.autograd.function.BackwardCFunction)
    picked = index.instances(tensor_types | node_types)
    tensors = [o for o in picked if type(o) in tensor_types]
    python_nodes = [o for o in picked if type(o) in node_types]
    picked.clear()
    match = _TargetMatcher(targets).match

    def add(target_i: int, holder: Any, steps: tuple[HolderStep, ...], weight: int) -> None:
        found.add(id(targets[target_i]), (holder, steps, weight))

    # Tensors a graph may have saved that have a graph of their own (an intermediate result, held from C++
    # only once Python dropped it) or that nothing in Python refers to: edges into them too, so that a path
    # through one starts at what holds that graph rather than at a tensor "held outside Python".
    wanted = {id(t) for t in targets}
    others = [t for t in tensors if id(t) not in wanted]
    unheld = index.refer_counts([id(t) for t in others])
    inner = [t for t, n in zip(others, unheld) if not n or _has_graph(t)]
    others.clear()
    match_all = _TargetMatcher([*targets, *inner]).match
    n_targets = len(targets)

    def match_saved(v: Any) -> list[tuple[int, str]]:
        return [(i, s) for i, s in match_all(v) if i < n_targets or not s]

    def add_saved(i: int, holder: Any, steps: tuple[HolderStep, ...], weight: int) -> None:
        obj = targets[i] if i < n_targets else inner[i - n_targets]
        found.add(id(obj), (holder, steps, weight))

    # (object holding the graph, the graph's first node, the steps into it, their weight)
    graph_roots: list[tuple[Any, Any, tuple[HolderStep, ...], int]] = []
    for t in tensors:
        try:
            fn = GRAD_FN(t)
        except Exception:
            continue
        if fn is not None:
            step = HolderStep(StepKind.GRAD_FN, ".grad_fn", type(fn).__name__, type(t).__name__)
            graph_roots.append((t, fn, (step,), 2))
            continue
        try:
            g = GRAD(t)
        except Exception:
            g = None
        if g is not None:
            hits = match(g)
            for ti, shares in hits:
                text = f".grad{shares and ' (shares storage)'}"
                add(ti, t, (HolderStep(StepKind.ATTRIBUTE, text, "grad", type(t).__name__),), 1)
            if not hits:
                # Not a target: an edge by identity, for a search that climbs through it (a gradient whose
                # graph saved its own tensor: ``x.grad = g`` with ``create_graph=True``, a cycle).
                step = HolderStep(StepKind.ATTRIBUTE, ".grad", "grad", type(t).__name__)
                found.add(id(g), (t, (step,), 1))
        try:
            b = BASE(t) if IS_VIEW(t) else None
        except Exception:
            b = None
        if b is not None:
            hits = match(b)
            for ti, shares in hits:
                text = f"._base{shares and ' (shares storage)'}"
                add(ti, t, (HolderStep(StepKind.ATTRIBUTE, text, "_base", type(t).__name__),), 1)
            if not hits:
                step = HolderStep(StepKind.ATTRIBUTE, "._base", "_base", type(t).__name__)
                found.add(id(b), (t, (step,), 1))
    # The edge that closes each autograd cycle: x.grad's graph keeps x (x is seldom a target: without this
    # edge, x held only by that graph would read as held outside Python).
    for cycle in grad_cycles(tensors, out_of_time):
        for x, g, step in cycle.members:
            into = HolderStep(StepKind.GRAD_FN, ".grad_fn", type(GRAD_FN(g)).__name__, type(g).__name__)
            edge: VirtualEdge = (g, (into, step), 2)
            found.add(id(x), edge)
            found.cycle_edges[id(x)] = edge
        cycle.members.clear()
        cycle.nodes.clear()
    for o in python_nodes:
        graph_roots.append((o, o, (), 1))
    if graph_roots:
        # Graphs that Python code refers to first: a path from them reads better than one that climbs
        # through intermediate results autograd keeps (each another `.grad_fn -> saved tensor` hop).
        held = index.referred([id(h) for h, _, _, _ in graph_roots], ignore or set())
        _saved_edges(graph_roots, held, match_saved, add_saved, out_of_time)
    inner.clear()
    return found


def _has_graph(t: Any) -> bool:
    try:
        return GRAD_FN(t) is not None
    except Exception:
        return False


def _saved_edges(
    graph_roots: list[tuple[Any, Any, tuple[HolderStep, ...], int]],
    held: list[bool],
    match: Callable[[Any], list[tuple[int, str]]],
    add: Callable[[int, Any, tuple[HolderStep, ...], int], None],
    out_of_time: Callable[[], bool],
) -> None:
    """Edges from the graphs' holders into the targets their nodes saved.

    One breadth-first walk from every graph root at once; each node keeps the :data:`NEAREST` roots that
    Python refers to (``held``) and the :data:`NEAREST` others that reach it first (fewest edges), so a node
    is expanded a bounded number of times however many tensors share its graph, and every target a node
    saved gets an edge from each of them (the search ranks the paths).
    """
    nearest: dict[int, list[tuple[int, int]]] = {}  # id(node) -> [(graph root index, depth)]
    alive: dict[int, Any] = {}  # node wrappers stay alive (and their ids stable) during the walk
    kids: dict[int, list[Any]] = {}
    queue: deque[tuple[Any, int, int]] = deque()

    def reach(n: Any, ri: int, depth: int) -> None:
        k = id(n)
        got = nearest.get(k)
        if got is None:
            nearest[k] = [(ri, depth)]
            alive[k] = n
        elif any(r == ri for r, _ in got) or sum(held[r] == held[ri] for r, _ in got) >= NEAREST:
            return
        else:
            got.append((ri, depth))
        queue.append((n, ri, depth))

    popped = 0
    # Tensors' graphs first; then the Python-defined nodes no tensor's graph reached (a node a tensor's graph
    # holds is named through that tensor, not as a node held outside Python).
    for own in (False, True):
        for ri, (h, fn, _, _) in enumerate(graph_roots):
            if (h is fn) is own and (not own or id(fn) not in nearest):
                reach(fn, ri, 0)
        while queue:
            n, ri, depth = queue.popleft()
            for c in _children(n, kids):
                reach(c, ri, depth + 1)
            popped += 1
            if popped % 4096 == 0 and out_of_time():
                queue.clear()
                break
    for k, roots in nearest.items():
        for ti, step in _saved_by_node(alive[k], match):
            for ri, depth in roots:
                holder, _, into, weight = graph_roots[ri]
                # A hop into a graph reads as one step however deep the node is (`.grad_fn -> saved tensor
                # of X`): weighed so, a path from a graph Python holds beats one that climbs through the
                # intermediate results between (each another hop).
                add(ti, holder, (*into, step), weight + min(depth, 1))
