"""The functions a program's loop calls, read from its bytecode (issue 26's repeating unit).

A loop whose calls are cheap beside what else it does (``metric.update(...)`` between ``torch.rand`` and a
``time.sleep``) is almost never caught *inside* the call by a look at the stack: the program's frame is seen
at the loop's other lines. :func:`loop_calls` reads the loop the frame is in from its code instead: the
backward jump that spans the instruction the frame is at bounds the loop's body, and every name or dotted
name the body loads (``auroc.update``, ``step``, ``trainer.fit_batch``) is resolved without running the
program's code (:func:`inspect.getattr_static`: no property, no ``__getattr__`` runs). The Python functions
among them — the program's or a library's, never torch's, torchmem's or the standard library's, never a
generator — are where each can be wrapped: a class attribute, an instance's dict (a library that wraps a
method per instance, as torchmetrics wraps ``Metric.update``) or a module's globals.
"""

from __future__ import annotations

import dis
import inspect
from collections.abc import Callable, Iterator
from types import CodeType, FrameType, FunctionType, MethodType, ModuleType
from typing import Any

# Loads that start a dotted name, and loads that extend it.
_NAME_LOADS = frozenset(
    {"LOAD_NAME", "LOAD_GLOBAL", "LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_DEREF", "LOAD_CLASSDEREF"}
)
_ATTR_LOADS = frozenset({"LOAD_ATTR", "LOAD_METHOD"})
# Instructions that neither end a dotted name nor start one.
_NEUTRAL = frozenset({"CACHE", "EXTENDED_ARG", "NOP", "PUSH_NULL"})
# generators, coroutines, async generators: a return is not the end of an iteration's work
_GENERATOR_FLAGS = 0x20 | 0x80 | 0x100 | 0x200
# Functions wrapped from one look at most.
MAX_CALLS = 4

_loops: dict[CodeType, tuple[tuple[int, int], ...]] = {}
_names: dict[tuple[CodeType, int, int], tuple[tuple[str, ...], ...]] = {}


def _origin_of(frame: FrameType) -> int:
    from torchmem._warn import _origin

    return _origin(frame.f_code.co_filename, str(frame.f_globals.get("__name__", "")))


def _is_user(frame: FrameType) -> bool:
    from torchmem._warn import _USER

    return _origin_of(frame) == _USER


def _stdlib(filename: str) -> bool:
    import os
    import sysconfig

    std = sysconfig.get_paths().get("stdlib") or ""
    path = os.path.abspath(filename)
    return filename.startswith("<") or (
        bool(std) and path.startswith(std + os.sep) and "-packages" not in path
    )


def program_frames(frame: FrameType | None, program: str | None = None) -> list[FrameType]:
    """The stack of ``frame``, outermost first, from the outermost frame of the program's code (the first
    frame of ``program``'s file where it is given — the launcher's frames before it are not the program's —
    else the first frame of the user's code); empty where there is none."""
    chain: list[FrameType] = []
    f = frame
    while f is not None:
        chain.append(f)
        f = f.f_back
    chain.reverse()
    start = None
    if program:
        start = next((i for i, fr in enumerate(chain) if fr.f_code.co_filename == program), None)
    if start is None:
        start = next((i for i, fr in enumerate(chain) if _is_user(fr)), None)
    return [] if start is None else chain[start:]


def loop_ranges(code: CodeType) -> tuple[tuple[int, int], ...]:
    """``(first, last)`` instruction offsets of every loop of ``code``: a jump back to an earlier offset."""
    got = _loops.get(code)
    if got is None:
        spans: list[tuple[int, int]] = []
        for ins in dis.get_instructions(code):
            target = ins.argval
            jump = ins.opcode in dis.hasjrel or ins.opcode in dis.hasjabs
            if jump and isinstance(target, int) and target < ins.offset:
                spans.append((target, ins.offset))
        got = _loops[code] = tuple(spans)
    return got


def innermost_loop(code: CodeType, offset: int) -> tuple[int, int] | None:
    """The innermost loop of ``code`` whose body holds the instruction at ``offset``."""
    inside = [(a, b) for a, b in loop_ranges(code) if a <= offset <= b]
    return min(inside, key=lambda ab: ab[1] - ab[0]) if inside else None


