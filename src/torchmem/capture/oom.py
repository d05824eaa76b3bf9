"""OOM capture: the allocator state at the moment of an OOM, the process-wide OOM observer, memory pinned by
old exceptions, and the public :func:`explain_oom`, which gathers what is known live and hands it to the pure
:func:`torchmem.analysis.oom.diagnose`.

Every device read goes through the device layer (:mod:`torchmem.devices._allocator` for the caching
allocator's segments, counters and observer; :mod:`torchmem.devices._nvml` for other processes;
:mod:`torchmem.devices._host` for the host's memory). torch cannot detach an allocator OOM observer, so
torchmem attaches **one** per process, on first request, and dispatches to the callbacks registered with
:func:`attach_oom_observer`; :meth:`OOMObserver.detach` unregisters a callback (the torch-side observer
stays, doing nothing but a cheap capture: segment sizes and states, no stack frames).

:func:`watch_ooms` delivers an :class:`~torchmem.results.oom.OOMEvent` for **every** out-of-memory error at
the moment it is raised, including the ones the program catches itself: CUDA's through the same observer
(attached when the program initialises CUDA, never by torchmem initialising it), the CPU caps' of
:func:`torchmem.limit` / ``budget(hard=True)`` through the caps' crossing callback. Each event carries the
user's line, the OOM being handled when it was raised (a retry inside ``except``) and a diagnosis made from
the state of that moment; :func:`same_event` tells which event an exception that ended the program was.

Who holds the memory (:func:`torchmem.analysis.oom.holders.oom_holders`: a holder search of up to a second) is
never looked for inside the observer: it reads only what must be read at the moment (figures, the user's
line, the OOM being handled, autograd's mode), delivers the event, and hands the search to
:mod:`torchmem.capture.oom_defer`, which runs it where the error reaches the program (the ``except`` that
caught it, a ``with`` block it leaves) while the frames it went through are alive, and completes the event's
diagnosis with it. :func:`explain_oom` given the exception is such a point itself. The searches share a
budget (:data:`HOLDER_BUDGET`), so that a loop of OOMs (a batch-size search) does not pay one per OOM.
"""

from __future__ import annotations

import inspect
import os
import sys
import threading
import time
import types
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from torchmem._errors import TorchmemError
from torchmem._exceptions import exception_chain
from torchmem._format import fmt_bytes
from torchmem._warn import emit_warning
from torchmem.analysis.oom import diagnose, oom_exception, parse_oom_message
from torchmem.capture import oom_defer
from torchmem.devices import DeviceLike, cuda_available, resolve
from torchmem.devices import _allocator as al
from torchmem.devices._ledger import birth_site, ledger
from torchmem.results.oom import (
    AllocatorState,
    MachineMemory,
    OOMDiagnosis,
    OOMEvent,
    OOMHolders,
    OtherProcess,
    ParsedOOM,
    PinnedTensor,
    WorkingSetItem,
)


class OOMInputError(TorchmemError):
    """``explain_oom`` was given something that is neither an exception nor a message."""


# ---------------------------------------------------------------------------------------------------------
# state capture


def capture_state(
    device: DeviceLike = None,
    *,
    requested: int | None = None,
    device_free: int | None = None,
    limit: int | None = None,
    snapshot_file: str | None = None,
) -> AllocatorState:
    """Read the CUDA allocator's state of ``device`` now: segments and blocks, counters, driver figures
    and other processes (NVML, when available). Cheap: no history, no stack frames.

    A device that is not CUDA, or CUDA not yet used by this process, gives a state with ``None`` figures
    and a note (nothing is initialised).

    Example:
        >>> s = capture_state("cpu")
        >>> s.segments is None
        True
    """
    dev = resolve(device)
    notes: list[str] = []
    if dev.type != "cuda":
        return AllocatorState(
            device=str(dev), platform=dev.type, notes=(f"No allocator segments on {dev.type}.",)
        )
    idx = dev.index or 0
    if not al.cuda_ready():
        return AllocatorState(
            device=str(dev),
            platform=al.platform(),
            alloc_conf=al.alloc_conf(),
            notes=("CUDA is not initialised in this process: nothing is allocated yet.",),
        )
    segs: list[dict[str, Any]] | None
    try:
        segs = al.segments(idx)
    except Exception as exc:  # a torch without snapshots, or one that fails: degrade
        segs = None
        notes.append(f"Segments could not be read ({type(exc).__name__}: {exc}).")
    info = al.mem_info(idx) if device_free is None else None
    free = device_free if device_free is not None else (info[0] if info else None)
    total = al.device_total(idx)
    process_used, others = _processes(idx)
    if others is None:
        from torchmem.devices import _nvml

        problem = _nvml.nvml_problem()
        if problem:
            notes.append(problem)
    kw: dict[str, Any] = {
        "device": f"cuda:{idx}",
        "stats": al.flat_stats(idx),
        "device_total": total,
        "device_free": free,
        "limit": limit if limit is not None and (total is None or limit < total) else None,
        "process_used": process_used,
        "other_processes": others,
        "requested": requested,
        "alloc_conf": al.alloc_conf(),
        "platform": al.platform(),
        "timestamp": time.time(),
        "snapshot_file": snapshot_file,
        "grad_enabled": torch.is_grad_enabled(),
        "notes": tuple(notes),
    }
    if segs is None:
        return AllocatorState(**kw)
    return AllocatorState.from_snapshot(segs, **kw)


def _processes(idx: int) -> tuple[int | None, tuple[OtherProcess, ...] | None]:
    from torchmem.devices import _nvml

    nv = _nvml.device(idx, al.device_uuid(idx))
    if nv is None or nv.processes is None:
        return None, None
    me = os.getpid()
    used = next((p.used for p in nv.processes if p.pid == me), None)
    others = tuple(OtherProcess(p.pid, p.used, p.name) for p in nv.processes if p.pid != me)
    return used, others


# ---------------------------------------------------------------------------------------------------------
# the process-wide OOM observer

OOMCallback = Callable[[AllocatorState], None]
EventCallback = Callable[[OOMEvent], None]

#: How many OOM events each :func:`watch_ooms` handle gets fully diagnosed (segments, other processes, memory
#: pinned by old exceptions); later ones get a brief diagnosis from the figures of the moment.
FULL_EVENTS = 20
_RECENT = 64  # events kept to name the one being handled, and matching keys for same_event()

