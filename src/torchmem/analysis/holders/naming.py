"""Turning a chain of references into the steps of a holder path a person reads.

The search finds a chain of objects from a root down to the target (``namespace dict -> list -> tensor``);
:class:`PathNamer` names each reference by looking at the two objects (and the next one or two, to fold a
``__dict__``, a closure tuple or a module's ``_parameters`` into one step): ``.cache``, ``['k3']``, ``[17]``,
`` -> closure 'acts'``, ``, local 'batch'``, `` -> frame train.py:42 in step()``. Each step gets its
:class:`~torchmem.results.holders.StepKind` here, where the objects are known, so that nobody needs to parse
the text back: an item of a dict reached through an attribute named ``*_hooks`` is a ``hook`` entry, the
references of a ``weakref.finalize`` entry are ``weakref`` steps, and so on.

A reference can have several equally valid names (one tensor under two keys of a dict): the namer picks one
per choice point and :meth:`PathNamer.render_all` renders the path once per combination (at most
:data:`ALTERNATIVES` per choice). Dict keys are shown as their ``repr`` (60 characters at most), tensors as
``<Parameter 'fc1.weight' (4096, 1024) float32>``, parameter and buffer names being looked up once per
search from every top-level ``nn.Module``. Cost: proportional to the path length, plus one scan of a
container over 64 entries (cached) per lookup in it.
"""

from __future__ import annotations

import functools
import gc
import logging
import re
import types
import weakref
from collections import deque
from typing import Any

import torch

from torchmem._gc import items_now, values_now
from torchmem.analysis.holders.autograd import subclasses
from torchmem.analysis.holders.index import HeapIndex
from torchmem.analysis.holders.roots import IPYTHON_HISTORY, SYS_LAST, FrameSnapshots, Root, frame_description
from torchmem.results.holders import HolderPath, HolderStep, StepKind

_log = logging.getLogger("torchmem")

ALTERNATIVES = 8  # most names tried for one reference (an object under several keys of one dict)
MISSING: Any = object()

# One reference of a path: (holder, held, the typed steps of a virtual edge or None for a gc-visible one).
Link = tuple[Any, Any, "tuple[HolderStep, ...] | None"]

_AUTOGRAD_STEPS = (StepKind.GRAD_FN, StepKind.AUTOGRAD_EDGE, StepKind.SAVED_TENSOR)

_WEAKREF_HOLDERS: tuple[type, ...] = (weakref.ReferenceType, weakref.finalize, weakref.finalize._Info)  # type: ignore[attr-defined]


def type_name(o: Any) -> str:
    return type(o).__qualname__


_FRAME_LABEL = re.compile(r"(?P<file>.*):\d+ in (?P<func>.*)\(\)\Z", re.S)


def live_frame_name(label: str) -> str:
    """How a path names a live frame whose local holds the object: its function and file, never the line the
    frame is at now (that says where the program waits — the ``optimizer.step()`` that ended a step — not
    what holds the object). ``thread '...':`` stays in front of another thread's frame.

    Example:
        >>> live_frame_name("train.py:39 in main()"), live_frame_name("thread 'loader': w.py:8 in run()")
        ('main() in train.py', "thread 'loader': run() in w.py")
    """
    prefix, sep, desc = label.rpartition(": ") if label.startswith("thread '") else ("", "", label)
    m = _FRAME_LABEL.match(desc)
    if m is None:
        return label
    return f"{prefix}{sep}{m['func']}() in {m['file']}"


def _attribute_text(key: Any) -> str:
    if isinstance(key, str) and key.isidentifier():
        return f".{key}"
    if key is MISSING:
        return " -> ?"
    return f".__dict__[{key!r}]"


# Methods of an object that empty what it collects, or use it (a metric's ``compute``).
_LIFECYCLE = ("reset", "clear", "compute")
_lifecycle_of: dict[type, str] = {}


