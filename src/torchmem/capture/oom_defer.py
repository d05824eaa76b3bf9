"""Run work at the point an out-of-memory error reaches the program, not inside the allocator's callback.

torch calls its OOM observer (and torchmem's CPU caps call theirs) *before* the error is raised, from inside
the allocation: work there delays every OOM and runs where the allocator and torchmem's ledger are in the
middle of an operation. What must be read at that moment — the allocator's figures, the user's line, the OOM
being handled — is cheap and is read there. What is not — the holder search, up to a second — is handed to
:func:`at_catch_point`, which asks the interpreter (``Py_AddPendingCall``) to call it back on the main thread
at its next check of pending calls. Such checks happen at every function call and backward jump, so the
callback runs within a few instructions of the raise: in the ``except`` block that caught the error, in a
``with`` block's ``__exit__`` the error passes through, or in the first line after an ``except: pass`` —
while the frames the error went through are still alive.

The callback waits while it would run inside the observer that scheduled it or inside the work it runs
(``busy``: leaving that block schedules the callback again) or inside torchmem's own code (it re-schedules
itself), so it never runs where torchmem holds a lock. The interpreter runs a pending call that re-schedules
itself again at once (up to 32 times per check: those cost nothing but the call), so after :data:`EAGER`
checks waited through it re-schedules from a timer, every :data:`WAIT` seconds: code of torchmem's that
catches an OOM and works on (a runner ending the program) is not slowed down meanwhile. After
:data:`GIVE_UP_AFTER` seconds it stops asking; it runs at the next OOM's scheduling or the next
:func:`run_now` (``explain_oom``, a watcher's ``detach()``). Where it cannot be scheduled (another thread:
pending calls run on the main thread only; an interpreter without ``Py_AddPendingCall``),
:func:`at_catch_point` says so and the caller does without. :func:`run_now` runs what is waiting at once (a
public call such as ``explain_oom`` is a catch point of its own). Never raises into the program.
"""

from __future__ import annotations

import ctypes
import sys
import sysconfig
import threading
import time
from collections.abc import Callable
from typing import Any

#: Seconds a scheduled callback keeps asking to run once the program's own code runs again.
GIVE_UP_AFTER = 2.0
#: Checks waited through re-scheduled at once; later ones from a timer, every :data:`WAIT` seconds.
EAGER = 64
WAIT = 0.002

_lock = threading.RLock()  # a pending call runs on the thread it interrupts: it may hold this lock already
_waiting: list[tuple[float, Callable[[], None]]] = []
_state: dict[str, Any] = {
    "scheduled": False,
    "callback": None,
    "add": None,
    "problem": None,
    "waits": 0,  # checks waited through since the last run
    "at": None,  # (id of the frame, offset) of the last check waited through
    "timer": False,  # a timer will re-schedule
}
_tls = threading.local()


def is_busy() -> bool:
    """Whether scheduled work (or the code that schedules it) runs on this thread now."""
    return bool(getattr(_tls, "busy", 0))


class busy:
    """A block during which scheduled work must not run on this thread (the observer that schedules it, the
    work itself): a pending call meanwhile does nothing, and leaving the outermost block schedules again
    what waits."""

    def __enter__(self) -> busy:
        _tls.busy = getattr(_tls, "busy", 0) + 1
        return self

    def __exit__(self, *exc: object) -> None:
        _tls.busy -= 1
        if not _tls.busy and _waiting:
            _schedule()


_STDLIB = tuple(
    p for p in {sysconfig.get_paths().get("stdlib"), sysconfig.get_paths().get("platstdlib")} if p
)
_STDLIB_NAMES = frozenset(getattr(sys, "stdlib_module_names", ()))


def _library(f: Any, top: str) -> bool:
    """torch's or the standard library's frame (importlib's frozen ones included): code that runs on behalf
    of whoever called it."""
    if top == "torch" or top in _STDLIB_NAMES:
        return True
    name = str(f.f_code.co_filename)
    return name.startswith("<frozen") or name.startswith(_STDLIB)


