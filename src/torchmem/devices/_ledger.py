"""Exact live-bytes accounting of tensor storages, on any device, through a dispatch mode.

Every aten op that runs while the ledger is on is seen by :class:`_LedgerMode`. Each output whose storage
the ledger has not seen, and that is not one of the op's inputs (a view, an in-place result, ``out=``), is
a new storage: its ``nbytes()`` is added and a weak reference with a callback on its ``untyped_storage()``
subtracts it when the storage dies. Tensors that only autograd holds (saved for backward) are storages like
any other, so they are counted until the graph is freed. ``resize_`` and ``out=`` growth are followed by
re-reading ``nbytes()`` of the storages a mutating op touched.

What is counted: storages created while the ledger was on, on the threads where it was on (plus autograd's
backward, which inherits the dispatch-mode state). Memory that does not belong to a tensor storage
(allocator caches, library workspaces) is not a tensor and is not counted.

Cost: a few µs per op on the thread where it is on, on top of torch's own dispatch-mode machinery (about as
much again): opt-in, or on only while it is needed (``benchmarks/ledger_cost.py``).
"""

from __future__ import annotations

import functools
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from torchmem._warn import ReportedOnce, emit_warning
from torchmem.devices._ledger_ops import (
    MANY_OUTPUTS,
    OpFacts,
    inner_tensors,
    input_storage_keys,
    is_input_storage,
    op_facts,
    written_sizes,
)
from torchmem.devices._ledger_sites import EngineCalls
from torchmem.devices._ledger_sites import Site as Site  # imported from here too (capture/)
from torchmem.devices._ledger_sites import birth_site as birth_site  # (capture/host.py, oom.py)
from torchmem.devices._ledger_threads import ThreadSwitch

try:  # private module, present in every torch >= 2.0; guarded so a rename degrades to "unavailable"
    from torch.utils._python_dispatch import TorchDispatchMode as _TorchDispatchMode
except ImportError:  # pragma: no cover - exercised only on a torch that dropped it
    _TorchDispatchMode = None  # type: ignore[assignment,misc]


_SKIP_DEVICES = frozenset({"meta"})


class Cohort:
    """The storages born while a cohort was open, and how many of them are still alive.

    Opened by :meth:`Ledger.open_cohort`; used by ``track()`` to say what survived a block.
    """

    __slots__ = ("_keys", "born_bytes", "born_count", "closed", "device", "devices", "live_bytes", "sites")

    def __init__(self, device: str | None, sites: bool = False) -> None:
        self.device = device  # None: every device
        self.devices: set[str] = set()  # every device a storage was born on while open (alive or not)
        self.sites = sites  # record each birth's allocation site (the user's file:line)
        self._keys: set[int] = set()
        self.born_bytes = 0
        self.born_count = 0
        self.live_bytes = 0
        self.closed = False

    @property
    def live_count(self) -> int:
        """Storages born in the cohort that are still alive."""
        return len(self._keys)


class Watermark:
    """A peak counter for one device that starts at the current figure when opened."""

    __slots__ = ("device", "peak", "start")

    def __init__(self, device: str, current: int) -> None:
        self.device = device
        self.start = current
        self.peak = current


class Cap:
    """A byte cap on one device's counted figure, checked after every op (used by ``limit()``/``budget()``).

    ``hard``: the op that takes the figure over ``bytes`` fails with ``torch.OutOfMemoryError`` (its output
    storages are freed first, and the peaks do not count them). Soft: the first crossing only calls
    ``on_cross``. ``on_cross(cap)`` runs after the op, outside the ledger's lock, at most once per cap.
    """

    __slots__ = ("bytes", "crossed", "device", "hard", "on_cross", "owner", "requested")

    def __init__(
        self,
        device: str,
        nbytes: int,
        hard: bool,
        owner: str = "torchmem.limit()",
        on_cross: Callable[[Cap], None] | None = None,
    ) -> None:
        self.device = device
        self.bytes = nbytes
        self.hard = hard
        self.owner = owner  # who set it, for the OOM message
        self.on_cross = on_cross
        self.crossed = False
        self.requested = 0  # size of the allocation that crossed


