"""``torchmem.holders()``: who keeps an object alive, as referrer paths a person can read.

A holder path starts at a root a person knows and follows references down to the target::

    __main__.trainer.optimizer.state[<Parameter 'fc1.weight' (4096, 1024) float32>]['exp_avg']
    train.py:42 in step(), local 'batch'
    sys.last_traceback -> frame train.py:42 in f(), local 'x'
    __main__.losses[17].grad_fn -> saved tensor of AddmmBackward0 (_saved_mat1)
    Out[7]

Roots: module globals (every module in ``sys.modules``), the locals of every live frame of every thread,
``sys.last_traceback``/``sys.last_value``/``sys.last_exc``, the exception being handled
(``sys.exc_info()``, in every thread), IPython's output history (``Out``, ``_``, ``__``, ``___``, ``_N``)
and classes (named by module and qualified name). What no root reaches is still reported: an object held
only from outside Python's view (C code, a C++ autograd node) is a ``gc-orphan`` root, and one held only
by unreachable reference cycles is a ``cycle`` root (the next ``gc.collect()`` frees it).

How it is fast. A forward walk from the roots visits the whole heap (~5 µs an object, 5–6 s at a million
objects), and ``gc.get_referrers(*objs)`` compares every reference in the heap with each of its arguments
(~1.2 ms per argument per million objects). Instead the search takes one snapshot of the heap's
references: ``gc.get_referents`` over chunks of 64 objects, the referents' addresses copied straight out
of the list that holds them, sorted once (as 32-bit keys; the addresses make matches exact). Each level of
the backward breadth-first search from all targets at once is then a ``searchsorted``, and the referrer
of each match is found by walking the few matching chunks. The paths are rebuilt best-first (A*) from
each target up to the roots, rendered, and the most readable kept. References the garbage collector
cannot see are added as virtual edges: a tensor's ``.grad`` and ``._base``, and every tensor saved for
backward in an autograd graph (walked from each live tensor's ``grad_fn`` through ``next_functions``;
matched to targets by identity, or by data pointer, shape and stride when autograd unpacks a fresh
wrapper, as it does for saved outputs; a different view of the same storage is reported as sharing it).

The search does not count itself: its own frames (and every executing ``torchmem`` frame), its
temporaries, the target sequence and whatever is passed in ``exclude`` are not holders. The result holds
strings only. Reading a function frame's ``f_locals`` (CPython <= 3.12) leaves a snapshot dict on the
frame that would keep its locals alive; the search empties the snapshots it made when nobody else holds
them and no Python-level tracer could write them back.

Cost: about 0.45 s at a million live gc-tracked objects (2 cores), plus ~30 bytes of temporary memory per
reference while the search runs; the garbage collector is paused meanwhile and restored after. Python's
own tools run untouched: the caller's torch function and dispatch modes do not see the search's tensors.

Limits: objects frozen with ``gc.freeze()`` are not in the snapshot (only the root namespaces' references
are added back); holders that keep an object only on a C stack or in C state show as ``gc-orphan``;
reading autograd's saved tensors runs any ``saved_tensors_hooks`` unpack hook.
"""

from __future__ import annotations

import bisect
import ctypes
import functools
import gc
import heapq
import itertools
import logging
import os
import re
import sys
import threading
import time
import types
from array import array
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, overload

import torch

from torchmem._errors import TorchmemError

__all__ = ["HolderPath", "HolderPaths", "HolderSearch", "HoldersTargetError", "find_holders", "holders"]

_log = logging.getLogger("torchmem")


# --------------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class HolderPath:
    """One chain of references from a root to the object, rendered for people.

    Attributes:
        root: The kind of root the path starts at: ``"module"`` (a module global), ``"class"`` (a class
            attribute), ``"frame"`` (a local of a live frame of the calling thread), ``"thread"`` (a local
            of a live frame of another thread), ``"traceback"`` (``sys.last_traceback``), ``"exception"``
            (``sys.last_value``, ``sys.last_exc`` or an exception being handled), ``"ipython"`` (IPython's
            output history), ``"gc-orphan"`` (held from outside Python's view: C code, a C++ object) or
            ``"cycle"`` (held only by an unreachable reference cycle).
        steps: Readable fragments from the root to the object; ``"".join(steps)`` is the path.
        depth: How many references the path follows (a hop inside an autograd graph counts as one).

    Example:
        >>> p = HolderPath("module", ("__main__", ".cache", "['x']"), 2)
        >>> str(p)
        "__main__.cache['x']"
    """

    root: str
    steps: tuple[str, ...]
    depth: int

    def __str__(self) -> str:
        return "".join(self.steps)

    def __repr__(self) -> str:
        # The readable path, so that a list of paths reads as the README shows it:
        # [__main__.losses[17].grad_fn -> saved tensor of AddmmBackward0 (_saved_mat1)]
        return str(self)

    def to_dict(self) -> dict[str, Any]:
        return {"root": self.root, "path": str(self), "steps": list(self.steps), "depth": self.depth}


class HolderPaths(list[HolderPath]):
    """The holder paths of one object, as :func:`holders` returns them: a plain ``list`` of
    :class:`HolderPath` whose ``str()`` puts one readable path on each line.

    ``repr()`` is the list's (``[__main__.cache['w'], ...]``); indexing, ``len()``, ``==`` with a list and
    ``isinstance(paths, list)`` work as for any list.

    Example:
        >>> paths = HolderPaths([HolderPath("module", ("__main__", ".cache", "['w']"), 2)])
        >>> print(paths)
        __main__.cache['w']
        >>> paths
        [__main__.cache['w']]
    """

    def __str__(self) -> str:
        if not self:
            return "no holders found"
        return "\n".join(str(p) for p in self)


class HoldersTargetError(TorchmemError, ValueError):
    """:func:`holders` was asked about a value the whole interpreter shares (``None``, ``True``, ``0``, ...).

    Such a value is one object that every module, function and frame refers to, so its "holders" are
    arbitrary paths (``sys.pycache_prefix``, ``__main__.__doc__``) that explain nothing. Also a
    ``ValueError``.
    """


@dataclass(frozen=True)
class HolderSearch:
    """The result of one search for the holders of several objects.

    Attributes:
        paths: One tuple per target, in the order given, most readable first: rooted paths before
            ``gc-orphan`` and ``cycle`` ones, then fewer steps, then fewer references. Empty where nothing
            but the search itself (or what was excluded) holds the target.
        truncated: A limit was hit, so some holders may be missing.
        reason: Which limits, comma-separated: ``"max_paths"`` (a target has more paths than asked
            for), ``"time_limit"``, ``"max_objects"``, ``"fan_in"`` (an object had too many referrers
            to follow them all), ``"error: <type>"`` (the search failed; logged, paths empty).
        seconds: Wall time of the search.
        visited: Objects the backward search explored.

    Example:
        >>> r = HolderSearch(((HolderPath("module", ("__main__", ".x"), 1),),), False, None, 0.1, 3)
        >>> print(r)  # doctest: +NORMALIZE_WHITESPACE
        holders of 1 object (0.10 s, 3 objects visited)
        [0] __main__.x
    """

    paths: tuple[tuple[HolderPath, ...], ...]
    truncated: bool
    reason: str | None
    seconds: float
    visited: int

    def __str__(self) -> str:
        n = len(self.paths)
        plural = "s" if n != 1 else ""
        head = f"holders of {n} object{plural} ({self.seconds:.2f} s, {self.visited} objects visited"
        head += f", truncated: {self.reason})" if self.truncated else ")"
        lines = [head]
        for i, ps in enumerate(self.paths):
            if not ps:
                lines.append(f"[{i}] no holder found")
            for j, p in enumerate(ps):
                lines.append(f"{f'[{i}]' if j == 0 else '':<4}{p}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "paths": [[p.to_dict() for p in ps] for ps in self.paths],
            "truncated": self.truncated,
            "reason": self.reason,
            "seconds": self.seconds,
            "visited": self.visited,
        }