def _own_code_on_top() -> bool:
    """Whether the innermost frames, down to the first of the program's, are torchmem's (or torch's or the
    standard library's called from torchmem): the callback would run inside torchmem's own work (a dispatch
    mode, a cap's check, a lock held)."""
    f: Any = sys._getframe(2)
    while f is not None:
        top = str(f.f_globals.get("__name__", "")).partition(".")[0]
        if top == "torchmem":
            return True
        if not _library(f, top):
            return False
        f = f.f_back
    return False


def _pending(_arg: Any) -> int:
    """The interpreter's pending call: run what waits, or wait longer. Returns 0 always (never raises)."""
    try:
        with _lock:
            _state["scheduled"] = False
            if not _waiting:
                return 0
            newest = _waiting[-1][0]
        if sys.is_finalizing():
            with _lock:
                _waiting.clear()
            return 0
        here = sys._getframe(1)
        at = (id(here), here.f_lasti)
        del here
        if at == _state["at"]:
            # the same check again: the interpreter pops calls re-scheduled from a pending call in the same
            # loop (up to 32). Stay scheduled for the next check, at no cost.
            _schedule()
            return 0
        if is_busy():
            return 0  # leaving the busy block schedules it again
        if _own_code_on_top():
            if time.monotonic() - newest >= GIVE_UP_AFTER:
                return 0  # stop asking: the next OOM, explain_oom() or a watcher's detach() runs it
            with _lock:
                _state["at"] = at
                _state["waits"] += 1
                eager = _state["waits"] <= EAGER
            if eager:
                _schedule()
            else:
                _schedule_later()
            return 0
        _state["at"] = None
        run_now()
    except BaseException:  # a pending call that raises would raise into whatever code is running
        pass
    return 0


def _schedule() -> bool:
    add = _state["add"]
    if add is None:
        return False
    with _lock:
        if _state["scheduled"]:
            return True
        _state["scheduled"] = True
    try:
        ok = bool(add(_state["callback"], None) == 0)
    except Exception:
        ok = False
    if not ok:
        with _lock:
            _state["scheduled"] = False
    return ok


def _schedule_later() -> None:
    with _lock:
        if _state["timer"]:
            return
        _state["timer"] = True

    def fire() -> None:
        with _lock:
            _state["timer"] = False
        _schedule()

    t = threading.Timer(WAIT, fire)
    t.daemon = True
    t.start()


def _setup() -> str | None:
    if _state["add"] is not None or _state["problem"] is not None:
        return _state["problem"]  # type: ignore[no-any-return]
    try:
        proto = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
        callback = proto(_pending)
        add = ctypes.pythonapi.Py_AddPendingCall
        add.argtypes = [proto, ctypes.c_void_p]
        add.restype = ctypes.c_int
    except Exception as exc:  # not CPython, or no ctypes
        _state["problem"] = f"this interpreter cannot schedule a call ({type(exc).__name__}: {exc})"
        return _state["problem"]  # type: ignore[no-any-return]
    _state["callback"], _state["add"] = callback, add
    return None


def at_catch_point(fn: Callable[[], None]) -> str | None:
    """Call ``fn`` on this (the main) thread once the program's own code runs again after the OOM being
    raised now; ``None`` when it is scheduled, else why it cannot be (then ``fn`` is not called)."""
    if threading.current_thread() is not threading.main_thread():
        return "the OOM was raised on another thread than the main one"
    problem = _setup()
    if problem is not None:
        return problem
    with _lock:
        _waiting.append((time.monotonic(), fn))
    if not _schedule():
        with _lock:
            if _waiting and _waiting[-1][1] is fn:
                _waiting.pop()
        return "the interpreter refused to schedule a call"
    return None


def run_now() -> None:
    """Run every waiting callback now, oldest first (each once; one that fails is skipped)."""
    while True:
        with _lock:
            _state["waits"] = 0
            if not _waiting:
                return
            _, fn = _waiting.pop(0)
        try:
            with busy():
                fn()
        except Exception:
            pass


def waiting() -> int:
    """How many callbacks wait."""
    with _lock:
        return len(_waiting)


__all__ = ["EAGER", "GIVE_UP_AFTER", "WAIT", "at_catch_point", "busy", "is_busy", "run_now", "waiting"]
