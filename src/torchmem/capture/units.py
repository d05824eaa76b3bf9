"""The repeating unit of a program with no step torchmem recognises (issue 26): found from the evidence.

A loop of ``metric.update(...)`` calls, a data transform applied again and again, an epoch function: no
optimizer step, no ``backward()``, no top-level model call, no DataLoader batch. :class:`UnitFinder` looks
at the main thread's stack from the sampler thread (``sys._current_frames()``: no tracing, no cost to the
program), takes the function the program's own loop calls — the callee of the outermost frame of the
program's code that is still running — and wraps that function (its class attribute for a method, its
module's name for a function). The wrapper counts the calls that return; once one returns again and again
(3 times), each return is a step of the run (``on_step``), labelled ``"update() call"``. A candidate that
does not repeat (``main()``, called once) stays counted but inert, and the next level inwards is tried.

The wrappers call the original exactly once with the program's arguments and return its result; an error in
torchmem's part switches the finder off (reported once). :meth:`UnitFinder.remove` restores every name it
rebound, where the program did not rebind it meanwhile.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from types import CodeType, FrameType, FunctionType, ModuleType
from typing import Any

from torchmem.capture.loop_calls import (
    _is_user,
    frame_local,
    frame_locals,
    loop_calls,
    never_a_unit,
    not_the_programs,
    program_frames,
)

# Samples with the same candidate before it is wrapped; returns that make it the repeating unit.
_SAMPLES = 3
_REPEATS = 3
_MAX_CANDIDATES = 12
# A unit that has not returned for this long (and for 20 of its usual gaps), and is not running, belongs to a
# loop the program left (a set-up loop): the loop the program runs now is looked for (at most _RETIRE times).
_STALE_S = 3.0
_RETIRE = 3
# The shortest step a unit makes: shorter calls are counted in runs of k (a power of two, at most _MAX_EVERY).
_MIN_STEP_S = 0.0005
_MAX_EVERY = 4096


def candidate(
    frame: FrameType | None, skip: set[CodeType], program: str | None = None
) -> tuple[FrameType, FrameType] | None:
    """``(caller, callee)``: the first call, from the outermost frame of the program's code inwards, whose
    callee is not in ``skip`` (candidates already tried), ``None`` where there is none. ``program``: the
    program's file (``torchmem run``'s script): its outermost frame starts the program's code (the
    launcher's frames before it are not the program's)."""
    chain = program_frames(frame, program)
    for i in range(len(chain) - 1):
        caller, callee = chain[i], chain[i + 1]
        if not _is_user(caller) and i != 0:
            continue
        code = callee.f_code
        if code in skip or never_a_unit(code):
            continue
        if not_the_programs(code, str(callee.f_globals.get("__name__", ""))):
            return None  # torch's, torchmem's and the standard library's code is never the unit (join, sleep)
        return caller, callee
    return None


def _owner_of(callee: FrameType) -> tuple[Any, str, Any, str | None] | None:
    """Where the function running in ``callee`` is bound: ``(owner, name, function, label)`` — the class
    (through its MRO) of the ``self``/``cls`` argument for a method, else the module globals of the function,
    else an instance's dict (:func:`_instance_owner`, labelled ``Class.name``)."""
    code = callee.f_code
    name = code.co_name
    args = code.co_varnames[: code.co_argcount]
    first = frame_local(callee, args[0]) if args else None
    if first is not None and args and args[0] in ("self", "cls"):
        klass = first if isinstance(first, type) else type(first)
        for k in klass.__mro__:
            fn = k.__dict__.get(name)
            target = getattr(fn, "__func__", fn)
            if getattr(target, "__code__", None) is code:
                return k, name, fn, None
        return None
    fn = callee.f_globals.get(name)
    if getattr(fn, "__code__", None) is code:
        return callee.f_globals, name, fn, None
    return _instance_owner(callee)


# Values of the caller's namespace looked into for a function bound on an instance (at most).
_MAX_VALUES = 2000


def _instance_owner(callee: FrameType) -> tuple[Any, str, Any, str | None] | None:
    """Where a function bound on an *instance* is (``metric.__dict__['update']``: a library that wraps a
    method per instance, as torchmetrics wraps ``Metric.update``): the instance dict of a value the caller
    names (its locals, or its module's globals) holding a function whose code runs in ``callee``."""
    code = callee.f_code
    caller = callee.f_back
    if caller is None:
        return None
    spaces = [caller.f_globals]
    if caller.f_code.co_flags & 0x02:  # CO_NEWLOCALS: a function's frame (a module's locals are its globals)
        spaces.insert(0, frame_locals(caller))  # a copy: the frame's snapshot is emptied again
    seen = 0
    for space in spaces:
        for value in list(space.values()):
            seen += 1
            if seen > _MAX_VALUES:
                return None
            if isinstance(value, (type, ModuleType, FunctionType)):
                continue
            try:
                d = object.__getattribute__(value, "__dict__")
            except Exception:
                continue
            if not isinstance(d, dict):
                continue
            for key, fn in list(d.items()):
                if isinstance(key, str) and getattr(fn, "__code__", None) is code:
                    return d, key, fn, f"{type(value).__qualname__}.{key}"
    return None


