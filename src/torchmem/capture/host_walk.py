"""The bounded walks of :class:`torchmem.capture.host.HostWatcher`'s scans: the live tensors' autograd graphs
(their heads, the nodes made since the last scan, the live nodes in all) and the Python objects' counts per
type, with the ids and a few new instances of the types that grow.

They run inside a step boundary (on the program's thread), each bounded in time or in what it keeps; none
keeps a graph alive between two scans: a :class:`HostScan` keeps numbers only.
"""

from __future__ import annotations

import collections
import contextlib
import gc
import itertools
import sys
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import Any

import torch

from torchmem.analysis.host import ChainGrowth, ChainHead

NO_SEQ = 1 << 63  # AccumulateGrad (and other leaves) have sequence number UINT64_MAX
_FIRST_PASS_NODES = 256  # nodes walked per graph before the others are walked at all
_MAX_IDS = 2_000_000  # ids remembered per scan, to tell new instances from old ones
SAMPLES_PER_TYPE = 4


class HostScan:
    """What one scan keeps until the next: type counts, autograd heads (numbers only, no object)."""

    def __init__(self, step: int) -> None:
        self.step = step
        self.counts: dict[str, int] = {}
        self.heads: dict[int, str] = {}  # head sequence number -> node type name
        self.watermark = 0
        self.chains: list[ChainGrowth] = []
        self.ids: dict[str, set[int]] = {}  # candidate type -> ids of its instances now
        self.lens: dict[int, tuple[int, ...]] = {}  # container id -> its lengths at the scans so far
        self.cpu_bytes = 0  # CPU tensor storages alive
        self.nodes: int | None = None  # live autograd nodes (None: the count was capped)


def type_name(t: type) -> str:
    mod = getattr(t, "__module__", "") or ""
    name = getattr(t, "__qualname__", None) or t.__name__
    return name if mod in ("builtins", "") else f"{mod}.{name}"


def is_node_type(t: type) -> bool:
    """An autograd node's wrapper type (by its members: ``issubclass`` with the ``Node`` ABC would fill the
    ABC's caches with weak references, objects the type counts would then see growing)."""
    return hasattr(t, "next_functions") and hasattr(t, "_sequence_nr")