_lock = threading.Lock()
_attach_lock = threading.Lock()
_tls = threading.local()
_registry: dict[str, Any] = {
    "attached": False,
    "problem": None,  # why torch's observer could not be attached
    "queued": False,  # the attach waits on torch's lazy-init queue
    "init_problem": None,  # why it could not be queued
    "callbacks": [],  # list[OOMObserver]
    "watchers": [],  # list[OOMWatch]
    "index": 0,  # OOMs seen in this process
    "cuda_ooms": 0,  # of them, the allocator's
    "recent": deque(maxlen=_RECENT),  # the last OOMEvents
    "keys": {},  # event index -> (id of the site's frame, line) for same_event()
    "last": {},  # device index -> AllocatorState
    "reported": set(),
    "moments": deque(maxlen=_RECENT),  # _Moment of the last OOMs: autograd's mode and figures at the raise
    "budget": [None, 0.0],  # holder-search seconds left, and when it was last topped up (time.monotonic())
}

#: Seconds of holder searches (at the OOMs and in explain_oom) the process may spend in a burst; the budget
#: grows back by :data:`HOLDER_REFILL` seconds per second. ``explain_oom(..., holders=True)`` ignores it.
HOLDER_BUDGET = 1.0
HOLDER_REFILL = 0.01


@dataclass(eq=False)
class _Moment:
    """What an OOM looked like when it was raised: read there because it changes once the error unwinds."""

    index: int
    device: str
    requested: int | None
    grad_enabled: bool
    allocated: int | None
    timestamp: float


def _remember(index: int, device: str, requested: int | None, allocated: int | None) -> _Moment:
    m = _Moment(index, device, requested, torch.is_grad_enabled(), allocated, time.time())
    with _lock:
        _registry["moments"].append(m)
    return m


def _moment_for(device: str | None, requested: int | None, max_age: float = 600.0) -> _Moment | None:
    """The latest remembered OOM of ``device`` with this request, raised in the last ``max_age`` seconds."""
    now = time.time()
    with _lock:
        moments: list[_Moment] = list(_registry["moments"])
    for m in reversed(moments):
        if now - m.timestamp > max_age:
            break
        if (device is None or m.device == device) and _same_request(m.requested, requested):
            return m
    return None


def _take_budget(force: bool) -> bool:
    """Whether a holder search may run now (``force``: always)."""
    with _lock:
        left, when = _registry["budget"]
        now = time.monotonic()
        left = HOLDER_BUDGET if left is None else min(HOLDER_BUDGET, left + (now - when) * HOLDER_REFILL)
        _registry["budget"] = [left, now]
        return force or left > 0


def _spend(seconds: float) -> None:
    with _lock:
        _registry["budget"][0] = (_registry["budget"][0] or 0.0) - seconds


@dataclass(eq=False)
class OOMObserver:
    """Handle of a registered OOM callback.

    Attributes:
        callback: Called with the :class:`AllocatorState` captured at each OOM (may be ``None``).
        snapshot_dir: Where a memory_viz snapshot is written at each OOM while history recording is on.
        active: Whether it is still registered.
        problem: Why torch's observer could not be attached (``None``: attached).
    """

    callback: OOMCallback | None
    snapshot_dir: str | None
    active: bool = True
    problem: str | None = None

    def detach(self) -> None:
        """Stop calling this callback (torch's own observer cannot be removed; it stays, idle and cheap)."""
        with _lock:
            _registry["callbacks"][:] = [h for h in _registry["callbacks"] if h is not self]
        self.active = False

    def __enter__(self) -> OOMObserver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.detach()


def _report_once(key: str, message: str) -> None:
    with _lock:
        if key in _registry["reported"]:
            return
        _registry["reported"].add(key)
    emit_warning(message)  # the user's line; never raises, even with warnings as errors


def _ensure_attached() -> str | None:
    """Attach torchmem's one observer to the caching allocator unless it is; why not, else ``None``."""
    with _attach_lock:
        with _lock:
            if _registry["attached"]:
                return None
        problem = al.attach_oom_observer(_on_oom)
        with _lock:
            _registry["attached"] = problem is None
            _registry["problem"] = problem
        return problem


def _capture_full(
    device: int, requested: int, limit_or_total: int, device_free: int, dirs: list[str]
) -> AllocatorState:
    snap_file = None
    if dirs and al.history_enabled():
        os.makedirs(dirs[0], exist_ok=True)
        path = os.path.join(dirs[0], f"oom_cuda{device}_{os.getpid()}_{time.time_ns()}.pickle")
        try:
            if al.dump_snapshot(path):
                snap_file = path
        except Exception as exc:
            _report_once("dump", f"torchmem could not write the OOM snapshot ({type(exc).__name__}: {exc}).")
    return capture_state(
        torch.device("cuda", device),
        requested=requested,
        device_free=device_free,
        limit=limit_or_total,
        snapshot_file=snap_file,
    )


def _capture_brief(device: int, requested: int, limit_or_total: int, device_free: int) -> AllocatorState:
    """The counters and the observer's figures only: no segment walk, no NVML (a later OOM of many)."""
    total = al.device_total(device)
    return AllocatorState(
        device=f"cuda:{device}",
        stats=al.brief_stats(device),
        device_total=total,
        device_free=device_free,
        limit=limit_or_total if total is None or limit_or_total < total else None,
        requested=requested,
        alloc_conf=al.alloc_conf(),
        platform=al.platform(),
        timestamp=time.time(),
        grad_enabled=torch.is_grad_enabled(),
        notes=("Segments and other processes not read: a later OOM of a long run of them.",),
    )


