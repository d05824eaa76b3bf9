"""From what the third scan of a :class:`torchmem.capture.host.HostWatcher` sequence found (growing chains,
new instances of growing types, growing containers, running profilers, graphs kept alive) and the paths
that hold them (:func:`torchmem.analysis.holders.find_holders`) to the facts its culprits are named from
(:class:`~torchmem.analysis.host.ChainFact`, :class:`~torchmem.analysis.host.ObjectFact`,
:class:`~torchmem.analysis.host_state.StateEvidence`)."""

from __future__ import annotations

import collections
import sys
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from torchmem._gc import items_now, values_now
from torchmem.analysis.host import ChainFact, ChainGrowth, ObjectFact
from torchmem.analysis.host_state import NODE_BYTES, LineGrowth, StateEvidence, closest_line
from torchmem.analysis.leaks import holder_name, holder_pattern, through_hook
from torchmem.capture.host_objects import creation_line, kept_entries, measure, newest, type_label
from torchmem.capture.host_walk import SAMPLES_PER_TYPE, count_nodes, mean_size, short
from torchmem.capture.host_windows import HostSiteWindow
from torchmem.devices._ledger import Site
from torchmem.results.holders import HolderPath, HolderStep, StepKind

# What a loop's results are made of (the entries of a container that gathers them)
_DATA = frozenset({"Tensor", "ndarray", "tuple", "list", "dict", "float", "int", "str", "bytes", "bool"})
MAX_TYPES = 6  # growing types whose new instances are sampled, most new instances per step first


class HostKept:
    """A container that grew at every scan: its lengths then, its newest entries (keys and values), their
    mean size, and where tracemalloc says they were made (a program that traces on its own)."""

    __slots__ = ("cid", "container", "inside", "items", "keys", "lens", "site", "size")

    def __init__(
        self, container: Any, entries: list[tuple[Any, Any]], lens: tuple[int, ...], site: str | None
    ) -> None:
        self.cid, self.container, self.lens, self.site = id(container), container, lens, site
        self.keys = [k for k, _ in entries]
        self.items = [v for _, v in entries]
        sizes = [measure(o) for o in self.items]
        self.size = sum(b for b, _ in sizes) / len(sizes) if sizes else 0.0
        inside: collections.Counter[str] = collections.Counter()
        for _, counts in sizes:
            inside.update(counts)
        self.inside = {k: v / len(sizes) for k, v in inside.most_common(3)}  # per entry


def kept_items(
    found: dict[int, Any], lens: dict[int, tuple[int, ...]], steps: int, cpu_tensors: bool = False
) -> list[HostKept]:
    """The containers that grew at every scan and keep at least 256 B per step, or tensors with their
    autograd graphs (a few, most bytes per step first), with their newest entries (numpy arrays, strings,
    lists, dicts, ...; tensors are the device report's, CPU tensors too unless ``cpu_tensors``: a run that
    watches a GPU): instance counts per type cannot see untracked objects, and mix a type's new instances
    of every holder."""
    rows: list[HostKept] = []
    for i, ls in lens.items():
        if len(ls) < 3 or not ls[2] > ls[1] > ls[0]:
            continue
        c = found[i]
        entries = kept_entries(newest(c, min(ls[-1] - ls[1], SAMPLES_PER_TYPE)), cpu_tensors)
        if not entries:
            continue
        exact = [o for _, o in entries if type(o).__module__ != "builtins"]
        sites = collections.Counter(s for s in map(creation_line, exact) if s)
        row = HostKept(c, entries, ls, sites.most_common(1)[0][0] if sites else None)
        # (entries that carry an autograd graph keep its nodes, which their size does not count: a kept
        # 64-byte logits tensor holds ~100 nodes on the host)
        if row.size * (ls[-1] - ls[0]) / max(1, steps) >= 256 or any(
            _has_graph(t) for t in _tensors_in_entries(row.items)
        ):
            rows.append(row)
    rows.sort(key=lambda r: -r.size * (r.lens[-1] - r.lens[0]))
    return rows[:MAX_TYPES]


