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

The parts live beside this module and are re-exported here: the device and host reads in
:mod:`torchmem.capture.oom_state`, memory pinned by old exceptions in :mod:`torchmem.capture.oom_pins`, the
process-wide registry and holder-search budget in :mod:`torchmem.capture.oom_registry`, and what happens at
each OOM (the observer's callback, the caps', each event built and delivered) in
:mod:`torchmem.capture.oom_events`. This module attaches, registers and explains.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from torchmem._errors import TorchmemError
from torchmem._exceptions import exception_chain
from torchmem.analysis.oom import diagnose, oom_exception, parse_oom_message
from torchmem.capture import oom_defer
from torchmem.capture.oom_events import _holders, _on_oom, match_event, record_cap_oom, same_event
from torchmem.capture.oom_pins import (
    _frame_ids,
    _handled_pins,
    _old_exceptions,
    _Pins,
    _stack_ids,
    _type_name,
    pinned_tensors,
)
from torchmem.capture.oom_registry import (
    FULL_EVENTS,
    HOLDER_BUDGET,
    HOLDER_REFILL,
    EventCallback,
    OOMCallback,
    OOMWatch,
    _attach_lock,
    _lock,
    _Moment,
    _moment_for,
    _observer_problem,
    _registry,
    _registry_budget_left,
    _same_request,
    _take_budget,
)
from torchmem.capture.oom_state import capture_state, machine_memory
from torchmem.devices import DeviceLike, cuda_available, resolve
from torchmem.devices import _allocator as al
from torchmem.results.oom import (
    AllocatorState,
    OOMDiagnosis,
    OOMHolders,
    ParsedOOM,
    PinnedTensor,
    WorkingSetItem,
)


class OOMInputError(TorchmemError):
    """``explain_oom`` was given something that is neither an exception nor a message."""


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


def _attach_at_init() -> None:
    """Queued on torch's lazy CUDA initialisation (or run at once when CUDA is initialised)."""
    _ensure_attached()


def check_cuda_observer() -> str | None:
    """Attach the CUDA observer now if CUDA came up without torch's lazy-init queue (an old or changed
    torch); cheap otherwise. Returns why CUDA OOMs cannot be seen, ``None`` when they can (or CUDA is
    unused)."""
    al.run_pending_cuda_init()
    return _observer_problem()


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


__all__ = [
    "FULL_EVENTS",
    "HOLDER_BUDGET",
    "HOLDER_REFILL",
    "EventCallback",
    "OOMCallback",
    "OOMInputError",
    "OOMObserver",
    "OOMWatch",
    "attach_oom_observer",
    "capture_state",
    "check_cuda_observer",
    "explain_oom",
    "last_oom_state",
    "machine_memory",
    "match_event",
    "pinned_tensors",
    "record_cap_oom",
    "same_event",
    "watch_ooms",
]
