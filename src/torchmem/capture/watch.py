"""``torchmem.watch()``: per-step memory monitoring that finds leaks and names them.

Light mode reads one allocator figure at step boundaries (every step, or every other step when a step is so
short that the read would cost more than 1 % of it). When the figure grows steadily, an *attribution window*
opens: the exact storage ledger records each new storage's allocation site for a few steps, and the sites
whose live bytes keep rising are joined to the objects that hold them (:func:`torchmem.holders`), to the
autograd graphs they belong to and to reference cycles. Deep mode opens such windows periodically even
without growth. On the CPU (no allocator statistics) the figure is the C heap in use (glibc ``mallinfo2``: a
few µs per reading, the first 32 readings after the warm-up at every step — fewer where they cost 10-50 % of a
step, at least 12 — then strided as an allocator's),
and the ledger runs only in attribution windows, as with an allocator (issue 29: a CPU loop under the ledger
for the whole watch took ~3x its time). ``source="ledger"`` asks for the exact accounting as the figure, on
for the whole watch; it is the figure where the C heap cannot be read (no glibc >= 2.33).

Cost per step: one reading, then O(1) work (:class:`~torchmem.analysis.leaks.GrowthStream`'s pre-checks and
a bounded series): flat in the number of steps (``benchmarks/watch_cost.py``).

The :class:`Watcher` is the lifecycle and the step; its parts: which steps are read
(:mod:`~torchmem.capture.watch_stride`), the attribution windows and the culprits they name
(:mod:`~torchmem.capture.watch_window`), and what the readings say, the verdict and the report
(:mod:`~torchmem.capture.watch_verdict`).
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack
from typing import Any, Generic, TypeVar

import torch

from torchmem._errors import TorchmemError
from torchmem._format import fmt_bytes
from torchmem._warn import ReportedOnce, emit_warning
from torchmem.capture.watch_stride import (
    EARLY_READINGS,
    PUBLIC_RELAX_AFTER,
    PUBLIC_RELAXED_FACTOR,
    PUBLIC_RELAXED_SHARE,
    ReadingSchedule,
)
from torchmem.capture.watch_verdict import STEADY_READINGS as STEADY_READINGS  # imported from here too
from torchmem.capture.watch_verdict import WINDOW_READINGS as WINDOW_READINGS
from torchmem.capture.watch_verdict import GrowthTrack, build_report
from torchmem.capture.watch_window import Attribution, AttributionWindow
from torchmem.devices import Backend, DeviceLike, backend, ledger, resolve
from torchmem.devices._host import heap_in_use, process_rss
from torchmem.results.leaks import Culprit, LeakReport
from torchmem.results.survivors import SurvivorReport

_log = logging.getLogger("torchmem")
T = TypeVar("T")

SOURCES = ("auto", "allocator", "ledger", "heap")

# Active watchers per device; weak, so the registry never keeps a watcher (or what it wraps) alive.
_active: weakref.WeakValueDictionary[str, Watcher[Any]] = weakref.WeakValueDictionary()
_active_lock = threading.Lock()


def active_watchers() -> list[Watcher[Any]]:
    """The users' watchers running now (one per device at most)."""
    with _active_lock:
        return [w for w in _active.values() if w._started and not w._stopped]


class WatchError(TorchmemError):
    """A watcher cannot start or is used the wrong way (a second watcher on a device, no statistics)."""


class LeakWarning(UserWarning):
    """Emitted once per watcher when memory is found to grow step over step."""