def _on_oom(device: int, requested: int, limit_or_total: int, device_free: int) -> None:
    """torch calls this after an allocation failed, before raising (the allocator lock is released), on the
    allocating thread. It must never raise: pybind would turn the OOM into another error. Nothing heavy runs
    here: who holds the memory is looked for where the error reaches the program (:mod:`.oom_defer`)."""
    if getattr(_tls, "busy", False) or oom_defer.is_busy():  # an OOM inside our own work: record nothing
        return
    _tls.busy = True
    quiet = oom_defer.busy()  # what this schedules waits until the observer has returned
    quiet.__enter__()
    try:
        with _lock:
            handles = list(_registry["callbacks"])
            watchers = [w for w in _registry["watchers"] if w.active]
            _registry["index"] += 1
            _registry["cuda_ooms"] += 1
            index = _registry["index"]
            if watchers:
                full = bool(handles) or any(w.seen < w.full for w in watchers)
            else:  # nobody watching: the state is kept for explain_oom, in full for the first ones only
                full = bool(handles) or _registry["cuda_ooms"] <= FULL_EVENTS
            for w in watchers:
                w.seen += 1
        state: AllocatorState | None = None
        try:
            if full:
                dirs = [h.snapshot_dir for h in handles if h.snapshot_dir]
                state = _capture_full(device, requested, limit_or_total, device_free, dirs)
            else:
                state = _capture_brief(device, requested, limit_or_total, device_free)
            with _lock:
                _registry["last"][device] = state
        except Exception as exc:
            _report_once("observer", f"torchmem's OOM observer failed ({type(exc).__name__}: {exc}).")
        moment = _remember(index, f"cuda:{device}", requested, state.allocated if state is not None else None)
        if state is not None:
            for h in handles:
                if h.callback is None:
                    continue
                try:
                    h.callback(state)
                except Exception as exc:
                    _report_once(
                        f"cb{id(h)}", f"torchmem: an OOM callback failed ({type(exc).__name__}: {exc})."
                    )
        if watchers:
            parsed = _observer_message(device, requested, limit_or_total, device_free, state)
            _emit(watchers, index, full, torch.device("cuda", device), "allocator", parsed, state, moment)
    except Exception as exc:  # never let the observer turn an OOM into something else
        _report_once("observer", f"torchmem's OOM observer failed ({type(exc).__name__}: {exc}).")
    finally:
        _tls.busy = False
        quiet.__exit__()


def attach_oom_observer(
    callback: OOMCallback | None = None, *, snapshot_dir: str | None = None
) -> OOMObserver:
    """Capture the allocator state at every CUDA OOM of this process (and call ``callback`` with it).

    The first call attaches torchmem's single observer to PyTorch's caching allocator (this initialises
    CUDA, as torch does to attach); later calls only register more callbacks. When
    ``torch.cuda.memory._record_memory_history()`` is recording and ``snapshot_dir`` is given, each OOM
    also writes a snapshot pickle there that https://pytorch.org/memory_viz opens. The last state per
    device is kept for :func:`explain_oom` (:func:`last_oom_state`). :func:`watch_ooms` is the lighter way
    to see every OOM: it does not initialise CUDA and bounds the work per OOM.

    Where torch has no observer (no CUDA, the ``cudaMallocAsync`` backend, an old torch) the handle's
    ``problem`` says why and nothing is captured; no exception is raised.

    Example:
        >>> obs = attach_oom_observer(lambda state: print(state.requested))   # doctest: +SKIP
        >>> obs.detach()                                                      # doctest: +SKIP
    """
    handle = OOMObserver(callback, snapshot_dir)
    _ensure_attached()
    with _lock:
        handle.problem = _registry["problem"]
        if _registry["attached"]:
            _registry["callbacks"].append(handle)
        else:
            handle.active = False
    return handle


def last_oom_state(device: int | None = None) -> AllocatorState | None:
    """The state the observer captured at the most recent OOM (of ``device``, else of any device)."""
    with _lock:
        last: dict[int, AllocatorState] = dict(_registry["last"])
    if device is not None:
        return last.get(device)
    if not last:
        return None
    return max(last.values(), key=lambda s: s.timestamp or 0.0)


# ---------------------------------------------------------------------------------------------------------
# memory pinned by old exceptions and notebook output


def _tensors_in(obj: Any, depth: int = 2) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if depth <= 0:
        return []
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [t for x in list(obj)[:1000] for t in _tensors_in(x, depth - 1)]
    if isinstance(obj, dict):
        return [t for x in list(obj.values())[:1000] for t in _tensors_in(x, depth - 1)]
    return []


def _storage_key(t: torch.Tensor) -> tuple[str, int] | None:
    try:
        st = t.untyped_storage()
        return (str(t.device), int(st.data_ptr()))
    except Exception:
        return None


def _nbytes(t: torch.Tensor) -> int:
    try:
        return int(t.untyped_storage().nbytes())
    except Exception:
        return 0


def _function_locals(frame: types.FrameType) -> list[tuple[str, Any]]:
    """The locals of a finished *function* frame (module and class frames: ``[]``, their names are the
    program's namespace). Before Python 3.13 reading ``f_locals`` leaves a snapshot dict on the frame that
    ``frame.clear()`` does not empty, so a program that clears the frames itself (``traceback.clear_frames``)
    would still keep the tensors: the snapshot is emptied again after reading (for a function frame it is a
    copy; the frame's own variables are untouched)."""
    if not frame.f_code.co_flags & inspect.CO_OPTIMIZED:
        return []
    try:
        loc = frame.f_locals
        items = list(loc.items())
    except Exception:
        return []
    if sys.version_info < (3, 13) and type(loc) is dict:
        loc.clear()
    return items


class _Pins:
    """Collects :class:`PinnedTensor` s: storages on ``device`` (every non-CPU device when ``None``), each
    counted once, parameters skipped (a model holds them anyway)."""

    def __init__(self, device: torch.device | None) -> None:
        self.device = device
        self.seen: set[tuple[str, int]] = set()
        self.out: list[PinnedTensor] = []

    def wanted(self, t: torch.Tensor) -> bool:
        if isinstance(t, torch.nn.Parameter):
            return False
        if self.device is None:
            return t.device.type not in ("cpu", "meta")
        return t.device == self.device or (t.device.type == self.device.type and self.device.index is None)

    def add(self, where: str, objs: list[torch.Tensor]) -> None:
        total = 0
        for t in objs:
            if not self.wanted(t):
                continue
            key = _storage_key(t)
            if key is None or key in self.seen:
                continue
            self.seen.add(key)
            total += _nbytes(t)
        if total:
            self.out.append(PinnedTensor(where, total))

    def frames(
        self, label: str, tbs: Iterable[types.TracebackType], skip: set[int], limit: int = 256
    ) -> None:
        """The tensors held by the finished function frames of ``tbs`` (not those whose id is in ``skip``)."""
        n = 0
        for first in tbs:
            tb: types.TracebackType | None = first
            while tb is not None and n < limit:
                frame, line = tb.tb_frame, tb.tb_lineno
                tb = tb.tb_next
                if id(frame) in skip:
                    continue
                skip.add(id(frame))
                n += 1
                code = frame.f_code
                for name, value in _function_locals(frame):
                    self.add(
                        f"{label} -> frame {os.path.basename(code.co_filename)}:{line} {code.co_name}() "
                        f"local {name!r}",
                        _tensors_in(value),
                    )
            del first


