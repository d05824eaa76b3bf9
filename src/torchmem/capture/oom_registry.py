"""What the OOM capture shares across the process: the registered callbacks and watchers (:class:`OOMWatch`),
the OOMs seen and the last events, autograd's mode and the figures at each raise, and the holder-search
budget (:data:`HOLDER_BUDGET`).

torch cannot detach an allocator OOM observer, so torchmem attaches one per process and dispatches from this
one registry (:mod:`torchmem.capture.oom_events`); :mod:`torchmem.capture.oom` registers and explains.
Re-exported by :mod:`torchmem.capture.oom`.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from torchmem._warn import emit_warning
from torchmem.capture import oom_defer
from torchmem.results.oom import AllocatorState, OOMEvent

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


def _report_once(key: str, message: str) -> None:
    with _lock:
        if key in _registry["reported"]:
            return
        _registry["reported"].add(key)
    emit_warning(message)  # the user's line; never raises, even with warnings as errors


def _observer_problem() -> str | None:
    with _lock:
        problem: str | None = _registry["problem"] or _registry["init_problem"]
    return problem


def _registry_budget_left() -> bool:
    with _lock:
        left = _registry["budget"][0]
    return left is None or left > 0


def _same_request(a: int | None, b: int | None) -> bool:
    if a is None or b is None:
        return True
    return abs(a - b) <= max(1 << 20, b // 100)


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


__all__ = ["FULL_EVENTS", "HOLDER_BUDGET", "HOLDER_REFILL", "EventCallback", "OOMCallback", "OOMWatch"]