def lifecycle_methods(obj: Any) -> str:
    """Which of ``reset``, ``clear``, ``compute`` the class of ``obj`` defines as plain functions (through
    its MRO, never ``object``'s or a builtin container's), comma-separated; read from the classes' dicts, so
    nothing of the object runs."""
    t = type(obj)
    got = _lifecycle_of.get(t)
    if got is None:
        names = []
        for name in _LIFECYCLE:
            for k in t.__mro__:
                if getattr(k, "__module__", "") == "builtins" or name not in k.__dict__:
                    continue
                fn = k.__dict__[name]  # the first class that defines it decides (``reset = None`` hides it)
                if isinstance(getattr(fn, "__func__", fn), types.FunctionType):
                    names.append(name)
                break
        got = _lifecycle_of[t] = ",".join(names)
    return got


def _named(kind: StepKind, key: Any, holder: Any) -> HolderStep:
    """An attribute-like step (attribute, module global, class attribute) for ``key``; `` -> ?`` unnamed."""
    if key is MISSING:
        return HolderStep(StepKind.OTHER, " -> ?", "", type_name(holder))
    methods = lifecycle_methods(holder) if kind is StepKind.ATTRIBUTE else ""
    return HolderStep(
        kind, _attribute_text(key), key if isinstance(key, str) else repr(key), type_name(holder), "", methods
    )


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


