"""Holder paths: who keeps an object alive, as typed steps from a root a person knows down to the object.

:class:`HolderPath` is one chain of references, made of :class:`HolderStep` s; each step has a
:class:`StepKind` (an attribute, a container item, a closure cell, a hook entry, a tensor's ``grad_fn``, a
tensor saved for backward, ...), the fragment a person reads (``".cache"``, ``"['k3']"``,
``" -> closure 'acts'"``) and the bare name or key it names. ``str(path)`` joins the fragments::

    __main__.losses[17].grad_fn -> saved tensor of AddmmBackward0 (_saved_mat1)

Code that needs to know *what* a path goes through (the leak analysis: a retained graph, a hook, a module
global) reads the step kinds, never the rendered text. :class:`HolderPaths` is the list ``holders()``
returns; :class:`HolderSearch` the result of one search for several objects.

Plain frozen data with ``to_dict()``/``from_dict()``: nothing here imports torch or touches an object; the
search that builds these lives in :mod:`torchmem.analysis.holders`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from torchmem.results._dicts import ResultFormatError, from_mapping

# What the autograd graph of a held tensor still keeps (:attr:`HolderPath.graph`).
GRAPH_SAVED = "saved"
GRAPH_NODES = "nodes"


class StepKind(str, Enum):
    """What one step of a holder path follows (the value is the name stored in ``to_dict()``)."""

    ROOT = "root"
    """Where the path starts: a module (``__main__``), a live frame (``step() in train.py``: its function and
    file, never the line it is at now), a class, ``sys.last_traceback``, IPython's ``Out``, or
    ``<Tensor held outside Python>``."""
    MODULE_GLOBAL = "module_global"
    """A global of a module: ``.REGISTRY`` after the module's name."""
    FRAME_LOCAL = "frame_local"
    """A local (or cell) variable of a live or suspended frame: ``, local 'batch'``; of a live frame with the
    line(s) that assign it: ``, local 'batch' (assigned at line 12)``."""
    CLASS_ATTRIBUTE = "class_attribute"
    """An attribute stored on a class: ``.cache`` after the class's name."""
    ATTRIBUTE = "attribute"
    """An attribute of an object (``__dict__``, ``__slots__``, a module's parameter or child, a tensor's
    ``.grad``/``._base``, a bound method's ``__self__``, a custom autograd Function's ``ctx`` field)."""
    ITEM = "item"
    """An element of a dict, list, tuple or deque: ``['k3']``, ``[17]``, ``.args[0]``."""
    DICT_KEY = "dict_key"
    """The object is a key of a dict: `` key <Tensor (4,) float32>``."""
    SET_MEMBER = "set_member"
    """The object is a member of a set: `` (set member)``."""
    CLOSURE_CELL = "closure_cell"
    """A variable a function closes over: `` -> closure 'acts'``."""
    DEFAULT_ARGUMENT = "default_argument"
    """A function's default argument: `` -> default of 'x'``."""
    HOOK = "hook"
    """An entry of a hook dict (``_forward_hooks[0]``, ``_global_backward_hooks[3]``)."""
    GRAD_FN = "grad_fn"
    """From a tensor to the autograd node that made it: ``.grad_fn``."""
    AUTOGRAD_EDGE = "autograd_edge"
    """Through the edges of an autograd graph (``next_functions``) to a leaf it accumulates into:
    `` -> graph leaf (AccumulateGrad.variable)``."""
    SAVED_TENSOR = "saved_tensor"
    """A tensor an autograd node saved for backward: `` -> saved tensor of AddmmBackward0 (_saved_mat1)``."""
    TRACEBACK = "traceback"
    """From an exception to its traceback, or from a traceback to a frame: ``.__traceback__``,
    `` -> frame train.py:42 in step()``."""
    EXCEPTION_LINK = "exception_link"
    """From an exception to the one it was raised from or during: ``.__cause__``, ``.__context__``."""
    WEAKREF = "weakref"
    """Held by a weak reference's callback or a ``weakref.finalize`` entry (its function and arguments)."""
    OTHER = "other"
    """Any other reference (`` -> <SomeCType>``, `` -> caller frame ...``, a reference the search could not
    name: `` -> ?``)."""


def _step_kind(v: Any) -> StepKind:
    """The kind stored as ``v``; a kind this version does not know (a newer capture) reads as ``other``."""
    if isinstance(v, StepKind):
        return v
    if not isinstance(v, str):
        raise ResultFormatError(f"HolderStep.kind: expected text, got {v!r}")
    try:
        return StepKind(v)
    except ValueError:
        return StepKind.OTHER