def dotted_loads(code: CodeType, first: int, last: int) -> tuple[tuple[str, ...], ...]:
    """The dotted names loaded between offsets ``first`` and ``last`` (``("auroc", "update")``), in order,
    each once."""
    key = (code, first, last)
    got = _names.get(key)
    if got is None:
        found: list[tuple[str, ...]] = []
        chain: list[str] = []

        def close() -> None:
            if chain and tuple(chain) not in found:
                found.append(tuple(chain))
            chain.clear()

        for ins in dis.get_instructions(code):
            if ins.offset < first or ins.offset > last:
                continue
            if ins.opname in _NEUTRAL:
                continue
            if ins.opname in _NAME_LOADS and isinstance(ins.argval, str):
                close()
                chain.append(ins.argval)
            elif ins.opname in _ATTR_LOADS and chain and isinstance(ins.argval, str):
                chain.append(ins.argval)
            else:
                close()
        close()
        got = _names[key] = tuple(found)
    return got


_STORES = frozenset({"STORE_NAME", "STORE_GLOBAL", "STORE_FAST", "STORE_DEREF"})
_carried: dict[tuple[CodeType, int, int], frozenset[str]] = {}


def carried_names(code: CodeType, first: int, last: int) -> frozenset[str]:
    r"""The variables the loop between offsets ``first`` and ``last`` reads before it writes them, and writes:
    the state each iteration hands to the next (``logits, hidden = model(tokens, hidden)``: ``hidden``, not
    ``logits``), in the order of the loop's code (a branch is read as if both sides ran).

    Example:
        >>> src = "for _ in range(3):\n    out, h = f(x, h)\n    x = out.argmax()\n    log.append(out)"
        >>> code = compile(src, "<loop>", "exec")
        >>> sorted(carried_names(code, *loop_ranges(code)[0]))
        ['h', 'x']
    """
    key = (code, first, last)
    got = _carried.get(key)
    if got is None:
        read_first: set[str] = set()
        written: set[str] = set()
        for ins in dis.get_instructions(code):
            if ins.offset < first or ins.offset > last:
                continue
            op, arg = ins.opname, ins.argval
            names = arg if isinstance(arg, tuple) else (arg,)
            if op == "STORE_FAST_LOAD_FAST" and len(names) == 2:  # 3.13: a store, then a load
                written.add(str(names[0]))
                if names[1] not in written:
                    read_first.add(str(names[1]))
            elif op in _STORES or op == "STORE_FAST_STORE_FAST":
                written.update(str(n) for n in names)
            elif (op in _NAME_LOADS or op == "LOAD_FAST_LOAD_FAST") and op != "LOAD_FAST_AND_CLEAR":
                read_first.update(str(n) for n in names if n not in written)
        got = _carried[key] = frozenset(read_first & written)
    return got


def loop_carried(frame: FrameType | None, program: str | None = None) -> frozenset[str]:
    """The names carried from iteration to iteration (:func:`carried_names`) by the loops the program's
    frames on this stack are in now (the outermost first; a frame's innermost loop)."""
    out: set[str] = set()
    for fr in program_frames(frame, program):
        if not _is_user(fr):
            continue
        loop = innermost_loop(fr.f_code, fr.f_lasti)
        if loop is not None:
            out |= carried_names(fr.f_code, *loop)
    return frozenset(out)


def _read_locals(frame: FrameType, take: Callable[[dict[str, Any]], Any], default: Any) -> Any:
    """``take`` of the function frame's locals (``default`` where the frame refuses), read without leaving the
    program's locals alive: before Python 3.13 reading ``f_locals`` leaves a snapshot dict on the frame that
    keeps every local it had (a model the program deletes next) until the frame reads it again; the snapshot
    is emptied again where nobody else holds it (:class:`~torchmem.analysis.holders.roots.FrameSnapshots`)."""
    from torchmem.analysis.holders.roots import FrameSnapshots

    snaps = FrameSnapshots()
    loc = snaps.read(frame)
    try:
        return default if loc is None else take(loc)
    finally:
        del loc
        snaps.release()


def frame_local(frame: FrameType, name: str, default: Any = None) -> Any:
    """The value of the function frame's local ``name`` (``default`` where unbound), keeping nothing alive
    (:func:`_read_locals`)."""
    return _read_locals(frame, lambda loc: loc.get(name, default), default)


def frame_locals(frame: FrameType) -> dict[str, Any]:
    """A copy of the function frame's locals, keeping nothing alive once the copy is dropped
    (:func:`_read_locals`)."""
    return _read_locals(frame, dict, {})  # type: ignore[no-any-return]


