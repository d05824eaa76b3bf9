"""The backward search: from the targets up to the roots, then the most readable paths back down.

1. Roots are collected (:mod:`.roots`), the garbage collector is paused and the heap's references are
   indexed once (:mod:`.index`); references gc cannot see (``.grad``, ``._base``, autograd's saved tensors)
   are added as virtual edges with their steps (:mod:`.autograd`).
2. A breadth-first search goes up from all targets at once: each level is one index lookup for the whole
   frontier. Every explored object is a node; ``parents[node]`` lists its referrers with the virtual steps and
   weight of each edge; ``target_bits[node]`` says which targets it leads to. The search stops at roots
   (namespaces, classes, exceptions), at its limits (``time_limit``, ``max_objects``, ``fan_in``), or once
   every target has enough candidate paths (``max_paths``).
3. For each target, paths are enumerated best-first (A*, the distance to the nearest root as the heuristic)
   from the target up to a root; where none is found, up to an object nothing gc-visible refers to (a
   ``gc-orphan``: held from C code), or around an unreachable reference cycle (``cycle``). Each candidate is
   named by :mod:`.naming`, and the most readable kept: rooted paths first, then fewer steps to read, then
   fewer references.

The search does not count itself: its own frames (and every executing ``torchmem`` frame), its temporaries,
the target sequence and whatever is passed in ``exclude`` are not holders. The result holds strings and step
kinds only. Cost: about 0.45 s at a million live gc-tracked objects (2 cores), ~30 bytes of temporary memory
per reference; the garbage collector is paused meanwhile and restored after. The caller's torch function and
dispatch modes do not see the search's tensors.
"""

from __future__ import annotations

import gc
import heapq
import itertools
import logging
import time
import types
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from torchmem.analysis.holders.autograd import VirtualEdge, autograd_edges
from torchmem.analysis.holders.index import HeapIndex
from torchmem.analysis.holders.naming import PathNamer
from torchmem.analysis.holders.roots import FrameSnapshots, Root, RootSet, class_root
from torchmem.results.holders import HolderPath, HolderSearch, HolderStep, StepKind

_log = logging.getLogger("torchmem")

FAN_IN = 2048  # most referrers followed per object
POP_BUDGET = 20_000  # most states the path enumeration pops per target and pass
_INF = 1 << 30

_OWN_TYPES: dict[type, bool] = {}


def torchmem_owned(obj: Any) -> bool:
    """Whether ``obj`` is torchmem's own machinery (an instance of one of its classes, one of its functions or
    a method bound to its objects): never a holder a person should be shown, even where a library keeps it
    (a hook torchmem installed in ``torch.nn.modules.module``). The demo's program (``torchmem._demo``) is
    the user's code."""
    t = type(obj)
    if t is types.FunctionType:
        mod = getattr(obj, "__module__", None) or ""
        if not mod.startswith("torchmem.") or mod.startswith("torchmem._demo"):
            return False
        # a wrapper torchmem put in the program's place stands for the function it wraps
        return getattr(obj, "__wrapped__", None) is None
    if t is types.MethodType:
        return torchmem_owned(obj.__func__) or torchmem_owned(obj.__self__)
    own = _OWN_TYPES.get(t)
    if own is None:
        mod = getattr(t, "__module__", "") or ""
        own = _OWN_TYPES[t] = mod.startswith("torchmem.") and not mod.startswith("torchmem._demo")
    return own


def _raised_at(e: BaseException) -> str:
    """``file:line`` of the innermost frame of ``e``'s traceback (where a failed search broke)."""
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return "?"
    code = tb.tb_frame.f_code
    return f"{code.co_filename.rsplit('/', 1)[-1]}:{tb.tb_lineno} in {code.co_name}()"


# An edge up from a node: (parent node, the steps of a virtual edge or None, weight in references).
ParentEdge = tuple[int, "tuple[HolderStep, ...] | None", int]
# A partial path from a target upward: (node, steps of the edge below it, weight, the link below) or None.
PathLink = Any


def readability(p: HolderPath) -> tuple[bool, int, int]:
    """Sort key: rooted paths first, then fewer steps to read, then fewer references.

    A hop `` -> `` and a dict-key membership read as an extra step; a tensor's ``.grad_fn`` and what it
    reaches in the graph (``.grad_fn -> saved tensor of ...``) read as one.
    """
    grad_fn_hops = sum(1 for k in p.kinds if k is StepKind.GRAD_FN)
    steps = len(p.steps) - grad_fn_hops + sum(s.count(" -> ") + s.startswith(" key ") for s in p.steps)
    return (p.root in ("gc-orphan", "cycle"), steps, p.depth)