def _old_exceptions(pins: _Pins, exclude: BaseException | None) -> None:
    # the whole chain, causes and contexts: every part of it is the OOM being explained
    excluded = {id(e) for e in exception_chain(exclude)}
    last = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    tbs: list[types.TracebackType] = []
    if last is not None:
        # the old exception and its cause/context chain: a wrapped OOM's frames are in its __cause__
        tbs.extend(
            e.__traceback__
            for e in exception_chain(last)
            if id(e) not in excluded and e.__traceback__ is not None
        )
    else:
        last_tb = getattr(sys, "last_traceback", None)
        if last_tb is not None:
            tbs.append(last_tb)
    pins.frames("sys.last_traceback", tbs, set())
    tbs.clear()
    ip = sys.modules.get("IPython")
    get = getattr(ip, "get_ipython", None) if ip is not None else None
    shell = get() if get is not None else None
    ns = getattr(shell, "user_ns", None)
    if isinstance(ns, dict):
        outs = ns.get("Out")
        if isinstance(outs, dict):
            for k, v in list(outs.items()):
                pins.add(f"IPython Out[{k}]", _tensors_in(v))
        for name in ("_", "__", "___"):
            if name in ns:
                pins.add(f"IPython {name}", _tensors_in(ns[name]))


def pinned_tensors(
    device: torch.device | None = None, *, exclude: BaseException | None = None
) -> list[PinnedTensor]:
    """Device memory held by a finished exception (``sys.last_exc`` / ``last_traceback``) and by IPython's
    output history (``Out``, ``_``): storages on ``device`` (every non-CPU device when ``None``), one entry
    per holder, each storage counted once. Parameters are skipped (a model holds them anyway); an old
    exception in ``exclude``'s cause/context chain (the OOM being explained, or the exception that wraps
    it) is skipped: its frames are the working set, not an old leftover. Only function frames count (a
    module's frame holds the program's own namespace).
    """
    pins = _Pins(device)
    _old_exceptions(pins, exclude)
    return pins.out


def _type_name(exc: BaseException) -> str:
    t = type(exc)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _tracebacks(exc: BaseException | None, limit: int = 16) -> list[types.TracebackType]:
    out: list[types.TracebackType] = []
    for i, e in enumerate(exception_chain(exc)):
        if i >= limit:
            break
        if e.__traceback__ is not None:
            out.append(e.__traceback__)
    return out


def _frame_ids(tbs: Iterable[types.TracebackType]) -> set[int]:
    ids: set[int] = set()
    for first in tbs:
        tb: types.TracebackType | None = first
        while tb is not None:
            ids.add(id(tb.tb_frame))
            tb = tb.tb_next
    return ids


def _stack_ids() -> set[int]:
    ids: set[int] = set()
    f: types.FrameType | None = sys._getframe(1)
    while f is not None:
        ids.add(id(f))
        f = f.f_back
    return ids


def _handled_pins(pins: _Pins, handled: BaseException, running: set[int]) -> None:
    """What the frames of ``handled`` (the OOM being handled when a new one was raised) hold, except the
    frames in ``running`` (still executing then: their locals are the program's, not the failed attempt's)."""
    pins.frames(f"the handled {_type_name(handled)}'s traceback", _tracebacks(handled), set(running))


# ---------------------------------------------------------------------------------------------------------
# OOM events: every OOM at the moment it is raised, caught or not


@dataclass(eq=False)
class OOMWatch:
    """Handle returned by :func:`watch_ooms`; a context manager that detaches at the end of the block.

    Attributes:
        callback: Called with each :class:`~torchmem.results.oom.OOMEvent`, on the thread that hit the OOM,
            before the error is raised.
        full: How many events get the full diagnosis; later ones get a brief one.
        active: Whether it is still registered.
        seen: Events delivered so far.
    """

    callback: EventCallback
    full: int = FULL_EVENTS
    active: bool = True
    seen: int = 0
    failed: bool = False

    @property
    def problem(self) -> str | None:
        """Why CUDA OOMs cannot be seen (``None``: they are, or CUDA is not in use yet or not at all)."""
        return _observer_problem()

    def detach(self) -> None:
        """Deliver no more events to this callback (idempotent); an event whose holder search waits for the
        program's code to run again is completed first."""
        if threading.current_thread() is threading.main_thread():
            oom_defer.run_now()
        with _lock:
            _registry["watchers"][:] = [w for w in _registry["watchers"] if w is not self]
        self.active = False

    def __enter__(self) -> OOMWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.detach()


def _attach_at_init() -> None:
    """Queued on torch's lazy CUDA initialisation (or run at once when CUDA is initialised)."""
    _ensure_attached()


def check_cuda_observer() -> str | None:
    """Attach the CUDA observer now if CUDA came up without torch's lazy-init queue (an old or changed
    torch); cheap otherwise. Returns why CUDA OOMs cannot be seen, ``None`` when they can (or CUDA is
    unused)."""
    al.run_pending_cuda_init()
    return _observer_problem()


def _observer_problem() -> str | None:
    with _lock:
        problem: str | None = _registry["problem"] or _registry["init_problem"]
    return problem


def watch_ooms(callback: EventCallback, *, full: int = FULL_EVENTS) -> OOMWatch:
    """Call ``callback`` with an :class:`~torchmem.results.oom.OOMEvent` for every out-of-memory error this
    process raises from now on — at the moment it is raised, before the program can catch it.

    - **CUDA**: torch's caching-allocator OOM observer. It is attached when the program initialises CUDA
      (torch's lazy-init queue), so watching never initialises CUDA itself; where CUDA already is, at once.
      Where the allocator has no observer (``cudaMallocAsync``, an old torch) ``handle.problem`` says so.
    - **CPU**: the errors raised by the caps of :func:`torchmem.limit` and ``torchmem.budget(hard=True)``.

    Each event names the user's line that raised it, the OOM being handled at that moment if any (a retry
    inside ``except``, whose failed attempt's frames are still alive: the diagnosis is then
    ``pinned_by_exception`` with what they hold) and a diagnosis made from the allocator's state then. The
    first ``full`` events get the full diagnosis (segments, other processes, pinned memory); later ones a
    brief one from the figures of the moment, so a retry loop that raises hundreds stays cheap. The
    callback runs on the allocating thread; an error in it is reported once and the OOM goes on unchanged.
    :func:`same_event` tells whether an exception (one that ended the program) is an event's.

    Who held the memory (``event.diagnosis.holders``: variables, containers, graphs, models, optimizers,
    with bytes, and the situations they show) is looked for where the error reaches the program, on the main
    thread — never inside the allocator's callback — and completes the event's diagnosis in place then,
    within the holder-search budget (:data:`HOLDER_BUDGET`); an OOM on another thread, or past the budget,
    keeps the diagnosis of the moment with a note saying why.

    Args:
        callback: Called with each event.
        full: How many events get the full diagnosis.

    Returns:
        An :class:`OOMWatch` (``detach()``, or use it as a context manager).

    Raises:
        OOMInputError: ``callback`` is not callable.

    Example:
        >>> import torch, torchmem
        >>> from torchmem.capture.oom import watch_ooms
        >>> events = []
        >>> with watch_ooms(events.append), torchmem.limit("1MiB", "cpu"):
        ...     try:
        ...         x = torch.ones(1 << 19)          # 2 MiB over a 1 MiB cap: caught below
        ...     except torch.OutOfMemoryError:
        ...         pass
        >>> events[0].device, events[0].kind
        ('cpu', 'too_large')
    """
    if not callable(callback):
        raise OOMInputError(
            f"watch_ooms needs a callable, not a {type(callback).__name__}.",
            "Pass a function that takes one OOMEvent, e.g. watch_ooms(events.append).",
        )
    handle = OOMWatch(callback, max(0, int(full)))
    with _lock:
        _registry["watchers"].append(handle)
        queue = not _registry["attached"] and not _registry["queued"]
        if queue:
            _registry["queued"] = True
    if queue:
        why = al.on_cuda_init(_attach_at_init)
        if why is not None:
            with _lock:
                _registry["init_problem"] = why
    return handle