# --------------------------------------------------------------------------------------------------
# Public functions
# --------------------------------------------------------------------------------------------------
@overload
def holders(obj: object, /, *, max_paths: int = 8, time_limit: float = 5.0) -> list[HolderPath]: ...


@overload
def holders(
    obj: object, obj2: object, /, *more: object, max_paths: int = 8, time_limit: float = 5.0
) -> list[list[HolderPath]]: ...


def holders(
    obj: object, *more: object, max_paths: int = 8, time_limit: float = 5.0
) -> list[HolderPath] | list[list[HolderPath]]:
    """Who keeps ``obj`` alive: referrer paths from roots a person understands, shortest first.

    Several objects share one search: ``holders(a, b, c)`` returns one list per object. Use
    :func:`find_holders` to learn whether the search was truncated.

    Args:
        obj: The object to explain (usually a tensor).
        *more: More objects, searched together.
        max_paths: Most paths reported per object.
        time_limit: Seconds the search may take before it stops with what it found.

    Returns:
        For one object, its paths as a :class:`HolderPaths` (a ``list``; ``print()`` shows one path per
        line, the interactive ``repr`` the readable paths in brackets); for several, one such list per
        object. ``str(path)`` (and ``repr(path)``) is the readable path.

    Raises:
        HoldersTargetError: ``obj`` is a value the whole interpreter shares (``None``, ``True``,
            ``False``, ``Ellipsis``, ``NotImplemented``, a small int, the empty tuple or string, a
            one-character string): everything holds it, so its paths would mean nothing.

    Example:
        >>> import torch, torchmem
        >>> cache = {"w": torch.zeros(3)}
        >>> torchmem.holders(cache["w"])  # doctest: +SKIP
        [__main__.cache['w']]
        >>> print(torchmem.holders(cache["w"]))  # doctest: +SKIP
        __main__.cache['w']
    """
    targets = (obj, *more)
    for i, t in enumerate(targets):
        _check_target(t, "holders", f"argument {i + 1}" if more else "")
    search = find_holders(targets, max_paths=max_paths, time_limit=time_limit, exclude=(more,))
    if search.truncated:
        _log.debug("holders(): search truncated (%s)", search.reason)
    if not more:
        return HolderPaths(search.paths[0])
    each: list[list[HolderPath]] = [HolderPaths(p) for p in search.paths]
    return each


# Values the interpreter shares between all code: their holders are everything, which says nothing.
_SINGLETONS: tuple[tuple[object, str], ...] = (
    (None, "None"),
    (True, "True"),
    (False, "False"),
    (Ellipsis, "Ellipsis"),
    (NotImplemented, "NotImplemented"),
)


def _shared_value(obj: object) -> str | None:
    """Why ``obj`` is one object the whole interpreter shares, or ``None`` when it is not."""
    for value, name in _SINGLETONS:
        if obj is value:
            return f"{name} is a singleton"
    t = type(obj)
    if t is int and -5 <= obj <= 256:  # type: ignore[operator]
        return f"small ints (-5 to 256) are cached: every {obj} in the program is this same object"
    if t is tuple and not obj:
        return "the empty tuple is a single shared object"
    if t is str and not obj:
        return "the empty string is a single shared object"
    if t is str and len(obj) == 1 and ord(obj) < 256:  # type: ignore[arg-type]
        return f"one-character strings are cached: every {obj!r} in the program is this same object"
    if t is bytes and len(obj) <= 1:  # type: ignore[arg-type]
        return "empty and one-byte bytes objects are cached and shared by all code"
    return None


def _check_target(obj: object, fn: str, where: str) -> None:
    why = _shared_value(obj)
    if why is None:
        return
    at = f" ({where})" if where else ""
    raise HoldersTargetError(
        f"{fn}() cannot explain {obj!r}{at}: {why}, referred to by every module, function and frame that "
        "uses it, so its holder paths would be arbitrary (sys.pycache_prefix, __main__.__doc__, ...).",
        "Pass the object whose memory you want explained: a tensor, module, optimizer or container, e.g. "
        "torchmem.holders(model.fc.weight). If a variable you expected to hold a tensor is None, the tensor "
        "was never assigned to it (or was already dropped).",
    )


def find_holders(
    targets: Sequence[object],
    *,
    max_paths: int = 8,
    time_limit: float = 5.0,
    exclude: Iterable[object] = (),
    max_objects: int = 500_000,
) -> HolderSearch:
    """Find the holder paths of several objects in one backward search of the heap.

    Args:
        targets: The objects to explain. The sequence itself is not a holder.
        max_paths: Most paths reported per target.
        time_limit: Seconds the search may take; when it runs out the paths found so far are returned
            with ``truncated=True``.
        exclude: Objects that must not count as holders (the caller's own containers of the targets).
            Executing ``torchmem`` frames never count.
        max_objects: Most objects the backward search explores.

    Returns:
        A :class:`HolderSearch` holding only strings: the targets are not kept alive.

    Example:
        >>> import torch
        >>> from torchmem.analysis.holders import find_holders
        >>> a, b = torch.zeros(2), torch.ones(2)
        >>> box = [a, {"b": b}]
        >>> r = find_holders([a, b])
        >>> [str(p) for p in r.paths[1]]  # doctest: +SKIP
        ["<stdin>:1 in <module>(), local 'box'[1]['b']", ...]
    """
    for i, t in enumerate(targets):
        _check_target(t, "find_holders", f"targets[{i}]")
    if max_paths < 1:
        raise ValueError(f"max_paths must be at least 1, got {max_paths}")
    if time_limit <= 0:
        raise ValueError(f"time_limit must be positive, got {time_limit}")
    search = _Search(targets, max_paths, time_limit, exclude, max_objects)
    try:
        return search.run()
    finally:
        search.close()


# --------------------------------------------------------------------------------------------------
# Heap snapshot helpers
# --------------------------------------------------------------------------------------------------
_CHUNK = 64  # objects per get_referents call while indexing
_FAN_IN = 2048  # most referrers followed per object
_POP_BUDGET = 20_000  # most states the path enumeration pops per target and pass
_ALTERNATIVES = 8  # most names tried for one reference (an object under several keys of one dict)
_INF = 1 << 30
_CO_OPTIMIZED = 0x0001
_SYS_LAST = {"last_traceback": "traceback", "last_value": "exception", "last_exc": "exception"}
_IPY_HIST = re.compile(r"_\d+\Z")
_MISSING: Any = object()

_list_items_offset: int | bool | None = False  # False: not probed yet; None: unavailable


def _probe_list_layout() -> int | None:
    """Offset of ``ob_item`` in a CPython list, verified on a real list; ``None`` where it does not hold."""
    if sys.implementation.name != "cpython":
        return None
    offset = ctypes.sizeof(ctypes.c_ssize_t) * 3  # ob_refcnt, ob_type, ob_size
    probe = [object(), object(), object()]
    try:
        ptr = ctypes.c_void_p.from_address(id(probe) + offset).value
        if not ptr:
            return None
        got = list((ctypes.c_int64 * 3).from_address(ptr))
    except (ValueError, OSError):  # pragma: no cover - defensive
        return None
    return offset if got == [id(o) for o in probe] else None


