"""The host watcher's reads of Python objects that type counts do not see, bounded, at its scans only.

- **Growing containers.** Objects the garbage collector does not track (numpy arrays, strings, bytes,
  numbers) are invisible to instance counts per type; the list, dict or deque that keeps them is not. The
  lengths of the heap's containers are read at the first scan (:func:`container_lengths`: C-speed, ~0.1 s
  at 300,000 objects) and again at the next two (:func:`still_growing`); a container that grew in both
  intervals keeps something per step, and its newest entries (:func:`newest`) are sampled with their sizes
  (:func:`item_size`).
- **Lines that keep what they allocate.** :func:`traced_lines` reads a tracemalloc snapshot as bytes still
  alive per user line (the innermost frame of the program; an allocation whose innermost frame outside
  torch and the standard library is torchmem's own is left out), split into the part in the C heap (blocks
  larger than Python's small objects) and the rest.
- **CPU tensors.** :func:`cpu_storage_bytes` sums the CPU storages of the live tensors (each once).
"""

from __future__ import annotations

import collections
import gc
import itertools
import os
import sys
import tracemalloc
import types as types_
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from torchmem._gc import items_now
from torchmem.analysis.holders.find import _shared_value
from torchmem.analysis.holders.roots import FrameSnapshots
from torchmem.capture.host_walk import Heap, as_heap
from torchmem.devices._ledger_sites import internal_dirs as _internal_dirs
from torchmem.devices._storage import key_of_storage

_CONTAINERS = (list, dict, collections.deque)
_PLAIN_DICT = frozenset({dict})
_MIN_LEN = 4  # a container growing for 10 steps or more holds at least this many entries
_MAX_CONTAINERS = 1_000_000
_SMALL = 512  # Python's largest small object: larger blocks come from the C heap
_OWN = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "")
_LIBRARY = os.sep + "site-packages" + os.sep
_LIBRARY_DEB = os.sep + "dist-packages" + os.sep


def _frames(limit: int = 512) -> list[types_.FrameType]:
    """The frames running now on every thread (the garbage collector lists none of them, and does not see
    their locals: their ``f_locals`` are read, then emptied again)."""
    out: list[types_.FrameType] = []
    for f in list(sys._current_frames().values()):
        frame: types_.FrameType | None = f
        while frame is not None and len(out) < limit:
            out.append(frame)
            frame = frame.f_back
    return out


def _program_modules() -> dict[str, Any]:
    """The program's own modules: ``__main__`` and those whose file is outside torch, torchmem, the standard
    library and installed packages."""
    internal = _internal()
    out: dict[str, Any] = {}
    for name, mod in items_now(sys.modules):
        fn = getattr(mod, "__file__", None) or ""
        if name == "__main__" or (
            fn and not fn.startswith(internal) and _LIBRARY not in fn and _LIBRARY_DEB not in fn
        ):
            out[name] = mod
    return out


def _containers(objs: Heap | list[Any]) -> list[Any]:
    """The lists, dicts and deques among ``objs``, and the dicts the garbage collector does not track (a dict
    whose keys and values are all untracked, such as ``{"k3": ndarray}``, is untracked itself:
    ``gc.get_objects()`` does not list it) that the program's own namespaces refer to: its modules' globals,
    the instances of its classes, the running frames' locals. C-speed filtering; ~0.1 s at 300,000
    objects."""
    heap = as_heap(objs)
    kinds = heap.types()
    types = {t for t in kinds if issubclass(t, _CONTAINERS)}
    out = list(heap.of_types(types))
    modules = _program_modules()
    mine = {t for t in kinds if getattr(t, "__module__", "") in modules}
    namespaces: list[Any] = [
        vars(m) for m in modules.values() if isinstance(getattr(m, "__dict__", None), dict)
    ]
    snapshots = FrameSnapshots()
    try:
        for f in _frames():
            if not f.f_code.co_filename.startswith(_OWN):
                loc = snapshots.read_dict(f)  # (3.13+: a copy of the proxy, dropped below)
                if loc is not None:
                    namespaces.append(loc)
        refs = gc.get_referents(*namespaces, *heap.of_types(mine))
        namespaces.clear()
    finally:
        snapshots.release()
    dicts = itertools.compress(refs, map(_PLAIN_DICT.__contains__, map(type, refs)))
    seen: set[int] = set()
    for d in itertools.filterfalse(gc.is_tracked, dicts):
        if id(d) not in seen:
            seen.add(id(d))
            out.append(d)
    refs.clear()
    return out


def _lengths(conts: list[Any]) -> list[int]:
    try:
        return list(map(len, conts))  # C speed
    except Exception:  # a subclass whose __len__ fails
        out = []
        for c in conts:
            try:
                out.append(len(c))
            except Exception:
                out.append(-1)
        return out


def container_lengths(objs: Heap | list[Any], own: Iterable[Any]) -> dict[int, int]:
    """``{id: len}`` of the lists, dicts and deques among ``objs`` with at least 4 entries (bounded),
    torchmem's own objects left out."""
    conts = _containers(objs)[:_MAX_CONTAINERS]
    out = {i: n for i, n in zip(map(id, conts), _lengths(conts)) if n >= _MIN_LEN}
    for o in own:
        out.pop(id(o), None)
    return out