def record_cap_oom(cap: Any) -> None:
    """A hard cap of :func:`torchmem.limit` / ``budget(hard=True)`` (a ``devices._ledger.Cap``) refused an op;
    the op raises ``torch.OutOfMemoryError`` next. Called once per refused op (by ``actions/limit.py``), on
    the allocating thread; never raises."""
    if getattr(_tls, "busy", False) or oom_defer.is_busy():
        return
    try:  # autograd's mode at the raise, for explain_oom (cheap; kept whether or not anyone watches)
        used = ledger().current(cap.device)
        requested = int(cap.requested)
        moment = _remember(0, str(torch.device(cap.device)), requested, used)
    except Exception:
        return
    with _lock:
        watchers = [w for w in _registry["watchers"] if w.active]
        if not watchers:
            return
        _registry["index"] += 1
        index = _registry["index"]
        moment.index = index
        full = any(w.seen < w.full for w in watchers)
        for w in watchers:
            w.seen += 1
    _tls.busy = True
    quiet = oom_defer.busy()  # what this schedules waits until the cap's check has returned
    quiet.__enter__()
    try:
        dev = torch.device(cap.device)
        parsed = ParsedOOM(
            # the words of the error the ledger raises next, with the figures after its outputs were freed
            text=f"{cap.device.upper()} out of memory. Tried to allocate {fmt_bytes(requested)}. Device "
            f"{cap.device} has a limit of {fmt_bytes(cap.bytes)} set by {cap.owner}, of which "
            f"{fmt_bytes(max(int(cap.bytes) - used, 0))} is free. Of the allocated memory {fmt_bytes(used)} "
            f"is allocated by tensors torchmem tracks on {cap.device}.",
            is_oom=True,
            source="torchmem_cap",
            backend=dev.type,
            format="torchmem",
            exception_type="torch.OutOfMemoryError",
            requested=requested,
            device_index=dev.index,
            device_free=max(int(cap.bytes) - used, 0),
            allowed=int(cap.bytes),
            allocated=used,
            cap_owner=str(cap.owner),
        )
        _emit(watchers, index, full, dev, "torchmem_cap", parsed, None, moment)
    except Exception as exc:
        _report_once("cap-event", f"torchmem could not record an OOM event ({type(exc).__name__}: {exc}).")
    finally:
        _tls.busy = False
        quiet.__exit__()


def _observer_message(
    device: int,
    requested: int,
    limit_or_total: int,
    device_free: int,
    state: AllocatorState | None,
) -> ParsedOOM:
    """The figures torch hands its observer, as the message it is about to raise would give them."""
    plat = al.platform()
    total = state.device_total if state is not None else None
    allowed = limit_or_total if total is not None and limit_or_total < total else None
    text = (
        f"{'HIP' if plat == 'rocm' else 'CUDA'} out of memory. Tried to allocate {fmt_bytes(requested)}. "
        f"GPU {device} has a total capacity of {fmt_bytes(total)} of which {fmt_bytes(device_free)} is free."
    )
    if allowed is not None:
        text += f" {fmt_bytes(allowed)} allowed;"
    if state is not None and state.allocated is not None and state.cached_free is not None:
        text += (
            f" Of the allocated memory {fmt_bytes(state.allocated)} is allocated by PyTorch, and "
            f"{fmt_bytes(state.cached_free)} is reserved by PyTorch but unallocated."
        )
    return ParsedOOM(
        text=text,
        is_oom=True,
        source="allocator",
        backend=plat,
        format="observer",
        exception_type="torch.OutOfMemoryError",
        requested=requested,
        device_index=device,
        device_total=total,
        device_free=device_free,
        allowed=allowed,
    )


def _site() -> tuple[Any, tuple[int, int] | None]:
    """The user's line that is allocating (``devices._ledger.birth_site``) and its frame's key."""
    site = birth_site(1)
    if site is None:
        return None, None
    f: types.FrameType | None = sys._getframe(1)
    while f is not None:
        c = f.f_code
        if c.co_filename == site.filename and c.co_name == site.function and f.f_lineno == site.lineno:
            return site, (id(f), site.lineno)
        f = f.f_back
    return site, None


def _emit(
    watchers: list[OOMWatch],
    index: int,
    full: bool,
    device: torch.device,
    source: str,
    parsed: ParsedOOM,
    state: AllocatorState | None,
    moment: _Moment,
) -> None:
    """Build the event of one OOM from what the moment shows (the site, the OOM being handled, what its frames
    hold) and deliver it now; the holders of the memory complete its diagnosis where the error reaches the
    program (:mod:`.oom_defer`), when a holder search may run. Never raises."""
    site, key = _site()
    handled_exc = sys.exc_info()[1]
    handled = oom_exception(handled_exc) if handled_exc is not None else None
    del handled_exc
    delivery = _Delivery(watchers, index, full, device, source, parsed, state, moment, site, key)
    if handled is not None:
        delivery.while_handling = _type_name(handled)
        with _lock:
            recent = list(_registry["recent"])
        earlier = match_event(recent, handled)
        delivery.handling_index = earlier.index if earlier is not None else None
        delivery.handled = weakref.ref(handled)
    try:
        pins = _Pins(device if device.type == "cpu" or device.index is not None else None)
        if full:
            _old_exceptions(pins, handled)
        if handled is not None:
            _handled_pins(pins, handled, _stack_ids())
        delivery.pins = pins.out
    except Exception as exc:
        _report_once("event-pins", f"torchmem could not read an OOM's frames ({type(exc).__name__}: {exc}).")
    del handled
    why: str | None = "a later OOM of a long run of them (the first ones were searched)"
    if full and _take_budget(False):
        why = oom_defer.at_catch_point(delivery.complete)
    elif full:
        why = "the holder searches of the last OOMs used up their time budget"
    delivery.deliver(why)