def short(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def no_torch_function() -> Any:
    """Reading ``grad_fn`` without running a tensor subclass's or a mode's ``__torch_function__``."""
    cls = getattr(torch._C, "DisableTorchFunction", None)
    return cls() if cls is not None else contextlib.nullcontext()


def seq(node: Any) -> int:
    return int(node._sequence_nr())


def mean_size(objs: Sequence[Any]) -> float:
    """Mean size of ``objs`` with what only they hold: the object plus its numbers and strings (objects gc
    does not track, which no type count sees); contained containers are counted as their own types."""
    sizes = []
    for o in objs:
        try:
            size = sys.getsizeof(o)
            for r in gc.get_referents(o):
                if not gc.is_tracked(r) and not isinstance(r, type):
                    size += sys.getsizeof(r)
            sizes.append(size)
        except Exception:
            continue
    return sum(sizes) / len(sizes) if sizes else 0.0


class Heap:
    """One listing of the heap (``gc.get_objects()``) with each object's type read once: the passes of a scan
    (type counts, tensors, containers, the instances of the types that grew, profilers) filter by this list
    of types at C speed instead of reading every object's header again (a pass of ``map(type, objs)`` is
    ~25 ms at 330,000 objects, and a scan made five to seven of them)."""

    __slots__ = ("_types", "kinds", "objs")

    def __init__(self, objs: list[Any]) -> None:
        self.objs = objs
        self.kinds: list[type] = list(map(type, objs))
        self._types: set[type] | None = None

    def __len__(self) -> int:
        return len(self.objs)

    def types(self) -> set[type]:
        """The distinct types present."""
        if self._types is None:
            self._types = set(self.kinds)
        return self._types

    def of_types(self, wanted: Collection[type]) -> Iterator[Any]:
        """The objects whose type is in ``wanted`` (exact types), in listing order."""
        return itertools.compress(self.objs, map(wanted.__contains__, self.kinds))

    def clear(self) -> None:
        self.objs = []
        self.kinds = []
        self._types = None


def as_heap(objs: Heap | list[Any]) -> Heap:
    """``objs`` as a :class:`Heap` (a plain listing is read once)."""
    return objs if isinstance(objs, Heap) else Heap(objs)


def count_types(objs: Heap | list[Any]) -> dict[type, int]:
    """Instances per type, at C speed where CPython's counting helper exists (``Counter(...)`` itself
    would ask the ``Mapping`` ABC about the iterator, and refill its caches: objects the counts see)."""
    kinds = objs.kinds if isinstance(objs, Heap) else list(map(type, objs))
    counts: dict[type, int] = {}
    helper = getattr(collections, "_count_elements", None)
    if helper is not None:
        helper(counts, kinds)
        return counts
    for t in kinds:  # pragma: no cover - other Pythons
        counts[t] = counts.get(t, 0) + 1
    return counts


def _of_types(objs: Heap | list[Any], names: Collection[str]) -> tuple[set[type], Iterator[Any]]:
    """The types named in ``names`` present in ``objs`` and an iterator over their instances (C-speed)."""
    heap = as_heap(objs)
    types = {t for t in heap.types() if type_name(t) in names}
    return types, heap.of_types(types)


def ids_of(objs: Heap | list[Any], types: Collection[str], own: list[Any]) -> dict[str, set[int]]:
    """The ids of the instances of ``types`` now (bounded), by type name."""
    mine = {id(o) for o in own}
    out: dict[str, set[int]] = {k: set() for k in types}
    present, instances = _of_types(objs, types)
    names = {t: type_name(t) for t in present}
    for total, o in enumerate(instances):
        if total >= _MAX_IDS:
            break
        if id(o) not in mine:
            out[names[type(o)]].add(id(o))
    return out


def new_instances(
    objs: Heap | list[Any], types: Collection[str], old: Mapping[str, set[int]], mine: Collection[int]
) -> dict[str, list[Any]]:
    """A few instances of each type that did not exist at the previous scan, spread over those found
    (``mine``: the ids of torchmem's own objects)."""
    found: dict[str, list[Any]] = {k: [] for k in types}
    present, instances = _of_types(objs, types)
    names = {t: type_name(t) for t in present}
    full = 0
    for o in instances:
        k = names[type(o)]
        lst = found[k]
        if len(lst) < 64 and id(o) not in old[k] and id(o) not in mine:
            lst.append(o)
            if len(lst) == 64:
                full += 1
                if full == len(found):
                    break
    out: dict[str, list[Any]] = {}
    for k, lst in found.items():
        if lst:
            step = max(1, len(lst) // SAMPLES_PER_TYPE)
            out[k] = lst[::step][:SAMPLES_PER_TYPE]
        lst.clear()
    return out


def heads(
    tensors: Sequence[torch.Tensor], prev: HostScan | None, budget: float
) -> tuple[list[ChainHead], dict[int, str], int]:
    """Each live tensor's autograd head, the nodes made since ``prev`` that it reaches and which of
    ``prev``'s heads it reaches: a walk from the head that stops at nodes older than ``prev`` (a node's
    inputs are always older than the node), so a long chain costs only its newest part. ``budget``: seconds of
    this thread's CPU time (a loaded machine does not cut the walk short)."""
    roots: list[tuple[int, Any]] = []
    with no_torch_function():
        for i, t in enumerate(tensors):
            try:
                g = t.grad_fn
            except Exception:
                continue
            if g is not None:
                roots.append((i, g))
    found: dict[int, str] = {}
    wm = prev.watermark if prev is not None else 0
    top = wm
    out: list[ChainHead] = []
    pending: list[tuple[int, Any, int]] = []
    for i, g in roots:
        try:
            s = seq(g)
        except Exception:
            continue
        found.setdefault(s, type(g).__name__)
        if s < NO_SEQ:
            top = max(top, s)
        if prev is None:
            continue
        if s <= wm or s >= NO_SEQ:
            reached = (s,) if prev.heads.get(s) == type(g).__name__ else ()
            out.append(ChainHead(i, s, type(g).__name__, 0, reached))
        else:
            pending.append((i, g, s))
    if prev is None:
        return out, found, top
    deadline = time.thread_time() + budget
    again: list[tuple[int, Any, int]] = []
    for cap, work in ((_FIRST_PASS_NODES, pending), (None, again)):
        for i, g, s in work:
            h, capped, newest = _walk(i, g, s, prev, cap, deadline)
            top = max(top, newest)
            if capped and cap is not None and time.thread_time() < deadline:
                again.append((i, g, s))
            else:
                out.append(h)
    return out, found, top


def _walk(
    index: int, head: Any, head_seq: int, prev: HostScan, cap: int | None, deadline: float
) -> tuple[ChainHead, bool, int]:
    wm = prev.watermark
    seen: dict[int, Any] = {id(head): head}
    stack = [head]
    names: collections.Counter[str] = collections.Counter()
    names[type(head).__name__] += 1
    new_seqs = [head_seq]
    reached: dict[int, None] = {}
    capped = False
    newest = head_seq
    visited = 0
    while stack:
        node = stack.pop()
        visited += 1
        if (cap is not None and len(seen) > cap) or (visited % 256 == 0 and time.thread_time() > deadline):
            capped = True
            break
        for child, _ in node.next_functions:
            if child is None or id(child) in seen:
                continue
            seen[id(child)] = child
            s = seq(child)
            if s >= NO_SEQ:
                continue
            if s <= wm:
                if prev.heads.get(s) == type(child).__name__:
                    reached[s] = None
                continue
            newest = max(newest, s)
            names[type(child).__name__] += 1
            if len(new_seqs) < 8:
                new_seqs.append(s)
            stack.append(child)
    new_nodes = sum(names.values())
    seen.clear()
    h = ChainHead(
        index,
        head_seq,
        type(head).__name__,
        new_nodes,
        tuple(reached),
        tuple(k for k, _ in names.most_common(4)),
        tuple(new_seqs),
        capped,
    )
    return h, capped, newest


def tensors_in(objs: Heap | list[Any], counts: Mapping[type, int] | None = None) -> list[torch.Tensor]:
    """The tensors among ``objs`` (C-speed filtering by type)."""
    heap = as_heap(objs)
    types = counts.keys() if counts is not None else heap.types()
    ttypes = {t for t in types if torch.Tensor in t.__mro__}
    return list(heap.of_types(ttypes))


def count_nodes(tensors: Sequence[torch.Tensor], budget: float, *, leaves: bool = True) -> tuple[int, bool]:
    """Autograd nodes reachable from ``tensors`` (a walk bounded by ``budget`` s of this thread's CPU time:
    ``(count, capped)``); ``leaves=False`` leaves the parameters' ``AccumulateGrad`` nodes out of the count
    (every step's graph shares them)."""
    roots = []
    with no_torch_function():
        for t in tensors:
            try:
                g = t.grad_fn
            except Exception:
                continue
            if g is not None:
                roots.append(g)
    seen: dict[int, Any] = {id(r): r for r in roots}
    stack = list(seen.values())
    roots.clear()
    deadline = time.thread_time() + budget
    capped = False
    k = 0
    while stack:
        node = stack.pop()
        k += 1
        if k % 512 == 0 and time.thread_time() > deadline:
            capped = True
            break
        for child, _ in node.next_functions:
            if child is not None and id(child) not in seen:
                seen[id(child)] = child
                stack.append(child)
    n = len(seen)
    if not leaves:
        n -= sum(1 for node in seen.values() if type(node).__name__ == "AccumulateGrad")
    seen.clear()
    stack.clear()
    return n, capped