@dataclass(frozen=True)
class HolderStep:
    """One step of a holder path.

    Attributes:
        kind: What the step follows (see :class:`StepKind`).
        text: The fragment as the path shows it (``".cache"``, ``"['k3']"``, ``" -> closure 'acts'"``).
        name: The bare name or key the step names: the attribute, global, local or closure variable name, the
            key as shown between the brackets (``"'k3'"``, ``"17"``), the node type of a ``grad_fn``, the
            saved attribute of a saved tensor (``"_saved_mat1"``), the module name of a module root.
        holder_type: The type of the object that holds the reference (``"dict"``, ``"list"``, ``"Linear"``,
            ``"AddmmBackward0"``); ``""`` for a root.
        key_type: For an item, dict key or hook entry: the type of the key (``"str"``, ``"int"``); else
            ``""``.
        methods: For an attribute of an object: which of the methods that empty or use what it collects
            (``reset``, ``clear``, ``compute``) its class defines, comma-separated (``"reset,compute"`` for a
            metric); else ``""``.

    Example:
        >>> s = HolderStep(StepKind.ITEM, "['k3']", "'k3'", "dict", "str")
        >>> str(s), s.kind.value
        ("['k3']", 'item')
    """

    kind: StepKind
    text: str
    name: str = ""
    holder_type: str = ""
    key_type: str = ""
    methods: str = ""

    def __str__(self) -> str:
        return self.text

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind.value,
            "text": self.text,
            "name": self.name,
            "holder_type": self.holder_type,
            "key_type": self.key_type,
            **({"methods": self.methods} if self.methods else {}),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> HolderStep:
        if not isinstance(d, Mapping):
            raise ResultFormatError(f"a stored HolderStep must be an object, got {type(d).__name__}")
        return from_mapping(cls, d, kind=_step_kind(d.get("kind")))


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
        typed_steps: The same steps with their kinds and names, one :class:`HolderStep` per fragment of
            ``steps``. A path built from fragments alone (an older record) gets ``root`` for its first step
            and ``other`` for the rest.
        graph: What the autograd graph of the held tensor keeps, where the search looked: ``"saved"``
            (tensors saved for backward: no backward ran through it), ``"nodes"`` (a ``grad_fn`` whose saved
            tensors a backward freed: only its nodes), ``""`` (no graph, or not looked at). Not part of the
            path's text.

    Example:
        >>> p = HolderPath("module", ("__main__", ".cache", "['x']"), 2)
        >>> str(p)
        "__main__.cache['x']"
        >>> q = HolderPath.of(
        ...     "module",
        ...     (
        ...         HolderStep(StepKind.ROOT, "__main__", "__main__"),
        ...         HolderStep(StepKind.MODULE_GLOBAL, ".cache", "cache", "dict"),
        ...         HolderStep(StepKind.ITEM, "['x']", "'x'", "dict", "str"),
        ...     ),
        ...     2,
        ... )
        >>> str(q) == str(p), [k.value for k in q.kinds]
        (True, ['root', 'module_global', 'item'])
    """

    root: str
    steps: tuple[str, ...]
    depth: int
    typed_steps: tuple[HolderStep, ...] = ()
    graph: str = ""

    def __post_init__(self) -> None:
        if not self.typed_steps:
            untyped = tuple(
                HolderStep(StepKind.ROOT if i == 0 else StepKind.OTHER, text)
                for i, text in enumerate(self.steps)
            )
            object.__setattr__(self, "typed_steps", untyped)
        elif tuple(s.text for s in self.typed_steps) != tuple(self.steps):
            raise ValueError("HolderPath: typed_steps must render the same fragments as steps")

    @classmethod
    def of(cls, root: str, typed_steps: Iterable[HolderStep], depth: int) -> HolderPath:
        """The path made of ``typed_steps`` (its ``steps`` are their fragments)."""
        typed = tuple(typed_steps)
        return cls(root, tuple(s.text for s in typed), depth, typed)

    @property
    def kinds(self) -> tuple[StepKind, ...]:
        """The kind of each step, root first."""
        return tuple(s.kind for s in self.typed_steps)

    def __str__(self) -> str:
        return "".join(self.steps)

    def __repr__(self) -> str:
        # The readable path, so that a list of paths reads as the README shows it:
        # [__main__.losses[17].grad_fn -> saved tensor of AddmmBackward0 (_saved_mat1)]
        return str(self)

    def to_dict(self) -> dict[str, Any]:
        return {
            "root": self.root,
            "path": str(self),
            "steps": list(self.steps),
            "depth": self.depth,
            "typed_steps": [s.to_dict() for s in self.typed_steps],
            **({"graph": self.graph} if self.graph else {}),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> HolderPath:
        """The path stored as ``to_dict()`` (records without ``typed_steps`` read as untyped steps)."""
        return from_mapping(cls, d)


class HolderPaths(list[HolderPath]):
    """The holder paths of one object, as :func:`torchmem.holders` returns them: a plain ``list`` of
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

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> HolderSearch:
        return from_mapping(cls, d)


__all__ = ["HolderPath", "HolderPaths", "HolderSearch", "HolderStep", "StepKind"]
