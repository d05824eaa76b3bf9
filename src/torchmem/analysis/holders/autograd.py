"""References the garbage collector cannot see, added to the search as virtual edges with typed steps.

A tensor's ``.grad`` and ``._base`` and every tensor an autograd graph saved for backward are held from C++:
``gc.get_referents`` does not return them. :func:`autograd_edges` finds them for the targets of one search:

- ``.grad`` and ``._base`` of every live tensor (an ``attribute`` step);
- every graph reachable from a live tensor's ``grad_fn`` (a ``grad_fn`` step) or from a Python-defined node
  (``torch.autograd.function.BackwardCFunction``), walked through ``next_functions`` once for all targets:
  each node's ``_saved_*`` attributes and ``saved_tensors`` (a ``saved_tensor`` step), the variable of an
  ``AccumulateGrad`` leaf (an ``autograd_edge`` step) and tensors stored on a custom Function's ``ctx`` (an
  ``attribute`` step). A hop through the graph weighs one reference per edge.

A saved tensor is matched to a target by identity, or by data pointer, shape, stride and dtype when autograd
unpacks a fresh wrapper (as it does for saved outputs); a different view of the same storage is reported as
sharing it. Cost: one visit per graph node (memoised), plus reading each node's saved attributes, which runs
any ``saved_tensors_hooks`` unpack hook.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import torch

from torchmem.analysis.holders.index import HeapIndex
from torchmem.results.holders import HolderStep, StepKind

# A virtual edge into a target: (the object holding the reference, the steps that name it, its weight).
VirtualEdge = tuple[Any, tuple[HolderStep, ...], int]

_INF = 1 << 30
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
        if i is not None:
            return [(i, "")]
        if not self.starts or not isinstance(v, torch.Tensor):
            return []
        try:
            dp = int(DATA_PTR(v))
        except Exception:
            return []
        k = bisect.bisect_right(self.starts, dp) - 1
        if not dp or k < 0:
            return []
        end, indices = self.by_storage[self.starts[k]]
        if dp >= end:
            return []
        out: list[tuple[int, str]] = []
        for ti in indices:
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

    for a in saved_attributes(type(node)):
        try:
            v = getattr(node, a)
        except Exception:  # freed by backward, or unpacking failed
            continue
        if isinstance(v, torch.Tensor):
            out.extend((ti, saved(a, s)) for ti, s in match(v))
        elif isinstance(v, (list, tuple)):
            for j, x in enumerate(v):
                if isinstance(x, torch.Tensor):
                    out.extend((ti, saved(f"{a}[{j}]", s)) for ti, s in match(x))
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


def autograd_edges(
    targets: Sequence[Any], index: HeapIndex, out_of_time: Callable[[], bool]
) -> dict[int, list[VirtualEdge]]:
    """Virtual edges into the targets, by ``id(target)``: ``.grad``, ``._base``, autograd's saved tensors."""
    edges: dict[int, list[VirtualEdge]] = {}
    tensor_types = subclasses(torch.Tensor)
    node_types = subclasses(torch.autograd.function.BackwardCFunction)
    picked = index.instances(tensor_types | node_types)
    tensors = [o for o in picked if type(o) in tensor_types]
    python_nodes = [o for o in picked if type(o) in node_types]
    picked.clear()
    match = _TargetMatcher(targets).match

    def add(target_i: int, holder: Any, steps: tuple[HolderStep, ...], weight: int) -> None:
        edges.setdefault(id(targets[target_i]), []).append((holder, steps, weight))

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
                edges.setdefault(id(g), []).append((t, (step,), 1))
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
                edges.setdefault(id(b), []).append((t, (step,), 1))
    for o in python_nodes:
        graph_roots.append((o, o, (), 1))
    if not graph_roots:
        return edges

    # Per node: the targets it keeps, itself or below it, with the fewest edges to them (memoised).
    memo: dict[int, tuple[tuple[int, HolderStep, int], ...]] = {}
    kids: dict[int, list[Any]] = {}
    alive: list[Any] = []  # node wrappers stay alive (and their ids stable) during the walk

    def children(n: Any) -> list[Any]:
        k = id(n)
        c = kids.get(k)
        if c is None:
            try:
                c = [x for x, _ in n.next_functions if x is not None]
            except Exception:
                c = []
            kids[k] = c
        return c

    visited = 0
    for holder, fn, into, weight in graph_roots:
        if holder is fn and id(fn) in memo:
            continue  # a Python-defined node already reached from a tensor's grad_fn
        stack: list[tuple[Any, bool]] = [(fn, False)]
        while stack:
            n, done = stack.pop()
            k = id(n)
            if done:
                best: dict[tuple[int, HolderStep], int] = {}
                for ti, step in _saved_by_node(n, match):
                    best[(ti, step)] = 0
                for c in children(n):
                    for ti, step, d in memo.get(id(c), ()):
                        if d + 1 < best.get((ti, step), _INF):
                            best[(ti, step)] = d + 1
                memo[k] = tuple((ti, step, d) for (ti, step), d in itertools.islice(best.items(), 64))
                continue
            if k in memo or k in kids:
                continue
            alive.append(n)
            stack.append((n, True))
            stack.extend((c, False) for c in children(n) if id(c) not in memo)
            visited += 1
            if visited % 4096 == 0 and out_of_time():
                return edges
        for ti, step, d in memo.get(id(fn), ()):
            add(ti, holder, (*into, step), weight + d)
    return edges