def _link_depth(link: PathLink) -> int:
    depth = 0
    while link is not None:
        depth += link[2]
        link = link[3]
    return depth


class _BackwardSearch:
    """One search for the holders of several targets (see the module docstring for the steps)."""

    def __init__(
        self,
        targets: Sequence[object],
        max_paths: int,
        time_limit: float,
        exclude: Iterable[object],
        max_objects: int,
    ) -> None:
        self.started = time.perf_counter()
        # The limit is this thread's CPU time (the search's own work): on a loaded machine the search still
        # gets its seconds of work, and the wall time it took is reported beside it.
        self.deadline = time.thread_time() + time_limit
        self.max_paths = max_paths
        self.max_objects = max_objects
        self.targets: list[Any] = list(targets)
        excluded = list(exclude)
        # ids of objects that are never holders: the search's own containers and what the caller excludes
        self.ignore: set[int] = {id(targets), id(self.targets), id(excluded), id(self)}
        self.ignore.update(id(o) for o in excluded)
        exclude_frames = {id(o) for o in excluded if isinstance(o, types.FrameType)}
        excluded.clear()
        self.reasons: list[str] = []
        self.snapshots = FrameSnapshots()
        self.roots = RootSet(self.ignore, exclude_frames, self.snapshots)
        self.index = HeapIndex()
        self.gc_was_enabled = gc.isenabled()
        self.complete = False
        self._fresh_graph()
        for own in (self.ignore, exclude_frames, self.reasons, self.targets, self.index):
            self.ignore.add(id(own))

    def _fresh_graph(self) -> None:
        """New, empty containers for the search graph (made after the heap snapshot, so not in it)."""
        self.nodes: list[Any] = []  # the explored objects; a node is an index into this list
        self.node_of_id: dict[int, int] = {}
        self.parents: list[list[ParentEdge]] = []
        self.target_bits: list[int] = []  # bit i: the node leads down to target i
        self.expanded: list[bool] = []  # its referrers were looked up
        self.root_of_node: dict[int, Root] = {}
        self.held_by_ignored: set[int] = set()  # nodes the search's own containers refer to
        self.self_referring: set[int] = set()
        self.virtual_parents: dict[int, list[VirtualEdge]] = {}  # id(object) -> edges gc cannot see
        self.on_cycle: set[int] = set()  # ids of tensors and gradients on an autograd cycle
        self.cycle_starts: set[int] = set()  # of them, the tensors whose .grad's graph keeps them

    # -- limits -----------------------------------------------------------------------------------
    def _out_of_time(self) -> bool:
        if time.thread_time() > self.deadline:
            self._truncate("time_limit")
            return True
        return False

    def _truncate(self, reason: str) -> None:
        if reason not in self.reasons:
            self.reasons.append(reason)

    # -- entry ------------------------------------------------------------------------------------
    def run(self) -> HolderSearch:
        n = len(self.targets)
        if n == 0:
            return HolderSearch((), False, None, time.perf_counter() - self.started, 0)
        # The search's own tensors must not go through the caller's torch function or dispatch modes
        # (`with torch.device("cuda")`, a FakeTensorMode, torchmem's own ledger).
        paths: list[tuple[HolderPath, ...]] = [() for _ in range(n)]
        try:
            with torch._C.DisableTorchFunction(), torch._C._DisableTorchDispatch():
                self.roots.collect()
                gc.disable()
                if self._build_index():
                    if any(isinstance(t, torch.Tensor) for t in self.targets):
                        found = autograd_edges(self.targets, self.index, self._out_of_time, self.ignore)
                        for target_id, edges in found.edges.items():
                            self.virtual_parents.setdefault(target_id, []).extend(edges)
                        for x_id, (g, _, _) in found.cycle_edges.items():
                            self.on_cycle.update((x_id, id(g)))
                            self.cycle_starts.add(x_id)
                        found.edges.clear()
                        found.cycle_edges.clear()
                    self._search_up()
                    paths = self._all_paths()
        except Exception as e:  # an object that refused inspection must not break release() or a report
            _log.warning("holders(): the search failed at %s: %r", _raised_at(e), e)
            self._truncate(f"error: {type(e).__name__}")
        return HolderSearch(
            tuple(paths),
            bool(self.reasons),
            ", ".join(self.reasons) or None,
            time.perf_counter() - self.started,
            len(self.nodes),
        )

    def close(self) -> None:
        """Drop every reference the search took; empty the frame snapshots it made where that is safe."""
        self.index.clear()
        self._fresh_graph()
        self.roots.clear()
        self.targets = []
        try:
            self.snapshots.release()
        finally:
            if self.gc_was_enabled and not gc.isenabled():
                gc.enable()

    # -- heap index -------------------------------------------------------------------------------
    def _build_index(self) -> bool:
        """Snapshot every gc-visible reference (see :class:`HeapIndex`)."""
        objects = gc.get_objects()
        self.ignore.add(id(objects))
        self._fresh_graph()  # containers the search fills must not be among the indexed objects
        if not self.index.build(objects, self._out_of_time):
            return False
        if gc.get_freeze_count():
            self._index_frozen_roots()
        return not self._out_of_time()

    def _index_frozen_roots(self) -> None:
        # Objects moved to the permanent generation (gc.freeze()) are not in gc.get_objects(): add the
        # references of the root namespaces, the ones that matter most, as edges gc did not index (named
        # as ordinary references: no steps of their own).
        for root_id, root in self.roots.by_id.items():
            if not root.container:
                continue
            ns = self.roots.namespace(root_id)
            if ns is None:
                continue
            for v in gc.get_referents(ns):
                self.virtual_parents.setdefault(id(v), []).append((ns, (), 1))

    # -- backward breadth-first search ------------------------------------------------------------
    def _node(self, obj: Any, bits: int) -> int:
        n = len(self.nodes)
        self.nodes.append(obj)
        self.node_of_id[id(obj)] = n
        self.parents.append([])
        self.target_bits.append(bits)
        self.expanded.append(False)
        return n

    def _root_for(self, obj: Any) -> Root | None:
        r = self.roots.get(obj)
        return r if r is not None else class_root(obj)

    def _referrers(self, frontier: list[int]) -> list[tuple[int, Any]]:
        """(child node, referrer) for every gc-visible reference to a frontier object."""
        ids = [id(self.nodes[n]) for n in frontier]
        found = [(frontier[w], m) for m, w in self.index.referrers(ids, FAN_IN)]
        if self.index.capped:
            self._truncate("fan_in")
        return found

    def _search_up(self) -> None:
        paths_found = [0] * len(self.targets)
        frontier: list[int] = []
        for i, t in enumerate(self.targets):
            n = self.node_of_id.get(id(t))
            if n is None:
                n = self._node(t, 0)
                frontier.append(n)
                r = self.roots.get(t)
                if r is not None and not r.container:
                    self.root_of_node[n] = r
            self.target_bits[n] |= 1 << i
        ignore, node_of_id, parents, root_of_node = (
            self.ignore,
            self.node_of_id,
            self.parents,
            self.root_of_node,
        )
        while frontier:
            if self._out_of_time():
                return
            if len(self.nodes) > self.max_objects:
                self._truncate("max_objects")
                return
            edges: list[tuple[int, Any, tuple[HolderStep, ...] | None, int]] = [
                (c, p, None, 1) for c, p in self._referrers(frontier)
            ]
            for c in frontier:
                self.expanded[c] = True
                for holder, named, weight in self.virtual_parents.get(id(self.nodes[c]), ()):
                    edges.append((c, holder, named or None, weight))
            next_frontier: list[int] = []
            seen: set[tuple[int, int, tuple[HolderStep, ...] | None]] = set()
            fan: dict[int, int] = {}
            for c, p, steps, w in edges:
                pid = id(p)
                if pid in ignore or torchmem_owned(p):
                    self.held_by_ignored.add(c)
                    continue
                pn = node_of_id.get(pid)
                if pn is None:
                    r = self._root_for(p)
                    if r is None:
                        k = fan.get(c, 0)
                        if k >= FAN_IN:
                            self._truncate("fan_in")
                            continue
                        fan[c] = k + 1
                    pn = self._node(p, self.target_bits[c])
                    if r is not None:
                        root_of_node[pn] = r
                        self.expanded[pn] = True
                    else:
                        next_frontier.append(pn)
                else:
                    self.target_bits[pn] |= self.target_bits[c]
                if pn == c:
                    self.self_referring.add(c)
                    continue
                if (c, pn, steps) in seen:
                    continue
                seen.add((c, pn, steps))
                parents[c].append((pn, steps, w))
                if pn in root_of_node:
                    bits = self.target_bits[c]
                    while bits:
                        low = bits & -bits
                        paths_found[low.bit_length() - 1] += 1
                        bits ^= low
            frontier = next_frontier
            if frontier and min(paths_found) > 2 * self.max_paths + 2:  # candidates _all_paths ranks
                self._truncate("max_paths")
                return
        self.complete = True

    # -- paths ------------------------------------------------------------------------------------
    def _distances(self, goals: Iterable[int]) -> list[int]:
        """Unit distance from every node up to the nearest goal node."""
        children: list[list[int]] = [[] for _ in self.nodes]
        for c, ps in enumerate(self.parents):
            for p, _, _ in ps:
                children[p].append(c)
        dist = [_INF] * len(self.nodes)
        q: deque[int] = deque()
        for g in goals:
            dist[g] = 0
            q.append(g)
        while q:
            n = q.popleft()
            d = dist[n] + 1
            for c in children[n]:
                if dist[c] > d:
                    dist[c] = d
                    q.append(c)
        return dist

    def _all_paths(self) -> list[tuple[HolderPath, ...]]:
        n_targets = len(self.targets)
        if not self.nodes:
            return [() for _ in range(n_targets)]
        namer = PathNamer(self.index, self.snapshots)
        to_root = self._distances(self.root_of_node)
        # Explored objects that no gc-visible object refers to: something outside Python holds them.
        orphans = [
            n
            for n in range(len(self.nodes))
            if self.expanded[n]
            and not self.parents[n]
            and n not in self.root_of_node
            and n not in self.held_by_ignored
            and n not in self.self_referring
        ]
        orphan_set = set(orphans)
        to_orphan = self._distances(orphans) if orphans else None
        # Gather more candidates than asked for, then keep the most readable: a parameter is better named
        # `model.0.weight` than by its place among an optimizer's state keys, fewer references or not.
        want = 2 * self.max_paths + 2
        out: list[tuple[HolderPath, ...]] = []
        try:
            for t in self.targets:
                tn = self.node_of_id[id(t)]
                found: dict[str, HolderPath] = {}
                more = self._enumerate(
                    namer, tn, to_root, self.root_of_node.__contains__, found, "root", want
                )
                if len(found) < want and to_orphan is not None:
                    more |= self._enumerate(
                        namer, tn, to_orphan, orphan_set.__contains__, found, "gc-orphan", want
                    )
                if not found and self.complete and self.parents[tn]:
                    p = self._cycle_path(namer, tn)
                    if p is not None:
                        found[str(p)] = p
                loop = self._loop_path(namer, tn) if id(t) in self.on_cycle else None
                if loop is not None:
                    # On an autograd cycle (x.grad's graph keeps x): the loop is a holder too, even where the
                    # program still refers to it (dropping that reference would not free it).
                    found.setdefault(str(loop), loop)
                ranked = sorted(found.values(), key=readability)
                if more or len(ranked) > self.max_paths:
                    self._truncate("max_paths")
                kept = ranked[: self.max_paths]
                if loop is not None and self.max_paths > 1 and str(loop) not in {str(p) for p in kept}:
                    kept[-1] = loop  # the loop says more than one more way to the same variable
                out.append(tuple(kept))
                if self._out_of_time():
                    out.extend(() for _ in range(n_targets - len(out)))
                    break
        finally:
            namer.clear()
        return out

    def _enumerate(
        self,
        namer: PathNamer,
        tn: int,
        h: list[int],
        is_goal: Callable[[int], bool],
        found: dict[str, HolderPath],
        start: str,
        want: int,
    ) -> bool:
        """Best-first (A*) enumeration of the shortest paths from target node ``tn`` up to goal nodes.

        Adds rendered paths to ``found`` (deduplicated by text); returns whether more than ``want``
        paths existed.
        """
        if h[tn] >= _INF:
            return False
        seq = itertools.count()
        # state: (f, g, seq, node, link); link = (node, steps, weight, prev link) from the target upward
        heap: list[tuple[int, int, int, int, PathLink]] = [(h[tn], 0, next(seq), tn, (tn, None, 0, None))]
        pops: dict[int, int] = {}
        budget = POP_BUDGET
        while heap and budget:
            budget -= 1
            if budget % 1024 == 0 and self._out_of_time():
                break
            _, g, _, n, link = heapq.heappop(heap)
            k = pops.get(n, 0)
            if k > want:
                continue
            pops[n] = k + 1
            if is_goal(n):
                for p in self._render(namer, link, g, start, want + 1):
                    if str(p) not in found:
                        if len(found) >= want:
                            return True
                        found[str(p)] = p
                if n != tn:
                    continue
            for pn, steps, w in self.parents[n]:
                if h[pn] >= _INF:
                    continue
                on_path = False
                ln = link
                while ln is not None:
                    if ln[0] == pn:
                        on_path = True
                        break
                    ln = ln[3]
                if on_path:
                    continue
                heapq.heappush(heap, (g + w + h[pn], g + w, next(seq), pn, (pn, steps, w, link)))
        return False

    def _loop_path(self, namer: PathNamer, tn: int, most: int = 12) -> HolderPath | None:
        """The shortest loop from target node ``tn`` up through its referrers back to itself, rendered from
        the target round to the target (``None`` when none is found within ``most`` references)."""
        q: deque[PathLink] = deque([(tn, None, 0, None)])
        seen = {tn}
        while q:
            link = q.popleft()
            n = link[0]
            if _link_depth(link) >= most:
                continue
            for p, s, w in self.parents[n]:
                if p == tn:
                    loop = (p, s, w, link)
                    return next(iter(self._render(namer, loop, _link_depth(loop), "cycle", 1)), None)
                if p in seen or p in self.root_of_node:
                    continue
                seen.add(p)
                q.append((p, s, w, link))
        return None

    def _cycle_path(self, namer: PathNamer, tn: int) -> HolderPath | None:
        """A path from a node on an unreachable reference cycle down to the target."""
        link: PathLink = (tn, None, 0, None)
        seen = {tn}
        n = tn
        for _ in range(10_000):
            ps = self.parents[n]
            # Up through a referrer that leads somewhere (it has referrers of its own, or it is the target):
            # the search's own containers hold the targets too, and end there.
            leads = [e for e in ps if e[0] == tn or self.parents[e[0]] or e[0] in self.self_referring]
            nxt = next(
                (e for e in leads if e[0] not in self.held_by_ignored),
                leads[0] if leads else (ps[0] if ps else None),
            )
            if nxt is None:
                # a node that refers only to itself closes the cycle
                if n not in self.self_referring:
                    return None
                return next(iter(self._render(namer, link, _link_depth(link), "cycle", 1)), None)
            p, s, w = nxt
            link = (p, s, w, link)
            if p == tn:
                # the target is on the cycle: the whole loop, from the target round to itself
                return next(iter(self._render(namer, link, _link_depth(link), "cycle", 1)), None)
            if p in seen:
                # start the path at the first (lowest) occurrence of the node that closes the cycle
                ln = link[3]
                while ln[0] != p:
                    ln = ln[3]
                # or, round an autograd cycle, at the tensor whose .grad's graph keeps it: the path then
                # reads `x.grad.grad_fn -> saved tensor of ...`
                walk = link[3]
                while walk is not ln:
                    if id(self.nodes[walk[0]]) in self.cycle_starts:
                        ln = walk
                        break
                    walk = walk[3]
                return next(iter(self._render(namer, ln, _link_depth(ln), "cycle", 1)), None)
            seen.add(p)
            n = p
        return None

    def _render(
        self, namer: PathNamer, link: PathLink, depth: int, start: str, limit: int
    ) -> list[HolderPath]:
        """The path ``link`` (top node first when unwound) named by ``namer``, once per way of naming it."""
        nodes: list[int] = []
        steps: list[tuple[HolderStep, ...] | None] = []
        ln = link
        while ln is not None:
            nodes.append(ln[0])
            steps.append(ln[1])
            ln = ln[3]
        # nodes[0] is the top, nodes[-1] the target; steps[i] names the edge nodes[i] -> nodes[i + 1]
        objects = [self.nodes[n] for n in nodes]
        root: Root | str = self.root_of_node[nodes[0]] if start == "root" else start
        return namer.render_all(objects, steps[:-1], root, depth, limit)