def _lookup(frame: FrameType, name: str) -> Any:
    missing = object()
    if frame.f_code.co_flags & 0x02:  # CO_NEWLOCALS: a function's frame
        value = frame_local(frame, name, missing)
        if value is not missing:
            return value
    value = frame.f_globals.get(name, missing)
    if value is not missing:
        return value
    builtins = frame.f_globals.get("__builtins__")
    space = builtins if isinstance(builtins, dict) else getattr(builtins, "__dict__", {})
    return space.get(name)


def _static(obj: Any, name: str) -> Any:
    try:
        return inspect.getattr_static(obj, name)
    except AttributeError:
        return None


def where_bound(obj: Any, name: str) -> tuple[Any, str, Any, str | None] | None:
    """Where the function ``obj.name`` is bound, as :func:`~torchmem.capture.units` wraps it:
    ``(owner, name, function, label)``; ``None`` where it is no plain Python function."""
    if isinstance(obj, ModuleType):
        fn = obj.__dict__.get(name)
        return (obj.__dict__, name, fn, None) if isinstance(fn, FunctionType) else None
    if not isinstance(obj, type):
        try:
            d = object.__getattribute__(obj, "__dict__")
        except Exception:
            d = None
        if isinstance(d, dict) and isinstance(d.get(name), FunctionType):
            return d, name, d[name], f"{type(obj).__qualname__}.{name}"
    klass = obj if isinstance(obj, type) else type(obj)
    for k in klass.__mro__:
        fn = k.__dict__.get(name)
        target = getattr(fn, "__func__", fn)
        if fn is not None:
            return (k, name, fn, None) if isinstance(target, FunctionType) else None
    return None


def _resolve(frame: FrameType, dotted: tuple[str, ...]) -> tuple[Any, str, Any, str | None] | None:
    head = _lookup(frame, dotted[0])
    if head is None:
        return None
    if len(dotted) == 1:
        if isinstance(head, MethodType) and isinstance(head.__func__, FunctionType):
            return where_bound(head.__self__, head.__func__.__name__)
        if isinstance(head, FunctionType) and frame.f_globals.get(dotted[0]) is head:
            return frame.f_globals, dotted[0], head, None  # a local variable cannot be rebound: only globals
        return None
    obj = head
    for attr in dotted[1:-1]:
        obj = _static(obj, attr)
        if obj is None or isinstance(obj, (property, staticmethod, classmethod)):
            return None
    return where_bound(obj, dotted[-1])


def never_a_unit(code: CodeType) -> bool:
    """A generator's, a coroutine's or a lambda's/comprehension's code: a return of it is not an iteration's
    end."""
    return bool(code.co_flags & _GENERATOR_FLAGS) or code.co_name.startswith("<")


def not_the_programs(code: CodeType, module: str) -> bool:
    """torch's, torchmem's or the standard library's code (a ``join``, a ``sleep``): never the unit."""
    from torchmem._warn import _INTERNAL, _origin

    return _origin(code.co_filename, module) == _INTERNAL or _stdlib(code.co_filename)


def _eligible(fn: Any) -> CodeType | None:
    target = getattr(fn, "__func__", fn)
    code = getattr(target, "__code__", None)
    if not isinstance(code, CodeType) or never_a_unit(code):
        return None
    if not_the_programs(code, str(getattr(target, "__module__", "") or "")):
        return None
    return code


def loop_calls(
    frame: FrameType | None, skip: set[CodeType], program: str | None = None
) -> Iterator[tuple[Any, str, Any, str | None]]:
    """The functions the loop of the program's outermost frame that is in a loop calls, not in ``skip``
    (each one given is added to it), at most :data:`MAX_CALLS`: ``(owner, name, function, label)`` each
    (see the module's text). Where that loop's calls were all tried, the next frame inwards in a loop."""
    for fr in program_frames(frame, program):
        if not _is_user(fr):
            continue
        loop = innermost_loop(fr.f_code, fr.f_lasti)
        if loop is None:
            continue
        given = 0
        for dotted in dotted_loads(fr.f_code, *loop):
            where = _resolve(fr, dotted)
            if where is None:
                continue
            code = _eligible(where[2])
            if code is None or code in skip:
                continue
            skip.add(code)
            yield where
            given += 1
            if given >= MAX_CALLS:
                return
        if given:
            return  # the outermost loop's calls first; a frame further in is looked at once they are tried


__all__ = [
    "MAX_CALLS",
    "carried_names",
    "dotted_loads",
    "innermost_loop",
    "loop_calls",
    "loop_carried",
    "loop_ranges",
    "where_bound",
]