class _Delivery:
    """One OOM's event: delivered at the moment, its diagnosis completed with the holders of the memory where
    the error reaches the program (see :func:`_emit`)."""

    def __init__(
        self,
        watchers: list[OOMWatch],
        index: int,
        full: bool,
        device: torch.device,
        source: str,
        parsed: ParsedOOM,
        state: AllocatorState | None,
        moment: _Moment,
        site: Any,
        key: tuple[int, int] | None,
    ) -> None:
        self.watchers, self.index, self.full, self.device = watchers, index, full, device
        self.source, self.parsed, self.state, self.moment = source, parsed, state, moment
        self.site, self.key = site, key
        self.thread = threading.current_thread().name
        self.timestamp = time.time()
        self.while_handling: str | None = None
        self.handling_index: int | None = None
        self.handled: weakref.ref[BaseException] | None = None
        self.pins: list[PinnedTensor] = []
        self.event: OOMEvent | None = None

    def complete(self) -> None:
        """Called back where the error reached the program: find the holders and complete the event's
        diagnosis with them (the event the watchers got is updated in place)."""
        event = self.event
        if event is None:
            return
        holders, why = None, None
        try:
            exc = sys.exc_info()[1]
            oom = oom_exception(exc) if exc is not None else None
            mine = oom is not None and self._raised(oom)
            holders = _holders(
                self.device,
                allocated=self.moment.allocated,
                requested=self.parsed.requested,
                grad_enabled=self.moment.grad_enabled,
                exc=oom if mine else None,
                handled=self.handled() if self.handled is not None else None,
                source=self.source,
                exclude=[self],
            )
            del exc, oom
        except Exception as e:
            why = f"the holder search failed ({type(e).__name__}: {e})"
        diagnosis = self._diagnose(holders, why)
        if diagnosis is not None:
            event._complete(diagnosis)

    def _raised(self, oom: BaseException) -> bool:
        if self.key is None:
            return False
        frame_id, line = self.key
        tb = oom.__traceback__
        while tb is not None:
            if id(tb.tb_frame) == frame_id and tb.tb_lineno == line:
                return True
            tb = tb.tb_next
        return False

    def _diagnose(self, holders: OOMHolders | None, why: str | None) -> OOMDiagnosis | None:
        try:
            notes = []
            if not self.full:
                notes.append(
                    f"Brief diagnosis: OOM #{self.index} of this process; the first ones were read in full "
                    "(segments, other processes, memory held by old exceptions)."
                )
            elif holders is None and why:
                notes.append(f"Who holds the memory was not looked for: {why}.")
            state = self.state
            conf = (
                state.alloc_conf
                if state is not None
                else (al.alloc_conf() if self.source == "allocator" else None)
            )
            return diagnose(
                self.parsed,
                state,
                alloc_conf=conf,
                pinned=self.pins,
                grad_enabled=self.moment.grad_enabled,
                notes=notes,
                while_handling=self.while_handling,
                holders=holders,
            )
        except Exception as exc:
            _report_once(
                "event-diagnosis", f"torchmem could not diagnose an OOM ({type(exc).__name__}: {exc})."
            )
            return None

    def deliver(self, why: str | None) -> None:
        """Diagnose from the moment and hand the event to the watchers (``why``: why no holder search will
        complete it; ``None`` when one will)."""
        site = self.site
        event = OOMEvent(
            index=self.index,
            device=str(self.device),
            requested=self.parsed.requested,
            site=str(site) if site is not None else None,
            function=site.function if site is not None else None,
            filename=site.filename if site is not None else None,
            thread=self.thread,
            timestamp=self.timestamp,
            while_handling=self.while_handling,
            handling_index=self.handling_index,
            source=self.source,
            detail="full" if self.full else "brief",
            diagnosis=self._diagnose(None, why),
        )
        self.event = event
        with _lock:
            _registry["recent"].append(event)
            keys: dict[int, tuple[int, int] | None] = _registry["keys"]
            keys[self.index] = self.key
            while len(keys) > 4 * _RECENT:
                del keys[next(iter(keys))]
        for w in self.watchers:
            if not w.active:
                continue
            try:
                w.callback(event)
            except Exception as exc:
                if not w.failed:
                    w.failed = True
                    emit_warning(
                        f"torchmem: an OOM event callback failed ({type(exc).__name__}: {exc}); the "
                        "out-of-memory error itself goes on unchanged."
                    )


def _holders(
    device: torch.device,
    *,
    allocated: int | None,
    requested: int | None,
    grad_enabled: bool | None,
    exc: BaseException | None,
    handled: BaseException | None,
    source: str | None,
    exclude: list[Any],
    when: str = "at the OOM",
) -> OOMHolders:
    """Who holds the memory of ``device`` now (:func:`~torchmem.analysis.oom.holders.oom_holders`), on the
    CPU under a torchmem cap counting only what its ledger counts; spends the holder budget."""
    from torchmem.analysis.oom.holders import oom_holders

    only: set[int] | None = None
    if device.type == "cpu" and source == "torchmem_cap" and ledger().active:
        only = {st._cdata for st, _ in ledger().largest("cpu", 1 << 62)}
    with oom_defer.busy():
        found = oom_holders(
            device,
            allocated=allocated,
            requested=requested,
            grad_enabled=grad_enabled,
            exc=exc,
            handled=handled,
            only=only,
            exclude=exclude,
            when=when,
        )
    _spend(found.seconds)
    return found


def _message_device(p: ParsedOOM) -> str | None:
    if p.backend == "cpu":
        return "cpu"
    if p.backend in ("cuda", "rocm") and p.device_index is not None:
        return f"cuda:{p.device_index}"
    return None