def _addresses(lst: list[Any]) -> torch.Tensor:
    """``[id(o) for o in lst]`` as an int64 tensor, read from the list's item array where possible."""
    global _list_items_offset
    if _list_items_offset is False:
        _list_items_offset = _probe_list_layout()
    n = len(lst)
    if n and isinstance(_list_items_offset, int) and ctypes.sizeof(ctypes.c_void_p) == 8:
        ptr = ctypes.c_void_p.from_address(id(lst) + _list_items_offset).value
        if ptr:
            out = torch.empty(n, dtype=torch.int64)
            ctypes.memmove(out.data_ptr(), ptr, n * 8)  # (a ctypes array type per length would pile up)
            return out
    return (
        torch.tensor(array("q", map(id, lst)), dtype=torch.int64) if n else torch.zeros(0, dtype=torch.int64)
    )


def _frame_desc(f: types.FrameType, lineno: int | None = None) -> str:
    code = f.f_code
    line = f.f_lineno if lineno is None else lineno
    return f"{os.path.basename(code.co_filename)}:{line} in {code.co_name}()"


def _tracing_may_rewrite_locals(frames: Iterable[types.FrameType]) -> bool:
    """Whether a Python-level trace or profile function may copy a frame's locals dict back into it.

    CPython <= 3.12 calls such functions through a trampoline that refreshes ``f_locals`` before the
    call and writes it back into the frame after; a snapshot emptied in between would delete the
    frame's locals. C tracers (coverage's CTracer) and ``sys.monitoring`` do not do that.
    """
    fns: list[Any] = [sys.gettrace(), sys.getprofile()]
    for name in ("gettrace", "getprofile"):
        get = getattr(threading, name, None)
        if get is not None:
            fns.append(get())
    for fn in fns:
        if fn is None:
            continue
        if isinstance(fn, (types.FunctionType, types.MethodType, functools.partial)):
            return True
        if type(fn).__flags__ & (1 << 9):  # Py_TPFLAGS_HEAPTYPE: a Python class with __call__
            return True
    return any(f.f_trace is not None for f in frames)


class _Root:
    __slots__ = ("container", "ipython", "kind", "label")

    def __init__(self, kind: str, label: str, container: bool, ipython: bool = False) -> None:
        self.kind = kind  # module | frame | thread | exception | class
        self.label = label
        self.container = container  # edges from it are keys (a namespace dict), not attributes
        self.ipython = ipython


def _is_ipython_ns(d: dict[str, Any]) -> bool:
    return isinstance(d.get("Out"), dict) and ("_oh" in d or "In" in d or "get_ipython" in d)


_TB: Any = torch._C.TensorBase.__dict__  # C getters, bypassing subclass properties
_GRAD_FN = _TB["grad_fn"].__get__
_GRAD = _TB["grad"].__get__
_BASE = _TB["_base"].__get__
_IS_VIEW = torch._C.TensorBase._is_view
_DATA_PTR = torch._C.TensorBase.data_ptr
_saved_names: dict[type, tuple[str, ...]] = {}


def _saved_attrs(node_type: type) -> tuple[str, ...]:
    names = _saved_names.get(node_type)
    if names is None:
        names = tuple(
            a
            for a in dir(node_type)
            if a.startswith("_saved_") and not a.endswith(("_sym_sizes", "_sym_strides"))
        )
        _saved_names[node_type] = names
    return names


def _subclasses(base: type) -> set[type]:
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


