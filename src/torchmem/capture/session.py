"""A monitoring session around a whole program: what ``torchmem run`` and ``torchmem demo`` record.

One session = a capture file (written line by line, crash-safe), a :class:`~torchmem.capture.watch.Watcher`
whose steps are the program's optimizer steps (or a named function's returns), a sampler thread for the
timeline and the live status line, the CUDA OOM observer, and the readings at start and end.
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import time
import types
import weakref
from dataclasses import dataclass
from typing import Any, TextIO

import torch

from torchmem._format import fmt_bytes
from torchmem.capture.read import counters
from torchmem.capture.watch import Watcher, watch
from torchmem.devices import DeviceLike, ledger, resolve
from torchmem.results.leaks import LeakReport

# The session running now in this process (``torchmem run``/``demo``), for on-demand reports; weak.
_current: weakref.ref[Session] | None = None


def current_session() -> Session | None:
    """The session running now in this process, if any (``torchmem run``), else ``None``."""
    ref = _current
    session = ref() if ref is not None else None
    return session if session is not None and not session._stop.is_set() else None


@dataclass(frozen=True)
class SessionResult:
    """What a session recorded, in short (the capture file has everything)."""

    capture: str
    steps: int
    seconds: float
    peak_allocated: int | None
    peak_reserved: int | None
    leak: LeakReport | None
    oom: Any
    exit_code: int | None
    reason: str
    no_steps: str | None = None
    """Why no step was counted and what to do, when none was (else ``None``)."""
    children: tuple[str, ...] = ()
    """Processes the program started (DataLoader workers excluded): their memory is not in this capture."""
    survivors: Any = None
    """What the loop allocated and is still alive (a :class:`~torchmem.results.survivors.SurvivorReport`)."""
    boundary: str = ""
    """What one step was (``""``: none was found)."""
    host_leak: LeakReport | None = None
    """The host-memory verdict (device ``"host"``)."""
    ooms: tuple[Any, ...] = ()
    """Every out-of-memory error the program raised, caught or not (``OOMEvent`` s, in order)."""
    caught_ooms: tuple[Any, ...] = ()
    """Those the program caught and went on."""
    overhead: str | None = None
    """What torchmem's own work added to the run, in words, when the run took 1.2x as long or more."""
    child_captures: tuple[str, ...] = ()
    """The captures the followed child processes (``mp.spawn``, ``mp.Process`` workers) write."""
    rank: Any = None
    """This process's place in a distributed job (a ``capture.ranks.RankInfo``), else ``None``."""
    forecast: Any = None
    """When the memory runs out at the leak's rate (a :class:`~torchmem.results.forecast.Forecast`), if it
    leaks and the capacity is known."""
    gpus: Any = None
    """Every GPU the process had a context on and what their figures show (a
    :class:`~torchmem.results.gpus.GpusReport`), ``None`` when it used no GPU."""


class _StatusAwareStream:
    """``sys.stdout``/``sys.stderr`` while the live status line shows: the line is cleared before the
    program writes, and redrawn only once the program's line is complete."""

    def __init__(self, stream: Any, session: Session) -> None:
        self._tm_stream = stream
        self._tm_session = session

    def write(self, text: str) -> int:
        # Under the status lock: the sampler cannot draw between the clearing and the program's text.
        with self._tm_session._status_lock:
            self._tm_session._before_program_write(text)
            return int(self._tm_stream.write(text))

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tm_stream, name)