def still_growing(
    objs: Heap | list[Any], before: Mapping[int, tuple[int, ...]]
) -> tuple[dict[int, tuple[int, ...]], dict[int, Any]]:
    """The containers of ``before`` (``{id: (lengths so far)}``) that are longer now than at every earlier
    reading: ``({id: lengths with now's}, {id: container})``. A container that shrank or stayed drops out."""
    grown: dict[int, tuple[int, ...]] = {}
    found: dict[int, Any] = {}
    if not before:
        return grown, found
    conts = _containers(objs)
    known = list(itertools.compress(conts, map(before.__contains__, map(id, conts))))
    for c, n in zip(known, _lengths(known)):
        lens = before[id(c)]
        if n > lens[-1]:
            grown[id(c)] = (*lens, n)
            found[id(c)] = c
    return grown, found


def newest(container: Any, k: int) -> list[tuple[Any, Any]]:
    """The ``k`` entries added last, newest last, as ``(key, value)``: a list's or deque's end (the key is
    the index), a dict's last items."""
    try:
        if isinstance(container, dict):
            return list(itertools.islice(reversed(container.items()), k))[::-1]
        n = len(container)
        if isinstance(container, collections.deque):
            values = list(itertools.islice(reversed(container), k))[::-1]
        else:
            values = list(container[-k:])
        return list(zip(range(n - len(values), n), values))
    except Exception:  # changed while read (another thread), or a subclass that refuses
        return []


def kept_entries(entries: Sequence[tuple[Any, Any]], cpu_tensors: bool = False) -> list[tuple[Any, Any]]:
    """The entries that say what a container keeps: tensors aside (their memory is the device report's; CPU
    tensors stay where ``cpu_tensors``: a run that watches a GPU does not watch the CPU's; a device tensor
    with an autograd graph stays: its nodes are the host's), and values the whole interpreter shares
    (``None``, small ints: nothing keeps them per step)."""
    return [
        (k, o)
        for k, o in entries
        if not isinstance(o, type)
        and (
            not isinstance(o, torch.Tensor)
            or (cpu_tensors and _on_cpu(o))
            or (not _on_cpu(o) and _carries_graph(o))
        )
        and _shared_value(o) is None
    ]


def _carries_graph(t: torch.Tensor) -> bool:
    """A tensor with a ``grad_fn``: on any device, its graph's autograd nodes are on the host."""
    try:
        return t.grad_fn is not None
    except Exception:  # a tensor subclass that refuses
        return False


def _on_cpu(t: torch.Tensor) -> bool:
    try:
        return t.device.type == "cpu"
    except Exception:  # a tensor subclass that refuses
        return False


def untracked_items(items: Sequence[Any]) -> list[Any]:
    """The objects among ``items`` the garbage collector does not track (what instance counts cannot see),
    tensors and values the whole interpreter shares aside."""
    return [o for _, o in kept_entries([(None, o) for o in items]) if not gc.is_tracked(o)]


_DEEP_MAX = 10_000  # objects counted into one entry's size


def measure(o: Any) -> tuple[int, dict[str, int]]:
    """An entry's size with what only it holds, and the objects inside it by type name: ``sys.getsizeof``,
    a numpy array's buffer where ``getsizeof`` leaves it out (a view's), and the values inside its lists,
    tuples, dicts and sets, recursively (bounded: 10,000 objects). Dict keys inside it (shared strings, most
    often) and values the whole interpreter shares (small ints, ``None``) are not counted."""
    total = 0
    inside: dict[str, int] = {}
    seen: set[int] = set()
    stack = [o]
    while stack and len(seen) < _DEEP_MAX:
        x = stack.pop()
        if id(x) in seen or x is None or (type(x) is int and -5 <= x <= 256):
            continue
        seen.add(id(x))
        try:
            size = int(sys.getsizeof(x))
        except Exception:
            continue
        nbytes = getattr(x, "nbytes", None)
        if isinstance(nbytes, int) and nbytes > size and not (isinstance(x, torch.Tensor) and not _on_cpu(x)):
            size += nbytes  # (a device tensor's bytes are not the host's)
        total += size
        if x is not o:
            name = type(x).__name__
            inside[name] = inside.get(name, 0) + 1
        if isinstance(x, (list, tuple, set, frozenset, collections.deque)):
            stack.extend(x)
        elif isinstance(x, dict):
            stack.extend(x.values())
    return total, inside


def item_size(o: Any) -> int:
    """:func:`measure`'s size."""
    return measure(o)[0]


def type_label(objs: Sequence[Any]) -> str:
    """The most common type's short name among ``objs``."""
    counts = collections.Counter(type(o).__name__ for o in objs)
    return counts.most_common(1)[0][0] if counts else "object"


_OWN_FILE, _SKIP_FILE, _LIBRARY_FILE, _PROGRAM_FILE = range(4)


