"""Where holder paths start: the namespaces and objects a person knows by name.

:class:`RootSet` collects, once per search: every module's globals (``sys.modules``), IPython's user
namespace, the locals of every live frame of every thread (``train.py:42 in step()``; other threads as
``thread 'loader': ...``), the exception being handled in each thread; classes are roots wherever the search
meets one (:func:`class_root`). ``sys.last_traceback``/``last_value``/``last_exc`` and IPython's output
history (``Out``, ``_``, ``_7``) are globals of ``sys`` and of the user namespace, named as such when a path
is rendered.

Reading a function frame's ``f_locals`` (CPython <= 3.12) leaves a snapshot dict on the frame that keeps its
locals alive; :class:`FrameSnapshots` records the snapshots the search made and empties them afterwards when
nobody else holds them and no Python-level tracer could write them back (:func:`tracing_may_rewrite_locals`).
Frames that run ``torchmem`` code and frames the caller excluded are not roots: their locals are the
search's own. Neither are torch's frames on the searching thread: the call path that reached torchmem (a
module call whose hook ended a step) holds its arguments, which the program's frame above names.
Cost: one pass over ``sys.modules`` and the frame stacks, microseconds per frame.
"""

from __future__ import annotations

import functools
import os
import re
import sys
import threading
import types
from collections.abc import Iterable
from typing import Any

from torchmem._gc import items_now, values_now

CO_OPTIMIZED = 0x0001  # a function frame: f_locals is a snapshot (<= 3.12) or a proxy (3.13+)
# A generator's, coroutine's or async generator's code. Before Python 3.11 the frame of one is an object of
# its own that its generator refers to: an executing one is a link of a path (a generator that iterates the
# program's generator: `torchmem.watch(gen)`), as the generator itself is from 3.11 on.
_GENERATOR_CODE = 0x0020 | 0x0080 | 0x0200
_FRAME_OBJECTS = sys.version_info < (3, 11)
SYS_LAST = {"last_traceback": "traceback", "last_value": "exception", "last_exc": "exception"}
IPYTHON_HISTORY = re.compile(r"_\d+\Z")  # _7: IPython's output of cell 7


class Root:
    """A root: what kind it is, its label, and whether references out of it are namespace keys."""

    __slots__ = ("container", "ipython", "kind", "label", "name")

    def __init__(self, kind: str, label: str, container: bool, ipython: bool = False, name: str = "") -> None:
        self.kind = kind  # module | frame | thread | exception | class
        self.label = label  # as the path shows it
        self.name = name or label  # what a person calls it: the module name, a class's qualified name
        self.container = container  # edges from it are keys (a namespace dict), not attributes
        self.ipython = ipython


def frame_description(f: types.FrameType, lineno: int | None = None) -> str:
    """``train.py:42 in step()``."""
    code = f.f_code
    line = f.f_lineno if lineno is None else lineno
    return f"{os.path.basename(code.co_filename)}:{line} in {code.co_name}()"


def is_ipython_namespace(d: dict[str, Any]) -> bool:
    return isinstance(d.get("Out"), dict) and ("_oh" in d or "In" in d or "get_ipython" in d)


def class_root(obj: Any) -> Root | None:
    """A class met by the search is a root, named by its module and qualified name."""
    if isinstance(obj, type):
        return Root("class", f"{obj.__module__}.{obj.__qualname__}", False, name=obj.__qualname__)
    return None


def tracing_may_rewrite_locals(frames: Iterable[types.FrameType]) -> bool:
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


class FrameSnapshots:
    """The ``f_locals`` snapshot dicts the search made, so that it can empty them when it is done."""

    __slots__ = ("ids", "made")

    def __init__(self) -> None:
        self.made: list[tuple[types.FrameType, dict[str, Any]]] = []
        self.ids: set[int] = set()

    def note(self, f: types.FrameType, locals_: Any) -> None:
        """Record ``locals_`` (just read from ``f.f_locals``) if it is a function frame's snapshot dict."""
        if f.f_code.co_flags & CO_OPTIMIZED and type(locals_) is dict and id(locals_) not in self.ids:
            self.ids.add(id(locals_))
            self.made.append((f, locals_))

    def read(self, f: types.FrameType) -> Any:
        """``f.f_locals`` (recorded when it is a snapshot), or ``None`` when the frame refuses."""
        try:
            loc = f.f_locals
        except Exception:
            return None
        self.note(f, loc)
        return loc

    def read_dict(self, f: types.FrameType) -> dict[str, Any] | None:
        """``f.f_locals`` as a dict: the snapshot itself (<= 3.12, recorded as :meth:`read` does) or a copy
        of a PEP 667 proxy (3.13+, whose only referent is the frame); ``None`` when the frame refuses."""
        loc = self.read(f)
        if loc is None or type(loc) is dict:
            return loc
        try:
            return dict(loc)
        except Exception:
            return None

    def release(self) -> None:
        """Empty the snapshots nobody else holds, where no Python-level tracer could write them back."""
        made, self.made = self.made, []
        try:
            if made and not tracing_may_rewrite_locals(f for f, _ in made):
                _clear_snapshots(made)
        finally:
            made.clear()