class Session:
    """Monitors the calling thread's program from :meth:`start` to :meth:`finish`."""

    def __init__(
        self,
        capture: str,
        *,
        device: DeviceLike = None,
        interval: float = 0.05,
        status: bool | None = None,
        step_marker: str | None = None,
        modules: bool = False,
        argv: list[str] | None = None,
        status_file: TextIO | None = None,
        warmup: int = 3,
        memory_viz: str | None = None,
        force: bool = False,
        protect: list[str] | None = None,
    ) -> None:
        self.capture = capture
        self.force = force
        self.protect = list(protect or ())
        self.memory_viz = memory_viz
        rank_device = _rank_device() if device is None else None
        # No device given and not a launched rank: the GPU the program really works on is discovered as it
        # runs (set_device, tensors on cuda:1, mp.spawn children), never assumed to be cuda:0.
        self._auto_device = device is None and rank_device is None
        self.device = resolve(device if device is not None else rank_device)
        self._gpus: Any = None  # capture/gpus.GpuWatch: every GPU the process touches, and how
        self._device_settled = not self._auto_device
        self._switch_lock = threading.Lock()
        self._own_work = False  # torchmem's step bookkeeping is running (the CPU sampler skips its reading)
        self._forecast_at = 0.0
        self._units: Any = None  # capture/units.UnitFinder: the repeating unit when no boundary is found
        self._forecast_text = ""
        self.interval = interval
        self._status_file = status_file if status_file is not None else sys.stderr
        self.status = (
            status if status is not None else bool(getattr(self._status_file, "isatty", lambda: False)())
        )
        self.step_marker = step_marker
        self.modules = modules
        self.argv = list(argv or sys.argv)
        self.warmup = warmup
        self._writer: Any = None
        self._watcher: Watcher[Any] | None = None
        self._hook: Any = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._t0 = 0.0
        self._main = threading.get_ident()
        self._pid = os.getpid()
        self._steps = 0
        self._first_readings: dict[str, int] = {}  # boundary kind -> the figure at its first event
        self._replay: int | None = None  # the next step's figure, read earlier (StepBoundaries on_first)
        self._leak_written = False
        self._observer: Any = None
        self._status_len = 0
        self._profile_prev: Any = None
        self._profiler: Any = None
        self._profiled = False
        self._last_opt: Any = None
        self._disabled = False
        self._marker_returns = 0
        self._optimizer_steps = 0
        self._children: list[str] = []  # processes the program started (not DataLoader workers)
        self._workers = 0
        self._saved_start: Any = None
        self._streams: list[tuple[str, Any]] = []
        self._user_line_open = False
        self._status_lock = threading.RLock()
        self._other_thread_steps = 0
        self._boundaries: Any = None
        self._boundary_kind: str | None = None
        self._boundary_label = ""
        self._switches: list[str] = []
        self._timeline: list[tuple[float, int]] = []
        self._timeline_every = 1
        self._timeline_n = 0
        self._peak_seen = 0
        self._last_step_write = 0.0
        self._step_parts = [0.0, 0.0, 0.0]  # the step's readings, loop survivors, host watcher (seconds)
        self._sampler_workers_s = 0.0
        self._ticks = 0
        self._tick_s: float | None = None
        self._pending_steps: collections.deque[tuple[float, int, int | None]] = collections.deque()
        self._survivors: Any = None
        self._worker_checks: Any = None  # the DataLoader/worker checks (capture/workers.py)
        self._host: Any = None
        self._oom_events: list[Any] = []  # every OOM event, in order
        self._pending_ooms: list[tuple[Any, int]] = []  # (event, step) not yet written
        self._oom_lock = threading.Lock()
        self._caught_ooms: list[Any] = []
        self._born_before: set[int] = set()  # storages alive when the program started (the timeline census)
        # What torchmem's own work costs the program (the "overhead" record, and a note when it is large):
        self._own_step_s = 0.0  # time inside step(): readings, scans, holder searches, records
        self._sampler_s = 0.0  # the sampler thread's work (it holds the GIL while it works)
        self._step_end_t: float | None = None
        self._instrumented = False  # the exact ledger or a site window is on for the step under way
        self._plain_steps: collections.deque[float] = collections.deque(maxlen=512)
        self._instr_sum = 0.0
        self._instr_n = 0
        # The exact accounting's cost in steps of an earlier boundary kind (steps of one kind are compared
        # with steps of the same kind only): (seconds, steps, whether it could be estimated).
        self._ledger_banked = (0.0, 0, True)
        # Distributed runs (capture/ranks.py): who this process is, the job's OOM flag, followed children.
        self._rank: Any = None
        self._oom_flag: Any = None
        self._flag_raised = False
        self._rank_state_written = False
        self._followed: list[str] = []  # captures of the child processes that record their own
        self._child_lock = threading.Lock()
        self._job = ""
        self._pg_written = False
        self._unwatch_groups: Any = None  # undoes the torch.distributed wrappers (NCCL measured in windows)
        self._pg_end_read = False  # the reading before destroy_process_group was taken

    # -- start -----------------------------------------------------------------------------------
    def start(self) -> Session:
        """Open the capture (errors here are raised before the program runs), then start monitoring."""
        from torchmem.capture.file import CaptureWriter

        self._t0 = time.perf_counter()
        extra = self._rank_header()
        self._writer = CaptureWriter(
            self.capture,
            device=str(self.device),
            device_name=_device_name(self.device),
            argv=self.argv,
            source=_source_of(self.device),
            force=self.force,
            protect=self.protect,
            **extra,
        )
        self._record_stats("start")
        self._born_before = _live_storage_keys(self.device)
        if self.memory_viz is not None:
            from torchmem.devices import _ops

            problem = _ops.record_history(True)
            if problem is not None:
                self._note(f"--memory-viz: {problem}")
                self.memory_viz = None
        try:
            from torchmem.capture.oom import watch_ooms

            self._observer = watch_ooms(self._on_oom_event)
            if self.device.type == "cuda" and self._observer.problem:
                self._note(f"out-of-memory errors the program catches are not seen: {self._observer.problem}")
        except Exception as exc:
            self._note(f"the OOM observer could not be set up ({type(exc).__name__}: {exc})")
        self._watcher = self._new_watcher()
        self._survivors = self._new_survivors()
        self._host = self._new_host()
        from torchmem.capture.boundaries import StepBoundaries

        self._boundaries = StepBoundaries(
            self._on_boundary,
            self._on_switch,
            thread=self._main,
            on_error=self._note,
            on_first=self._on_first,
        )
        if self.step_marker:
            # The user said what a step is: only optimizer steps are counted (for the 0-step advice).
            self._boundaries._install_optimizer()
            self._profile_prev = sys.getprofile()
            sys.setprofile(self._profile)
        else:
            self._boundaries.start()
            try:
                from torchmem.capture.units import UnitFinder

                program = (
                    os.path.abspath(self.argv[0]) if self.argv and os.path.isfile(self.argv[0]) else None
                )
                self._units = UnitFinder(self._unit_step, self._unit_found, self._note, self._main, program)
            except Exception as exc:
                self._note(f"the repeating unit will not be looked for ({type(exc).__name__}: {exc})")
        # A weak reference: the interpreter keeps fork callbacks forever, a session must not live that long.
        ref = weakref.ref(self)

        def in_child() -> None:
            session = ref()
            if session is not None:
                session._in_child()

        os.register_at_fork(after_in_child=in_child)
        self._watch_processes()
        try:
            from torchmem.capture.ranks import watch_process_groups

            self._unwatch_groups = watch_process_groups(self._before_destroy)
        except Exception as exc:
            self._note(f"NCCL's memory will be estimated, not measured ({type(exc).__name__}: {exc})")
        if self.status:
            self._wrap_streams()
        try:
            from torchmem.capture.workers import WorkerChecks

            self._worker_checks = WorkerChecks(self.device, self._worker_warning)
            self._worker_checks.install()
        except Exception as exc:
            self._note(f"the DataLoader checks could not be set up ({type(exc).__name__}: {exc})")
        try:
            from torchmem.capture.gpus import GpuWatch

            self._gpus = GpuWatch(self.device, self._auto_device, self._note).install()
        except Exception as exc:
            self._note(f"the GPUs besides {self.device} are not watched ({type(exc).__name__}: {exc})")
        self._thread = threading.Thread(target=self._sample_loop, name="torchmem-sampler", daemon=True)
        self._thread.start()
        global _current
        _current = ref
        return self

    def survivors_now(self, time_limit: float = 2.0) -> Any:
        """What the loop allocated in its recorded steps and is still alive, now (a
        :class:`~torchmem.results.survivors.SurvivorReport`); ``None`` when the loop's survivors are not
        recorded (a step marker's session before its first step)."""
        rec = self._survivors
        if rec is None:
            return None
        return rec.report(total_steps=self._steps, time_limit=time_limit, boundary=self._boundary_label)

    # -- steps -----------------------------------------------------------------------------------
    def _new_watcher(self) -> Watcher[Any]:
        # On the CPU the figure is the C heap in use (one ~1 µs read per step); the exact ledger only runs in
        # attribution windows, once the figure grows. Elsewhere the allocator's counters.
        source = "heap" if self.device.type == "cpu" else "auto"
        try:
            w: Watcher[Any] = watch(device=self.device, warn=False, warmup=self.warmup, source=source)
        except Exception as exc:  # a watcher without the heap figure: the exact ledger, as before
            self._note(f"the {source} figure is unavailable ({exc}); using the exact tensor ledger")
            w = watch(device=self.device, warn=False, warmup=self.warmup)
        w._exclusive = False  # the monitored program may use torchmem.watch() itself
        # After the first 64 readings (a short loop is read every step or two), the stride follows the
        # readings' cost in the loop: a CUDA reading is 25-130 µs, 3-10 % of a 1-4 ms step if read each step.
        w._relax_after = 64
        w.__enter__()
        return w

    def _on_oom_event(self, event: Any) -> None:
        """An OOM was raised (on any thread): written once we know whether the program caught it."""
        if self._disabled or os.getpid() != self._pid:
            return
        with self._oom_lock:
            self._oom_events.append(event)
            self._pending_ooms.append((event, self._steps))
        if self._oom_flag is not None and not self._flag_raised:
            self._raise_flag(getattr(event, "site", None))

    def _flush_ooms(self, caught_by: BaseException | None, final: bool = False) -> None:
        """Write the pending OOM events: at a step boundary they were all caught (the program went on); at
        the end, the one that ended the program (``caught_by``) is not."""
        with self._oom_lock:
            pending, self._pending_ooms = self._pending_ooms, []
        if not pending:
            return
        uncaught = None
        if final and caught_by is not None:
            from torchmem.capture.oom import match_event

            uncaught = match_event([e for e, _ in pending], caught_by)
        for event, step in pending:
            if event is not uncaught:
                self._caught_ooms.append(event)
            d = event.diagnosis
            self._write(
                "oom",
                diagnosis=d.to_dict() if d is not None else {},
                step=step,
                caught=event is not uncaught,
                site=event.site,
                event=event.to_dict() | {"diagnosis": None},
            )

    def _new_host(self, boundary: str = "") -> Any:
        """The host-memory watcher (RSS and C heap per step; autograd chains and Python objects)."""
        try:
            from torchmem.capture.host import HostWatcher

            # Node counts and readings within 0.2 % of the run each (its own default: 0.5 %): the run's
            # budget is shared with the device readings, the sampler and the loop survivors. The first
            # count after 30 s (a count walks the whole heap: ~0.1 s with a framework imported), so a short
            # run pays none; a scan for growing host memory counts them anyway.
            host = HostWatcher(
                warmup=self.warmup,
                boundary=boundary,
                node_interval=6.0,
                node_overhead=0.002,
                own_history=bool(self.memory_viz),  # --memory-viz turned the allocator's history on
                share=0.002,
                # No ramp: with readings from the first steps, scans (tracemalloc on) start within a short
                # run and cost it seconds, and kept host data with no culprit named reads as a leak (H100,
                # session 8: a 24-step run took 37.8 s; an inference control that keeps its outputs on the
                # host was called a leak).
                ramp=False,
            )
            return host.start()
        except Exception as exc:
            self._note(f"host memory is not watched ({type(exc).__name__}: {exc})")
            return None

    def _new_survivors(self, spent_s: float = 0.0, since: float | None = None) -> Any:
        from torchmem.capture.survivors import LoopSurvivors

        # A quarter of the leak threshold per step: a short loop's site that keeps less (predicted labels,
        # a few scalars) is not a leak, as it would not be for the growth detector.
        # Within ~1 % of the run (after a small fixed allowance: a loop of a few ms per step is covered
        # fully); a long run's verdict comes from the growth detector, the survivors are for short loops.
        return LoopSurvivors(
            str(self.device),
            min_bytes_per_step=64 * 1024,
            budget=SURVIVORS_BUDGET,
            spent_s=spent_s,
            since=since,
        )

    def _on_boundary(self) -> None:
        if not self._disabled and not self.step_marker:
            self.step()

    def _on_first(self, kind: str) -> None:
        """The first event of a kind while none is chosen: its reading, for the step it ends if the kind is
        chosen at its next event (a boundary is recognised at its second occurrence)."""
        w = self._watcher
        if self._disabled or self.step_marker or w is None or w.steps:
            return
        try:
            self._first_readings[kind] = w._reader()
        except Exception as exc:
            self._note(f"step detection: a first reading failed ({type(exc).__name__}: {exc})")

    def _unit_found(self, label: str) -> None:
        """The program's repeating unit was found (no other boundary): its calls are the steps from now."""
        if self._boundary_kind is None:
            self._on_switch("unit", f"{label} (the function the program's loop calls)")

    def _unit_step(self) -> None:
        if self._boundary_kind == "unit" and not self._disabled:
            self.step()

    def _on_switch(self, kind: str, label: str) -> None:
        """A step boundary was chosen, or a better one took over: the watcher restarts on it."""
        if self._disabled or self.step_marker:
            return
        if kind != "unit" and self._units is not None:
            self._units.active = False  # a boundary torchmem recognises counts the steps
        try:
            previous, self._boundary_kind, self._boundary_label = self._boundary_kind, kind, label
            old = self._watcher
            if previous is not None and old is not None and old.steps:
                if old.steps >= 3:
                    self._switches.append(
                        f"steps were counted at each {self._boundary_label_of(previous)} until step "
                        f"{old.steps}, then at each {label} (a better boundary was found): the leak detector "
                        "restarted"
                    )
                old.stop()
                self._bank_ledger()
                self._watcher = self._new_watcher()
                spent, since = 0.0, None
                if self._survivors is not None:  # its recorded steps were steps of the old kind
                    self._survivors.stop()
                    try:  # the new recorder shares the run's budget: the old one's cost is spent
                        spent, since = self._survivors.spent, self._survivors.first_boundary
                    except Exception:
                        pass
                self._survivors = self._new_survivors(spent, since)
                if self._host is not None:
                    self._host.stop()
                self._host = self._new_host(label)
                self._steps = 0
                self._leak_written = False
            self._write("boundary", kind=kind, label=label, count=0)
            first = self._first_readings.pop(kind, None) if previous is None else None
            self._first_readings.clear()
            w = self._watcher
            if first is not None and w is not None and not w.steps:
                self._replay = first
                self.step()  # the first event of the kind ended the first step, at the figure read then
        except Exception as exc:
            self._note(f"step detection: switching boundaries failed ({type(exc).__name__}: {exc})")

    def _boundary_label_of(self, kind: str) -> str:
        from torchmem.capture.boundaries import _default_label

        if kind == "unit":
            return self._units.label if self._units is not None and self._units.label else "call"
        return _default_label(kind)

    @property
    def _optimizer_steps_seen(self) -> int:
        b = self._boundaries
        return int(b.counts["optimizer"]) if b is not None else self._optimizer_steps

    @property
    def _last_optimizer(self) -> Any:
        b = self._boundaries
        return getattr(b, "last_optimizer", None) if b is not None else None

    def _profile(self, frame: types.FrameType, event: str, _arg: Any) -> None:
        if event == "return" and frame.f_code.co_name == self.step_marker and not self._disabled:
            self._marker_returns += 1
            self.step()

    def step(self) -> None:
        """One step ended: the watcher's reading, a step marker in the capture, the leak record once."""
        t0 = time.perf_counter()
        if self._step_end_t is not None:
            d = t0 - self._step_end_t  # the program's own step (without this bookkeeping)
            if self._instrumented:
                self._instr_sum += d
                self._instr_n += 1
            else:
                self._plain_steps.append(d)
        try:
            self._step_work()
        finally:
            t1 = time.perf_counter()
            self._own_step_s += t1 - t0
            self._step_end_t = t1
            try:
                self._instrumented = ledger().active or (self._host is not None and self._host.instrumenting)
            except Exception:
                self._instrumented = False

    def _settle_device(self) -> None:
        """While the first steps run (or, without steps, while nothing was judged): watch the GPU the program
        really works on — the one with a context that holds the most — and switch to it once."""
        g = self._gpus
        if g is None or self._device_settled:
            return
        if self._steps > self.warmup or not self._switch_lock.acquire(blocking=False):
            self._device_settled = self._steps > self.warmup
            return
        try:
            dev = g.choose()
            if dev is not None and dev != self.device:
                self._switch_device(dev)
        except Exception as exc:
            self._device_settled = True
            self._note(f"the GPU the program works on could not be followed ({type(exc).__name__}: {exc})")
        finally:
            self._switch_lock.release()

    def _switch_device(self, dev: torch.device) -> None:
        """Watch ``dev`` from now on: the watcher and the loop's survivors restart on it (this happens only
        within the first steps, before any verdict)."""
        old, self.device = self.device, dev
        if self._gpus is not None:
            self._gpus.watched = dev
        if self._worker_checks is not None:
            self._worker_checks.device = dev
        w = self._watcher
        if w is not None:
            w.stop()
        self._watcher = self._new_watcher()
        if self._survivors is not None:
            self._survivors.stop()
            self._survivors = self._new_survivors()
        self._steps = 0
        self._leak_written = False
        self._timeline.clear()
        why = ""
        if self._gpus is not None:
            sets = [s for s in self._gpus.evidence.get("set_device", ()) if s.get("index") == dev.index]
            if sets:
                why = f" (torch.cuda.set_device({dev.index}) at {sets[-1].get('site') or '?'})"
        self._write(
            "device",
            device=str(dev),
            name=_device_name(dev),
            previous=str(old),
            reason=f"the program works on {dev}{why}: it holds its memory there",
        )

    def _step_work(self) -> None:
        # On the CPU the figure is the C heap, which torchmem's own work (scans, the exact ledger's records)
        # also uses: the sampler takes no reading while this runs, so the timeline is the program's.
        self._own_work = True
        try:
            self._step_body()
        finally:
            self._own_work = False

    def _step_body(self) -> None:
        try:
            if not self._device_settled:
                self._settle_device()
            w = self._watcher
            if w is None:
                return
            pc = time.perf_counter
            t0 = pc()
            replay, self._replay = self._replay, None
            if replay is None:
                w.step()
            else:
                w.step_at(replay)
            self._steps = n = w.steps
            series = w._series
            if self.device.type == "cpu" and series and series[-1][0] == n:
                v = series[-1][1]  # every reading counts towards the peak (the step's as the sampler's)
                if v is not None and v > self._peak_seen:
                    self._peak_seen = int(v)
            t1 = pc()
            # (A replayed first step: the loop survivors and the host watcher saw nothing of it; their first
            # boundary is the next one.)
            if self._survivors is not None and replay is None:
                self._survivors.boundary(n)
            t2 = pc()
            if self._host is not None and replay is None:
                self._host.step()
            t3 = pc()
            parts = self._step_parts
            parts[0] += t1 - t0
            parts[1] += t2 - t1
            parts[2] += t3 - t2
            # One step record per reading the watcher took, at most one per 10 ms (a loop of thousands of
            # steps per second must not pay a JSON line per step); the sampler keeps the timeline.
            read_now = bool(series) and series[-1][0] == n
            if n <= 1000 or read_now:
                now = time.perf_counter()
                if n <= 1000 or now - self._last_step_write >= 0.01:
                    self._last_step_write = now
                    # Kept here and written by the sampler thread (one batch per tick): a JSON line and a
                    # write() per step were the largest part of a step's bookkeeping on a GPU host.
                    writer = self._writer
                    if writer is not None:
                        self._pending_steps.append((writer.elapsed(), n, series[-1][1] if read_now else None))
                        if len(self._pending_steps) > 4096:  # the sampler is not draining them: write here
                            self._flush_steps()
            if w.leaking and not self._leak_written and w.culprits:
                self._leak_written = True
                self._write("leak", report=self._labelled(w.report()).to_dict())
            if self.modules and not self._profiled:
                self._module_profile_step()
            if self._pending_ooms:
                self._flush_ooms(caught_by=None)  # the program went on: it caught them
        except Exception as exc:  # never break the program
            self._note(f"step bookkeeping failed: {type(exc).__name__}: {exc}")

    def _module_profile_step(self) -> None:
        """Profile one step per module (``--modules``): from the end of step 1 to the end of step 2."""
        try:
            from torchmem.capture.profile import profile
        except ImportError:  # pragma: no cover - the profile module ships with torchmem
            self._profiled = True
            return
        if self._profiler is None:
            if self._steps < 1:
                return
            model = _largest_module()
            if model is None:
                self._note("--modules: no nn.Module with parameters was found to profile")
                self._profiled = True
                return
            last = self._last_optimizer
            opt = last if isinstance(last, torch.optim.Optimizer) else None
            self._profiler = profile(model, device=self.device, optimizer=opt)
            self._profiler.__enter__()
            return
        prof, self._profiler = self._profiler, None
        self._profiled = True
        prof.__exit__(None, None, None)
        rep = prof.report()
        # The capture's "modules" record keeps its documented columns (ROW_KEYS), one row per module.
        self._write("modules", rows=[r.to_row() for r in rep.rows], notes=list(rep.notes))

    # -- sampling and status ---------------------------------------------------------------------
    def _sample_loop(self) -> None:
        last_status = 0.0
        wait = self.interval
        while not self._stop.wait(wait):
            if self._disabled:
                return
            # The thread's CPU time, not the wall clock: time spent waiting for the GIL costs the program
            # nothing (it is the program running).
            t_s = time.thread_time()
            t_w = 0.0  # of it, the DataLoader checks'
            try:
                self._flush_steps()
                if not self._pg_written:
                    self._write_group_facts()
                if self._gpus is not None:
                    self._gpus.poll()
                    if not self._device_settled and self._boundary_kind is None and self._steps == 0:
                        self._settle_device()  # no step yet: the timeline follows the program's GPU
                if self.device.type == "cpu" and self._own_work:
                    # torchmem's own step work is running on the C heap: not the program's figure
                    self._sampler_s += time.thread_time() - t_s
                    continue
                r = self._sample()
                now = time.perf_counter()
                if r.allocated is not None:
                    self._keep_timeline(now - self._t0, r.allocated)
                if self._boundaries is not None:
                    self._boundaries.check_imports()
                if self._units is not None and self._boundary_kind is None and not self._children:
                    self._units.sample()  # no step yet (and no work in child processes): the loop's call
                if self._worker_checks is not None:
                    t0 = time.thread_time()
                    self._worker_checks.poll(now)
                    t_w = time.thread_time() - t0
                if self._oom_flag is not None and self._oom_flag.seen is None:
                    self._check_flag()
                if self.status and now - last_status >= 0.25:
                    last_status = now
                    self._show_status(r.allocated, r.reserved, r.peak_allocated)
            except Exception as exc:
                self._note(f"sampler stopped: {type(exc).__name__}: {exc}")
                return
            spent = time.thread_time() - t_s
            self._sampler_s += spent
            self._sampler_workers_s += t_w
            self._ticks += 1
            # Holding the GIL for its ticks costs a host-bound program their time: the ticks are spaced so
            # that the sampler keeps under SAMPLER_SHARE of the run (a tick is ~0.1-1 ms: every 50 ms or
            # more), judged on a moving average of the ticks (the first ones write the first 1000 step
            # records, a one-off).
            tick = spent if self._tick_s is None else 0.8 * self._tick_s + 0.2 * spent
            self._tick_s = tick
            # Without steps the verdict comes from this timeline: its readings keep their pace then.
            if self._ticks >= 20 and self._steps > 0:
                wait = max(self.interval, min(_SAMPLER_MAX_INTERVAL, tick / SAMPLER_SHARE))
            else:
                wait = self.interval

    def _sample(self) -> Any:
        """A reading, written as a ``sample`` record; returned."""
        r = self._reading()
        self._write(
            "sample",
            step=self._steps,
            allocated=r.allocated,
            reserved=r.reserved,
            peak_allocated=r.peak_allocated,
            peak_reserved=r.peak_reserved,
        )
        return r

    def _reading(self) -> Any:
        """The session's figure: the allocator's counters, or on the CPU the C heap in use (the exact
        ledger is off outside attribution windows), with the peak of what was read."""
        if self.device.type != "cpu":
            return counters(self.device)
        from torchmem.devices import HotReading
        from torchmem.devices._host import heap_in_use, process_rss

        v = heap_in_use()
        if v is None:
            v = process_rss()
        if v is not None and v > self._peak_seen:
            self._peak_seen = v
        return HotReading(v, None, None, self._peak_seen or v, None)

    def _keep_timeline(self, t: float, value: int) -> None:
        """The (seconds, bytes) timeline for a verdict without steps: every reading up to 4096, then
        every 2nd, 4th, ... (bounded)."""
        self._timeline_n += 1
        if self._timeline_n % self._timeline_every:
            return
        self._timeline.append((t, value))
        if len(self._timeline) >= 4096:
            self._timeline = self._timeline[::2]
            self._timeline_every *= 2

    def _timeline_report(self) -> LeakReport | None:
        """With no repeating step, growth decided on the sampled timeline, per second."""
        from torchmem.analysis.leaks import timeline_growth, timeline_report

        pts = list(self._timeline)
        g = timeline_growth(pts)
        if g is None:
            return None
        w = self._watcher
        culprits: tuple[Any, ...] = ()
        notes = ["no repeating step was found: the verdict is per second of the sampled timeline"]
        if g.leaking:
            try:
                culprits, more = self._timeline_culprits(g.bytes_per_step)
                notes += more
            except Exception as exc:
                notes.append(f"what grows could not be named ({type(exc).__name__}: {exc})")
        source = w.source if w is not None else "n/a"
        return timeline_report(pts, g, device=str(self.device), source=source, culprits=culprits, notes=notes)

    def _timeline_culprits(self, rate: float, unit: str = "s") -> tuple[tuple[Any, ...], list[str]]:
        """Who holds what grew, without steps: the tensors born during the run and still alive, their
        holders named (there is no allocation site: the exact ledger never ran without a step)."""
        from torchmem.analysis.holders.survivors import holder_paths_of_storages
        from torchmem.analysis.leaks import attribute
        from torchmem.results.leaks import SiteGrowth

        born = [(k, s) for k, s in _live_storages(self.device).items() if k not in self._born_before]
        if not born:
            return (), ["no tensor born during the run is alive: what grew is not a tensor storage"]
        born.sort(key=lambda ks: -_nbytes(ks[1]))
        live = sum(_nbytes(s) for _, s in born)
        samples = [s for _, s in born[:6]]
        born.clear()
        info: dict[str, Any] = {}
        paths = holder_paths_of_storages(samples, max_paths=2, time_limit=3.0, info=info)
        samples.clear()
        flat = tuple(p for ps in paths for p in ps)
        fact = SiteGrowth(None, rate, live, len(paths), 1.0, flat)
        culprits = attribute([fact], min_bytes_per_step=0.0, unit=unit, device=str(self.device))
        return culprits, [
            "per second: without a step the allocation site is unknown; what holds the tensors born "
            "during the run is named (name the loop's function with --step-marker for the site)"
        ]

    def _named(self, leak: LeakReport, survivors: Any) -> LeakReport:
        """A leak the watcher found with no culprit (it was found in the last steps, or in a short run, before
        the exact ledger could attribute it): name it from what the loop's recorded steps allocated and still
        hold (allocation site and holder), else from the tensors born during the run that are still alive
        (holder only). The note says what the naming rests on."""
        if not leak.leaking or leak.culprits:
            return leak
        import dataclasses

        from torchmem.analysis.leaks import attribute
        from torchmem.results.leaks import SiteGrowth

        unit = "s" if leak.boundary == "second" else "step"
        rate = leak.bytes_per_step
        facts: list[SiteGrowth] = []
        note = ""
        groups = [g for g in getattr(survivors, "groups", ()) if g.live_bytes > 0 and g.holders]
        if groups:
            big = max(g.live_bytes for g in groups)
            # the groups that matter at this rate: the largest, and any within 1/8 of it
            chosen = [g for g in groups if g.live_bytes >= big / 8]
            total = sum(g.live_bytes for g in chosen) or 1
            for g in chosen:
                share = rate * g.live_bytes / total
                facts.append(SiteGrowth(g.site, share, g.live_bytes, g.count, 1.0, tuple(g.holders)))
            from torchmem.results.survivors import step_ranges

            covered = step_ranges(tuple(getattr(survivors, "covered", ()) or ()))
            note = (
                f"named from what the loop's recorded steps ({covered}) allocated and still hold: the growth "
                "was found from the readings, after the exact ledger's window"
            )
        else:
            try:
                culprits, _ = self._timeline_culprits(rate, unit)
            except Exception:
                culprits = ()
            if culprits:
                return dataclasses.replace(
                    leak,
                    culprits=culprits,
                    notes=(
                        *leak.notes,
                        "named from the tensors born during the run that are still alive "
                        "(no allocation site: the exact ledger did not record these steps)",
                    ),
                )
            return leak
        culprits = attribute(facts, min_bytes_per_step=0.0, unit=unit, device=str(self.device))
        if not culprits:
            return leak
        return dataclasses.replace(leak, culprits=culprits, notes=(*leak.notes, note))

    def _labelled_host(self, rep: LeakReport) -> LeakReport:
        import dataclasses

        label = f"return of {self.step_marker}()" if self.step_marker else self._boundary_label
        return dataclasses.replace(rep, boundary=label)

    def _labelled(self, rep: LeakReport) -> LeakReport:
        """The watcher's report with the step boundary it was fed and the switches between boundaries."""
        import dataclasses

        label = self._boundary_label
        if self.step_marker:
            label = f"return of {self.step_marker}()"
        notes = tuple(self._switches) + tuple(rep.notes)
        return dataclasses.replace(rep, boundary=label, notes=notes)

    def forecast(self, leak: LeakReport | None) -> Any:
        """When the watched device (or the RAM) runs out at the leak's rate (a
        :class:`~torchmem.results.forecast.Forecast`), ``None`` without a leak or a known capacity."""
        if leak is None or not leak.leaking or leak.bytes_per_step <= 0:
            return None
        from torchmem.analysis.forecast import forecast

        unit = "s" if leak.boundary == "second" else "step"
        step_s = _median(self._plain_steps)
        r = self._reading()
        if self.device.type == "cpu":
            from torchmem.devices._host import host_memory, process_rss

            hm = host_memory()
            used = r.allocated
            if used is None or hm.available is None:
                return None
            room, what = hm.available, "the RAM"
            rss = process_rss()
            if hm.cgroup_limit is not None and rss is not None and hm.cgroup_limit - rss < room:
                room, what = max(hm.cgroup_limit - rss, 0), "the cgroup's memory limit"
            return forecast(leak.bytes_per_step, unit, used, used + room, what, step_s)
        from torchmem.devices import backend

        info = backend(self.device).mem_info()
        if info is None or r.allocated is None:
            return None
        free, _total = info
        # growth fills the allocator's cached blocks first, then takes what the driver has free
        capacity = (r.reserved if r.reserved is not None else r.allocated) + free
        return forecast(leak.bytes_per_step, unit, r.allocated, capacity, str(self.device), step_s)

    def _status_forecast(self, w: Any) -> str:
        now = time.perf_counter()
        if now - self._forecast_at >= 2.0:
            self._forecast_at = now
            try:
                f = self.forecast(w.report())
                self._forecast_text = f" | {f.short()}" if f is not None else ""
            except Exception:
                self._forecast_text = ""
        return self._forecast_text

    def status_text(self, allocated: int | None, reserved: int | None, peak: int | None) -> str:
        w = self._watcher
        text = f"[torchmem] step {self._steps} | allocated {fmt_bytes(allocated)}"
        if reserved is not None:
            text += f" | reserved {fmt_bytes(reserved)}"
        text += f" | peak {fmt_bytes(peak)}"
        if w is not None and w.leaking:
            text += f" | LEAK +{fmt_bytes(int(w.report().bytes_per_step))}/step"
            text += self._status_forecast(w)
        if self._gpus is not None:
            text += self._gpus.status()  # the other GPUs this process uses
        return text

    def _worker_warning(self, code: str, text: str) -> None:
        """A DataLoader/worker check's warning (once each): in the capture and on stderr now."""
        self._note(text)
        with self._status_lock:
            self._clear_status_locked()
            try:
                print(f"torchmem: warning: {text}", file=self._status_file, flush=True)
            except Exception:
                pass

    def _show_status(self, allocated: int | None, reserved: int | None, peak: int | None) -> None:
        text = self.status_text(allocated, reserved, peak)
        with self._status_lock:
            if self._user_line_open:  # the program is in the middle of a line: do not write into it
                return
            pad = max(0, self._status_len - len(text))
            self._status_len = len(text)
            self._status_file.write("\r" + text + " " * pad)
            self._status_file.flush()

    def _clear_status(self) -> None:
        with self._status_lock:
            self._clear_status_locked()

    def _clear_status_locked(self) -> None:
        if self.status and self._status_len:
            self._status_file.write("\r" + " " * self._status_len + "\r")
            self._status_file.flush()
            self._status_len = 0

    def _before_program_write(self, text: str) -> None:
        """Called with the status lock held, before the program's ``text`` is written."""
        try:
            if self._status_len:
                self._clear_status_locked()
            if text:
                self._user_line_open = not text.endswith("\n")
        except Exception:  # never break the program's output
            pass

    def _wrap_streams(self) -> None:
        """Clear the status line before the program prints (stdout and stderr share the terminal)."""
        for name in ("stdout", "stderr"):
            stream = getattr(sys, name)
            if stream is None or isinstance(stream, _StatusAwareStream):
                continue
            wrapper = _StatusAwareStream(stream, self)
            setattr(sys, name, wrapper)
            self._streams.append((name, wrapper))

    def _unwrap_streams(self) -> None:
        for name, wrapper in self._streams:
            if getattr(sys, name) is wrapper:  # the program may have replaced it: then leave it
                setattr(sys, name, wrapper._tm_stream)
        self._streams = []

    # -- child processes ---------------------------------------------------------------------------
    def _watch_processes(self) -> None:
        """Note the processes the program starts (mp.spawn, multiprocessing, hogwild): their memory is
        not this process's, and a run whose work happens there must say so. The hook is removed at the
        end; DataLoader workers are counted apart."""
        import multiprocessing.process as mpp

        original = mpp.BaseProcess.start
        session = self

        def start(proc: Any) -> None:
            try:
                session._before_process_start(proc)
            except Exception:
                pass
            original(proc)
            try:
                session._process_started(proc)
            except Exception:
                pass

        start.__wrapped__ = original  # type: ignore[attr-defined]
        self._saved_start = original
        mpp.BaseProcess.start = start  # type: ignore[method-assign,assignment]

    def _restore_processes(self) -> None:
        import multiprocessing.process as mpp

        if self._saved_start is not None and getattr(mpp.BaseProcess.start, "__wrapped__", None) is (
            self._saved_start
        ):
            mpp.BaseProcess.start = self._saved_start  # type: ignore[method-assign,assignment]
        self._saved_start = None

    def _process_started(self, proc: Any) -> None:
        if os.getpid() != self._pid or self._disabled:
            return
        target = getattr(proc, "_target", None)
        if getattr(target, "__module__", "") == "torch.utils.data._utils.worker":
            self._workers += 1
            if self._gpus is not None and proc.pid:
                self._gpus.skip([int(proc.pid)])  # the DataLoader checks describe workers
            return
        followed = getattr(proc, "_tm_capture", None)
        from torchmem.capture.ranks import FollowedTarget

        if isinstance(target, FollowedTarget):
            target = target.target
        what = getattr(target, "__qualname__", None) or type(proc).__name__
        desc = f"{proc.name} (pid {proc.pid}, {what})"
        self._children.append(desc)
        if self._gpus is not None and proc.pid:
            from torchmem.capture.gpus import _site

            self._gpus.child_started(int(proc.pid), f"{what} (multiprocessing)", _site(), bool(followed))
        if followed:
            self._note(f"the program started process {desc}; it records its own capture {followed}")
        else:
            self._note(f"the program started process {desc}; its memory is not in this capture")

    def _before_process_start(self, proc: Any) -> None:
        """Wrap a training child's target (capture/ranks.FollowedTarget) so it records its own capture."""
        if os.getpid() != self._pid or self._disabled:
            return
        from torchmem.capture.ranks import FollowedTarget, child_capture, should_follow, spawn_index

        target = getattr(proc, "_target", None)
        if target is None or not should_follow(target):
            return
        with self._child_lock:
            index = spawn_index(proc)
            if index is None or any(c == child_capture(self.capture, index) for c in self._followed):
                index = len(self._followed)
                while child_capture(self.capture, index) in self._followed:
                    index += 1
            capture = child_capture(self.capture, index)
            self._followed.append(capture)
            if not self._job:
                import hashlib

                self._job = hashlib.sha1(f"{os.getpid()}|{time.time()}".encode()).hexdigest()[:12]
            if self._oom_flag is None:
                from torchmem.capture.ranks import OOMFlag

                self._oom_flag = OOMFlag(os.path.dirname(os.path.abspath(self.capture)), self._job)
        options = {
            # the child follows the GPU it uses (set_device(rank)), unless the run was given one
            "device": None if self._auto_device else str(self.device),
            "interval": self.interval,
            "warmup": self.warmup,
            "step_marker": self.step_marker,
            "force": self.force,
            "job": self._job,
        }
        proc._target = FollowedTarget(target, capture, index, options, Session)
        proc._tm_capture = capture

    def _why_no_steps(self) -> str:
        """Why no step was counted, and what to do next."""
        if self._followed:
            n = len(self._followed)
            return (
                f"the program's work ran in {n} child process{'es' if n > 1 else ''} it started; each "
                f"recorded its own capture ({', '.join(self._followed[:3])}{', ...' if n > 3 else ''}). "
                f"Merge them: torchmem report {_glob_of(self.capture)} (inside a worker, torchmem.watch() "
                "watches one loop)"
            )
        if self._children:
            n = len(self._children)
            return (
                f"the program's work ran in {n} child process{'es' if n > 1 else ''} it started "
                f"({', '.join(self._children[:3])}{', ...' if n > 3 else ''}); torchmem run measures this "
                "process only. Use torchmem.watch() inside the worker function, or launch the workers "
                "with torchrun and run each under torchmem (torchrun ... -m torchmem run train.py)."
            )
        if self.step_marker:
            name = self.step_marker
            dotted = (
                f" The marker is a bare function name: use {name.rsplit('.', 1)[-1]!r}, not {name!r}."
                if "." in name
                else ""
            )
            also = (
                f" ({self._optimizer_steps_seen} optimizer steps did run: drop --step-marker to count those.)"
                if self._optimizer_steps_seen
                else ""
            )
            return (
                f"no function named {name!r} returned in this process, so --step-marker counted no step."
                + dotted
                + also
                + " Check the spelling against the def of the function one iteration of the loop calls."
            )
        b = self._boundaries
        other = b.other_thread["optimizer"] if b is not None else self._other_thread_steps
        if other:
            return (
                f"{other} optimizer steps ran in other threads; torchmem run counts the steps of the main "
                "thread. Wrap the training loop in torchmem.watch() in its thread."
            )
        seen = b.describe() if b is not None else "none"
        return (
            "no repeating step was found: no optimizer step, backward() call, model call, DataLoader batch "
            f"or generate() call repeated on the main thread (seen: {seen}). The leak verdict comes from the "
            "sampled timeline (bytes per second). If the program has a loop, name the function one iteration "
            "calls: --step-marker FUNCTION, or wrap the loop: for batch in torchmem.watch(loader)."
        )

    # -- distributed runs (capture/ranks.py) -----------------------------------------------------
    def _rank_header(self) -> dict[str, Any]:
        """The header's ``rank`` field (launcher, rank, local rank, world size, host, job) and the job's OOM
        flag, from the environment only (no process-group call)."""
        try:
            from torchmem.capture.ranks import OOMFlag, rank_info

            info = rank_info()
            if info is None:
                return {}
            self._rank = info
            self._job = info.job
            if info.job and (info.world_size > 1 or info.launcher == "spawn"):
                self._oom_flag = OOMFlag(os.path.dirname(os.path.abspath(self.capture)), info.job)
            return {"rank": info.to_dict()}
        except Exception:
            return {}

    def _raise_flag(self, site: Any) -> None:
        """This process ran out of memory: the job's flag tells the other ranks (no collective)."""
        self._flag_raised = True
        try:
            rank = self._rank.rank if self._rank is not None else None
            self._oom_flag.raise_(
                rank, site=site, step=self._steps, device=str(self.device), capture=self.capture
            )
        except Exception:
            pass

    def _check_flag(self) -> None:
        try:
            body = self._oom_flag.check()
        except Exception:
            body = None
        if body is not None:
            self._write_rank_state(body)

    def _write_rank_state(self, trigger: dict[str, Any]) -> None:
        """What this process holds at the moment a rank of the job ran out of memory (a ``rank_state``)."""
        with self._child_lock:
            if self._rank_state_written:
                return
            self._rank_state_written = True
        try:
            r = self._reading()
            stats: Any = None
            try:
                from torchmem.capture.snapshot import read_stats

                stats = read_stats(self.device, probe=False).to_dict()
            except Exception:
                stats = None
            self._write(
                "rank_state",
                trigger=trigger,
                wall=time.time(),
                step=self._steps,
                allocated=r.allocated,
                reserved=r.reserved,
                peak_allocated=r.peak_allocated,
                peak_reserved=r.peak_reserved,
                stats=stats,
            )
        except Exception as exc:
            self._note(
                f"this rank's state at another rank's OOM could not be read ({type(exc).__name__}: {exc})"
            )

    def _write_group_facts(self) -> None:
        """The default process group's rank, world size, backend, NCCL communicators: once, no collective."""
        dist = sys.modules.get("torch.distributed")
        if dist is None:
            return
        try:
            if not dist.is_available() or not dist.is_initialized():
                return
            from torchmem.capture.ranks import process_group_facts
            from torchmem.results.ranks import estimate_nccl

            facts = process_group_facts()
            if facts is None:
                return
            self._pg_written = True
            nccl = estimate_nccl(os.environ, facts.get("nccl_communicators") or 0)
            self._write("rank", **facts, nccl=nccl.to_dict() if nccl is not None else None)
        except Exception as exc:
            self._pg_written = True
            self._note(f"the process group could not be described ({type(exc).__name__}: {exc})")

    def _finish_ranks(self, exc: BaseException | None) -> None:
        """At the end: the process group's facts if no step wrote them, the flag raised for an OOM that
        ended the run unseen, and this rank's state if a flag was raised and the sampler missed it."""
        if not self._pg_written:
            self._write_group_facts()
        flag = self._oom_flag
        if flag is None:
            return
        if exc is not None and not self._flag_raised:
            try:
                from torchmem.analysis.oom import is_oom

                if is_oom(exc):
                    self._raise_flag(None)
            except Exception:
                pass
        if flag.seen is None:
            self._check_flag()

    # -- end -------------------------------------------------------------------------------------
    def finish(self, exit_code: int | None, reason: str, exc: BaseException | None = None) -> SessionResult:
        """Stop monitoring, explain an OOM, write the final records and close the capture."""
        finish_t = time.perf_counter()
        global _current
        if _current is not None and _current() is self:
            _current = None
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        self._flush_steps()
        if self._worker_checks is not None:
            self._worker_checks.uninstall()
        self._finish_ranks(exc)
        self._clear_status()
        self._unwrap_streams()
        self._restore_processes()
        if self._gpus is not None:
            self._gpus.remove()
        undo, self._unwatch_groups = self._unwatch_groups, None
        if undo is not None:
            undo()
        if self.step_marker:
            sys.setprofile(self._profile_prev)
        if self._boundaries is not None:
            self._boundaries.stop()
        if self._units is not None:
            self._units.remove()
        if self._profiler is not None:  # the program ended inside the profiled step
            try:
                self._profiler.__exit__(None, None, None)
            except Exception as e:
                self._note(f"--modules: the profile could not be finished ({type(e).__name__}: {e})")
            self._profiler = None
        w = self._watcher
        # the end reading is a sample like the others: the run's summary and `torchmem report` read one peak
        r = self._sample()
        self._record_stats("end")
        gpus = None
        if self._gpus is not None:
            try:
                gpus = self._gpus.report()
                if gpus.rows or gpus.children:
                    self._write("gpus", report=gpus.to_dict())
                else:
                    gpus = None
            except Exception as e:
                self._note(f"the GPUs' figures could not be written ({type(e).__name__}: {e})")
        if self.memory_viz is not None:
            from torchmem.devices import _ops

            problem = _ops.dump_history_snapshot(self.memory_viz)
            _ops.record_history(False)
            self._note(
                f"--memory-viz: {problem}" if problem else f"allocator history snapshot: {self.memory_viz}"
            )
        leak: LeakReport | None = None
        if w is not None:
            w.stop()
            leak = self._labelled(w.report())
            if self._boundary_kind is None and not self.step_marker:
                timeline = self._timeline_report()
                if timeline is not None:
                    leak = timeline
        survivors = None
        if self._survivors is not None:
            try:
                self._survivors.stop()
                survivors = self._survivors.report(total_steps=self._steps, boundary=self._boundary_label)
                if survivors.leaking and leak is not None and leak.verdict not in ("too_few", "no_steps"):
                    # The loop ran long enough for the growth detector: its verdict stands, and what the
                    # first steps left alive (a cache, a history) is for information only.
                    import dataclasses

                    survivors = dataclasses.replace(
                        survivors,
                        leaking=False,
                        notes=(
                            *survivors.notes,
                            f"the loop ran {self._steps} steps, enough for the growth detector's verdict "
                            f"({leak.verdict}): these survivors are listed for information",
                        ),
                    )
                self._write("survivors", report=survivors.to_dict())
            except Exception as e:
                self._note(f"the loop's survivors could not be reported ({type(e).__name__}: {e})")
        if leak is not None:
            try:
                leak = self._named(leak, survivors)
            except Exception as e:
                self._note(f"the leak could not be named ({type(e).__name__}: {e})")
            self._write("leak", report=leak.to_dict(), final=True)
        forecast = None
        try:
            forecast = self.forecast(leak)
            if forecast is not None:
                self._write("forecast", forecast=forecast.to_dict())
        except Exception as e:
            self._note(f"when the memory runs out could not be forecast ({type(e).__name__}: {e})")
        oom = None
        final_exc = None
        if exc is not None:
            from torchmem.analysis.oom import is_oom

            if is_oom(exc):
                reason = "oom"
                final_exc = exc
        matched = None
        if final_exc is not None and self._oom_events:
            from torchmem.capture.oom import match_event

            with self._oom_lock:
                matched = match_event([e for e, _ in self._pending_ooms], final_exc)
        try:
            self._flush_ooms(caught_by=final_exc, final=True)
        except Exception as e:
            self._note(f"the recorded OOMs could not be written ({type(e).__name__}: {e})")
        if final_exc is not None:
            try:
                from torchmem.capture.oom import explain_oom

                oom = explain_oom(final_exc, device=self.device, leak=leak if leak and leak.leaking else None)
                if matched is None:  # not seen when raised (an OOM outside the observers): written now
                    self._write("oom", diagnosis=oom.to_dict(), step=self._steps, caught=False, site=None)
            except Exception as e:
                self._note(f"the OOM could not be explained ({type(e).__name__}: {e})")
        if self._observer is not None:
            self._observer.detach()
        host = None
        if self._host is not None:
            try:
                self._host.stop()
                host = self._host.report()
                if self._boundary_label or self.step_marker:
                    host = self._labelled_host(host)
                host = _host_policy(host)
                inner = leak is not None and leak.verdict == "inner_growth"
                if (
                    host.leaking
                    and self.device.type == "cpu"
                    and leak is not None
                    and (leak.leaking or inner)
                    and not (host.culprits and not leak.culprits)  # the host names what the device cannot
                ):
                    # On the CPU the device figure is the C heap: the device report already is this growth.
                    import dataclasses

                    host = dataclasses.replace(
                        host,
                        leaking=False,
                        verdict="flat" if not host.culprits else host.verdict,
                        notes=(*host.notes, "on the CPU the device report covers this growth"),
                    )
                if host.leaking and leak is not None and leak.verdict == "inner_growth":
                    host = _host_inner(host)  # the device saw growth inside each call: the host's is the same
                self._write("host_leak", report=host.to_dict(), final=True)
            except Exception as e:
                self._note(f"the host memory verdict could not be made ({type(e).__name__}: {e})")
        if self._boundary_kind is not None:
            self._write("boundary", kind=self._boundary_kind, label=self._boundary_label, count=self._steps)
        elif not self.step_marker:
            self._write("boundary", kind="timeline" if self._timeline else "none", label="second", count=0)
        no_steps = self._why_no_steps() if self._steps == 0 else None
        if no_steps is not None:
            self._note(f"0 steps: {no_steps}")
        overhead = None
        try:
            overhead = self._overhead(finish_t)
        except Exception as e:
            self._note(f"torchmem's own cost could not be estimated ({type(e).__name__}: {e})")
        seconds = time.perf_counter() - self._t0
        if self._writer is not None and not self._disabled:
            with self._lock:
                self._writer.close(exit_code=exit_code, reason=reason, steps=self._steps, seconds=seconds)
        return SessionResult(
            capture=self.capture,
            steps=self._steps,
            seconds=seconds,
            peak_allocated=r.peak_allocated,
            peak_reserved=r.peak_reserved,
            leak=leak,
            oom=oom,
            exit_code=exit_code,
            reason=reason,
            no_steps=no_steps,
            children=tuple(self._children),
            child_captures=tuple(self._followed),
            rank=self._rank,
            survivors=survivors,
            boundary=self._boundary_label,
            ooms=tuple(self._oom_events),
            host_leak=host,
            caught_ooms=tuple(self._caught_ooms),
            overhead=overhead,
            gpus=gpus,
            forecast=forecast,
        )

    # -- what torchmem cost --------------------------------------------------------------------
    def _ledger_estimate(self) -> tuple[float, int, bool]:
        """The exact accounting's extra time in this boundary kind's instrumented steps: their time beyond
        the median step of the same kind without it (``known`` False when every step was instrumented)."""
        if self._instr_n == 0:
            return 0.0, 0, True
        base = _median(self._plain_steps)
        if base is None:
            return 0.0, self._instr_n, False
        return max(0.0, self._instr_sum - self._instr_n * base), self._instr_n, True

    def _bank_ledger(self) -> None:
        s, n, known = self._ledger_estimate()
        b = self._ledger_banked
        self._ledger_banked = (b[0] + s, b[1] + n, b[2] and known)
        self._plain_steps.clear()
        self._instr_sum, self._instr_n = 0.0, 0
        self._step_end_t = None  # the step under way spans the switch: not timed

    def _overhead(self, finish_t: float) -> str | None:
        """Estimate what torchmem's own work added to the program's run (up to its end), write it as the
        ``overhead`` record, and say so in a note when the run took 1.2x as long as it would without it.

        The parts, each measured as it ran: the step bookkeeping (readings, scans, holder searches,
        records: timed inside :meth:`step`), the sampler thread's work, and the exact ledger's per-op cost
        in the steps it was on (those steps' time beyond the median step without it). The module hooks that
        find the steps are not timed (about a microsecond per top-level call).
        """
        wall = finish_t - self._t0
        cur_s, cur_n, cur_known = self._ledger_estimate()
        bank_s, bank_n, bank_known = self._ledger_banked
        ledger_s, ledger_n, known = cur_s + bank_s, cur_n + bank_n, cur_known and bank_known
        parts = {"steps": self._own_step_s, "sampler": self._sampler_s, "ledger": ledger_s}
        own = min(sum(parts.values()), 0.95 * wall)
        ratio = wall / (wall - own) if wall > 0 else 1.0
        sp = self._step_parts
        detail = {
            "steps.reading": sp[0],
            "steps.survivors": sp[1],
            "steps.host": sp[2],
            "steps.other": max(0.0, self._own_step_s - sum(sp)),
            "sampler.workers": self._sampler_workers_s,
            "sampler.other": max(0.0, self._sampler_s - self._sampler_workers_s),
        }
        self._write(
            "overhead",
            wall_s=round(wall, 6),
            own_s=round(own, 6),
            ratio=round(ratio, 4),
            parts={k: round(v, 6) for k, v in parts.items()},
            detail={k: round(v, 6) for k, v in detail.items()},
            sampler_ticks=self._ticks,
            steps=self._steps,
            ledger_steps=ledger_n,
            ledger_known=known,
        )
        if ratio < OVERHEAD_NOTE_RATIO or wall < OVERHEAD_NOTE_MIN_S:
            return None
        words = {
            "steps": f"step bookkeeping {parts['steps']:.1f} s over {self._steps} steps (readings, scans, "
            "holder searches)",
            "sampler": f"the background sampler {parts['sampler']:.1f} s",
            "ledger": f"exact tensor accounting {parts['ledger']:.1f} s in the {ledger_n} steps it was on "
            "(recording the loop's first steps, naming growth; steps of every kind counted)",
        }
        top = [words[k] for k, v in sorted(parts.items(), key=lambda kv: -kv[1]) if v >= 0.05 * own]
        text = (
            f"torchmem's own work took about {own:.1f} s of this {wall:.1f} s run: the program ran about "
            f"{ratio:.2f}x as long as it would without it ({'; '.join(top)})"
        )
        self._note(text)
        return text

    # -- helpers ---------------------------------------------------------------------------------
    def _before_destroy(self) -> None:
        """The program destroys its process group: a reading while NCCL's communicators still exist (the
        end reading comes after them; NCCL's measured figure is in this one)."""
        if self._disabled or self._pg_end_read:
            return
        from torchmem.capture.ranks import process_group_facts

        facts = process_group_facts()
        if facts and facts.get("nccl_communicators"):
            self._pg_end_read = True
            self._record_stats("destroy_process_group")

    def _record_stats(self, when: str) -> None:
        try:
            from torchmem.capture.snapshot import read_stats

            s = read_stats(self.device, probe=False)  # no probe process on the program's time
            try:
                bd: Any = s.breakdown().to_dict()
            except Exception:
                bd = None
            self._write("stats", when=when, stats=s.to_dict(), breakdown=bd)
        except Exception as exc:
            self._note(f"stats at {when} could not be read ({type(exc).__name__}: {exc})")

    def _flush_steps(self) -> None:
        """Write the step records the loop kept since the last flush (in order, with their own times)."""
        pending = self._pending_steps
        while pending:
            try:
                t, n, allocated = pending.popleft()
            except IndexError:
                return
            self._write("step", step=n, allocated=allocated, t=t)

    def _write(self, record: str, /, **fields: Any) -> None:
        if self._writer is None or self._disabled:
            return
        with self._lock:
            if record == "sample":
                self._writer.sample(**fields)
            elif record == "step":
                self._writer.step(**fields)
            else:
                self._writer.record(record, **fields)

    def _note(self, text: str) -> None:
        try:
            self._write("note", text=text)
        except Exception:  # the writer reports its own failures once
            pass

    def _in_child(self) -> None:
        # A forked child (DataLoader workers) is not monitored: it must never write the parent's capture.
        if os.getpid() != self._pid:
            self._disabled = True
            self._writer = None