class HostNamed(NamedTuple):
    """What one scan sequence names: the facts, and the containers found growing (id -> their entries'
    type, length then, entries per step)."""

    chains: tuple[ChainFact, ...]
    objects: tuple[ObjectFact, ...]
    kept_lens: dict[int, tuple[str, int, float]]
    evidence: StateEvidence
    # the holder paths (as written) of the containers whose entries are plain data (tensors with no graph,
    # arrays, numbers, strings, tuples/lists/dicts of them), reached through no hook
    data_paths: frozenset[str] = frozenset()


def name_facts(
    paths: Sequence[tuple[HolderPath, ...]],
    *,
    confirmed: Sequence[ChainGrowth],
    window: HostSiteWindow | None,
    grew: dict[str, float],
    samples: dict[str, list[Any]],
    created: dict[str, str | None],
    kept: Sequence[HostKept],
    profilers: int,
    graphs: int,
    lines: Sequence[LineGrowth],
    first: int,
    third: int,
    new_shapes: tuple[int, int, int] | None,
    own_history: bool,
) -> HostNamed:
    """The facts from the holder search's ``paths``, one group per object searched, in the order searched:
    the chains' tensors, the new instances of each growing type in ``samples``, the growing containers of
    ``kept``, ``profilers`` running profilers, ``graphs`` tensors whose graphs stay alive."""
    sample_types = list(samples)
    per_type = [len(samples[k]) for k in sample_types]
    sizes = {k: [mean_size([o]) for o in v] for k, v in samples.items()}
    is_tensor = {k: bool(v) and isinstance(v[0], torch.Tensor) for k, v in samples.items()}
    chain_facts = []
    for i, g in enumerate(confirmed):
        site = window.site_of((g.seq, *g.new_seqs)) if window is not None else None
        chain_facts.append(
            ChainFact(g.nodes_per_step, g.node_names, paths[i] if i < len(paths) else (), _site(site))
        )
    object_facts = []
    j = len(confirmed)

    def each(count: int) -> list[tuple[HolderPath, ...]]:
        nonlocal j
        out = [tuple(p for p in group if not _through_torchmem(p)) for group in paths[j : j + count]]
        j += count
        return out + [()] * (count - len(out))

    def take(count: int) -> tuple[HolderPath, ...]:
        return tuple(p for group in each(count) for p in group)

    for k, count in zip(sample_types, per_type):
        ps, size = _majority(each(count), sizes[k])
        where = created.get(k) or closest_line(lines, grew[k] * size)
        object_facts.append(ObjectFact(short(k), grew[k], size, ps, is_tensor[k], where))
    kept_lens: dict[int, tuple[str, int, float]] = {}
    held: list[ObjectFact] = []
    data_paths: set[str] = set()
    for row, found in zip(kept, each(len(kept))):
        per_step = (row.lens[-1] - row.lens[0]) / max(1, third - first)
        where = row.site or closest_line(lines, per_step * row.size)
        label = type_label(row.items)
        entry_paths = tuple(_entry_path(p, row.container, row.keys[-1]) for p in found)
        tensors = _tensors_in_entries(row.items)
        graph = any(_has_graph(t) for t in tensors)
        # an entry that carries a graph keeps its autograd nodes on the host: counted in its size (one
        # entry's graph, walked; the parameters' AccumulateGrad leaves are shared by every step's graph)
        size = row.size + (count_nodes(tensors[-1:], 0.01, leaves=False)[0] * NODE_BYTES if graph else 0)
        held.append(ObjectFact(label, per_step, size, entry_paths, False, where, graph))
        if not graph and label in _DATA and all(k in _DATA for k in row.inside):
            data_paths.update(str(p) for p in entry_paths if not through_hook(p))
        # what each entry holds: named in the fix (their bytes are in the entry's size)
        held += [ObjectFact(k, per_step * c, 0.0, entry_paths) for k, c in row.inside.items()]
        kept_lens[row.cid] = (label, row.lens[-1], per_step)
    # A container found growing names its entries exactly, with what they hold: the new instances of any
    # type held by the same variable (sampled among every new instance of the type) are left out.
    names = {holder_name(f.paths[0]) for f in held if f.paths}
    object_facts = [f for f in object_facts if not (f.paths and holder_name(f.paths[0]) in names)]
    object_facts += held
    evidence = StateEvidence(
        profilers=take(profilers),
        graph_paths=_majority(each(graphs), [0.0] * graphs)[0],
        new_shapes=new_shapes,
        history_by_torchmem=own_history,
    )
    return HostNamed(tuple(chain_facts), tuple(object_facts), kept_lens, evidence, frozenset(data_paths))