class PathNamer:
    """Names the references of the paths of one search (caches container lookups and parameter names)."""

    def __init__(self, index: HeapIndex, snapshots: FrameSnapshots) -> None:
        self.index = index
        self.snapshots = snapshots
        self.positions_cache: dict[int, dict[int, list[Any]]] = {}  # id(container) -> id(value) -> keys
        self.parameter_names: dict[int, str] | None = None
        self._choices: list[int] = []
        self._counts: list[int] = []
        self._cursor = 0

    # -- whole paths ------------------------------------------------------------------------------
    def render_all(
        self,
        objects: list[Any],
        virtual: list[tuple[HolderStep, ...] | None],
        start: Root | str,
        depth: int,
        limit: int,
    ) -> list[HolderPath]:
        """The path through ``objects`` (root first) rendered once per way of naming it, at most ``limit``.

        ``virtual[i]`` names the reference ``objects[i] -> objects[i + 1]`` when the garbage collector cannot
        see it. ``start`` is the root, or ``"gc-orphan"``/``"cycle"`` for a path from an unrooted object.
        """
        chain: list[Link] = [(objects[i], objects[i + 1], virtual[i]) for i in range(len(objects) - 1)]
        out: list[HolderPath] = []
        choices: list[int] = []
        while len(out) < limit:
            self._choices, self._counts, self._cursor = choices, [], 0
            p = self._render(objects[0], chain, start, depth)
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

    def _render(self, top: Any, chain: list[Link], start: Root | str, depth: int) -> HolderPath | None:
        try:
            if isinstance(start, Root):
                root_kind, steps, i = self._root_steps(start, chain)
            elif start == "gc-orphan":
                t = type_name(top)
                root_kind, steps, i = (
                    "gc-orphan",
                    [HolderStep(StepKind.ROOT, f"<{t} held outside Python>", t)],
                    0,
                )
            else:
                owner = _instance_of_dict(top) if type(top) is dict else None
                if owner is not None:
                    # the cycle was entered at an instance's __dict__ (a separate object before Python
                    # 3.11): it starts at the instance, as `<reference cycle through Node>.t`
                    top, chain = owner, [(owner, top, None), *chain]
                root_kind, steps, i = "cycle", [self._cycle_root(top, chain)], 0
            while i < len(chain):
                more, used = self._step(chain, i, steps[-1] if steps else None)
                steps.extend(s for s in more if s.text)
                i += max(used, 1)
            if start == "cycle" and chain and chain[-1][1] is top:
                # the loop closes on the object it started from (x.grad's graph saved x itself)
                what = "tensor" if isinstance(top, torch.Tensor) else "object"
                steps.append(HolderStep(StepKind.OTHER, f" -> the same {what}", "", type_name(top)))
        except Exception as e:  # a holder changed under the search, or an object refused inspection
            _log.debug("holders(): could not render a path: %r", e)
            return None
        return HolderPath.of(root_kind, steps, depth)

    def _cycle_root(self, top: Any, chain: list[Link]) -> HolderStep:
        """``<reference cycle through Node>``; a cycle through autograd's graph (a tensor's ``.grad``, saved
        tensors, graph leaves: references gc cannot see) names the tensor it starts from:
        ``<reference cycle through autograd: Parameter 'fc.weight' (4, 4) float32>``."""
        t = type_name(top)
        autograd = any(
            v is not None
            and any(
                s.kind in _AUTOGRAD_STEPS or (s.kind is StepKind.ATTRIBUTE and s.name in ("grad", "_base"))
                for s in v
            )
            for _, _, v in chain
        )
        if autograd and isinstance(top, torch.Tensor):
            return HolderStep(
                StepKind.ROOT, f"<reference cycle through autograd: {self._tensor_label(top)[1:-1]}>", t
            )
        return HolderStep(StepKind.ROOT, f"<reference cycle through {t}>", t)

    def _root_steps(self, root: Root, chain: list[Link]) -> tuple[str, list[HolderStep], int]:
        first = HolderStep(StepKind.ROOT, root.label, root.name)
        if not root.container or not chain:
            return root.kind, [first], 0
        ns, child, _ = chain[0]
        key = self.key_in_dict(ns, child)
        if key is MISSING:
            return root.kind, [first, HolderStep(StepKind.OTHER, " -> ?", "", type_name(ns))], 1
        if root.kind in ("frame", "thread"):
            name = live_frame_name(root.label)
            local = HolderStep(StepKind.FRAME_LOCAL, f", local {key!r}", str(key), "frame")
            return root.kind, [HolderStep(StepKind.ROOT, name, name), local], 1
        if root.label == "sys" and key in SYS_LAST:
            return SYS_LAST[key], [HolderStep(StepKind.ROOT, f"sys.{key}", f"sys.{key}")], 1
        if root.ipython and isinstance(key, str):
            if key in ("Out", "_oh"):
                return "ipython", [HolderStep(StepKind.ROOT, "Out", "Out")], 1
            if key in ("_", "__", "___") or IPYTHON_HISTORY.match(key):
                return "ipython", [HolderStep(StepKind.ROOT, key, key)], 1
        return root.kind, [first, _named(StepKind.MODULE_GLOBAL, key, ns)], 1

    # -- one reference ----------------------------------------------------------------------------
    def _step(
        self, chain: list[Link], i: int, previous: HolderStep | None
    ) -> tuple[tuple[HolderStep, ...], int]:
        """The steps naming ``chain[i]`` and how many references of the chain they cover."""
        p, _, virtual = chain[i]
        if virtual is not None:
            return virtual, 1
        step, used = self._name(chain, i, previous)
        if step is not None and step.kind is not StepKind.WEAKREF and isinstance(p, _WEAKREF_HOLDERS):
            step = HolderStep(StepKind.WEAKREF, step.text, step.name, step.holder_type, step.key_type)
        return ((step,) if step is not None else ()), used

    def _name(self, chain: list[Link], i: int, previous: HolderStep | None) -> tuple[HolderStep | None, int]:
        p, c, _ = chain[i]
        nxt = chain[i + 1][1] if i + 1 < len(chain) and chain[i + 1][2] is None else MISSING
        nxt2 = chain[i + 2][1] if i + 2 < len(chain) and chain[i + 2][2] is None else MISSING
        holder = type_name(p)

        if isinstance(p, types.FrameType):
            return self._frame_step(p, c, nxt, "", "frame")
        if isinstance(p, types.TracebackType):
            if c is p.tb_next:
                return None, 1
            if c is p.tb_frame:
                desc = frame_description(p.tb_frame, p.tb_lineno)
                return HolderStep(StepKind.TRACEBACK, f" -> frame {desc}", desc, holder), 1
        if isinstance(p, (types.GeneratorType, types.CoroutineType, types.AsyncGeneratorType)):
            fr = getattr(p, "gi_frame", None) or getattr(p, "cr_frame", None) or getattr(p, "ag_frame", None)
            if fr is not None:
                prefix = f" -> suspended {type(p).__name__} {frame_description(fr)}"
                if c is fr and nxt is not MISSING:  # through the frame object itself (Python 3.10)
                    step, used = self._frame_step(fr, nxt, nxt2, prefix, holder)
                    return step, used + 1
                return self._frame_step(fr, c, nxt, prefix, holder)
        if isinstance(p, types.FunctionType):
            code = p.__code__
            if c is p.__closure__ and nxt is not MISSING:
                j = self.index_of(c, nxt)
                name = code.co_freevars[j] if 0 <= j < len(code.co_freevars) else str(j)
                if nxt2 is not MISSING and isinstance(nxt, types.CellType):
                    return HolderStep(StepKind.CLOSURE_CELL, f" -> closure {name!r}", name, holder), 3
                return HolderStep(StepKind.CLOSURE_CELL, f" -> closure cell {name!r}", name, holder), 2
            if c is p.__defaults__ and nxt is not MISSING:
                j = self.index_of(c, nxt)
                params = code.co_varnames[: code.co_argcount]
                k = len(params) - len(p.__defaults__) + j
                name = params[k] if 0 <= k < len(params) else str(j)
                return HolderStep(StepKind.DEFAULT_ARGUMENT, f" -> default of {name!r}", name, holder), 2
            if c is p.__kwdefaults__ and nxt is not MISSING:
                key = self.key_in_dict(c, nxt)
                return HolderStep(StepKind.DEFAULT_ARGUMENT, f" -> default of {key!r}", str(key), holder), 2
        if isinstance(p, types.MethodType):
            if c is p.__self__:
                return HolderStep(StepKind.ATTRIBUTE, ".__self__", "__self__", holder), 1
            if c is p.__func__:
                return HolderStep(StepKind.ATTRIBUTE, ".__func__", "__func__", holder), 1
        if isinstance(p, functools.partial):
            if c is p.func:
                return HolderStep(StepKind.ATTRIBUTE, ".func", "func", holder), 1
            if c is p.args and nxt is not MISSING:
                j = self.index_of(c, nxt)
                return HolderStep(StepKind.ITEM, f".args[{j}]", str(j), holder, "int"), 2
            if c is p.keywords and nxt is not MISSING:
                key = self.key_in_dict(c, nxt)
                return HolderStep(StepKind.ITEM, f".keywords[{key!r}]", repr(key), holder, type_name(key)), 2
        if isinstance(p, types.CellType):
            return HolderStep(StepKind.CLOSURE_CELL, " -> cell", "", holder), 1
        if isinstance(p, type):
            if isinstance(c, dict) and nxt is not MISSING:
                key = self.key_in_dict(c, nxt)
                if key is not MISSING:
                    return _named(StepKind.CLASS_ATTRIBUTE, key, p), 2
            return HolderStep(StepKind.OTHER, f" -> <{type_name(c)}>", type_name(c), holder), 1
        if isinstance(p, types.ModuleType) and c is getattr(p, "__dict__", None) and nxt is not MISSING:
            return _named(StepKind.MODULE_GLOBAL, self.key_in_dict(c, nxt), p), 2
        if isinstance(p, BaseException):
            if c is p.__traceback__:
                return HolderStep(StepKind.TRACEBACK, ".__traceback__", "__traceback__", holder), 1
            if c is p.__context__:
                return HolderStep(StepKind.EXCEPTION_LINK, ".__context__", "__context__", holder), 1
            if c is p.__cause__:
                return HolderStep(StepKind.EXCEPTION_LINK, ".__cause__", "__cause__", holder), 1
            if c is p.args and nxt is not MISSING:
                j = self.index_of(c, nxt)
                return HolderStep(StepKind.ITEM, f".args[{j}]", str(j), holder, "int"), 2
        if isinstance(p, dict):
            key = self.key_in_dict(p, c)
            if key is not MISSING:
                shown = self.render_key(key)
                hook = (
                    previous is not None
                    and previous.name.endswith("_hooks")
                    and previous.kind
                    in (
                        StepKind.ATTRIBUTE,
                        StepKind.MODULE_GLOBAL,
                        StepKind.CLASS_ATTRIBUTE,
                    )
                )
                kind = StepKind.HOOK if hook else StepKind.ITEM
                return HolderStep(kind, f"[{shown}]", shown, holder, type_name(key)), 1
            if any(k is c for k in dict.keys(p)):
                shown = self.render_key(c)
                return HolderStep(StepKind.DICT_KEY, f" key {shown}", shown, holder, type_name(c)), 1
        elif isinstance(p, (list, tuple, deque)):
            j = self.index_of(p, c)
            if j >= 0:
                return HolderStep(StepKind.ITEM, f"[{j}]", str(j), holder, "int"), 1
        elif isinstance(p, (set, frozenset)) and any(x is c for x in p):
            return HolderStep(StepKind.SET_MEMBER, " (set member)", "", holder), 1
        return self._attribute_step(p, c, nxt, nxt2)

    def _attribute_step(self, p: Any, c: Any, nxt: Any, nxt2: Any) -> tuple[HolderStep, int]:
        try:
            d = object.__getattribute__(p, "__dict__")
        except Exception:
            d = None
        used = 1
        key: Any = MISSING
        if isinstance(d, dict):
            if d is c and nxt is not MISSING:
                key = self.key_in_dict(d, nxt)
                if key is not MISSING:
                    used, c, nxt = 2, nxt, nxt2
            else:
                key = self.key_in_dict(d, c)
        if key is MISSING:
            name = _slot_of(p, c)
            if name is None:
                return HolderStep(StepKind.OTHER, f" -> <{type_name(c)}>", type_name(c), type_name(p)), 1
            key = name
        if (
            isinstance(p, torch.nn.Module)
            and key in ("_parameters", "_buffers", "_modules")
            and isinstance(c, dict)
            and nxt is not MISSING
        ):
            sub = self.key_in_dict(c, nxt)
            if sub is not MISSING:
                return HolderStep(StepKind.ATTRIBUTE, f".{sub}", str(sub), type_name(p)), used + 1
        return _named(StepKind.ATTRIBUTE, key, p), used

    def _frame_step(
        self, f: types.FrameType, c: Any, nxt: Any, prefix: str, holder: str
    ) -> tuple[HolderStep, int]:
        loc = self.snapshots.read(f)
        if loc is c and nxt is not MISSING:
            key = self.key_in_dict(c, nxt)
            if key is not MISSING:
                return HolderStep(StepKind.FRAME_LOCAL, f"{prefix}, local {key!r}", str(key), holder), 2
        key = self.key_in_dict(loc, c) if loc is not None else MISSING
        if key is not MISSING:
            return HolderStep(StepKind.FRAME_LOCAL, f"{prefix}, local {key!r}", str(key), holder), 1
        if isinstance(c, types.CellType) and loc is not None:
            try:
                contents = c.cell_contents
            except ValueError:
                contents = MISSING
            code = f.f_code
            for name in (*code.co_cellvars, *code.co_freevars):
                if name in loc and loc[name] is contents:
                    if nxt is not MISSING:
                        return HolderStep(StepKind.FRAME_LOCAL, f"{prefix}, local {name!r}", name, holder), 2
                    return HolderStep(StepKind.FRAME_LOCAL, f"{prefix}, cell {name!r}", name, holder), 1
        if isinstance(c, types.FrameType) and c is f.f_back:
            desc = frame_description(c)
            return HolderStep(StepKind.OTHER, f"{prefix} -> caller frame {desc}", desc, holder), 1
        return HolderStep(StepKind.OTHER, f"{prefix} -> <{type_name(c)}>", type_name(c), holder), 1

    # -- keys and names ---------------------------------------------------------------------------
    def _pick(self, options: list[Any]) -> Any:
        """One of several equally valid names for a reference (the same object under several keys).

        :meth:`render_all` renders a path once per combination of choices.
        """
        i = self._cursor
        self._cursor += 1
        if i >= len(self._counts):
            self._counts.append(min(len(options), ALTERNATIVES))
        c = self._choices[i] if i < len(self._choices) else 0
        return options[c] if c < len(options) else options[0]

    def key_in_dict(self, d: Any, child: Any) -> Any:
        """A key under which ``child`` is a value of mapping ``d`` (``MISSING`` when it is not)."""
        keys: list[Any]
        if isinstance(d, dict):
            if len(d) > 64:
                cache = self.positions_cache.get(id(d))
                if cache is None:
                    cache = {}
                    # a copy: another thread, or a collection's finalizers, may change `d` meanwhile
                    for k, v in items_now(d):
                        cache.setdefault(id(v), []).append(k)
                    self.positions_cache[id(d)] = cache
                keys = [k for k in cache.get(id(child), ()) if dict.get(d, k, MISSING) is child]
            else:
                keys = [k for k, v in items_now(d) if v is child]
        else:
            try:
                keys = [k for k, v in list(d.items()) if v is child]
            except Exception:
                return MISSING
        return self._pick(keys) if keys else MISSING

    def index_of(self, seq: Any, child: Any) -> int:
        """An index of ``child`` in sequence ``seq`` by identity (-1 when absent)."""
        found: list[int]
        if len(seq) > 64:
            cache = self.positions_cache.get(id(seq))
            if cache is None:
                cache = {}
                for i, v in enumerate(seq):
                    cache.setdefault(id(v), []).append(i)
                self.positions_cache[id(seq)] = cache
            found = [i for i in cache.get(id(child), ()) if i < len(seq) and seq[i] is child]
        else:
            found = [i for i, v in enumerate(seq) if v is child]
        return int(self._pick(found)) if found else -1

    def render_key(self, k: Any) -> str:
        if isinstance(k, torch.Tensor):
            return self._tensor_label(k)
        if isinstance(k, (str, bytes, int, float, complex, bool, type(None))) or (
            isinstance(k, tuple) and len(k) <= 8
        ):
            r = repr(k)
            return r if len(r) <= 60 else r[:57] + "..."
        return f"<{type_name(k)}>"

    def _tensor_label(self, t: torch.Tensor) -> str:
        kind = "Parameter" if isinstance(t, torch.nn.Parameter) else type(t).__name__
        name = self._parameter_names().get(id(t))
        shape = str(tuple(t.shape))
        dtype = str(t.dtype).replace("torch.", "")
        return f"<{kind} {name!r} {shape} {dtype}>" if name else f"<{kind} {shape} {dtype}>"

    def _parameter_names(self) -> dict[int, str]:
        """Parameter and buffer names (``fc1.weight``) relative to each top-level module."""
        if self.parameter_names is not None:
            return self.parameter_names
        names: dict[int, str] = {}
        mods = self.index.instances(subclasses(torch.nn.Module))
        children: set[int] = set()
        for m in mods:
            sub = m.__dict__.get("_modules") or {}
            children.update(id(x) for x in values_now(sub) if x is not None)
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
        self.parameter_names = names
        return names

    def clear(self) -> None:
        self.positions_cache = {}
        self.parameter_names = None


def _instance_of_dict(d: dict[str, Any]) -> Any:
    """The instance whose ``__dict__`` is ``d`` (not a class or a module), ``None`` when there is none: one
    scan of ``d``'s referrers, made only for a cycle entered at a dict (before Python 3.11 an instance's
    attributes are a dict of their own)."""
    for obj in gc.get_referrers(d):
        if isinstance(obj, (type, types.ModuleType, dict, list, tuple, types.FrameType)):
            continue
        try:
            if object.__getattribute__(obj, "__dict__") is d:
                return obj
        except Exception:
            continue
    return None