# Host growth that names no culprit (no growing autograd chain, no accumulating Python objects) is data the
# program keeps on purpose (predicted labels, a history of numbers) unless it is as large as a device leak.
_HOST_UNEXPLAINED_MIN = 256 * 1024


# The estimated slowdown from which the end summary says what torchmem cost (issue 12's target for the usual
# program; op-heavy programs may reach 2x).
OVERHEAD_NOTE_RATIO = 1.2
OVERHEAD_NOTE_MIN_S = 0.5  # ... on a run of at least this long (a shorter one is mostly start-up)
# The share of the run the loop survivors' recording may add beyond their first two steps (issue 12: <= 2 %
# for all of torchmem).
SURVIVORS_BUDGET = 0.01
# The share of the run the sampler thread's ticks may take (their CPU time: a host-bound loop waits for the
# GIL while a tick runs), and the longest gap between two ticks that this spacing may reach.
SAMPLER_SHARE = 0.003
_SAMPLER_MAX_INTERVAL = 0.5


def _glob_of(capture: str) -> str:
    """The shell pattern of a capture and its children's: ``run.jsonl`` -> ``run*.jsonl``."""
    import shlex

    folder, name = os.path.split(capture)
    stem, dot, suffix = name.rpartition(".")
    if not (dot and stem):
        stem, suffix = name, ""
    # the literal part quoted, the star not: `'my runs/run'*.jsonl` can be pasted into a shell
    return shlex.quote(os.path.join(folder, stem)) + "*" + (f".{shlex.quote(suffix)}" if suffix else "")