class _Entry(weakref.ref):  # type: ignore[type-arg]
    """A counted storage: a weak reference to it (calling the entry gives the storage, or None once dead)
    that carries what was counted. Its callback (the ledger's ``_released``) receives the entry itself, so a
    birth builds one object, not an entry, a reference and a closure."""

    __slots__ = ("base", "cohorts", "device", "key", "nbytes", "site")

    key: int
    device: str
    nbytes: int  # bytes counted
    base: int  # bytes the storage had before the ledger saw it (never counted)
    cohorts: tuple[Cohort, ...]
    site: Site | None


class Ledger:
    """Live bytes per device, counted exactly from storage births and deaths.

    One process-wide instance (:func:`ledger`) is shared by every thread that turns it on; counts are
    kept per device string (``"cpu"``, ``"cuda:0"``). Which threads record is its :class:`ThreadSwitch`'s
    business (``devices/_ledger_threads.py``); where a storage was born, its :class:`EngineCalls`' and
    :func:`birth_site`'s (``devices/_ledger_sites.py``).
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._live: dict[int, _Entry] = {}
        self._current: dict[str, int] = {}
        self._peak: dict[str, int] = {}
        self._cohorts: list[Cohort] = []
        self._watermarks: list[Watermark] = []
        self._ops: dict[int, OpFacts] = {}  # id(op) -> its facts (each keeps its op alive)
        # the warning's fallback frame (all torchmem's and torch's): report_error's caller's caller
        self._reported = ReportedOnce(
            functools.partial(emit_warning, stacklevel=4),
            "torchmem: tensor accounting failed in {where} ({error}); figures may be low",
        )
        self._caps: list[Cap] = []  # limit()/budget(): see the "caps" section
        self._crossing = threading.local()  # per thread: the caps the last op crossed
        self._device_names: dict[Any, str] = {}  # torch.device -> "cpu", "cuda:0"
        self._on_death = self._released  # one bound method for every entry's callback
        self._engine = EngineCalls()
        self._switch = ThreadSwitch(self._lock, lambda: _mode_class()(self), self._forget)
        self._site_listeners: list[Callable[[bool], None]] = []  # see on_sites

    # -- births on engine threads ----------------------------------------------------------------
    @property
    def wants_sites(self) -> bool:
        """Whether a cohort that records birth sites is open (cheap: read without the lock)."""
        return any(c.sites for c in self._cohorts)

    def enter_engine_call(self, skip: int = 2) -> tuple[int, Site] | None:
        """The program calls into an engine that allocates on other threads (``backward()``): births on a
        thread with no program frame are given the caller's site until :meth:`leave_engine_call`. Returns
        what to hand back to it."""
        return self._engine.enter(skip + 1)

    def leave_engine_call(self, prev: tuple[int, Site] | None) -> None:
        self._engine.leave(prev)

    @property
    def _engine_caller(self) -> tuple[int, Site] | None:
        """The engine call under way: (the caller's thread, its site) (read by tests)."""
        return self._engine.caller

    # -- reading ---------------------------------------------------------------------------------
    @property
    def active(self) -> bool:
        """Whether any thread has the ledger on."""
        return self._switch.users > 0

    def current(self, device: str) -> int:
        return self._current.get(device, 0)

    def peak(self, device: str) -> int:
        return self._peak.get(device, 0)

    def counts(self, key: int) -> bool:
        """Whether the storage with this key (``untyped_storage()._cdata``) is counted (cheap: no lock)."""
        return key in self._live

    def live_storages(self, device: str | None = None) -> int:
        with self._lock:
            return sum(1 for e in self._live.values() if device is None or e.device == device)

    def reset_peak(self, device: str) -> None:
        with self._lock:
            self._peak[device] = self._current.get(device, 0)

    # -- cohorts and watermarks (used by track()) ------------------------------------------------
    def cohort_storages(self, cohort: Cohort) -> list[Any]:
        """The live storage objects born in ``cohort`` (strong references: drop them soon)."""
        out = []
        with self._lock:
            for key in list(cohort._keys):
                e = self._live.get(key)
                s = e() if e is not None else None
                if s is not None:
                    out.append(s)
        return out

    def cohort_entries(self, cohort: Cohort) -> list[tuple[Any, int, Site | None]]:
        """``(storage, counted bytes, birth site)`` of each live storage born in ``cohort``, oldest first.

        Strong references: drop them soon.
        """
        out = []
        with self._lock:
            keys = cohort._keys
            for key, e in list(self._live.items()):  # insertion order is birth order
                if key not in keys:
                    continue
                s = e()
                if s is not None:
                    out.append((s, e.nbytes, e.site))
        return out

    def cohort_site_bytes(self, cohort: Cohort) -> dict[Site | None, tuple[int, int]]:
        """Live bytes and storage count per birth site of the storages born in ``cohort`` (no strong refs)."""
        out: dict[Site | None, tuple[int, int]] = {}
        with self._lock:
            for key in cohort._keys:
                e = self._live.get(key)
                if e is None:
                    continue
                b, n = out.get(e.site, (0, 0))
                out[e.site] = (b + e.nbytes, n + 1)
        return out

    def open_cohort(self, device: str | None, sites: bool = False) -> Cohort:
        c = Cohort(device, sites)
        with self._lock:
            first = sites and not self.wants_sites
            self._cohorts.append(c)
        if first:
            self._tell_sites(True)
        return c

    def close_cohort(self, cohort: Cohort) -> None:
        with self._lock:
            had = self.wants_sites
            if cohort in self._cohorts:
                self._cohorts.remove(cohort)
            cohort.closed = True
            last = had and not self.wants_sites
        if last:
            self._tell_sites(False)

    def on_sites(self, listener: Callable[[bool], None]) -> Callable[[], None]:
        """Call ``listener(True)`` when the first cohort that records birth sites opens (:attr:`wants_sites`
        turns true) and ``listener(False)`` when the last one closes; returns the undo. A listener's error
        is its own (caught and said once)."""
        self._site_listeners.append(listener)

        def remove() -> None:
            if listener in self._site_listeners:
                self._site_listeners.remove(listener)

        return remove

    def _tell_sites(self, on: bool) -> None:
        for listener in tuple(self._site_listeners):
            try:
                listener(on)
            except Exception as exc:
                self.report_error("a site listener", exc)

    def open_watermark(self, device: str) -> Watermark:
        with self._lock:
            w = Watermark(device, self._current.get(device, 0))
            self._watermarks.append(w)
        return w

    def close_watermark(self, mark: Watermark) -> None:
        with self._lock:
            if mark in self._watermarks:
                self._watermarks.remove(mark)

    # -- switching on and off --------------------------------------------------------------------
    @contextmanager
    def enabled(self) -> Iterator[Ledger]:
        """Turn recording on for the calling thread for the duration of the block (re-entrant)."""
        if _TorchDispatchMode is None:  # pragma: no cover
            from torchmem._errors import TrackingError

            raise TrackingError(
                "This torch build has no torch.utils._python_dispatch.TorchDispatchMode.",
                "Exact tensor accounting needs torch >= 2.0.",
            )
        with self._switch.on():
            yield self

    def on_this_thread(self) -> bool:
        return self._switch.on_this_thread()

    @property
    def _tls(self) -> threading.local:
        """This thread's recording state (``mode``: the mode pushed, ``depth``: its users; read by tests)."""
        return self._switch.local

    # -- the program's other threads -------------------------------------------------------------
    def follow_threads(self) -> bool:
        """Turn recording on in the program's other Python threads too (a producer thread filling a queue),
        until :meth:`unfollow_threads`: each thread turns it on itself at its next Python call or return
        (a one-shot profile function, ``threading.setprofile_all_threads``), where no dispatch mode of its
        own is on. Returns whether it did: not before Python 3.12 (no way to reach a running thread), and
        not while any profile function is set (``cProfile``, ``torch.profiler``'s Python tracer: replacing
        it would change what the program measures) — births on other threads then stay unrecorded."""
        return self._switch.follow()

    def unfollow_threads(self) -> None:
        """Undo :meth:`follow_threads`. The followed threads stop counting as users now (the ledger is off
        once the program's own users are gone, whatever those threads do); each turns its recording off at
        its next Python event — a thread blocked in C for the rest of the run keeps an idle mode pushed,
        which records nothing while it is blocked."""
        self._switch.unfollow()

    @property
    def _followed(self) -> frozenset[int]:
        """The threads recording because they are followed (read by tests)."""
        return self._switch.followed

    @property
    def _releasing(self) -> frozenset[int]:
        """The threads no longer followed that have not turned their recording off yet (read by tests)."""
        return self._switch.releasing

    def _forget(self) -> None:
        # Last user gone: forget every entry; a late callback finds its entry gone and does nothing.
        self._live.clear()
        self._current.clear()
        self._peak.clear()

    # -- recording -------------------------------------------------------------------------------
    def _facts(self, func: Any) -> OpFacts:
        """What the recording path needs to know about an op, read from its schema once."""
        found = self._ops.get(id(func))
        if found is not None and found.func is func:
            return found
        facts = op_facts(func)
        self._ops[id(func)] = facts  # keeps func alive: its id is never reused while it is a key
        return facts

    def _is_mutable(self, func: Any) -> bool:
        return bool(self._facts(func).written)

    def _add(self, key: int, storage: Any, device: str, nbytes: int, base: int = 0) -> None:
        """Count a new storage (called under the lock)."""
        e = _Entry(storage, self._on_death)
        e.key = key
        e.device = device
        e.nbytes = nbytes
        e.base = base
        e.site = None
        e.cohorts = ()
        if self._cohorts:
            cohorts = tuple(c for c in self._cohorts if c.device is None or c.device == device)
            if cohorts:
                e.cohorts = cohorts
                if any(c.sites for c in cohorts):
                    site = birth_site(3)
                    e.site = site if site is not None else self._engine.site_elsewhere()
                for c in cohorts:
                    c._keys.add(key)
                    c.devices.add(device)
                    c.born_bytes += nbytes
                    c.born_count += 1
                    c.live_bytes += nbytes
        self._live[key] = e
        current = self._current
        cur = current.get(device, 0) + nbytes
        current[device] = cur
        if nbytes > 0 and (self._caps or self._watermarks or cur > self._peak.get(device, 0)):
            self._grown(device, cur, nbytes)

    def _grow(self, device: str, delta: int) -> None:
        cur = self._current.get(device, 0) + delta
        self._current[device] = cur
        if delta > 0:
            self._grown(device, cur, delta)

    def _grown(self, device: str, cur: int, delta: int) -> None:
        """After a growth by ``delta`` to ``cur``: caps, the peak, the watermarks."""
        if self._caps and self._check_caps(device, cur, delta):
            return  # a hard cap refused it: the op will fail, so it never reaches a peak
        if cur > self._peak.get(device, 0):
            self._peak[device] = cur
        for w in self._watermarks:
            if w.device == device and cur > w.peak:
                w.peak = cur

    def _released(self, entry: _Entry) -> None:
        """A counted storage died (the weak reference's callback; any thread, any time)."""
        with self._lock:
            key = entry.key
            if self._live.get(key) is not entry:
                return  # forgotten (the ledger went off), or a newer storage reuses the key
            del self._live[key]
            self._current[entry.device] = self._current.get(entry.device, 0) - entry.nbytes
            for c in entry.cohorts:
                if key in c._keys:
                    c._keys.discard(key)
                    c.live_bytes -= entry.nbytes

    def _resize(self, entry: _Entry, key: int, total: int) -> None:
        counted = max(total - entry.base, 0)
        delta = counted - entry.nbytes
        entry.nbytes = counted
        for c in entry.cohorts:
            if key in c._keys:
                c.live_bytes += delta
                if delta > 0:
                    c.born_bytes += delta
        self._grow(entry.device, delta)

    def _device_name(self, device: Any) -> str:
        """``"cpu"``, ``"cuda:0"``; ``""`` for a device whose storages are not counted (meta)."""
        name = self._device_names.get(device)
        if name is None:
            name = "" if device.type in _SKIP_DEVICES else str(device)
            self._device_names[device] = name
        return name

    def _record_output(
        self, fresh: bool, args: tuple[Any, ...], kwargs: Any, t: torch.Tensor, inputs: set[int] | None = None
    ) -> None:
        """Account for one output tensor of an op (called under the lock). ``fresh``: an op whose output
        is a new allocation even when it is handed through as an input (``lift_fresh``). ``inputs``: the
        inputs' storage keys when the op has many outputs (see :func:`input_storage_keys`)."""
        if type(t) is not torch.Tensor:
            inner = inner_tensors(t)
            if inner is not None:  # a wrapper subclass (DTensor): what it holds is its inner tensors
                keys = inputs if inputs is not None else input_storage_keys(args, kwargs)
                for x in inner:
                    self._record_output(fresh, args, kwargs, x, keys)
                return
        try:
            s = t.untyped_storage()
        except (RuntimeError, NotImplementedError, TypeError):  # sparse, nested and other storage-less
            return
        key = s._cdata
        e = self._live.get(key)
        if e is not None:  # a storage the ledger counts: a view, an in-place or out= result (size may change)
            n = s.nbytes()
            if n != e.nbytes + e.base:
                self._resize(e, key, n)
            return
        # A storage the ledger has not seen is new unless it is an input's: a view or in-place result of a
        # storage that predates the ledger.
        if not fresh and (key in inputs if inputs is not None else is_input_storage(key, t, args, kwargs)):
            return
        dev = s.device
        name = self._device_names.get(dev)
        if name is None:
            name = self._device_name(dev)
        if name:
            self._add(key, s, name, s.nbytes())

    def record(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None, out: Any) -> None:
        """Account for the outputs of one op (called by the mode after the op ran)."""
        fresh = self._facts(func).fresh
        with self._lock:
            if isinstance(out, torch.Tensor):
                self._record_output(fresh, args, kwargs, out)
            elif isinstance(out, (tuple, list)):
                inputs = input_storage_keys(args, kwargs) if len(out) > MANY_OUTPUTS else None
                for t in out:
                    if isinstance(t, torch.Tensor):
                        self._record_output(fresh, args, kwargs, t, inputs)

    def record_mutation(self, before: dict[int, tuple[Any, int]]) -> None:
        """After a mutating op: follow storages whose size changed (``resize_``, ``out=``)."""
        with self._lock:
            for key, (s, old) in before.items():
                n = s.nbytes()
                if n == old:
                    continue
                e = self._live.get(key)
                if e is not None:
                    self._resize(e, key, n)
                elif n > old:
                    # A storage from before the ledger grew: count the growth only.
                    name = self._device_name(s.device)
                    if name:
                        self._add(key, s, name, n - old, base=old)

    def sizes_before(
        self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None
    ) -> dict[int, tuple[Any, int]] | None:
        """Before a mutating op: the storages of the arguments it writes (only those can be resized or
        re-pointed: ``resize_``, ``out=``, ``set_``), with their sizes; ``None`` for an op that writes
        none."""
        return written_sizes(self._facts(func), args, kwargs)

    # -- caps (torchmem.limit() / torchmem.budget()) -------------------------------------------------
    def add_cap(self, cap: Cap) -> None:
        with self._lock:
            self._caps.append(cap)

    def remove_cap(self, cap: Cap) -> None:
        with self._lock:
            if cap in self._caps:
                self._caps.remove(cap)

    def caps(self, device: str) -> list[Cap]:
        with self._lock:
            return [c for c in self._caps if c.device == device]

    def largest(self, device: str, n: int) -> list[tuple[Any, int]]:
        """The ``n`` largest live counted storages of ``device``: ``(storage, bytes)`` (strong references)."""
        with self._lock:
            entries = sorted(
                (e for e in self._live.values() if e.device == device),
                key=lambda e: e.nbytes,
                reverse=True,
            )
            out = []
            for e in entries:
                s = e()
                if s is not None:
                    out.append((s, e.nbytes))
                if len(out) >= n:
                    break
            return out

    def _check_caps(self, device: str, cur: int, delta: int) -> bool:
        """Called by ``_grow`` under the lock on growth: marks crossed caps; True if a hard cap refused it."""
        refused = False
        for c in self._caps:
            if c.device != device or cur <= c.bytes:
                continue
            if c.hard:
                refused = True
            elif c.crossed:
                continue
            c.crossed = True
            c.requested = delta
            pending: list[Cap] = getattr(self._crossing, "crossed", None) or []
            if c not in pending:
                pending.append(c)
            self._crossing.crossed = pending
        return refused

    def after_op(self) -> str | None:
        """After an op: the OOM message if a hard cap refused it (callbacks wait for run_cap_callbacks)."""
        pending: list[Cap] | None = getattr(self._crossing, "crossed", None)
        if not pending:
            return None
        message = None
        for c in pending:
            if c.hard and message is None:
                from torchmem._format import fmt_bytes

                used = self._current.get(c.device, 0) - c.requested
                message = (
                    f"{c.device.upper()} out of memory. Tried to allocate {fmt_bytes(c.requested)}. "
                    f"Device {c.device} has a limit of {fmt_bytes(c.bytes)} set by {c.owner}, of which "
                    f"{fmt_bytes(max(c.bytes - used, 0))} is free. Of the allocated memory "
                    f"{fmt_bytes(used)} is allocated by tensors torchmem tracks on {c.device}."
                )
        return message

    def run_cap_callbacks(self) -> None:
        """Run the ``on_cross`` callbacks of the caps the last op crossed (a refused op freed its outputs)."""
        pending: list[Cap] | None = getattr(self._crossing, "crossed", None)
        if not pending:
            return
        self._crossing.crossed = None
        for c in pending:
            if c.on_cross is not None:
                try:
                    c.on_cross(c)
                except Exception as exc:
                    self.report_error("a memory cap's callback", exc)

    def report_error(self, where: str, exc: BaseException) -> None:
        """An error inside the recording path: reported once per place, never raised into user code."""
        self._reported(where, exc)


def _dispatch(
    self: Any, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
) -> Any:
    """The ledger's ``__torch_dispatch__``: run the op, then record its outputs (and a resize's change)."""
    owner = self._owner
    facts = self._ops.get(id(func))
    before = None
    try:
        if facts is None or facts.func is not func:
            facts = owner._facts(func)
        if facts.written:  # an op that may resize or re-point an argument (resize_, out=, set_)
            before = written_sizes(facts, args, kwargs)
    except Exception as exc:
        owner.report_error("pre-op", exc)
    out = func(*args, **kwargs) if kwargs else func(*args)
    try:
        fresh = facts is not None and facts.fresh
        with owner._lock:
            if isinstance(out, torch.Tensor):
                owner._record_output(fresh, args, kwargs, out)
            elif isinstance(out, (tuple, list)):
                inputs = input_storage_keys(args, kwargs) if len(out) > MANY_OUTPUTS else None
                for t in out:
                    if isinstance(t, torch.Tensor):
                        owner._record_output(fresh, args, kwargs, t, inputs)
        if before:
            owner.record_mutation(before)
    except Exception as exc:
        owner.report_error(str(func), exc)
    if owner._caps:  # torchmem.limit()/budget(): a refused op frees its outputs, then fails
        refused = owner.after_op()
        if refused is not None:
            del out, before
            owner.run_cap_callbacks()
            raise torch.OutOfMemoryError(refused)
        owner.run_cap_callbacks()
    return out


if _TorchDispatchMode is not None:

    class _LedgerModeLight(_TorchDispatchMode):
        """The mode while ``torch._dynamo`` is not loaded: its handler is not wrapped in dynamo's
        ``disable`` (torch >= 2.6 wraps every mode's handler, and the wrapper imports ``torch._dynamo`` at the
        first op: 0.7-2 s once). Nothing compiles without dynamo loaded, so there is nothing to skip."""

        @classmethod
        def _should_skip_dynamo(cls) -> bool:
            return False

        def __init__(self, owner: Ledger) -> None:
            super().__init__()
            self._owner = owner
            self._ops = owner._ops

        __torch_dispatch__ = _dispatch

    class _LedgerMode(_LedgerModeLight):
        """The mode once ``torch._dynamo`` is loaded (the program compiles): torch's own handling, so that
        dynamo never traces the handler."""

        _should_skip_dynamo = _TorchDispatchMode.__dict__.get(  # type: ignore[assignment]
            "_should_skip_dynamo", _LedgerModeLight.__dict__["_should_skip_dynamo"]
        )

        __torch_dispatch__ = _dispatch  # wrapped by torch when the class is made, under the base's rule


def _mode_class() -> Any:
    """The ledger mode for the next push: the light one unless ``torch._dynamo`` is loaded."""
    return _LedgerMode if "torch._dynamo" in sys.modules else _LedgerModeLight


_LEDGER = Ledger()


def ledger() -> Ledger:
    """The process-wide ledger."""
    return _LEDGER