def _tensors_in_entries(items: Sequence[Any]) -> list[torch.Tensor]:
    """The tensors among ``items`` and one level inside them (``(out, y)``, ``{"logits": out}``)."""
    out: list[torch.Tensor] = []
    for o in items:
        inner = o.values() if isinstance(o, dict) else o if isinstance(o, (tuple, list)) else (o,)
        try:
            out.extend(x for x in list(inner)[:64] if isinstance(x, torch.Tensor))
        except Exception:  # changed while read
            continue
    return out


def _has_graph(t: torch.Tensor) -> bool:
    try:
        return t.grad_fn is not None
    except Exception:  # a tensor subclass that refuses
        return False


def _site(site: Site | None) -> str | None:
    return str(site) if site is not None else None


_OWN_TYPES: list[frozenset[str]] = []
# Classes of torchmem run's parts whose names a program's own classes (or matplotlib's) often have: a path
# through torchmem's run state passes through its Session or a distinctive part anyway.
_COMMON_NAMES = frozenset(
    {"Figure", "Timeline", "Sampler", "Program", "Outcome", "Records", "Overhead", "ModuleProfile"}
)


def _own_type_names() -> frozenset[str]:
    """The names of the classes torchmem's capture and run layers define (its session, watchers, scans,
    samplers), less the run parts' common names."""
    if not _OWN_TYPES:
        names = set()
        for name, mod in items_now(sys.modules):
            run = name.startswith("torchmem.run")
            if (run or name.startswith("torchmem.capture")) and mod is not None:
                for v in values_now(vars(mod)):
                    mine = isinstance(v, type) and getattr(v, "__module__", "") == name
                    if mine and not (run and v.__name__ in _COMMON_NAMES):
                        names.add(v.__name__)
        _OWN_TYPES.append(frozenset(names))
    return _OWN_TYPES[0]


def _through_torchmem(p: HolderPath) -> bool:
    """A path from torchmem's own state (its session, its watchers, its threads) names nothing of the
    program."""
    steps = p.typed_steps
    if not steps:
        return False
    if steps[0].name.startswith("torchmem") or steps[0].text.startswith("thread 'torchmem"):
        return True
    own = _own_type_names()
    return any(s.holder_type in own for s in steps[1:])


def _entry_path(path: HolderPath, container: Any, key: Any) -> HolderPath:
    """``path`` (to a container) and the item ``key`` of it: ``__main__.rows`` -> ``__main__.rows[57]``."""
    if isinstance(container, dict):
        text, name = f"[{key!r}]", repr(key)
    else:
        text, name = f"[{key}]", str(key)
    step = HolderStep(StepKind.ITEM, text, name, type(container).__name__, type(key).__name__)
    return HolderPath.of(path.root, (*path.typed_steps, step), path.depth + 1)


def _majority(
    groups: Sequence[tuple[HolderPath, ...]], sizes: Sequence[float]
) -> tuple[tuple[HolderPath, ...], float]:
    """The holder paths and mean size of the sampled instances whose holder most of them share (new
    instances of a type include a few transient ones held elsewhere, whose sizes say nothing of what
    grows); all of them where no holder is shared."""
    keys = []
    for group in groups:
        rooted = [p for p in group if p.root not in ("gc-orphan", "cycle")]
        keys.append(holder_pattern(rooted[0]) if rooted else None)
    counts = collections.Counter(k for k in keys if k is not None)
    if not counts:
        chosen = list(range(len(groups)))
    else:
        top = counts.most_common(1)[0][0]
        chosen = [i for i, k in enumerate(keys) if k == top]
    paths = tuple(p for i in chosen for p in groups[i])
    picked = [sizes[i] for i in chosen if i < len(sizes)]
    return paths, (sum(picked) / len(picked) if picked else 0.0)