def _clear_snapshots(made: list[tuple[types.FrameType, dict[str, Any]]]) -> None:
    # Reading f_locals of a function frame (CPython <= 3.12) stores a snapshot dict on the frame that
    # keeps every local alive until the frame ends, even after the code deletes it. Empty the ones
    # nobody else holds (refs: the frame, `d`, getrefcount's argument); the next read refills them.
    while made:
        f, d = made.pop()
        del f
        if sys.getrefcount(d) <= 3:
            d.clear()
        del d


class RootSet:
    """The roots of one search, by the id of the namespace dict or object that is the root.

    ``ignore`` is the search's set of ids that are never holders: the frames walked, the locals of
    ``torchmem``'s own frames and the containers made here are added to it. ``keep`` holds the frames and
    namespaces whose ids are used while the search runs, so that the ids stay valid.
    """

    __slots__ = ("_namespaces", "by_id", "exclude_frames", "ignore", "keep", "snapshots")

    def __init__(self, ignore: set[int], exclude_frames: set[int], snapshots: FrameSnapshots) -> None:
        self.by_id: dict[int, Root] = {}
        self.keep: list[Any] = []
        self.ignore = ignore
        self.exclude_frames = exclude_frames
        self.snapshots = snapshots
        self._namespaces: dict[int, Any] | None = None  # id -> namespace dict, built on first use
        for own in (self, self.by_id, self.keep, snapshots, snapshots.made, snapshots.ids):
            ignore.add(id(own))

    def get(self, obj: Any) -> Root | None:
        return self.by_id.get(id(obj))

    def clear(self) -> None:
        self.by_id = {}
        self.keep = []
        self._namespaces = None

    def collect(self) -> None:
        """Find every root: module globals, IPython's namespace, live frames, exceptions being handled."""
        roots = self.by_id
        for name, mod in items_now(sys.modules):
            if isinstance(mod, types.ModuleType):
                try:
                    d = mod.__dict__
                except Exception:  # pragma: no cover - exotic lazy modules
                    continue
                if id(d) not in roots:
                    roots[id(d)] = Root("module", name, True, is_ipython_namespace(d))
        ipy = sys.modules.get("IPython")
        if ipy is not None:
            try:
                shell = ipy.get_ipython()
                ns = shell.user_ns if shell is not None else None
            except Exception:
                ns = None
            if isinstance(ns, dict) and id(ns) not in roots:
                roots[id(ns)] = Root("module", "__main__", True, is_ipython_namespace(ns))
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
            roots.setdefault(id(exc), Root("exception", "sys.exc_info()[1]", False))
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
                    roots.setdefault(id(e), Root("exception", label, False))
                    self.keep.append(e)
            others.clear()

    def _add_frame(self, f: types.FrameType, mine: bool, thread: str) -> None:
        code = f.f_code
        if not (_FRAME_OBJECTS and code.co_flags & _GENERATOR_CODE):
            self.ignore.add(id(f))
        self.keep.append(f)
        g = f.f_globals
        mod = str(g.get("__name__", ""))
        # torch's own frames on this thread are the plumbing that called us (a module call whose hook fired a
        # step boundary: its `args`, `result`): the program's frame above names the same objects.
        plumbing = mine and (mod == "torch" or mod.startswith("torch."))
        own = id(f) in self.exclude_frames or mod == "torchmem" or mod.startswith("torchmem.") or plumbing
        if id(g) not in self.by_id:
            self.by_id[id(g)] = Root(
                "module", str(g.get("__name__", "<globals>")), True, is_ipython_namespace(g)
            )
        loc: Any = f.f_locals
        if code.co_flags & CO_OPTIMIZED:
            if type(loc) is dict:
                self.snapshots.note(f, loc)
            else:  # PEP 667 proxy (3.13+): copy what it shows
                loc = dict(loc)
        elif loc is g:
            return
        elif not isinstance(loc, dict):
            loc = dict(loc)
        self.keep.append(loc)
        if own:
            self.ignore.add(id(loc))
        elif id(loc) not in self.by_id:
            desc = frame_description(f)
            kind = "frame" if mine else "thread"
            self.by_id[id(loc)] = Root(kind, desc if mine else f"thread '{thread}': {desc}", True)

    def namespace(self, root_id: int) -> dict[str, Any] | None:
        """The namespace dict whose id is ``root_id`` (held in ``keep``, or a module's ``__dict__``).

        One map of every namespace, built at the first call (a search asks for each of thousands of
        modules' namespaces when the heap was frozen with ``gc.freeze()``: one scan each was O(n²))."""
        found = self._namespaces
        if found is None:
            found = {}
            for m in values_now(sys.modules):
                d = getattr(m, "__dict__", None)
                if isinstance(d, dict):
                    found[id(d)] = d
            for d in self.keep:
                if isinstance(d, dict):
                    found[id(d)] = d
            self._namespaces = found
            self.ignore.add(id(found))
        return found.get(root_id)