def _file_kind(fn: str, internal: tuple[str, ...]) -> int:
    if fn.startswith(_OWN):
        return _OWN_FILE
    if fn.startswith(internal) or fn.startswith("<frozen"):
        return _SKIP_FILE
    if _LIBRARY in fn or _LIBRARY_DEB in fn:
        return _LIBRARY_FILE
    return _PROGRAM_FILE


def _owner(
    frames: Sequence[tuple[str, int]], internal: tuple[str, ...], kinds: dict[str, int] | None = None
) -> str | None:
    """``file.py:N`` of the program's innermost frame; ``None`` where torchmem's own code made the allocation
    (its frame comes first, from the innermost) or no program frame is there; an installed library's frame
    where the program's is out of reach. ``frames``: ``(filename, lineno)``, the innermost first (the order
    tracemalloc keeps them in); ``kinds``: each file's kind, filled as files are met (one dict for many
    tracebacks: the same few hundred files)."""
    if kinds is None:
        kinds = {}
    library = None
    for fn, lineno in frames:
        kind = kinds.get(fn)
        if kind is None:
            kind = kinds[fn] = _file_kind(fn, internal)
        if kind == _PROGRAM_FILE:
            return f"{os.path.basename(fn)}:{lineno}"
        if kind == _OWN_FILE:
            return None
        if kind == _LIBRARY_FILE and library is None:
            library = f"{os.path.basename(fn)}:{lineno}"
    return library


_INTERNAL: list[tuple[str, ...]] = []


def _internal() -> tuple[str, ...]:
    if not _INTERNAL:
        _INTERNAL.append(_internal_dirs())
    return _INTERNAL[0]


def _traceback_groups(snapshot: tracemalloc.Snapshot) -> list[tuple[tuple[tuple[str, int], ...], int, int]]:
    """``(frames, bytes, blocks)`` per distinct traceback of ``snapshot``, its frames the innermost first:
    what ``snapshot.statistics("traceback")`` counts, without a ``Traceback`` and a ``Statistic`` object per
    allocation and a Python-level hash of each (2.3 s against 0.55 s on 1.17M traces; 8.7 s against 1.2 s
    while tracing goes on). Where the snapshot's raw traces are not there (``Snapshot.traces._traces``,
    private to tracemalloc), its own statistics give the same groups."""
    raw = getattr(getattr(snapshot, "traces", None), "_traces", None)
    if not isinstance(raw, list) or (raw and not (isinstance(raw[0], tuple) and len(raw[0]) >= 3)):
        return [
            (tuple((f.filename, f.lineno) for f in reversed(list(stat.traceback))), stat.size, stat.count)
            for stat in snapshot.statistics("traceback")
        ]
    # Keyed by the traceback tuple itself (hashed in C, nothing allocated per trace: under tracing, each
    # allocation here is traced too), the sizes appended to a list per traceback and summed once.
    groups: dict[tuple[tuple[str, int], ...], list[int]] = {}
    get = groups.get
    for trace in raw:
        sizes = get(trace[2])
        if sizes is None:
            groups[trace[2]] = [trace[1]]
        else:
            sizes.append(trace[1])
    return [(frames, sum(sizes), len(sizes)) for frames, sizes in groups.items()]


def traced_lines(snapshot: tracemalloc.Snapshot) -> dict[str, tuple[int, int]]:
    """Bytes still alive per user line in ``snapshot``: ``{site: (bytes, bytes in blocks > 512 B)}``."""
    internal = _internal()
    out: dict[str, tuple[int, int]] = {}
    kinds: dict[str, int] = {}
    for frames, size, count in _traceback_groups(snapshot):
        site = _owner(frames, internal, kinds)
        if site is None:
            continue
        big = size if count and size / count > _SMALL else 0
        b, h = out.get(site, (0, 0))
        out[site] = (b + size, h + big)
    return out


def minus(now: dict[str, tuple[int, int]], base: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
    """``now`` less ``base``, per line (a program that traces on its own: what was alive before)."""
    if not base:
        return now
    out = {}
    for k, (b, h) in now.items():
        b0, h0 = base.get(k, (0, 0))
        out[k] = (b - b0, h - h0)
    return out


def creation_line(o: Any) -> str | None:
    """The program's line that created ``o`` (tracemalloc; ``None`` where it did not trace it)."""
    tb = tracemalloc.get_object_traceback(o)
    return None if tb is None else _owner([(f.filename, f.lineno) for f in reversed(list(tb))], _internal())


def cpu_storage_bytes(tensors: Sequence[torch.Tensor]) -> int:
    """Bytes of the distinct CPU storages of ``tensors``."""
    seen: set[int] = set()
    total = 0
    for t in tensors:
        try:
            if t.device.type != "cpu" or t.is_sparse or t.is_meta:
                continue
            s = t.untyped_storage()
            key = key_of_storage(s)
            if key in seen:
                continue
            seen.add(key)
            total += s.nbytes()
        except Exception:
            continue
    return total


__all__ = [
    "container_lengths",
    "cpu_storage_bytes",
    "creation_line",
    "item_size",
    "kept_entries",
    "measure",
    "minus",
    "newest",
    "still_growing",
    "traced_lines",
    "type_label",
    "untracked_items",
]