def same_event(event: OOMEvent, exc: BaseException) -> bool:
    """Whether ``exc`` (or the OOM in its cause/context chain) is the error ``event`` recorded — e.g. the
    exception that ended the program, to record that event as not caught.

    Matched on the frame and line that raised it (the event's site frame is in the exception's traceback),
    the device and the request. Frames are reused after they die, so several old events of one retry loop
    may match: :func:`match_event` takes the latest.

    Example:
        >>> import torch, torchmem
        >>> events = []
        >>> with watch_ooms(events.append), torchmem.limit("1MiB", "cpu"):
        ...     try:
        ...         x = torch.ones(1 << 19)
        ...     except torch.OutOfMemoryError as e:
        ...         print(same_event(events[-1], e))
        True
    """
    if not isinstance(exc, BaseException):
        return False
    oom = oom_exception(exc)
    if oom is None:
        return False
    parsed = parse_oom_message(str(oom))
    if parsed is not None and parsed.is_oom:
        if (
            parsed.requested is not None
            and event.requested is not None
            and not _same_request(event.requested, parsed.requested)
        ):
            return False
        dev = _message_device(parsed)
        if dev is not None and dev != event.device:
            return False
    with _lock:
        key = _registry["keys"].get(event.index)
    if key is None:
        return event.site is None  # raised where no user frame was (a backward thread): request and device
    frame_id, line = key
    tb: types.TracebackType | None = oom.__traceback__
    while tb is not None:
        if id(tb.tb_frame) == frame_id and tb.tb_lineno == line:
            return True
        tb = tb.tb_next
    return False


def match_event(events: Sequence[OOMEvent], exc: BaseException) -> OOMEvent | None:
    """The latest of ``events`` that :func:`same_event` matches with ``exc``, or ``None``."""
    for event in reversed(events):
        if same_event(event, exc):
            return event
    return None


# ---------------------------------------------------------------------------------------------------------
# the public entry point


def explain_oom(
    exc_or_message: BaseException | str,
    *,
    device: DeviceLike = None,
    state: AllocatorState | None = None,
    leak: Any = None,
    batch_size: int | None = None,
    working_set: Sequence[WorkingSetItem] = (),
    alloc_conf: str | None = None,
    holders: bool | None = None,
) -> OOMDiagnosis:
    """Explain an out-of-memory error: ranked causes, each with its evidence and the fixes it supports.

    Given an exception, the OOM is found by type in its ``__cause__``/``__context__`` chain, and the
    allocator state comes from the OOM observer (:func:`attach_oom_observer`) when it captured this OOM,
    else it is read now (a note says so). Given a message (a pasted log line), only the message is used —
    unless ``device`` or ``state`` is given, which says the message comes from this process. Memory held by
    an earlier exception or notebook output is looked for in this process when explaining a live exception;
    an OOM raised while an earlier OOM was being handled (its ``__context__``: a retry inside ``except``)
    is ``pinned_by_exception`` by what the earlier one's finished frames hold.

    Given a live exception, it also says who holds the memory of the OOM's device (``diagnosis.holders``:
    the largest holders — variables, containers, the autograd graphs tensors keep, models, optimizers, the
    frames of exceptions — with their bytes, what has no holder, what no live tensor explains) and the
    situations they show, each a cause with its own fix: a training graph kept during evaluation
    (``del out, loss``), the previous batch's outputs kept, an optimizer of a deleted model, the failed
    attempt's frames of a retry inside ``except``, a cycle through autograd. The search takes up to a second
    (bounded by time and objects; what it did not search is said); the one made where the error reached the
    program, for :func:`watch_ooms`, is reused.

    Args:
        exc_or_message: The exception (any exception whose chain holds the OOM) or the message text.
        device: The device of the OOM (default: the one the message names, else the current one).
        state: An allocator state to use instead of reading one.
        leak: A leak trend from a running watcher (its report, or a dict with ``bytes_per_step`` and
            ``culprits``).
        batch_size: The batch size of the failing step, to suggest a smaller one.
        working_set: The step's biggest holders or categories, when known.
        alloc_conf: The allocator settings in effect (default: ``PYTORCH_CUDA_ALLOC_CONF`` and friends from
            the environment).
        holders: Look for who holds the memory (live exceptions only): ``None`` within the process's budget
            of holder searches (:data:`HOLDER_BUDGET`, so that a loop of OOMs does not pay one per OOM),
            ``True`` always, ``False`` never.

    Returns:
        An :class:`~torchmem.results.oom.OOMDiagnosis`; ``is_oom`` is ``False`` (and nothing else is set)
        when the input is not an out-of-memory error.

    Raises:
        OOMInputError: ``exc_or_message`` is neither an exception nor a string.

    Example:
        >>> import torchmem
        >>> d = torchmem.explain_oom("CUDA out of memory. Tried to allocate 96.00 GiB. GPU 0 has a total "
        ...     "capacity of 79.19 GiB of which 70.00 GiB is free.")     # doctest: +SKIP
        >>> d.causes[0].kind                                               # doctest: +SKIP
        'too_large'
    """
    live_exc: BaseException | None = None
    if isinstance(exc_or_message, str):
        text = exc_or_message
    elif isinstance(exc_or_message, BaseException):
        live_exc = oom_exception(exc_or_message)
        text = str(live_exc) if live_exc is not None else str(exc_or_message)
        if live_exc is not None and not text.strip():
            text = f"{type(live_exc).__name__}: out of memory"
    else:
        raise OOMInputError(
            f"explain_oom needs an exception or a message, not a {type(exc_or_message).__name__}.",
            "Pass the caught exception (except torch.OutOfMemoryError as e: explain_oom(e)) or its text.",
        )
    parsed = parse_oom_message(text)
    if isinstance(exc_or_message, BaseException) and live_exc is None:
        return OOMDiagnosis(
            False,
            parsed if parsed is not None and not parsed.is_oom else None,
            (),
            (),
            notes=(f"{type(exc_or_message).__name__} is not an out-of-memory error.",),
        )
    if parsed is None and live_exc is not None:
        parsed = parse_oom_message(f"{type(live_exc).__name__}: {text}")
    if parsed is None:
        return OOMDiagnosis(False, None, (), (), notes=("The text holds no out-of-memory message.",))
    if not parsed.is_oom:
        return diagnose(parsed)
    notes: list[str] = []
    this_process = live_exc is not None or device is not None or state is not None
    at_oom = state is not None  # a state handed in, or one the observer captured: autograd's mode of the OOM
    if state is None and this_process and parsed.backend in ("cuda", "rocm", None):
        dev = _oom_device(device, parsed.device_index)
        if dev is not None and dev.type == "cuda":
            captured = last_oom_state(dev.index)
            if (
                captured is not None
                and captured.timestamp is not None
                and time.time() - captured.timestamp < 600
                and _same_request(captured.requested, parsed.requested)
            ):
                state, at_oom = captured, True
            elif al.cuda_ready():
                state = capture_state(dev, requested=parsed.requested)
                notes.append(
                    "Allocator state read after the OOM, not at it (attach_oom_observer() captures it at the "
                    "moment); temporaries freed while the exception unwound are not in it."
                )
    pinned: list[PinnedTensor] = []
    while_handling: str | None = None
    handled: BaseException | None = None
    if live_exc is not None:
        try:
            # the OOM's device: torchmem's CPU cap counts CPU tensors; elsewhere the accelerators' ones
            on = torch.device("cpu") if parsed.backend == "cpu" else None
            outer = exc_or_message if isinstance(exc_or_message, BaseException) else live_exc
            pins = _Pins(on)
            _old_exceptions(pins, outer)
            # raised while an earlier OOM was being handled (a retry inside except): that OOM's finished
            # frames were alive at the raise; the frames this one went through were running then
            ctx = live_exc.__context__
            handled = oom_exception(ctx) if ctx is not None else None
            if handled is not None:
                while_handling = _type_name(handled)
                earlier = {id(e) for e in exception_chain(handled)}
                running = _stack_ids() | _frame_ids(
                    e.__traceback__
                    for e in exception_chain(outer)
                    if id(e) not in earlier and e.__traceback__ is not None
                )
                _handled_pins(pins, handled, running)
            pinned = pins.out
        except Exception as exc:
            notes.append(f"Could not look for memory held by old exceptions ({type(exc).__name__}).")
    conf = (
        alloc_conf if alloc_conf is not None else (state.alloc_conf if state is not None else al.alloc_conf())
    )
    machine = None
    if parsed.source == "cpu_allocator" and parsed.device_total is None:
        # the CPU allocator's message gives only the request: judge it against this machine's memory
        machine = machine_memory(read_here=not this_process)
    moment = _moment_for(None if state is None else state.device, parsed.requested) if this_process else None
    grad_enabled = state.grad_enabled if state is not None and at_oom else None
    if grad_enabled is None and moment is not None:
        grad_enabled = moment.grad_enabled
    found: OOMHolders | None = None
    if live_exc is not None and holders is not False:
        try:
            found = _explained_holders(
                live_exc, parsed, state, device, moment, grad_enabled, handled, holders
            )
        except Exception as exc:
            notes.append(f"Who holds the memory could not be found ({type(exc).__name__}: {exc}).")
        if found is None and holders is None and not _registry_budget_left():
            notes.append(
                "Who holds the memory was not looked for: the holder searches of the last OOMs used up their "
                "time budget (explain_oom(..., holders=True) looks anyway)."
            )
    return diagnose(
        parsed,
        state,
        alloc_conf=conf,
        leak=leak,
        pinned=pinned,
        working_set=working_set,
        batch_size=batch_size,
        grad_enabled=grad_enabled,
        notes=notes,
        machine=machine,
        while_handling=while_handling,
        holders=found,
    )