# --------------------------------------------------------------------------------------------------
# The search
# --------------------------------------------------------------------------------------------------
class _Search:
    def __init__(
        self,
        targets: Sequence[object],
        max_paths: int,
        time_limit: float,
        exclude: Iterable[object],
        max_objects: int,
    ) -> None:
        self.t0 = time.perf_counter()
        self.deadline = self.t0 + time_limit
        self.max_paths = max_paths
        self.max_objects = max_objects
        self.targets: list[Any] = list(targets)
        excl = list(exclude)
        # ids of objects that are never holders: the search's own containers and what the caller excludes
        self.ignore: set[int] = {id(targets), id(self.targets), id(excl), id(self)}
        self.ignore.update(id(o) for o in excl)
        self.exclude_frames: set[int] = {id(o) for o in excl if isinstance(o, types.FrameType)}
        excl.clear()
        self.roots: dict[int, _Root] = {}
        self.snaps: list[tuple[types.FrameType, dict[str, Any]]] = []  # f_locals snapshots we made
        self.snap_ids: set[int] = set()
        self.keep: list[Any] = []  # namespace dicts and frames kept alive during the search
        self.reasons: list[str] = []
        self.gc_was_enabled = gc.isenabled()
        self.objs: list[Any] = []
        self.skeys: torch.Tensor | None = None
        self.sids: torch.Tensor | None = None
        self.perm: torch.Tensor | None = None
        self.cends: torch.Tensor | None = None
        self._fresh_graph()
        self.complete = False
        for name in ("ignore", "exclude_frames", "roots", "snaps", "snap_ids", "keep", "reasons", "targets"):
            self.ignore.add(id(getattr(self, name)))

    def _fresh_graph(self) -> None:
        """New, empty containers for the search graph."""
        self.nobj: list[Any] = []
        self.nid: dict[int, int] = {}
        self.par: list[list[tuple[int, str | None, int]]] = []
        self.mask: list[int] = []
        self.expanded: list[bool] = []
        self.root_of: dict[int, _Root] = {}
        self.held_by_ignored: set[int] = set()
        self.selfref: set[int] = set()  # nodes that refer to themselves
        self.vparents: dict[int, list[tuple[Any, str, int]]] = {}
        self.modules: list[Any] | None = None
        self.param_names: dict[int, str] | None = None
        self.key_cache: dict[int, dict[int, list[Any]]] = {}
        self._choices: list[int] = []
        self._counts: list[int] = []
        self._cursor = 0

    # -- limits -----------------------------------------------------------------------------------
    def _out_of_time(self) -> bool:
        if time.perf_counter() > self.deadline:
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
            return HolderSearch((), False, None, time.perf_counter() - self.t0, 0)
        # The search's own tensors must not go through the caller's torch function or dispatch modes
        # (`with torch.device("cuda")`, a FakeTensorMode, torchmem's own ledger).
        paths: list[tuple[HolderPath, ...]] = [() for _ in range(n)]
        try:
            with torch._C.DisableTorchFunction(), torch._C._DisableTorchDispatch():
                self._collect_roots()
                gc.disable()
                if self._build_index():
                    if any(isinstance(t, torch.Tensor) for t in self.targets):
                        self._autograd_edges()
                    self._bfs()
                    paths = self._all_paths()
        except Exception as e:  # an object that refused inspection must not break release() or a report
            _log.warning("holders(): the search failed: %r", e)
            self._truncate(f"error: {type(e).__name__}")
        visited = len(self.nobj)
        return HolderSearch(
            tuple(paths),
            bool(self.reasons),
            ", ".join(self.reasons) or None,
            time.perf_counter() - self.t0,
            visited,
        )

    def close(self) -> None:
        """Drop every reference the search took; empty the frame snapshots it made where that is safe."""
        self.objs = []
        self.skeys = self.sids = self.perm = self.cends = None
        self.nobj = []
        self.nid = {}
        self.par = []
        self.vparents = {}
        self.root_of = {}
        self.modules = None
        self.key_cache = {}
        self.targets = []
        self.keep = []
        snaps, self.snaps = self.snaps, []
        try:
            if snaps and not _tracing_may_rewrite_locals(f for f, _ in snaps):
                self._clear_snapshots(snaps)
        finally:
            snaps.clear()
            if self.gc_was_enabled and not gc.isenabled():
                gc.enable()

    @staticmethod
    def _clear_snapshots(snaps: list[tuple[types.FrameType, dict[str, Any]]]) -> None:
        # Reading f_locals of a function frame (CPython <= 3.12) stores a snapshot dict on the frame that
        # keeps every local alive until the frame ends, even after the code deletes it. Empty the ones
        # nobody else holds (refs: the frame, `d`, getrefcount's argument); the next read refills them.
        while snaps:
            f, d = snaps.pop()
            del f
            if sys.getrefcount(d) <= 3:
                d.clear()
            del d

    # -- roots ------------------------------------------------------------------------------------
    def _collect_roots(self) -> None:
        roots = self.roots
        for name, mod in list(sys.modules.items()):
            if isinstance(mod, types.ModuleType):
                try:
                    d = mod.__dict__
                except Exception:  # pragma: no cover - exotic lazy modules
                    continue
                if id(d) not in roots:
                    roots[id(d)] = _Root("module", name, True, _is_ipython_ns(d))
        ipy = sys.modules.get("IPython")
        if ipy is not None:
            try:
                shell = ipy.get_ipython()
                ns = shell.user_ns if shell is not None else None
            except Exception:
                ns = None
            if isinstance(ns, dict) and id(ns) not in roots:
                roots[id(ns)] = _Root("module", "__main__", True, _is_ipython_ns(ns))
                self.keep.append(ns)

        me = threading.get_ident()
        names = {t.ident: t.name for t in threading.enumerate()}
        frames = sys._current_frames()
        self.ignore.add(id(frames))
        f: types.FrameType | None = None
        for tid in list(frames):
            f = frames[tid]
            while f is not None:
                self._add_frame(f, tid == me, names.get(tid, str(tid)))
                f = f.f_back
        # This frame is among them: a local still naming it would be a reference cycle that keeps the
        # frame, its callers and their locals (the targets) alive until the next collection.
        f = None
        frames.clear()

        exc = sys.exc_info()[1]
        if exc is not None:
            roots.setdefault(id(exc), _Root("exception", "sys.exc_info()[1]", False))
            self.keep.append(exc)
        current = getattr(sys, "_current_exceptions", None)
        if current is not None:
            try:
                others = current()
            except Exception:  # pragma: no cover
                others = {}
            self.ignore.add(id(others))
            for tid, v in others.items():
                e = v[1] if isinstance(v, tuple) else v
                if tid != me and e is not None:
                    label = f"thread '{names.get(tid, tid)}': sys.exc_info()[1]"
                    roots.setdefault(id(e), _Root("exception", label, False))
                    self.keep.append(e)
            others.clear()

    def _add_frame(self, f: types.FrameType, mine: bool, thread: str) -> None:
        self.ignore.add(id(f))
        self.keep.append(f)
        g = f.f_globals
        mod = str(g.get("__name__", ""))
        own = id(f) in self.exclude_frames or mod == "torchmem" or mod.startswith("torchmem.")
        if id(g) not in self.roots:
            self.roots[id(g)] = _Root("module", str(g.get("__name__", "<globals>")), True, _is_ipython_ns(g))
        code = f.f_code
        loc: Any = f.f_locals
        if code.co_flags & _CO_OPTIMIZED:
            if type(loc) is dict:
                self.snap_ids.add(id(loc))
                self.snaps.append((f, loc))
            else:  # PEP 667 proxy (3.13+): copy what it shows
                loc = dict(loc)
        elif loc is g:
            return
        elif not isinstance(loc, dict):
            loc = dict(loc)
        self.keep.append(loc)
        if own:
            self.ignore.add(id(loc))
        elif id(loc) not in self.roots:
            desc = _frame_desc(f)
            kind = "frame" if mine else "thread"
            self.roots[id(loc)] = _Root(kind, desc if mine else f"thread '{thread}': {desc}", True)

    # -- heap index -------------------------------------------------------------------------------
    def _build_index(self) -> bool:
        """Snapshot every gc-visible reference: referent addresses, sorted, with the chunk each came from."""
        objs = gc.get_objects()
        self.objs = objs
        self.ignore.add(id(objs))
        self._fresh_graph()  # containers the search fills must not be among the indexed objects
        gr = gc.get_referents
        flat: list[Any] = []
        ends = array("q")
        ext, app = flat.extend, ends.append
        parts: list[torch.Tensor] = []
        total = 0
        n = len(objs)
        batch = _CHUNK * 512
        for base in range(0, n, batch):
            for i in range(base, min(base + batch, n), _CHUNK):
                ext(gr(*objs[i : i + _CHUNK]))
                app(total + len(flat))
            parts.append(_addresses(flat))
            total += len(flat)
            flat.clear()  # drop the references while they are still in cache
            if (base // batch) % 8 == 7 and self._out_of_time():
                return False
        ids = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64)
        parts.clear()
        # Sorting 32-bit keys is 2-3x faster than sorting the addresses; the addresses, gathered in the
        # same order, make the matches exact.
        self.skeys, self.perm = torch.sort((ids >> 4).to(torch.int32))
        self.sids = ids[self.perm]
        del ids
        self.cends = torch.tensor(ends, dtype=torch.int64)
        if gc.get_freeze_count():
            self._index_frozen_roots()
        return not self._out_of_time()

    def _index_frozen_roots(self) -> None:
        # Objects moved to the permanent generation (gc.freeze()) are not in gc.get_objects(): add the
        # references of the root namespaces, the ones that matter most, as virtual edges.
        for rid, root in self.roots.items():
            if not root.container:
                continue
            ns = next((d for d in self.keep if id(d) == rid), None)
            if ns is None:
                mod = next(
                    (m for m in list(sys.modules.values()) if id(getattr(m, "__dict__", None)) == rid), None
                )
                ns = None if mod is None else mod.__dict__
            if ns is None:
                continue
            for v in gc.get_referents(ns):
                self.vparents.setdefault(id(v), []).append((ns, "", 1))

    def _positions(self, ids: list[int], cap: int | None) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(index into ``ids``, position in the snapshot) of every reference to an object of ``ids``."""
        assert self.skeys is not None and self.sids is not None and self.perm is not None
        fids = torch.tensor(ids, dtype=torch.int64)
        fk = (fids >> 4).to(torch.int32)
        lo = torch.searchsorted(self.skeys, fk)
        cnt = torch.searchsorted(self.skeys, fk, right=True) - lo
        if cap is not None and int(cnt.max()) > cap:
            self._truncate("fan_in")
            cnt = cnt.clamp(max=cap)
        total = int(cnt.sum())
        if total == 0:
            return None
        which = torch.repeat_interleave(torch.arange(len(ids)), cnt)
        idx = (
            torch.repeat_interleave(lo, cnt)
            + torch.arange(total)
            - torch.repeat_interleave(torch.cumsum(cnt, 0) - cnt, cnt)
        )
        exact = self.sids[idx] == fids[which]  # keys of different addresses may collide
        return which[exact], self.perm[idx[exact]]

    def _hits(self, ids: list[int], cap: int | None) -> list[tuple[Any, int]]:
        """(referrer, index into ``ids``) for every indexed reference to an object of ``ids``.

        ``cap`` limits the references followed per object (reported as ``fan_in``).
        """
        assert self.cends is not None
        found = self._positions(ids, cap)
        if found is None:
            return []
        which, pos = found
        chunk = torch.searchsorted(self.cends, pos, right=True)
        first = torch.where(chunk > 0, self.cends[(chunk - 1).clamp(min=0)], 0)
        order = torch.argsort(pos)
        hits: dict[int, list[tuple[int, int]]] = {}
        for c, off, w in zip(chunk[order].tolist(), (pos - first)[order].tolist(), which[order].tolist()):
            hits.setdefault(c, []).append((off, w))
        out: list[tuple[Any, int]] = []
        objs, gr = self.objs, gc.get_referents
        for c, offs in hits.items():
            # The chunk's references were laid out member after member: find the members that hold them.
            members = objs[c * _CHUNK : (c + 1) * _CHUNK]
            lost: set[int] = set()
            k, start = 0, 0
            for m in members:
                t = type(m)
                refs: Any = None
                if t is list or t is tuple or t is set or t is frozenset:
                    size = len(m)
                else:
                    refs = gr(m)
                    size = len(refs)
                end = start + size
                while k < len(offs) and offs[k][0] < end:
                    w = offs[k][1]
                    if self._refers(m, refs, offs[k][0] - start, ids[w]):
                        out.append((m, w))
                    else:  # the chunk changed since the snapshot: look at every member
                        lost.add(w)
                    k += 1
                if k == len(offs):
                    break
                start = end
            lost.update(w for _, w in offs[k:])
            for w in lost:
                tid = ids[w]
                out.extend((m, w) for m in members if any(id(r) == tid for r in gr(m)))
        return out

    @staticmethod
    def _refers(m: Any, refs: Any, j: int, target_id: int) -> bool:
        """Whether ``m`` still refers to the object at ``target_id`` (the j-th of its references)."""
        t = type(m)
        if t is list or t is tuple:
            i = len(m) - 1 - j  # lists and tuples visit their items last to first
            return 0 <= i < len(m) and id(m[i]) == target_id
        if refs is None:
            refs = gc.get_referents(m)
        if 0 <= j < len(refs) and id(refs[j]) == target_id:
            return True
        return any(id(r) == target_id for r in refs)

    def _instances(self, types_: set[type]) -> list[Any]:
        """Every indexed object whose type is in ``types_`` (heap types: each instance refers to its type)."""
        found = self._positions([id(t) for t in types_], None) if types_ else None
        if found is None:
            return []
        assert self.cends is not None
        objs = self.objs
        out: list[Any] = []
        for c in torch.unique(torch.searchsorted(self.cends, found[1], right=True)).tolist():
            out.extend(o for o in objs[c * _CHUNK : (c + 1) * _CHUNK] if type(o) in types_)
        return out

    def _referrers(self, frontier: list[int]) -> list[tuple[int, Any]]:
        """(child node, referrer) for every gc-visible reference to a frontier object."""
        ids = [id(self.nobj[n]) for n in frontier]
        return [(frontier[w], m) for m, w in self._hits(ids, _FAN_IN)]

    # -- autograd and other C++-held references -----------------------------------------------------
    def _autograd_edges(self) -> None:
        tensor_types = _subclasses(torch.Tensor)
        node_types = _subclasses(torch.autograd.function.BackwardCFunction)
        picked = self._instances(tensor_types | node_types)
        tensors = [o for o in picked if type(o) in tensor_types]
        graph_objs = [o for o in picked if type(o) in node_types]
        picked.clear()

        tid: dict[int, int] = {}
        by_storage: dict[int, tuple[int, list[int]]] = {}  # storage start -> (end, target indices)
        for i, t in enumerate(self.targets):
            if isinstance(t, torch.Tensor):
                tid.setdefault(id(t), i)
                try:
                    s = t.untyped_storage()
                    start, size = int(s.data_ptr()), int(s.nbytes())
                except Exception:  # sparse, nested and other storage-less layouts
                    continue
                if start and size:
                    by_storage.setdefault(start, (start + size, []))[1].append(i)
        starts = sorted(by_storage)
        targets = self.targets

        def match(v: Any) -> list[tuple[int, str]]:
            """Targets that tensor ``v`` is (``""``) or shares a storage with (``", shares storage"``)."""
            i = tid.get(id(v))
            if i is not None:
                return [(i, "")]
            if not starts or not isinstance(v, torch.Tensor):
                return []
            try:
                dp = int(_DATA_PTR(v))
            except Exception:
                return []
            k = bisect.bisect_right(starts, dp) - 1
            if not dp or k < 0:
                return []
            end, idx = by_storage[starts[k]]
            if dp >= end:
                return []
            out: list[tuple[int, str]] = []
            for ti in idx:
                t = targets[ti]
                same = (
                    dp == int(_DATA_PTR(t))
                    and v.shape == t.shape
                    and v.stride() == t.stride()
                    and v.dtype == t.dtype
                )
                out.append((ti, "" if same else ", shares storage"))
            return out

        vp = self.vparents

        def add(target_i: int, parent: Any, label: str, weight: int) -> None:
            vp.setdefault(id(targets[target_i]), []).append((parent, label, weight))

        graph_roots: list[tuple[Any, Any, str, int]] = []
        for t in tensors:
            try:
                fn = _GRAD_FN(t)
            except Exception:
                continue
            if fn is not None:
                graph_roots.append((t, fn, ".grad_fn -> ", 2))
                continue
            try:
                g = _GRAD(t)
            except Exception:
                g = None
            if g is not None:
                for ti, suffix in match(g):
                    add(ti, t, f".grad{suffix and ' (shares storage)'}", 1)
            try:
                b = _BASE(t) if _IS_VIEW(t) else None
            except Exception:
                b = None
            if b is not None:
                for ti, suffix in match(b):
                    add(ti, t, f"._base{suffix and ' (shares storage)'}", 1)
        for o in graph_objs:
            graph_roots.append((o, o, " -> ", 1))
        if not graph_roots:
            return

        memo: dict[int, tuple[tuple[int, str, int], ...]] = {}
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

        def own_matches(n: Any) -> list[tuple[int, str]]:
            name = type(n).__name__
            out: list[tuple[int, str]] = []
            for a in _saved_attrs(type(n)):
                try:
                    v = getattr(n, a)
                except Exception:  # freed by backward, or unpacking failed
                    continue
                if isinstance(v, torch.Tensor):
                    out.extend((ti, f"saved tensor of {name} ({a}{s})") for ti, s in match(v))
                elif isinstance(v, (list, tuple)):
                    for j, x in enumerate(v):
                        if isinstance(x, torch.Tensor):
                            out.extend((ti, f"saved tensor of {name} ({a}[{j}]{s})") for ti, s in match(x))
            if name == "AccumulateGrad":
                try:
                    v = n.variable
                except Exception:
                    v = None
                if v is not None:
                    out.extend((ti, f"graph leaf (AccumulateGrad.variable{s})") for ti, s in match(v))
            elif isinstance(n, torch.autograd.function.BackwardCFunction):
                saved: Sequence[Any]
                try:
                    saved = n.saved_tensors
                except Exception:
                    saved = ()
                for j, x in enumerate(saved):
                    out.extend((ti, f"saved tensor of {name} (saved_tensors[{j}]{s})") for ti, s in match(x))
                try:
                    attrs = dict(object.__getattribute__(n, "__dict__"))
                except Exception:
                    attrs = {}
                for k, x in attrs.items():
                    if isinstance(x, torch.Tensor):
                        out.extend((ti, f"{name} ctx.{k}{s}") for ti, s in match(x))
            return out

        budget = 0
        for owner, fn, prefix, w0 in graph_roots:
            if owner is fn and id(fn) in memo:
                continue  # a Python-defined node already reached from a tensor's grad_fn
            stack: list[tuple[Any, bool]] = [(fn, False)]
            while stack:
                n, done = stack.pop()
                k = id(n)
                if done:
                    best: dict[tuple[int, str], int] = {}
                    for ti, label in own_matches(n):
                        best[(ti, label)] = 0
                    for c in children(n):
                        for ti, label, d in memo.get(id(c), ()):
                            if d + 1 < best.get((ti, label), _INF):
                                best[(ti, label)] = d + 1
                    memo[k] = tuple((ti, label, d) for (ti, label), d in itertools.islice(best.items(), 64))
                    continue
                if k in memo or k in kids:
                    continue
                alive.append(n)
                stack.append((n, True))
                stack.extend((c, False) for c in children(n) if id(c) not in memo)
                budget += 1
                if budget % 4096 == 0 and self._out_of_time():
                    return
            for ti, label, d in memo.get(id(fn), ()):
                add(ti, owner, prefix + label, w0 + d)

    # -- backward breadth-first search ----------------------------------------------------------------
    def _node(self, obj: Any, mask: int) -> int:
        n = len(self.nobj)
        self.nobj.append(obj)
        self.nid[id(obj)] = n
        self.par.append([])
        self.mask.append(mask)
        self.expanded.append(False)
        return n

    def _root_for(self, obj: Any) -> _Root | None:
        r = self.roots.get(id(obj))
        if r is not None:
            return r
        if isinstance(obj, type):
            return _Root("class", f"{obj.__module__}.{obj.__qualname__}", False)
        return None

    def _bfs(self) -> None:
        count = [0] * len(self.targets)
        frontier: list[int] = []
        for i, t in enumerate(self.targets):
            n = self.nid.get(id(t))
            if n is None:
                n = self._node(t, 0)
                frontier.append(n)
                r = self.roots.get(id(t))
                if r is not None and not r.container:
                    self.root_of[n] = r
            self.mask[n] |= 1 << i
        ignore, nid, par, roots_of = self.ignore, self.nid, self.par, self.root_of
        while frontier:
            if self._out_of_time():
                return
            if len(self.nobj) > self.max_objects:
                self._truncate("max_objects")
                return
            edges: list[tuple[int, Any, str | None, int]] = [
                (c, p, None, 1) for c, p in self._referrers(frontier)
            ]
            for c in frontier:
                self.expanded[c] = True
                for vp, vl, vw in self.vparents.get(id(self.nobj[c]), ()):
                    edges.append((c, vp, vl or None, vw))
            nxt: list[int] = []
            seen: set[tuple[int, int, str | None]] = set()
            fan: dict[int, int] = {}
            for c, p, label, w in edges:
                pid = id(p)
                if pid in ignore:
                    self.held_by_ignored.add(c)
                    continue
                pn = nid.get(pid)
                if pn is None:
                    r = self._root_for(p)
                    if r is None:
                        k = fan.get(c, 0)
                        if k >= _FAN_IN:
                            self._truncate("fan_in")
                            continue
                        fan[c] = k + 1
                    pn = self._node(p, self.mask[c])
                    if r is not None:
                        roots_of[pn] = r
                        self.expanded[pn] = True
                    else:
                        nxt.append(pn)
                else:
                    self.mask[pn] |= self.mask[c]
                if pn == c:
                    self.selfref.add(c)
                    continue
                if (c, pn, label) in seen:
                    continue
                seen.add((c, pn, label))
                par[c].append((pn, label, w))
                if pn in roots_of:
                    m = self.mask[c]
                    while m:
                        low = m & -m
                        count[low.bit_length() - 1] += 1
                        m ^= low
            frontier = nxt
            if frontier and min(count) > 2 * self.max_paths + 2:  # candidates _all_paths ranks
                self._truncate("max_paths")
                return
        self.complete = True

    # -- paths ------------------------------------------------------------------------------------
    def _distances(self, goals: Iterable[int]) -> list[int]:
        """Unit distance from every node up to the nearest goal node."""
        children: list[list[int]] = [[] for _ in self.nobj]
        for c, ps in enumerate(self.par):
            for p, _, _ in ps:
                children[p].append(c)
        dist = [_INF] * len(self.nobj)
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
        n_t = len(self.targets)
        if not self.nobj:
            return [() for _ in range(n_t)]
        rooted = self._distances(self.root_of)
        # Explored objects that no gc-visible object refers to: something outside Python holds them.
        orphans = [
            n
            for n in range(len(self.nobj))
            if self.expanded[n]
            and not self.par[n]
            and n not in self.root_of
            and n not in self.held_by_ignored
            and n not in self.selfref
        ]
        orphan_set = set(orphans)
        orphan_d = self._distances(orphans) if orphans else None
        # Gather more candidates than asked for, then keep the most readable: a parameter is better named
        # `model.0.weight` than by its place among an optimizer's state keys, fewer references or not.
        want = 2 * self.max_paths + 2
        out: list[tuple[HolderPath, ...]] = []
        for t in self.targets:
            tn = self.nid[id(t)]
            found: dict[str, HolderPath] = {}
            more = self._enumerate(tn, rooted, self.root_of.__contains__, found, "root", want)
            if len(found) < want and orphan_d is not None:
                more |= self._enumerate(tn, orphan_d, orphan_set.__contains__, found, "gc-orphan", want)
            if not found and self.complete and self.par[tn]:
                p = self._cycle_path(tn)
                if p is not None:
                    found[str(p)] = p
            ranked = sorted(found.values(), key=_readability)
            if more or len(ranked) > self.max_paths:
                self._truncate("max_paths")
            out.append(tuple(ranked[: self.max_paths]))
            if self._out_of_time():
                out.extend(() for _ in range(n_t - len(out)))
                break
        return out

    def _enumerate(
        self, tn: int, h: list[int], is_goal: Any, found: dict[str, HolderPath], kind: str, want: int
    ) -> bool:
        """Best-first (A*) enumeration of the shortest paths from target node ``tn`` up to goal nodes.

        Adds rendered paths to ``found`` (deduplicated by text); returns whether more than ``want``
        paths existed.
        """
        if h[tn] >= _INF:
            return False
        seq = itertools.count()
        # state: (f, g, seq, node, link); link = (node, label, weight, prev link) from the target upward
        heap: list[tuple[int, int, int, int, Any]] = [(h[tn], 0, next(seq), tn, (tn, None, 0, None))]
        pops: dict[int, int] = {}
        budget = _POP_BUDGET
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
                for p in self._render_all(link, g, kind, want + 1):
                    if str(p) not in found:
                        if len(found) >= want:
                            return True
                        found[str(p)] = p
                if n != tn:
                    continue
            for pn, label, w in self.par[n]:
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
                heapq.heappush(heap, (g + w + h[pn], g + w, next(seq), pn, (pn, label, w, link)))
        return False

    def _cycle_path(self, tn: int) -> HolderPath | None:
        """A path from a node on an unreachable reference cycle down to the target."""
        link: Any = (tn, None, 0, None)
        seen = {tn}
        n = tn
        for _ in range(10_000):
            ps = self.par[n]
            nxt = next(
                ((p, lab, w) for p, lab, w in ps if p not in self.held_by_ignored), ps[0] if ps else None
            )
            if nxt is None:
                # a node that refers only to itself closes the cycle
                return (
                    next(iter(self._render_all(link, _link_depth(link), "cycle", 1)), None)
                    if n in self.selfref
                    else None
                )
            p, lab, w = nxt
            link = (p, lab, w, link)
            if p in seen:
                # start the path at the first (lowest) occurrence of the node that closes the cycle
                ln = link[3]
                while ln[0] != p:
                    ln = ln[3]
                return next(iter(self._render_all(ln, _link_depth(ln), "cycle", 1)), None)
            seen.add(p)
            n = p
        return None

    # -- rendering --------------------------------------------------------------------------------
    def _render_all(self, link: Any, depth: int, kind: str, limit: int) -> list[HolderPath]:
        """The path ``link`` rendered once per way of naming it (an object under two keys: two paths)."""
        out: list[HolderPath] = []
        choices: list[int] = []
        while len(out) < limit:
            self._choices, self._counts, self._cursor = choices, [], 0
            p = self._render(link, depth, kind)
            if p is not None:
                out.append(p)
            counts = self._counts
            nxt = choices + [0] * (len(counts) - len(choices))
            j = len(counts) - 1
            while j >= 0:  # next combination, odometer-style
                nxt[j] += 1
                if nxt[j] < counts[j]:
                    break
                nxt[j] = 0
                j -= 1
            if j < 0:
                break
            choices = nxt
        return out

    def _render(self, link: Any, depth: int, kind: str) -> HolderPath | None:
        nodes: list[int] = []
        labels: list[str | None] = []
        ln = link
        while ln is not None:
            nodes.append(ln[0])
            labels.append(ln[1])
            ln = ln[3]
        # nodes[0] is the top (root), nodes[-1] the target; labels[i] labels the edge nodes[i] -> nodes[i+1]
        objs = [self.nobj[n] for n in nodes]
        chain: list[tuple[Any, Any, str | None]] = [
            (objs[i], objs[i + 1], labels[i]) for i in range(len(objs) - 1)
        ]
        try:
            if kind == "root":
                root = self.root_of[nodes[0]]
                root_kind, steps, i = self._root_steps(root, chain)
            elif kind == "gc-orphan":
                root_kind, steps, i = "gc-orphan", [f"<{_tname(objs[0])} held outside Python>"], 0
            else:
                root_kind, steps, i = "cycle", [f"<reference cycle through {_tname(objs[0])}>"], 0
            while i < len(chain):
                frag, used = self._step(chain, i)
                if frag:
                    steps.append(frag)
                i += max(used, 1)
        except Exception as e:  # a holder changed under the search, or an object refused inspection
            _log.debug("holders(): could not render a path: %r", e)
            return None
        return HolderPath(root_kind, tuple(steps), depth)

    def _root_steps(
        self, root: _Root, chain: list[tuple[Any, Any, str | None]]
    ) -> tuple[str, list[str], int]:
        if not root.container:
            return root.kind, [root.label], 0
        if not chain:
            return root.kind, [root.label], 0
        ns, child, _ = chain[0]
        key = self._key_in_dict(ns, child)
        if key is _MISSING:
            return root.kind, [root.label, " -> ?"], 1
        if root.kind in ("frame", "thread"):
            return root.kind, [root.label, f", local {key!r}"], 1
        if root.label == "sys" and key in _SYS_LAST:
            return _SYS_LAST[key], [f"sys.{key}"], 1
        if root.ipython and isinstance(key, str):
            if key in ("Out", "_oh"):
                return "ipython", ["Out"], 1
            if key in ("_", "__", "___") or _IPY_HIST.match(key):
                return "ipython", [key], 1
        return root.kind, [root.label, _attr(key)], 1

    def _step(self, chain: list[tuple[Any, Any, str | None]], i: int) -> tuple[str, int]:
        p, c, vlabel = chain[i]
        if vlabel is not None:
            return vlabel, 1
        nxt = chain[i + 1][1] if i + 1 < len(chain) and chain[i + 1][2] is None else _MISSING
        nxt2 = chain[i + 2][1] if i + 2 < len(chain) and chain[i + 2][2] is None else _MISSING

        if isinstance(p, types.FrameType):
            return self._frame_step(p, c, nxt, "")
        if isinstance(p, types.TracebackType):
            if c is p.tb_next:
                return "", 1
            if c is p.tb_frame:
                return f" -> frame {_frame_desc(p.tb_frame, p.tb_lineno)}", 1
        if isinstance(p, (types.GeneratorType, types.CoroutineType, types.AsyncGeneratorType)):
            fr = getattr(p, "gi_frame", None) or getattr(p, "cr_frame", None) or getattr(p, "ag_frame", None)
            if fr is not None:
                return self._frame_step(fr, c, nxt, f" -> suspended {type(p).__name__} {_frame_desc(fr)}")
        if isinstance(p, types.FunctionType):
            code = p.__code__
            if c is p.__closure__ and nxt is not _MISSING:
                j = self._index_of(c, nxt)
                name = code.co_freevars[j] if 0 <= j < len(code.co_freevars) else str(j)
                if nxt2 is not _MISSING and isinstance(nxt, types.CellType):
                    return f" -> closure {name!r}", 3
                return f" -> closure cell {name!r}", 2
            if c is p.__defaults__ and nxt is not _MISSING:
                j = self._index_of(c, nxt)
                params = code.co_varnames[: code.co_argcount]
                k = len(params) - len(p.__defaults__) + j
                name = params[k] if 0 <= k < len(params) else str(j)
                return f" -> default of {name!r}", 2
            if c is p.__kwdefaults__ and nxt is not _MISSING:
                key = self._key_in_dict(c, nxt)
                return f" -> default of {key!r}", 2
        if isinstance(p, types.MethodType):
            if c is p.__self__:
                return ".__self__", 1
            if c is p.__func__:
                return ".__func__", 1
        if isinstance(p, functools.partial):
            if c is p.func:
                return ".func", 1
            if c is p.args and nxt is not _MISSING:
                return f".args[{self._index_of(c, nxt)}]", 2
            if c is p.keywords and nxt is not _MISSING:
                return f".keywords[{self._key_in_dict(c, nxt)!r}]", 2
        if isinstance(p, types.CellType):
            return " -> cell", 1
        if isinstance(p, type):
            if isinstance(c, dict) and nxt is not _MISSING:
                key = self._key_in_dict(c, nxt)
                if key is not _MISSING:
                    return _attr(key), 2
            return f" -> <{_tname(c)}>", 1
        if isinstance(p, types.ModuleType) and c is getattr(p, "__dict__", None) and nxt is not _MISSING:
            return _attr(self._key_in_dict(c, nxt)), 2
        if isinstance(p, BaseException):
            if c is p.__traceback__:
                return ".__traceback__", 1
            if c is p.__context__:
                return ".__context__", 1
            if c is p.__cause__:
                return ".__cause__", 1
            if c is p.args and nxt is not _MISSING:
                return f".args[{self._index_of(c, nxt)}]", 2
        if isinstance(p, dict):
            key = self._key_in_dict(p, c)
            if key is not _MISSING:
                return f"[{self._render_key(key)}]", 1
            if any(k is c for k in dict.keys(p)):
                return f" key {self._render_key(c)}", 1
        elif isinstance(p, (list, tuple, deque)):
            j = self._index_of(p, c)
            if j >= 0:
                return f"[{j}]", 1
        elif isinstance(p, (set, frozenset)) and any(x is c for x in p):
            return " (set member)", 1
        return self._attr_step(p, c, nxt, nxt2)

    def _attr_step(self, p: Any, c: Any, nxt: Any, nxt2: Any) -> tuple[str, int]:
        try:
            d = object.__getattribute__(p, "__dict__")
        except Exception:
            d = None
        used = 1
        key: Any = _MISSING
        if isinstance(d, dict):
            if d is c and nxt is not _MISSING:
                key = self._key_in_dict(d, nxt)
                if key is not _MISSING:
                    used, c, nxt = 2, nxt, nxt2
            else:
                key = self._key_in_dict(d, c)
        if key is _MISSING:
            name = _slot_of(p, c)
            if name is None:
                return f" -> <{_tname(c)}>", 1
            key = name
        if (
            isinstance(p, torch.nn.Module)
            and key in ("_parameters", "_buffers", "_modules")
            and isinstance(c, dict)
            and nxt is not _MISSING
        ):
            sub = self._key_in_dict(c, nxt)
            if sub is not _MISSING:
                return f".{sub}", used + 1
        return _attr(key), used

    def _frame_step(self, f: types.FrameType, c: Any, nxt: Any, prefix: str) -> tuple[str, int]:
        loc = self._frame_locals(f)
        if loc is c and nxt is not _MISSING:
            key = self._key_in_dict(c, nxt)
            if key is not _MISSING:
                return f"{prefix}, local {key!r}", 2
        key = self._key_in_dict(loc, c) if loc is not None else _MISSING
        if key is not _MISSING:
            return f"{prefix}, local {key!r}", 1
        if isinstance(c, types.CellType) and loc is not None:
            try:
                contents = c.cell_contents
            except ValueError:
                contents = _MISSING
            code = f.f_code
            for name in (*code.co_cellvars, *code.co_freevars):
                if name in loc and loc[name] is contents:
                    return (
                        (f"{prefix}, local {name!r}", 2)
                        if nxt is not _MISSING
                        else (f"{prefix}, cell {name!r}", 1)
                    )
        if isinstance(c, types.FrameType) and c is f.f_back:
            return f"{prefix} -> caller frame {_frame_desc(c)}", 1
        return f"{prefix} -> <{_tname(c)}>", 1

    def _frame_locals(self, f: types.FrameType) -> Any:
        try:
            loc = f.f_locals
        except Exception:
            return None
        if f.f_code.co_flags & _CO_OPTIMIZED and type(loc) is dict and id(loc) not in self.snap_ids:
            self.snap_ids.add(id(loc))
            self.snaps.append((f, loc))
        return loc

    def _pick(self, options: list[Any]) -> Any:
        """One of several equally valid names for a reference (the same object under several keys).

        :meth:`_render_all` renders a path once per combination of choices.
        """
        i = self._cursor
        self._cursor += 1
        if i >= len(self._counts):
            self._counts.append(min(len(options), _ALTERNATIVES))
        c = self._choices[i] if i < len(self._choices) else 0
        return options[c] if c < len(options) else options[0]

    def _key_in_dict(self, d: Any, child: Any) -> Any:
        """A key under which ``child`` is a value of mapping ``d`` (``_MISSING`` when it is not)."""
        keys: list[Any]
        if isinstance(d, dict):
            if len(d) > 64:
                cache = self.key_cache.get(id(d))
                if cache is None:
                    cache = {}
                    for k, v in dict.items(d):
                        cache.setdefault(id(v), []).append(k)
                    self.key_cache[id(d)] = cache
                keys = [k for k in cache.get(id(child), ()) if dict.get(d, k, _MISSING) is child]
            else:
                keys = [k for k, v in dict.items(d) if v is child]
        else:
            try:
                keys = [k for k, v in list(d.items()) if v is child]
            except Exception:
                return _MISSING
        return self._pick(keys) if keys else _MISSING

    def _index_of(self, seq: Any, child: Any) -> int:
        """An index of ``child`` in sequence ``seq`` by identity (-1 when absent)."""
        found: list[int]
        if len(seq) > 64:
            cache = self.key_cache.get(id(seq))
            if cache is None:
                cache = {}
                for i, v in enumerate(seq):
                    cache.setdefault(id(v), []).append(i)
                self.key_cache[id(seq)] = cache
            found = [i for i in cache.get(id(child), ()) if i < len(seq) and seq[i] is child]
        else:
            found = [i for i, v in enumerate(seq) if v is child]
        return int(self._pick(found)) if found else -1

    def _render_key(self, k: Any) -> str:
        if isinstance(k, torch.Tensor):
            return self._tensor_label(k)
        if isinstance(k, (str, bytes, int, float, complex, bool, type(None))) or (
            isinstance(k, tuple) and len(k) <= 8
        ):
            r = repr(k)
            return r if len(r) <= 60 else r[:57] + "..."
        return f"<{_tname(k)}>"

    def _tensor_label(self, t: torch.Tensor) -> str:
        kind = "Parameter" if isinstance(t, torch.nn.Parameter) else type(t).__name__
        name = self._names().get(id(t))
        shape = str(tuple(t.shape))
        dtype = str(t.dtype).replace("torch.", "")
        return f"<{kind} {name!r} {shape} {dtype}>" if name else f"<{kind} {shape} {dtype}>"

    def _names(self) -> dict[int, str]:
        """Parameter and buffer names (``fc1.weight``) relative to each top-level module."""
        if self.param_names is not None:
            return self.param_names
        names: dict[int, str] = {}
        mods = self.modules
        if mods is None:
            mods = self._instances(_subclasses(torch.nn.Module))
        children: set[int] = set()
        for m in mods:
            sub = m.__dict__.get("_modules") or {}
            children.update(id(x) for x in sub.values() if x is not None)
        for m in mods:
            if id(m) in children:
                continue
            try:
                for name, p in m.named_parameters(remove_duplicate=False):
                    names.setdefault(id(p), name)
                for name, b in m.named_buffers(remove_duplicate=False):
                    names.setdefault(id(b), name)
            except Exception:  # a module that refuses to be walked keeps its tensors unnamed
                continue
        self.param_names = names
        return names


def _readability(p: HolderPath) -> tuple[bool, int, int]:
    """Sort key: rooted paths first, then fewer steps to read (a hop ``->`` or key membership counts two)."""
    steps = len(p.steps) + sum(s.count(" -> ") + s.startswith(" key ") for s in p.steps)
    return (p.root in ("gc-orphan", "cycle"), steps, p.depth)


def _link_depth(link: Any) -> int:
    depth = 0
    while link is not None:
        depth += link[2]
        link = link[3]
    return depth


def _tname(o: Any) -> str:
    return type(o).__qualname__


def _attr(key: Any) -> str:
    if isinstance(key, str) and key.isidentifier():
        return f".{key}"
    if key is _MISSING:
        return " -> ?"
    return f".__dict__[{key!r}]"


def _slot_of(p: Any, c: Any) -> str | None:
    for cls in type(p).__mro__:
        slots = cls.__dict__.get("__slots__")
        if slots is None:
            continue
        for name in (slots,) if isinstance(slots, str) else slots:
            mangled = (
                f"_{cls.__name__.lstrip('_')}{name}"
                if name.startswith("__") and not name.endswith("__")
                else name
            )
            descr = cls.__dict__.get(mangled)
            if descr is None or not hasattr(descr, "__get__"):
                continue
            try:
                if descr.__get__(p, type(p)) is c:
                    return str(name)
            except Exception:
                continue
    return None
