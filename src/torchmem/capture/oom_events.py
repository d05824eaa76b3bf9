"""OOM events: every out-of-memory error at the moment it is raised, caught by the program or not.

torch's caching allocator calls :func:`_on_oom` (torchmem's one observer) after an allocation failed, before
raising; torchmem's CPU caps call :func:`record_cap_oom`. Each reads what must be read at that moment (the
allocator's figures, the user's line, the OOM being handled, autograd's mode), builds the
:class:`~torchmem.results.oom.OOMEvent` with a diagnosis of the moment and delivers it to the watchers of
:func:`torchmem.capture.oom.watch_ooms`; who holds the memory is looked for later, where the error reaches the
program (:mod:`torchmem.capture.oom_defer`), and completes the event's diagnosis. :func:`same_event` /
:func:`match_event` tell which event an exception was. Re-exported by :mod:`torchmem.capture.oom`.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import types
import weakref
from collections.abc import Sequence
from typing import Any

import torch

from torchmem._format import fmt_bytes
from torchmem._warn import emit_warning
from torchmem.analysis.oom import diagnose, oom_exception, parse_oom_message
from torchmem.capture import oom_defer
from torchmem.capture.oom_pins import _handled_pins, _old_exceptions, _Pins, _stack_ids, _type_name
from torchmem.capture.oom_registry import (
    _RECENT,
    FULL_EVENTS,
    OOMWatch,
    _lock,
    _Moment,
    _registry,
    _remember,
    _report_once,
    _same_request,
    _spend,
    _take_budget,
    _tls,
)
from torchmem.capture.oom_state import capture_state
from torchmem.devices import _allocator as al
from torchmem.devices._ledger import birth_site, ledger
from torchmem.results.oom import AllocatorState, OOMDiagnosis, OOMEvent, OOMHolders, ParsedOOM, PinnedTensor


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
        >>> from torchmem.capture.oom import watch_ooms
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


__all__ = ["match_event", "record_cap_oom", "same_event"]
