"""Host-memory leak analysis: which autograd chain or which Python objects make the process's memory grow.

Pure functions over what :class:`torchmem.capture.host.HostWatcher` captured at a few step boundaries (scans):
nothing here walks the heap, reads memory or touches a tensor, so every rule is testable with plain data.

- **Autograd chains.** At each scan the watcher records, for every live tensor with a ``grad_fn``, its head
  node (sequence number, type name), the nodes created since the previous scan that its graph reaches
  (:class:`ChainHead`), and which heads of the previous scan it reaches. A tensor whose graph still contains
  the previous scan's head of some tensor and has new nodes on top of it carries a *chain*
  (:func:`chain_growth`); a chain seen growing over two intervals in a row is confirmed
  (:func:`confirmed_chains`).
- **Python objects.** Instance counts per type at three scans; a type whose count grew in both intervals
  (:func:`type_growth`) is a candidate; the holders of a few instances born between the last two scans name
  the container that keeps them (:func:`object_culprits` groups types by that holder).
- **Culprits and fixes.** :func:`chain_culprits` and :func:`object_culprits` build
  :class:`~torchmem.results.leaks.Culprit` s of kinds ``autograd_chain`` and ``python_objects``, with
  the fix phrased with the holder's name (:func:`chain_fix`, :func:`objects_fix`);
  :func:`node_trend` reads the sampled count of live autograd nodes.

Cost: linear in the heads and types given.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from torchmem._format import fmt_bytes
from torchmem.analysis.leak_fixes import RETAINED_GRAPH
from torchmem.analysis.leaks import holder_name, holder_pattern, through_hook
from torchmem.results.holders import HolderPath
from torchmem.results.leaks import Culprit

AUTOGRAD_CHAIN = "autograd_chain"
PYTHON_OBJECTS = "python_objects"

# Holder roots that name nothing a person wrote: such a sample does not name the container.
_UNROOTED = frozenset({"gc-orphan", "cycle"})


@dataclass(frozen=True)
class ChainHead:
    """One live tensor's autograd graph at a scan, relative to the previous scan.

    Attributes:
        index: The tensor's position in the scan's list of tensors (the watcher keeps the list).
        seq: The sequence number of its ``grad_fn`` (unique per thread, increasing: a node's inputs are
            always older than the node).
        name: The type name of its ``grad_fn`` (``"AddBackward0"``).
        new_nodes: Nodes reachable from it created since the previous scan (``AccumulateGrad`` leaves not
            counted).
        reached: Sequence numbers of the previous scan's heads that its graph reaches.
        node_names: Type names of the new nodes, most frequent first.
        new_seqs: Sequence numbers of the first new nodes met, head first (to find where they were made).
        capped: The walk stopped on its time budget: ``new_nodes`` is a lower bound.

    Example:
        >>> ChainHead(0, 12, "AddBackward0", 4, (8,), ("AddBackward0", "MulBackward0")).new_nodes
        4
    """

    index: int
    seq: int
    name: str
    new_nodes: int
    reached: tuple[int, ...] = ()
    node_names: tuple[str, ...] = ()
    new_seqs: tuple[int, ...] = ()
    capped: bool = False


@dataclass(frozen=True)
class ChainGrowth:
    """A tensor whose graph grew on top of a head of the previous scan.

    Attributes:
        index: The tensor's position in the later scan's list.
        seq: Its head's sequence number now.
        previous: The previous scan's head its graph continues.
        nodes_per_step: Nodes added per step.
        node_names: Type names of the added nodes, most frequent first.
        new_seqs: Sequence numbers of added nodes, head first.
    """

    index: int
    seq: int
    previous: int
    nodes_per_step: float
    node_names: tuple[str, ...] = ()
    new_seqs: tuple[int, ...] = ()


def chain_growth(
    heads: Sequence[ChainHead], steps: int, *, min_nodes_per_step: float = 0.5
) -> list[ChainGrowth]:
    """The chains among ``heads``: tensors whose graph contains a previous scan's head plus new nodes.

    Each previous head is continued by at most one tensor: the one with the fewest new nodes on top of it
    (the chain itself, not a later result computed from it, such as an output alive at the boundary).
    ``steps`` is the number of steps between the two scans.

    Example:
        >>> heads = [ChainHead(0, 20, "AddBackward0", 4, (10,)), ChainHead(1, 25, "SumBackward0", 30, (10,)),
        ...          ChainHead(2, 26, "MeanBackward0", 50, ())]
        >>> [(g.index, g.previous, g.nodes_per_step) for g in chain_growth(heads, 2)]
        [(0, 10, 2.0)]
    """
    if steps <= 0:
        return []
    best: dict[int, ChainHead] = {}
    for h in heads:
        if h.new_nodes <= 0:
            continue
        for prev in h.reached:
            if prev == h.seq:
                continue
            cur = best.get(prev)
            if cur is None or h.new_nodes < cur.new_nodes:
                best[prev] = h
    out: list[ChainGrowth] = []
    for prev, h in best.items():
        rate = h.new_nodes / steps
        if rate >= min_nodes_per_step:
            out.append(ChainGrowth(h.index, h.seq, prev, rate, h.node_names, h.new_seqs))
    out.sort(key=lambda g: (-g.nodes_per_step, g.index))
    return out


def confirmed_chains(first: Sequence[ChainGrowth], second: Sequence[ChainGrowth]) -> list[ChainGrowth]:
    """The chains of the second interval that continue a chain of the first one (growth seen twice in a
    row), with the mean rate of both intervals.

    Example:
        >>> a = [ChainGrowth(0, 10, 4, 2.0)]
        >>> b = [ChainGrowth(3, 16, 10, 3.0), ChainGrowth(4, 17, 11, 1.0)]
        >>> [(g.index, g.nodes_per_step) for g in confirmed_chains(a, b)]
        [(3, 2.5)]
    """
    earlier = {g.seq: g for g in first}
    out: list[ChainGrowth] = []
    for g in second:
        e = earlier.get(g.previous)
        if e is not None:
            rate = (e.nodes_per_step + g.nodes_per_step) / 2
            out.append(ChainGrowth(g.index, g.seq, g.previous, rate, g.node_names, g.new_seqs))
    return out


def standalone_graphs(heads: Sequence[ChainHead], since: int, until: int, limit: int) -> list[ChainHead]:
    """Up to ``limit`` of ``heads`` whose graphs were made after sequence number ``since`` (and before
    ``until``, the leaves' sequence number) and are graphs of their own, not a chain on an older head (a head
    the previous scan also saw counts: its ``reached`` is itself), oldest first: the step in progress has
    graphs the program has not yet put where it keeps the others (``loss`` before ``losses.append(loss)``).

    Example:
        >>> hs = [ChainHead(0, 30, "MeanBackward0", 7), ChainHead(1, 21, "MeanBackward0", 0, (21,)),
        ...       ChainHead(2, 25, "AddBackward0", 3, (12,)), ChainHead(3, 9, "MeanBackward0", 0, (9,))]
        >>> [h.seq for h in standalone_graphs(hs, since=10, until=1 << 63, limit=8)]
        [21, 30]
    """
    out = [h for h in heads if since < h.seq < until and (not h.reached or h.reached == (h.seq,))]
    out.sort(key=lambda h: h.seq)
    return out[:limit]


def type_growth(
    counts: Sequence[Mapping[str, int]], steps: Sequence[int], *, min_per_step: float = 1.0
) -> dict[str, float]:
    """Types whose instance count grew by at least ``min_per_step`` per step in every interval between
    consecutive scans, with their least growth per step (objects alive only around one scan, such as a
    loop's temporaries, do not count).

    ``counts`` holds one ``{type name: instances}`` map per scan, ``steps`` the step of each scan.

    Example:
        >>> type_growth([{"dict": 100, "float": 50}, {"dict": 102, "float": 49}, {"dict": 105, "float": 52}],
        ...             [10, 12, 14])
        {'dict': 1.0}
    """
    if len(counts) < 2 or len(counts) != len(steps):
        return {}
    out: dict[str, float] = {}
    names = set(counts[-1])
    for name in names:
        rates: list[float] = []
        for i in range(1, len(counts)):
            gap = steps[i] - steps[i - 1]
            if gap <= 0:
                break
            rates.append((counts[i].get(name, 0) - counts[i - 1].get(name, 0)) / gap)
        if len(rates) == len(counts) - 1 and rates and min(rates) >= min_per_step:
            out[name] = min(rates)
    return out


def node_trend(
    samples: Sequence[tuple[int, int]], *, min_samples: int = 3, lower_bounds: Collection[int] = ()
) -> float | None:
    """Autograd nodes added per step over sampled ``(step, live nodes)`` counts: the slope from the first
    sample to the last when every sample rose (``None`` when there are too few samples or they did not
    rise steadily).

    ``lower_bounds``: the steps whose count stopped at its time budget (the graph has at least that many
    nodes): such a count that is not above the one before says nothing and is left out.

    Example:
        >>> node_trend([(10, 100), (20, 120), (30, 141)])
        2.05
        >>> node_trend([(10, 100), (20, 90), (30, 141)]) is None
        True
        >>> node_trend([(10, 100), (20, 120), (25, 60), (30, 141)], lower_bounds={25})  # 60: "at least"
        2.05
    """
    kept: list[tuple[int, int]] = []
    for s in samples:
        if s[0] in lower_bounds and kept and s[1] <= kept[-1][1]:
            continue
        kept.append(s)
    if len(kept) < min_samples:
        return None
    tail = kept[-min_samples:]
    if not all(b[1] > a[1] and b[0] > a[0] for a, b in itertools.pairwise(tail)):
        return None
    (s0, n0), (s1, n1) = tail[0], tail[-1]
    return (n1 - n0) / (s1 - s0)


def chain_lasted(
    samples: Sequence[tuple[int, int]],
    since: int,
    nodes_per_step: float,
    *,
    lower_bounds: Collection[int] = (),
) -> bool | None:
    """Whether a chain the scans saw grow by ``nodes_per_step`` at step ``since`` went on growing, from the
    node counts after it: ``True`` when a later count is above the count at ``since`` by a quarter of the
    chain's rate or more (a count cut short by its budget is a lower bound: still proof), ``False`` when a
    complete later count is not above it, ``None`` when no count came after.

    Example:
        >>> chain_lasted([(20, 5000), (300, 28000)], 20, 256.0)
        True
        >>> chain_lasted([(20, 5000), (300, 5100)], 20, 256.0)
        False
        >>> chain_lasted([(20, 5000), (300, 4000)], 20, 256.0, lower_bounds={300}) is None  # "at least"
        True
    """
    at = [c for s, c in samples if s <= since]
    if not at or nodes_per_step <= 0:
        return None
    base = at[-1]
    verdict: bool | None = None
    for s, c in samples:
        if s <= since:
            continue
        if c - base >= 0.25 * nodes_per_step * (s - since):
            verdict = True
        elif s not in lower_bounds:
            verdict = False
    return verdict


def _kib(b: float) -> str:
    return fmt_bytes(int(b))


def _per(n: float) -> str:
    return f"{n:.0f}" if abs(n - round(n)) < 0.05 else f"{n:.1f}"


def chain_fix(name: str, nodes_per_step: float, node_names: Sequence[str] = (), tensors: int = 1) -> str:
    """The fix for an autograd chain kept by ``name``.

    Example:
        >>> print(chain_fix("shadow", 2, ("AddBackward0", "MulBackward0"), tensors=4))
        `shadow` carries an autograd graph from step to step in 4 tensors (+2 nodes/step each: AddBackward0, \
MulBackward0): it is updated from tensors that require grad; update it under `torch.no_grad()` (`with \
torch.no_grad(): ...` around the update) or use `p.detach()` in the update
    """
    which = f" in {tensors} tensors" if tensors > 1 else ""
    each = " each" if tensors > 1 else ""
    kinds = f": {', '.join(node_names[:3])}" if node_names else ""
    return (
        f"`{name}` carries an autograd graph from step to step{which} (+{_per(nodes_per_step)} nodes/step"
        f"{each}{kinds}): it is updated from tensors that require grad; update it under `torch.no_grad()` "
        "(`with torch.no_grad(): ...` around the update) or use `p.detach()` in the update"
    )


def objects_fix(
    name: str,
    type_name: str,
    per_step: float,
    bytes_per_step: float,
    *,
    contents: Sequence[tuple[str, float]] = (),
    is_tensor: bool = False,
    through_hook: bool = False,
    graph: bool = False,
) -> str:
    """The fix for ``name`` keeping ``per_step`` new ``type_name`` objects per step (``graph``: tensors that
    carry their autograd graph).

    ``contents`` lists other growing types kept inside them (``("float", 256.0)`` per step).

    Example:
        >>> print(objects_fix("history", "dict", 1, 8600, contents=(("float", 256.0), ("list", 1.0))))
        `history` keeps 1 new dict per step (+8.40 KiB/step with what they hold: 256 float, 1 list): keep a \
bounded window (`collections.deque(maxlen=...)`), write them out and clear `history`, or keep running totals
    """
    held = ""
    if contents:
        held = " with what they hold: " + ", ".join(f"{_per(n)} {t}" for t, n in contents[:3])
    what = f"`{name}` keeps {_per(per_step)} new {type_name} per step (+{_kib(bytes_per_step)}/step{held})"
    if through_hook:
        return (
            f"{what}: a hook or callback is registered again at every step; register it once, or call "
            "`handle.remove()` when done"
        )
    if graph:
        return (
            f"{what}: each carries its autograd graph (its nodes on the host, its saved tensors until a "
            "backward frees them); keep "
            f"`x.detach()` (or compute it under `torch.no_grad()`), or numbers (`.item()`, `.tolist()`)"
        )
    if is_tensor:
        return (
            f"{what}: each keeps a tensor's Python object and C++ state on the host; keep numbers "
            f"(`.item()`) or a bounded window instead"
        )
    return (
        f"{what}: keep a bounded window (`collections.deque(maxlen=...)`), write them out and clear "
        f"`{name}`, or keep running totals"
    )


@dataclass(frozen=True)
class ChainFact:
    """A confirmed chain with what names it (input of :func:`chain_culprits`).

    Attributes:
        nodes_per_step: Nodes added per step.
        node_names: Type names of the added nodes, most frequent first.
        paths: Holder paths of the tensor that carries the chain.
        site: The user's line that extends the chain (``"ema.py:12"``), ``None`` where unknown.
    """

    nodes_per_step: float
    node_names: tuple[str, ...]
    paths: tuple[HolderPath, ...]
    site: str | None = None


@dataclass(frozen=True)
class ObjectFact:
    """A Python type whose instances grow, with holders of a few new instances (input of
    :func:`object_culprits`).

    Attributes:
        type_name: The type's name (``"dict"``).
        per_step: New instances per step.
        size_each: Mean ``sys.getsizeof`` of the sampled instances (shallow), in bytes.
        paths: Holder paths of the sampled new instances.
        is_tensor: The type is a tensor type.
        site: Where most sampled instances were created (``"train.py:40"``), ``None`` where unknown.
        graph: The instances are tensors that carry an autograd graph (``grad_fn``).
    """

    type_name: str
    per_step: float
    size_each: float
    paths: tuple[HolderPath, ...]
    is_tensor: bool = False
    site: str | None = None
    graph: bool = False


def _rooted(paths: Sequence[HolderPath]) -> list[HolderPath]:
    return [p for p in paths if p.root not in _UNROOTED]


def _main_path(paths: Sequence[HolderPath]) -> HolderPath | None:
    """The path whose holder pattern most paths share (a container item beats a loop variable)."""
    rooted = _rooted(paths)
    if not rooted:
        return None
    counts: dict[str, int] = {}
    for p in rooted:
        k = holder_pattern(p)
        counts[k] = counts.get(k, 0) + 1
    key = max(counts, key=lambda k: (counts[k], "[*]" in k, -len(k)))
    return next(p for p in rooted if holder_pattern(p) == key)


def chain_culprits(
    facts: Sequence[ChainFact], *, bytes_per_step: float, steps: int = 0, estimated: bool = False
) -> tuple[Culprit, ...]:
    """``autograd_chain`` culprits: chains grouped by the holder that keeps them (``shadow[*]`` keeps one
    chain per parameter), largest first.

    ``bytes_per_step`` is the host growth the chains account for, shared among them by nodes added per
    step; ``steps`` the steps they have been growing for (an estimate of what they hold now).
    ``estimated`` says the bytes were estimated from node counts rather than measured.
    """
    groups: dict[str, list[tuple[ChainFact, HolderPath | None]]] = {}
    for f in facts:
        p = _main_path(f.paths)
        key = holder_pattern(p) if p is not None else "<unnamed chain>"
        groups.setdefault(key, []).append((f, p))
    total_nodes = sum(f.nodes_per_step for f in facts) or 1.0
    out: list[Culprit] = []
    for rows in groups.values():
        nodes = sum(f.nodes_per_step for f, _ in rows)
        per_step = bytes_per_step * nodes / total_nodes
        path = next((p for _, p in rows if p is not None), None)
        name = holder_name(path) if path is not None else "the tensor"
        names: dict[str, None] = {}
        for f, _ in rows:
            names.update(dict.fromkeys(f.node_names))
        sites: dict[str, float] = {}
        for f, _ in rows:
            if f.site:
                sites[f.site] = sites.get(f.site, 0.0) + bytes_per_step * f.nodes_per_step / total_nodes
        site_list = tuple(sorted(sites.items(), key=lambda kv: -kv[1]))
        fix = chain_fix(name, nodes / len(rows), tuple(names), tensors=len(rows))
        if estimated:
            fix += " (bytes estimated from the node count)"
        out.append(
            Culprit(
                kind=AUTOGRAD_CHAIN,
                site=site_list[0][0] if site_list else None,
                sites=site_list,
                holder=str(path) if path is not None else None,
                bytes=int(per_step * max(steps, 0)),
                bytes_per_step=per_step,
                graph_bytes=0.0,
                fix=fix,
            )
        )
    out.sort(key=lambda c: -c.bytes_per_step)
    return tuple(out)


def object_culprits(
    facts: Sequence[ObjectFact], *, min_bytes_per_step: float = 256.0, steps: int = 0
) -> tuple[Culprit, ...]:
    """``python_objects`` culprits: growing types grouped by the variable that keeps their new instances
    (a ``history`` list keeps new dicts, and the lists and floats inside them), largest first.

    The group's main type is the one whose holder path is shortest (the dicts, not the floats inside
    them); its bytes per step are the shallow sizes of all its growing types. Groups below
    ``min_bytes_per_step``, and types whose sampled instances have no nameable holder (garbage cycles not
    collected yet, objects held from C), are left out.

    Example:
        >>> from torchmem.results.holders import HolderStep as S, StepKind as K
        >>> def path(*items: str) -> HolderPath:
        ...     return HolderPath.of("module", (S(K.ROOT, "__main__", "__main__"),
        ...         S(K.MODULE_GLOBAL, ".history", "history"),
        ...         *(S(K.ITEM, f"[{i}]", i, "list", "int") for i in items)), 1 + len(items))
        >>> facts = [ObjectFact("dict", 1.0, 232.0, (path("7"),)),
        ...          ObjectFact("float", 256.0, 24.0, (path("7", "3"),))]
        >>> c = object_culprits(facts)[0]
        >>> c.kind, c.holder, c.bytes_per_step
        ('python_objects', '__main__.history[7]', 6376.0)
    """
    groups: dict[str, list[tuple[ObjectFact, HolderPath]]] = {}
    for f in facts:
        p = _main_path(f.paths)
        if p is None:
            continue
        groups.setdefault(holder_name(p), []).append((f, p))
    out: list[Culprit] = []
    for name, rows in groups.items():
        rows.sort(key=lambda r: (len(r[1].typed_steps), -r[0].per_step * r[0].size_each))
        main, path = rows[0]
        per_step = sum(f.per_step * f.size_each for f, _ in rows)
        if per_step < min_bytes_per_step:
            continue
        contents = tuple((f.type_name, f.per_step) for f, _ in rows[1:])
        fix = objects_fix(
            name,
            main.type_name,
            main.per_step,
            per_step,
            contents=contents,
            is_tensor=main.is_tensor,
            through_hook=through_hook(path),
            graph=main.graph,
        )
        sites: dict[str, float] = {}
        for f, _ in rows:
            if f.site:
                sites[f.site] = sites.get(f.site, 0.0) + f.per_step * f.size_each
        site_list = tuple(sorted(sites.items(), key=lambda kv: -kv[1]))
        out.append(
            Culprit(
                # tensors kept with their autograd graphs are a retained graph, whatever keeps them
                kind=RETAINED_GRAPH if main.graph else PYTHON_OBJECTS,
                site=main.site or (site_list[0][0] if site_list else None),
                sites=site_list,
                holder=str(path),
                bytes=int(per_step * max(steps, 0)),
                bytes_per_step=per_step,
                graph_bytes=0.0,
                fix=fix,
            )
        )
    out.sort(key=lambda c: -c.bytes_per_step)
    return tuple(out)


__all__ = [
    "AUTOGRAD_CHAIN",
    "PYTHON_OBJECTS",
    "ChainFact",
    "ChainGrowth",
    "ChainHead",
    "ObjectFact",
    "chain_culprits",
    "chain_fix",
    "chain_growth",
    "confirmed_chains",
    "node_trend",
    "object_culprits",
    "objects_fix",
    "standalone_graphs",
    "type_growth",
]