class UnitFinder:
    """Finds and wraps the repeating unit of a program (see the module's text).

    Args:
        on_step: Called (on the program's thread) at each return of the unit, once it repeats.
        on_found: Called once with the unit's label (``"update() call"``) when it starts counting steps.
        on_error: Called once with a message if torchmem's part fails.
        thread: The program's main thread's ident.
        program: The program's file (its outermost frame starts the program's code), if known.
    """

    def __init__(
        self,
        on_step: Callable[[], None],
        on_found: Callable[[str], None],
        on_error: Callable[[str], None],
        thread: int,
        program: str | None = None,
    ) -> None:
        self._program = program
        self._on_step = on_step
        self._on_found = on_found
        self._on_error = on_error
        self._thread = thread
        self._tried: set[CodeType] = set()
        self._seen: dict[CodeType, int] = {}
        self._undo: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        self.label: str | None = None
        self.active = True  # False once another boundary was chosen (then the wrappers only count)
        self._off = False
        self._unit_code: CodeType | None = None
        self._last_return = 0.0
        self._gap = 0.0  # moving average of the seconds between the unit's returns
        self._retired = 0

    def sample(self) -> None:
        """One look at the program's stack (from the sampler thread). Never raises."""
        if self._off or not self.active or (self.label is None and len(self._tried) >= _MAX_CANDIDATES):
            return
        try:
            frame = sys._current_frames().get(self._thread)
            if self.label is not None:
                self._check_stale(frame)
                return
            for owner, name, fn, bound in loop_calls(frame, self._tried, self._program):
                self._wrap_target(owner, name, fn, getattr(fn, "__func__", fn).__code__, bound)
            found = candidate(frame, self._tried, self._program)
            del frame
            if found is None:
                return
            caller, callee = found
            code = callee.f_code
            n = self._seen[code] = self._seen.get(code, 0) + 1
            if n >= _SAMPLES:
                self._tried.add(code)
                self._wrap(callee)
            del caller, callee
        except Exception as exc:
            self._fail(exc)

    def _check_stale(self, frame: FrameType | None) -> None:
        """Let go of a unit whose loop the program left: no return for :data:`_STALE_S` seconds and 20 of its
        usual gaps, and its function not running now. Its wrapper stays: if it returns again it is the unit
        again; meanwhile the loop the program runs now is looked for."""
        if not self.active or self._retired >= _RETIRE or len(self._tried) >= _MAX_CANDIDATES:
            return
        if time.monotonic() - self._last_return < max(_STALE_S, 20 * self._gap):
            return
        f = frame
        while f is not None:
            if f.f_code is self._unit_code:
                return  # a long call of the unit (an epoch function): still the unit
            f = f.f_back
        self._retired += 1
        self.label = None

    def _fail(self, exc: BaseException) -> None:
        if not self._off:
            self._off = True
            self._on_error(f"the repeating unit could not be found ({type(exc).__name__}: {exc})")

    def _wrap(self, callee: FrameType) -> None:
        where = _owner_of(callee)
        if where is None:
            return
        owner, name, fn, bound = where
        self._wrap_target(owner, name, fn, callee.f_code, bound)

    def _wrap_target(self, owner: Any, name: str, fn: Any, code: CodeType, bound: str | None) -> None:
        func = getattr(fn, "__func__", fn)
        # (Python 3.10 has no co_qualname: the function's own __qualname__, `Tracker.update`)
        qual = getattr(code, "co_qualname", None) or getattr(func, "__qualname__", name)
        label = f"{bound or qual}() call"
        finder = self
        calls: list[Any] = [0, 0.0, 1, label]  # returns, the first's time, returns a step, the label shown

        def unit(*args: Any, **kwargs: Any) -> Any:
            result = func(*args, **kwargs)
            try:
                finder._returned(calls, label, code)
            except Exception as exc:
                finder._fail(exc)
            return result

        unit.__wrapped__ = func  # type: ignore[attr-defined]
        unit.__name__ = getattr(func, "__name__", name)
        unit.__qualname__ = getattr(func, "__qualname__", name)
        unit.__doc__ = getattr(func, "__doc__", None)
        wrapped: Any = unit
        if isinstance(fn, staticmethod):
            wrapped = staticmethod(unit)
        elif isinstance(fn, classmethod):
            wrapped = classmethod(unit)
        if isinstance(owner, dict):

            def undo() -> None:
                if owner.get(name) is wrapped:
                    owner[name] = fn

        else:

            def undo() -> None:
                if owner.__dict__.get(name) is wrapped:
                    setattr(owner, name, fn)

        with self._lock:  # never installed once removed (another boundary took over meanwhile)
            if not self.active:
                return
            if isinstance(owner, dict):
                owner[name] = wrapped
            else:
                setattr(owner, name, wrapped)
            self._undo.append(undo)

    def _returned(self, calls: list[Any], label: str, code: CodeType) -> None:
        if threading.get_ident() != self._thread or self._off:
            return
        n = calls[0] = calls[0] + 1
        if n % calls[2] and self.label == label:
            return  # a call of a run of calls that makes one step (a unit of a few µs)
        if n == 1:
            calls[1] = time.monotonic()
        if self.label is None:
            if n < _REPEATS:
                return
            if calls[2] == 1:
                # A call of a few µs (a tokenizer's add_word) is no step to read memory at: every k-th return
                # ends one, k the least power of two that makes a step last _MIN_STEP_S.
                gap = (time.monotonic() - calls[1]) / (n - 1)
                every = 1
                while every * gap < _MIN_STEP_S and every < _MAX_EVERY:
                    every *= 2
                calls[2] = every
                calls[3] = label if every == 1 else f"run of {every} {label}s"
            self.label = label
            self._unit_code = code
            self._gap = 0.0
            self._last_return = time.monotonic()
            self._on_found(calls[3])
        elif self.label != label:
            return
        now = time.monotonic()
        self._gap = 0.9 * self._gap + 0.1 * (now - self._last_return)
        self._last_return = now
        if self.active:
            self._on_step()

    def remove(self) -> None:
        """Restore every name the finder rebound (where the program did not rebind it meanwhile)."""
        with self._lock:
            self.active = False
            undo, self._undo = self._undo, []
        for u in reversed(undo):
            try:
                u()
            except Exception:
                pass


__all__ = ["UnitFinder", "candidate"]