class Watcher(Generic[T]):
    """Watches device memory across steps; returned by :func:`watch`.

    Use it as an iterable wrapper (``for batch in torchmem.watch(loader)``), as a context manager with
    :meth:`step`, or with ``optimizer_steps=True`` to count optimizer steps. :meth:`report` can be called at
    any time, also after the watch ended.
    """

    def __init__(
        self,
        iterable: Iterable[T] | None,
        device: DeviceLike,
        mode: str,
        warmup: int,
        min_bytes_per_step: int,
        window: int,
        every: int,
        stride: int | None,
        max_stride: int | None,
        source: str,
        optimizer_steps: bool,
        on_leak: Callable[[LeakReport], Any] | None,
        warn: bool,
        max_paths: int,
        survivors: bool = False,
    ) -> None:
        if mode not in ("light", "deep"):
            raise WatchError(f"mode must be 'light' or 'deep', not {mode!r}.", "Use mode='light' (default).")
        if source not in SOURCES:
            raise WatchError(
                f"source must be 'auto', 'allocator', 'ledger' or 'heap', not {source!r}.",
                "Leave it at 'auto'.",
            )
        for name, v, lo in (("warmup", warmup, 0), ("window", window, 2), ("every", every, 1)):
            if not isinstance(v, int) or isinstance(v, bool) or v < lo:
                raise WatchError(f"{name} must be an integer >= {lo}, not {v!r}.")
        for name, val in (("stride", stride), ("max_stride", max_stride)):
            if val is not None and (not isinstance(val, int) or isinstance(val, bool) or val < 1):
                raise WatchError(f"{name} must be a positive integer or None, not {val!r}.")
        if min_bytes_per_step <= 0:
            raise WatchError(f"min_bytes_per_step must be positive, not {min_bytes_per_step!r}.")
        self._iterable = iterable
        self._device_spec = device
        self.mode = mode
        self.warmup = warmup
        self.min_bytes_per_step = int(min_bytes_per_step)
        self._source_wanted = source
        self._optimizer_steps = optimizer_steps
        self._on_leak = on_leak
        self._warn = warn
        self._want_survivors = bool(survivors)
        self._survivors: Any = None  # a LoopSurvivors with survivors=True

        self.device: torch.device | None = None
        self.source = "n/a"
        self.steps = 0
        self._backend: Backend | None = None
        self._stack: ExitStack | None = None
        self._started = False
        self._stopped = False
        self._thread: int | None = None
        self._reader: Callable[[], int] = _no_reading
        self._notes: list[str] = []
        self._report_error = ReportedOnce(
            self._say_error,
            "internal error in {where} ({error}); the step went on",
        )
        self._warned = False
        self._hook: Any = None
        self._exclusive = True  # counts as the one user watcher of its device
        # torchmem run on the CPU: the host watcher's own work on the same C heap (its scans' leftovers to
        # subtract, or None while its tracing is on and the figure is not the program's)
        self._others_work: Callable[[], int | None] | None = None
        self._workers: Any = None  # the DataLoader checks (capture/workers.py) of a user's watcher
        self._raw: tuple[int, int] | None = None  # (step, the figure as read) of the last reading
        # The parts: which steps are read, what the readings say, the attribution windows.
        self._schedule = ReadingSchedule(warmup, stride, max_stride)
        if max_stride is not None and max_stride >= 2:  # a long run's readings: under 0.5 % of its steps
            self._schedule.relax(PUBLIC_RELAX_AFTER, PUBLIC_RELAXED_SHARE, PUBLIC_RELAXED_FACTOR * max_stride)
        self._track = GrowthTrack(self.min_bytes_per_step, warmup)
        self._attribution = Attribution(
            window=window,
            every=every,
            mode=mode,
            min_bytes_per_step=self.min_bytes_per_step,
            max_paths=max_paths,
            note=self._notes.append,
            on_error=self._report_error,
        )

    # -- what torchmem run (and tests) read and set on a watcher ---------------------------------------
    @property
    def _relax_after(self) -> int | None:
        """After this many readings (``torchmem run``: a long run), the stride is chosen again now and then
        from the readings' cost in the loop, max_stride aside (see :class:`ReadingSchedule`)."""
        return self._schedule.relax_after

    @_relax_after.setter
    def _relax_after(self, readings: int | None) -> None:
        self._schedule.relax(readings)  # torchmem run's: RELAXED_SHARE of a step, RELAXED_MAX_STRIDE apart

    @property
    def stride(self) -> int:
        """The steps between two readings now (1: every step), as chosen from the readings' cost (or
        fixed by ``stride=``)."""
        return self._schedule.stride

    @property
    def _stride(self) -> int:
        return self._schedule.stride

    @_stride.setter
    def _stride(self, k: int) -> None:
        self._schedule.stride = k

    @property
    def _readings(self) -> int:
        return self._schedule.readings

    @_readings.setter
    def _readings(self, k: int) -> None:
        self._schedule.readings = k

    @property
    def _stride_note(self) -> str | None:
        return self._schedule.note

    def _set_stride(self, step_time: float, cost: float) -> None:
        self._schedule.set_stride(step_time, cost)

    @property
    def _series(self) -> list[tuple[int, int]]:
        """The readings kept for the report: ``(step, value)``."""
        return self._track.series

    @property
    def _window(self) -> AttributionWindow | None:
        """The attribution window open now."""
        return self._attribution.window

    # -- lifecycle -------------------------------------------------------------------------------
    def __enter__(self) -> Watcher[T]:
        self._start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __iter__(self) -> Iterator[T]:
        if self._iterable is None:
            raise WatchError(
                "This watcher wraps no iterable.", "Pass one: `for batch in torchmem.watch(loader): ...`."
            )
        it = iter(self._iterable)
        self._start()
        try:
            first = True
            while True:
                if not first:
                    self.step()  # the body of the previous item is done: a step boundary
                first = False
                try:
                    item = next(it)
                except StopIteration:
                    return
                yield item
        finally:
            self.stop()

    def _start(self) -> None:
        if self._started:
            raise WatchError(
                "This watcher was already started.", "Create a new torchmem.watch() for each run."
            )
        dev = resolve(self._device_spec)
        label = str(dev)
        if not self._exclusive:  # torchmem run's own watcher: the program may still start its own
            self._setup(dev)
            self._started = True
            return
        with _active_lock:
            other = _active.get(label)
            if other is not None and not other._stopped:
                raise WatchError(
                    f"Another torchmem.watch() is already active on {label}.",
                    "Use one watcher per device: stop the first (leave its block or loop) before starting "
                    "another, or call .step() on the one you have.",
                )
            _active[label] = self
        try:
            self._setup(dev)
        except BaseException:
            with _active_lock:
                if _active.get(label) is self:
                    del _active[label]
            raise
        self._started = True
        if self._warn:  # the user's watcher (torchmem run has its own checks, on its sampler thread)
            try:
                from torchmem.capture.workers import WorkerChecks, WorkerWarning

                def say(_code: str, text: str) -> None:
                    emit_warning(f"torchmem: {text}", WorkerWarning)

                checks = WorkerChecks(dev, say)
                checks.install()
                self._workers = checks
            except Exception as exc:
                _log.debug("watch(): the DataLoader checks could not be set up: %r", exc)

    def _setup(self, dev: torch.device) -> None:
        self.device = dev
        be = backend(dev)
        self._backend = be
        self._stack = ExitStack()
        # The CPU has no allocator: its figure is the C heap's, or the ledger's (even inside cpu_tracking()).
        has_stats = dev.type != "cpu" and be.hot().allocated is not None
        if self._source_wanted == "allocator" and not has_stats:
            raise WatchError(
                f"{dev} has no allocator statistics to watch.",
                "Use source='auto' or 'ledger': torchmem then counts tensor storages exactly (costs per op)"
                + (", or source='heap' (the C heap in use, ~1 µs per step)." if dev.type == "cpu" else "."),
            )
        wanted = self._source_wanted
        if wanted == "auto" and dev.type == "cpu" and heap_in_use() is not None:
            # The CPU's cheap figure (issue 29): the C heap, the exact accounting only while growth is named.
            wanted = "heap"
        if wanted == "heap":
            if dev.type != "cpu":
                raise WatchError(
                    f"source='heap' reads the process's C heap, which holds CPU tensors, not those of {dev}.",
                    "Use source='auto' for an accelerator, or device='cpu'.",
                )
            if heap_in_use() is not None:
                self.source, self._reader = "heap", _heap_reading
            elif process_rss() is not None:  # not glibc >= 2.33: the resident set size
                self.source, self._reader = "rss", _rss_reading
            else:
                raise WatchError(
                    "Neither the C heap (glibc mallinfo2) nor the resident set size can be read here.",
                    "Use source='auto' (torchmem's exact tensor accounting on the CPU).",
                )
        elif wanted == "ledger" or not has_stats:
            try:
                self._stack.enter_context(ledger().enabled())
            except TorchmemError as exc:
                raise WatchError(
                    f"{dev} has no memory statistics and no exact tensor accounting: {exc.message}",
                    "Watch a CUDA/XPU/MPS device, or upgrade torch.",
                ) from exc
            self.source = "ledger"
            led, label = ledger(), str(dev)
            self._reader = lambda: led.current(label)
        else:
            self.source = "allocator"

            def allocated() -> int:
                v = be.hot().allocated
                return int(v) if v is not None else 0

            self._reader = allocated
        self._thread = threading.get_ident()
        self._attribution.start(str(dev), self.source, self._read)
        # What one reading costs, to choose a sampling stride that keeps light mode under 1 % of a step.
        self._schedule.start(self.source, self._read)
        if self._exclusive and self._host_figure and self._schedule.fixed is None:
            self._schedule.early = EARLY_READINGS  # a short loop judged within 10 steps, as with the ledger
        if self._want_survivors:
            from torchmem.capture.survivors import LoopSurvivors

            # A quarter of the leak threshold per step, as under `torchmem run`.
            self._survivors = LoopSurvivors(str(dev), min_bytes_per_step=max(1, self.min_bytes_per_step // 4))
        if self._optimizer_steps:
            from torch.optim.optimizer import register_optimizer_step_post_hook

            self._hook = register_optimizer_step_post_hook(self._on_optimizer_step)
        self._schedule.clock()

    def stop(self) -> None:
        """End the watch (idempotent): remove hooks, close attribution windows, turn the ledger off."""
        if self._stopped or not self._started:
            self._stopped = True
            return
        self._stopped = True
        try:
            if self._workers is not None:
                self._workers.uninstall()
            if self._hook is not None:
                self._hook.remove()
                self._hook = None
            if self._attribution.window is not None:
                self._attribution.close()
            if self._survivors is not None:
                self._survivors.stop()
            if self._stack is not None:
                self._stack.close()
        finally:
            with _active_lock:
                label = str(self.device)
                if _active.get(label) is self:
                    del _active[label]

    def _on_optimizer_step(self, *_args: Any, **_kwargs: Any) -> None:
        if threading.get_ident() == self._thread:
            self.step()

    # -- the per-step work -----------------------------------------------------------------------
    def _read(self) -> int:
        return self._reader()

    def step(self) -> None:
        """Mark the end of one step. Never raises: an internal error is reported once and the step goes on."""
        if not self._started:
            raise WatchError("step() before the watch started.", "Use `with torchmem.watch() as w:`.")
        if self._stopped:
            return
        self.steps += 1
        try:
            if self._workers is not None:
                self._workers.poll()
            if self._survivors is not None:
                self._survivors.boundary(self.steps)
            self._step()
        except Exception as exc:  # never break the user's loop
            self._report_error("step", exc)

    def quiet_steps(self) -> int:
        """How many of the next steps need nothing of :meth:`step` but their count (``0``: the next one
        does): none in the warm-up, while an attribution window records every step, or with per-step helpers
        (workers, survivors); else the steps before the next reading (a short run's narrowed stride
        included: :meth:`ReadingSchedule.stride_at`). A caller that skips them adds them to
        :attr:`steps` (``torchmem run``'s per-step fast path); computed after a step, valid until the
        next call of :meth:`step`."""
        if self._stopped or self._workers is not None or self._survivors is not None:
            return 0
        n = self.steps
        if n <= self.warmup or self._attribution.window is not None:
            return 0
        schedule = self._schedule
        k = schedule.stride
        if k <= 1:
            return 0
        if schedule.stride_at(n + 1) == k:
            return k - 1 - n % k
        # a short run's floor narrows the stride as it goes (stride_at): the first step within k that the
        # floor reads (at the latest the k-th: calling step() there when it does not read costs nothing)
        stride_at = schedule.stride_at
        m = n + 1
        while m < n + k and m % stride_at(m):
            m += 1
        return m - n - 1

    def step_at(self, value: int) -> None:
        """:meth:`step` with the figure read earlier (``value``, as the reader returns it): a step whose end
        is known only afterwards (a boundary recognised at its second occurrence ended its first step too)."""
        reader = self._reader
        self._reader = lambda: value
        try:
            self.step()
        finally:
            self._reader = reader

    def _step(self) -> None:
        n = self.steps
        schedule = self._schedule
        if n <= self.warmup + 1:  # step durations matter only to choose the stride, at the warm-up's end
            schedule.step_ended(n)
        attribution = self._attribution
        win = attribution.window
        if win is not None:
            win.record()
        elif n % (schedule.stride if schedule.stride == 1 else schedule.stride_at(n)):
            return
        track = self._track
        if n <= self.warmup:
            raw = schedule.warmup_reading(self._reader)
            self._raw = (n, raw)
            track.keep(n, raw)
            if n == self.warmup:
                attribution.warmup_ended(n)
            return
        others = 0
        if self._others_work is not None:
            got = self._others_work()
            if got is None:  # torchmem's tracing is on: this step's figure is not the program's
                return
            others = got
        raw = schedule.reading(n, self._reader)
        self._raw = (n, raw)
        value = raw - attribution.offset - others
        track.keep(n, value)
        growth = track.add(n, value)
        if growth is None:
            return
        stream = track.stream
        if stream.rose:
            schedule.alert()  # a relaxed schedule reads more often while the figure rises
        attribution.after_reading(n, growth, stream.steps, stream.values)
        if growth.leaking and attribution.attempted and not self._warned:
            self._announce()

    def figure_read_now(self) -> int | None:
        """The figure as this watcher read it at the step that just ended (torchmem's own changes not left
        out), ``None`` where it did not read at that step (``torchmem run`` on the CPU: the host watcher,
        stepped right after it at the same boundary, takes the C heap from here instead of reading it a
        second time). Only with the C heap as the figure (a figure of 0 is one that could not be read)."""
        raw = self._raw
        if raw is None or raw[0] != self.steps or self.source != "heap" or raw[1] <= 0:
            return None
        return raw[1]

    @property
    def _host_figure(self) -> bool:
        return self.source in ("heap", "rss")

    # -- reporting -------------------------------------------------------------------------------
    def _announce(self) -> None:
        self._warned = True
        rep = self.report()
        top = rep.culprits[0] if rep.culprits else None
        what = "memory" if rep.device.split(":")[0] == "cpu" else "device memory"
        msg = f"torchmem: {what} grows by {fmt_bytes(rep.bytes_per_step)}/step on {rep.device}"
        if top is not None:
            msg += f"; {top.site or '?'} held by {top.holder or '?'}: {top.fix}"
        exc = emit_warning(msg, LeakWarning, log_level=logging.INFO, warn=self._warn)
        if exc is not None:  # warnings configured as errors: never break the step
            self._report_error("warning", exc)
        if self._on_leak is not None:
            try:
                self._on_leak(rep)
            except Exception as exc:
                self._report_error("on_leak callback", exc)

    def _say_error(self, note: str) -> None:
        self._notes.append(note)
        _log.warning("torchmem.watch: %s", note)

    @property
    def leaking(self) -> bool:
        """Whether memory grows steadily as of the last reading (O(1): call it at every step)."""
        return self._track.growth.leaking

    @property
    def culprits(self) -> tuple[Culprit, ...]:
        """The culprits named so far (O(1); :meth:`report` has them with the verdict and the readings)."""
        return self._attribution.culprits

    def survivors(self, time_limit: float = 2.0) -> SurvivorReport:
        """What the loop allocated in its recorded steps and is still alive, by allocation site and holder.

        Needs ``watch(..., survivors=True)``. Can be called at any time, in the loop or after it: a site
        whose storages are alive from (nearly) every recorded step *accumulates* (a leak, named even in a
        loop of a few steps, too short for the growth detector).

        Args:
            time_limit: Seconds the holder search may take (0: none).

        Raises:
            WatchError: the watcher was made without ``survivors=True``, or has not started.
        """
        if not self._want_survivors:
            raise WatchError(
                "This watcher does not record the loop's survivors.",
                "Create it with `torchmem.watch(..., survivors=True)`.",
            )
        if self._survivors is None:
            raise WatchError("The watch has not started.", "Call it inside the loop or after it.")
        rep: SurvivorReport = self._survivors.report(total_steps=self.steps, time_limit=time_limit)
        return rep

    def report(self) -> LeakReport:
        """The current verdict, culprits and readings (a frozen :class:`LeakReport`).

        When nothing is reported, ``reason`` says why — growth below ``min_bytes_per_step`` (with the value
        that would report it), too few steps (how many are needed), flat, shrinking or noisy — and what to do.
        """
        schedule = self._schedule
        note = schedule.note
        return build_report(
            self._track,
            device=str(self.device) if self.device is not None else "n/a",
            source=self.source,
            mode=self.mode,
            steps=self.steps,
            stride=schedule.fixed or schedule.stride,
            culprits=self._attribution.culprits,
            notes=self._notes if note is None else [note, *self._notes],
            excluded=self._attribution.excluded,
        )


def _no_reading() -> int:
    return 0


def _heap_reading() -> int:
    return heap_in_use() or 0


def _rss_reading() -> int:
    return process_rss() or 0


def watch(
    iterable: Iterable[T] | None = None,
    *,
    device: DeviceLike = None,
    mode: str = "light",
    warmup: int = 3,
    min_bytes_per_step: int = 256 * 1024,
    window: int = 4,
    every: int = 128,
    stride: int | None = None,
    max_stride: int | None = 2,
    source: str = "auto",
    optimizer_steps: bool = False,
    on_leak: Callable[[LeakReport], Any] | None = None,
    warn: bool = True,
    max_paths: int = 3,
    survivors: bool = False,
) -> Watcher[T]:
    """Watch device memory step by step; find steady growth and name the allocation site and holder.

    Args:
        iterable: Wrap it: each item is one step (``for batch in torchmem.watch(loader): ...``). Without it,
            use the watcher as a context manager and call ``.step()``, or pass ``optimizer_steps=True``.
        device: The device to watch (default: the current accelerator, else the CPU).
        mode: ``"light"``: one cheap reading per step boundary, attribution only once memory grows;
            ``"deep"``: also an attribution window every ``every`` steps.
        warmup: Steps ignored by the detector (optimizer state, lazily built buffers, workspaces).
        min_bytes_per_step: Smallest growth per step reported as a leak (default 256 KiB). Steady growth
            below it is not reported as a leak, but the report says so: ``reason`` gives the growth per
            step and the ``min_bytes_per_step`` that would report it (docs/leaks.md).
        window: Steps an attribution window records allocation sites for.
        every: In deep mode, steps between attribution windows.
        stride: Read every ``stride``-th step; ``None`` chooses from the warm-up: every step, or every
            k-th step when one reading costs more than 0.5 % of a step (capped by ``max_stride``). With the
            C heap as the figure (the CPU's default) the first 32 readings after the warm-up are taken at
            every step where they cost under 50 ms in all or each under 10 % of a step (a short loop is
            judged within 10 steps), and a reading then stays under 2 % of a step, ``max_stride`` aside (a
            fragmented heap's reading takes tens of µs, hundreds on a loaded machine).
        max_stride: The most steps between readings when the stride is chosen automatically. The default,
            2, keeps detection of a steady leak within 10 steps after the warm-up; ``None`` lets very short
            steps be read rarely enough to stay under 0.5 % (detection then takes 5 readings). After 256
            readings (a long run) the stride may widen to keep the readings' timed cost under 0.2 % of the
            steps (in the loop a reading costs 3-5x its timed cost: the step after it refills caches), up to
            8 x ``max_stride`` (a leak that starts then is found within 5 x 16 steps); ``max_stride=1``
            reads every step throughout.
        source: The figure read at each step. ``"auto"``: the allocator's counters where the device has
            them; on the CPU the C heap in use (``"heap"`` below) where glibc can report it, else
            torchmem's exact tensor accounting. ``"allocator"``: fail where the device has no allocator
            statistics. ``"ledger"``: the exact accounting on any device, on for the whole watch (a few µs
            per op: ~3x a loop of small CPU ops; figures exact to the byte). ``"heap"`` (CPU only): the C
            heap in use (glibc ``mallinfo2``, a few µs per reading; the resident set size where it cannot
            be read, and the report's ``source`` then says ``"rss"``). It also counts memory that is not a
            tensor (autograd graphs, malloc's headers, other native allocations), so it finds host-side
            growth too; the exact accounting runs only in attribution windows, while growth is named, as
            with an allocator. What turning it on and off, and naming the culprits (a garbage collection),
            change in the heap is left out of the readings.
        optimizer_steps: Count a step at every ``optimizer.step()`` of any optimizer (on this thread).
        on_leak: Called once with the :class:`LeakReport` when a leak is found and attributed.
        warn: Emit one :class:`LeakWarning` when a leak is found (it is always logged to the
            ``"torchmem"`` logger at INFO level).
        max_paths: Holder paths kept per culprit storage.
        survivors: Also record what a few steps of the loop allocate and keep (the exact tensor accounting
            with birth sites, on for up to 8 steps after the first, within ~10 % of the run's time), for
            :meth:`Watcher.survivors`: a leak named even in a loop of 3 steps.

    Returns:
        A :class:`Watcher`; ``.report()`` gives the :class:`LeakReport`.

    Raises:
        WatchError: bad arguments, another watcher active on the device, or a device with no statistics
            and no exact accounting.

    Example:
        >>> import torch, torchmem
        >>> model = torch.nn.Linear(512, 512)
        >>> losses = []
        >>> w = torchmem.watch(range(12), device="cpu", warn=False)
        >>> for step in w:     # validation without no_grad(), keeping the loss tensors and their graphs
        ...     losses.append(model(torch.randn(256, 512)).square().mean())
        >>> r = w.report()
        >>> r.leaking, r.culprits[0].kind, r.culprits[0].holder
        (True, 'retained_graph', '...losses[...')
        >>> print(r.culprits[0].fix)
        `losses` keeps autograd graphs (+.../step): store `loss.item()` for logging, or ...

        The C heap as the figure (the CPU's default; a few µs per reading, the ledger only while growth is
        named):

        >>> kept = []
        >>> with torchmem.watch(device="cpu", source="heap", stride=1, warn=False) as w:
        ...     for _ in range(14):
        ...         kept.append(torch.ones(512, 1024))  # 2 MiB per step, never freed
        ...         w.step()
        >>> r = w.report()
        >>> r.leaking, r.culprits[0].holder
        (True, '...kept[...')

        What a loop of four steps left alive, by site (``survivors=True``):

        >>> outs = []
        >>> with torchmem.watch(device="cpu", survivors=True, warn=False) as w:
        ...     for _ in range(4):
        ...         outs.append(model(torch.randn(256, 512)))  # each output keeps its graph
        ...         w.step()
        >>> s = w.survivors()
        >>> s.leaking, s.groups[0].verdict
        (True, 'accumulates')
    """
    return Watcher(
        iterable,
        device,
        mode,
        warmup,
        min_bytes_per_step,
        window,
        every,
        stride,
        max_stride,
        source,
        optimizer_steps,
        on_leak,
        warn,
        max_paths,
        survivors,
    )


__all__ = ["LeakWarning", "WatchError", "Watcher", "watch"]