def _median(values: collections.deque[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def _host_inner(host: LeakReport) -> LeakReport:
    """Host growth that climbs inside each call and falls back at its end (autograd nodes of a graph
    carried across an inner loop) is not a leak: the same verdict as the device's."""
    import dataclasses

    from torchmem.analysis.leaks import inner_growth

    found = inner_growth(host.series, max(host.min_bytes_per_step, 1.0))
    if found is None:
        return host
    rate, length, height, ramps = found
    return dataclasses.replace(
        host,
        leaking=False,
        bytes_per_step=0.0,
        verdict="inner_growth",
        trend_per_step=rate,
        reason=(
            f"host memory climbs by {fmt_bytes(int(rate))}/step for about {length} steps and falls back at "
            f"the end ({ramps} times, {fmt_bytes(height)} at its peak): growth inside each call, nothing "
            "kept across calls"
        ),
    )


def _host_policy(host: LeakReport) -> LeakReport:
    """A host verdict is a leak when it names what grows, or grows like a device leak (256 KiB/step)."""
    from torchmem.analysis.leaks import large_total

    seen = host.leaking or host.detected_at is not None
    rate = max(host.bytes_per_step, host.trend_per_step)
    large = host.leaking and len(host.series) > 1 and large_total(host.series[0][1], host.series[-1][1])
    if not seen or host.culprits or rate >= _HOST_UNEXPLAINED_MIN or large:
        return host
    import dataclasses

    return dataclasses.replace(
        host,
        leaking=False,
        verdict="below_threshold",
        detected_at=None,
        stopped_at=None,
        trend_per_step=rate,
        bytes_per_step=0.0,
        reason=(
            f"host memory grew by {fmt_bytes(int(rate))}/step with no growing autograd chain "
            f"and no accumulating Python objects: data the program keeps (reported as a leak from "
            f"{fmt_bytes(_HOST_UNEXPLAINED_MIN)}/step)"
        ),
    )


def _live_storages(device: torch.device) -> dict[int, Any]:
    """The storages of the live tensors on ``device`` (gc), by key. Strong references: drop soon."""
    import gc

    out: dict[int, Any] = {}
    tensor_t = torch.Tensor
    for o in gc.get_objects():
        if not issubclass(type(o), tensor_t):
            continue
        try:
            if o.device.type != device.type or (device.index is not None and o.device.index != device.index):
                continue
            st = o.untyped_storage()
        except Exception:  # sparse, nested, meta and other storage-less layouts
            continue
        out.setdefault(st._cdata, st)
    return out


def _live_storage_keys(device: torch.device) -> set[int]:
    try:
        return set(_live_storages(device))
    except Exception:
        return set()


def _nbytes(storage: Any) -> int:
    try:
        return int(storage.nbytes())
    except Exception:
        return 0


def _rank_device() -> torch.device | None:
    """The GPU of a launched rank (torchrun, SLURM, MPI: its local rank's) when several are visible, else
    ``None`` (the default device). Every rank watching cuda:0 would read the wrong GPU, and its first
    reading there would create a CUDA context (~500 MiB) on GPU 0 in every rank. Never initialises CUDA."""
    try:
        from torchmem.capture.ranks import rank_device_index, rank_info
        from torchmem.devices import cuda_available, cuda_count

        info = rank_info()  # the environment only: no CUDA query outside a launcher
        if info is None or info.local_rank is None or not cuda_available():
            return None
        index = rank_device_index(info, cuda_count())
    except Exception:
        return None
    return None if index is None else torch.device("cuda", index)


def _source_of(dev: torch.device) -> str:
    """What the capture's figures are: the caching allocator's, or on the CPU the C heap in use (the exact
    ledger where the heap cannot be read)."""
    if dev.type != "cpu":
        return "allocator"
    from torchmem.devices._host import heap_in_use

    return "heap" if heap_in_use() is not None else "ledger"


def _device_name(dev: torch.device) -> str | None:
    try:
        from torchmem.devices import backend

        return backend(dev).name()
    except Exception:
        return None


def _largest_module() -> torch.nn.Module | None:
    """The top-level nn.Module with the most parameters among live objects (the model being trained)."""
    import gc

    module_t = torch.nn.Module
    # type() rather than isinstance(): some objects warn or raise when __class__ is read.
    mods = [o for o in gc.get_objects() if issubclass(type(o), module_t)]
    children = {id(c) for m in mods for c in m.children()}
    tops = [m for m in mods if id(m) not in children]
    best: tuple[int, torch.nn.Module] | None = None
    for m in tops:
        n = sum(p.numel() for p in m.parameters())
        if n and (best is None or n > best[0]):
            best = (n, m)
    return best[1] if best else None


__all__ = ["Session", "SessionResult"]