def _registry_budget_left() -> bool:
    with _lock:
        left = _registry["budget"][0]
    return left is None or left > 0


def _explained_holders(
    exc: BaseException,
    parsed: ParsedOOM,
    state: AllocatorState | None,
    device: DeviceLike,
    moment: _Moment | None,
    grad_enabled: bool | None,
    handled: BaseException | None,
    force: bool | None,
) -> OOMHolders | None:
    """Who holds the memory of ``exc``'s device: the search its event made where the error reached the
    program, else one now (within the budget unless ``force``); ``None`` where the device is not here."""
    if threading.current_thread() is threading.main_thread():
        oom_defer.run_now()  # this OOM's event first: its search ran at the moment the error arrived
    dev: torch.device | None = None
    if parsed.backend == "cpu":
        dev = torch.device("cpu")
    elif state is not None and state.device and state.device.startswith("cuda"):
        dev = torch.device(state.device)
    elif parsed.backend in ("cuda", "rocm", None):
        d = _oom_device(device, parsed.device_index)
        dev = d if d is not None and d.type == "cuda" and al.cuda_ready() else None
    if dev is None:
        return None
    with _lock:
        recent = list(_registry["recent"])
    event = match_event(recent, exc)
    if event is not None and event.diagnosis is not None and event.diagnosis.holders is not None:
        return event.diagnosis.holders
    if not _take_budget(bool(force)):
        return None
    allocated = state.allocated if state is not None else None
    if allocated is None and parsed.source == "torchmem_cap":
        allocated = parsed.allocated
    if allocated is None and moment is not None:
        allocated = moment.allocated
    return _holders(
        dev,
        allocated=allocated,
        requested=parsed.requested,
        grad_enabled=grad_enabled,
        exc=exc,
        handled=handled,
        source=parsed.source,
        exclude=[],
        when="when the OOM was explained",
    )


def machine_memory(*, read_here: bool = False) -> MachineMemory | None:
    """This machine's memory as :func:`~torchmem.analysis.oom.diagnose` takes it: total RAM, the cgroup
    (container) limit when one is set, what is available; ``None`` when none of it can be read.

    ``read_here``: the figures are for a pasted message, which may come from another machine (a note says
    so in the diagnosis).

    Example:
        >>> m = machine_memory()
        >>> m is None or (m.total or 1) > 0
        True
    """
    from torchmem.devices._host import host_memory

    try:
        h = host_memory()
    except Exception:  # reading the OS must never turn an OOM explanation into another error
        return None
    if h.physical is None and h.cgroup_limit is None:
        return None
    return MachineMemory(
        physical=h.physical,
        physical_source=h.physical_source,
        cgroup_limit=h.cgroup_limit,
        cgroup_source=h.cgroup_source,
        available=h.available,
        read_here=read_here,
    )


def _same_request(a: int | None, b: int | None) -> bool:
    if a is None or b is None:
        return True
    return abs(a - b) <= max(1 << 20, b // 100)


def _oom_device(device: DeviceLike, index: int | None) -> torch.device | None:
    """The device of the OOM: the one given, else the CUDA device the message names when this process sees
    it, else the current one; ``None`` without CUDA."""
    if device is not None:
        return resolve(device)
    if not cuda_available():
        return None
    if index is not None and index < al.device_count():
        return torch.device("cuda", index)
    return resolve(None)
