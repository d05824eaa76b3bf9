"""A monitoring session around a whole program: what ``torchmem run`` and ``torchmem demo`` record.

One session = a capture file (written line by line, crash-safe), a :class:`~torchmem.capture.watch.Watcher`
whose steps are the program's optimizer steps (or a named function's returns), a sampler thread for the
timeline and the live status line, the CUDA OOM observer, and the readings at start and end.

:class:`Session` runs the lifecycle (start, steps, finish) and composes the parts, each with its own
interface: :class:`~torchmem.run.records.Records` (the capture file),
:class:`~torchmem.run.status.StatusLine`,
:class:`~torchmem.run.sampler.Sampler` (and its :class:`~torchmem.run.sampler.Figure`),
:class:`~torchmem.run.timeline.Timeline`, :class:`~torchmem.run.overhead.Overhead`,
:class:`~torchmem.run.followers.Followers` (child processes), :class:`~torchmem.run.rank_state.RankState`,
:class:`~torchmem.run.ooms.OOMLog` and :class:`~torchmem.run.modules.ModuleProfile`.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

import torch

from torchmem.capture.current import clear_current, set_current
from torchmem.devices import DeviceLike, ledger, resolve
from torchmem.results.leaks import LeakReport
from torchmem.run import verdicts
from torchmem.run.followers import Followers
from torchmem.run.modules import ModuleProfile
from torchmem.run.ooms import OOMLog
from torchmem.run.overhead import Overhead
from torchmem.run.rank_state import RankState
from torchmem.run.records import Records
from torchmem.run.sampler import Figure, Sampler
from torchmem.run.status import StatusLine
from torchmem.run.steps import StepSource
from torchmem.run.timeline import Timeline, live_storage_keys, timeline_report
from torchmem.run.watchers import StepWatchers

# The first steps each write a step record (the capture's plot of a short run); later ones only where the
# watcher read. Those steps always take the full bookkeeping (Session.step).
_EVERY_STEP_RECORDS = 1000


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
        min_growth: int | None = None,
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
        self.interval = interval
        status_file = status_file if status_file is not None else sys.stderr
        self.status = status if status is not None else bool(getattr(status_file, "isatty", lambda: False)())
        self.step_marker = step_marker
        self.modules = modules
        self.argv = list(argv or sys.argv)
        self.warmup = warmup
        self._t0 = 0.0
        self._pid = os.getpid()
        self._steps = 0
        self._quiet = 0  # steps still to count on the fast path (Session.step)
        self._quiet_run = 0  # quiet steps since the last full one
        self._leak_written = False
        self._last_step_write = 0.0
        self._worker_checks: Any = None  # the DataLoader/worker checks (capture/workers.py)
        self._observer: Any = None
        self._born_before: set[int] = set()  # storages alive when the program started (the timeline census)
        self._unwatch_groups: Any = None  # undoes the torch.distributed wrappers (NCCL measured in windows)
        # The parts.
        self._records = Records()
        self._status = StatusLine(status_file, self.status)
        self._figure = Figure()
        self._timeline = Timeline()
        self._overhead = Overhead()
        self._sampler = Sampler(interval, self._tick, self._step_count, self._is_disabled, self._records.note)
        # Distributed runs (capture/ranks.py): who this process is, the job's OOM flag, followed children.
        self._ranks = RankState(capture, self._records, self._reading, self._device_now, self._step_count)
        self._followers = Followers(
            capture, self._records, self._ranks, self._gpus_now, self._child_options, Session
        )
        self._ooms = OOMLog(self._records, self._step_count, self._on_oom)
        self._modules = ModuleProfile(self._records)
        self._watchers = StepWatchers(self._records, warmup, bool(memory_viz), min_growth)
        w = self._watchers
        self._source = StepSource(
            step_marker, self.argv, self._records, self.step, self._restart, w.fresh, w.reading
        )

    # -- what the parts read -----------------------------------------------------------------------
    def _step_count(self) -> int:
        return self._steps + self._source.quiet_counted()

    def _on_oom(self, site: Any) -> None:
        """An OOM was raised: the next step is a full one (it writes the OOM), and the job's flag is told."""
        self._source.end_quiet()
        self._ranks.on_oom(site)

    def _device_now(self) -> torch.device:
        return self.device

    def _gpus_now(self) -> Any:
        return self._gpus

    def _is_disabled(self) -> bool:
        return self._records.disabled

    def _reading(self) -> Any:
        """The session's figure now (the allocator's counters, or on the CPU the C heap in use)."""
        return self._figure.read(self.device)

    def _child_options(self) -> dict[str, Any]:
        """The options of this session a followed child's session takes over (its job aside)."""
        return {
            # the child follows the GPU it uses (set_device(rank)), unless the run was given one
            "device": None if self._auto_device else str(self.device),
            "interval": self.interval,
            "warmup": self.warmup,
            "step_marker": self.step_marker,
            "force": self.force,
        }

    @property
    def running(self) -> bool:
        """Started and not finished."""
        return not self._sampler.stopped

    # -- start -----------------------------------------------------------------------------------
    def start(self) -> Session:
        """Open the capture (errors here are raised before the program runs), then start monitoring."""
        self._t0 = time.perf_counter()
        extra = self._ranks.header()
        self._records.open(
            self.capture,
            device=str(self.device),
            device_name=_device_name(self.device),
            argv=self.argv,
            source=_source_of(self.device),
            force=self.force,
            protect=self.protect,
            **extra,
        )
        note = self._records.note
        self._records.stats(self.device, "start")
        self._born_before = live_storage_keys(self.device)
        if self.memory_viz is not None:
            from torchmem.devices import _ops

            problem = _ops.record_history(True)
            if problem is not None:
                note(f"--memory-viz: {problem}")
                self.memory_viz = None
        try:
            from torchmem.capture.oom import watch_ooms

            self._observer = watch_ooms(self._ooms.on_event)
            if self.device.type == "cuda" and self._observer.problem:
                note(f"out-of-memory errors the program catches are not seen: {self._observer.problem}")
        except Exception as exc:
            note(f"the OOM observer could not be set up ({type(exc).__name__}: {exc})")
        self._watchers.start(self.device)
        self._source.install()
        # A weak reference: the interpreter keeps fork callbacks forever, a session must not live that long.
        ref = weakref.ref(self)

        def in_child() -> None:
            session = ref()
            if session is not None:
                session._in_child()

        os.register_at_fork(after_in_child=in_child)
        self._followers.install()
        try:
            from torchmem.capture.ranks import watch_process_groups

            self._unwatch_groups = watch_process_groups(self._ranks.before_destroy)
        except Exception as exc:
            note(f"NCCL's memory will be estimated, not measured ({type(exc).__name__}: {exc})")
        if self.status:
            self._status.wrap_streams()
        try:
            from torchmem.capture.workers import WorkerChecks

            self._worker_checks = WorkerChecks(self.device, self._worker_warning)
            self._worker_checks.install()
        except Exception as exc:
            note(f"the DataLoader checks could not be set up ({type(exc).__name__}: {exc})")
        try:
            from torchmem.capture.gpus import GpuWatch

            self._gpus = GpuWatch(self.device, self._auto_device, note).install()
        except Exception as exc:
            note(f"the GPUs besides {self.device} are not watched ({type(exc).__name__}: {exc})")
        self._sampler.start()
        set_current(self)
        return self

    def survivors_now(self, time_limit: float = 2.0) -> Any:
        """What the loop allocated in its recorded steps and is still alive, now (a
        :class:`~torchmem.results.survivors.SurvivorReport`); ``None`` when the loop's survivors are not
        recorded (a step marker's session before its first step)."""
        rec = self._watchers.survivors
        if rec is None:
            return None
        return rec.report(total_steps=self._step_count(), time_limit=time_limit, boundary=self._source.label)

    def _restart(self, label: str) -> int:
        """A better boundary took over: the watchers restart on it if they counted steps (returned)."""
        old = self._watchers.watcher
        if old is not None:
            self._take_quiet()
        if old is None or not old.steps:
            return 0
        counted = old.steps
        self._overhead.bank()
        self._watchers.restart(self.device, label)
        self._steps = self._quiet = self._quiet_run = 0
        self._leak_written = False
        return int(counted)

    # -- steps -----------------------------------------------------------------------------------
    def step(self) -> None:
        """One step ended: the watcher's reading, a step marker in the capture, the leak record once. The
        steps no watcher works at (*quiet*: :meth:`_quiet_after`) are only counted, untimed."""
        if self._quiet and not self._ooms.pending:
            self._quiet -= 1
            self._quiet_run += 1
            self._steps = self._watchers.count()
            return
        t0 = time.perf_counter()
        self._take_quiet()
        self._overhead.step_began(t0, self._quiet_run + 1)
        self._quiet_run = 0
        try:
            self._step_work()
        finally:
            t1 = time.perf_counter()
            try:
                instrumented = ledger().active or self._watchers.instrumenting
            except Exception:
                instrumented = False
            self._overhead.step_ended(t0, t1, instrumented)
        quiet = 0 if instrumented else self._quiet_after()
        # the boundary's hook counts them where it can (the quiet lane: no call reaches the session)
        self._quiet = 0 if self._source.quiet(quiet) else quiet

    def _take_quiet(self) -> None:
        """The steps the boundary's quiet lane counted since the last full step: counted by the watchers."""
        lane = self._source.take_quiet()
        if lane and self._watchers.watcher is not None:
            self._quiet_run += lane
            self._steps = self._watchers.count(lane)

    def _quiet_after(self) -> int:
        """The quiet steps after this one: none in the first :data:`_EVERY_STEP_RECORDS` steps, until the
        program's GPU is settled, while the module profile runs, or where a watcher wants the next step."""
        if self._steps <= _EVERY_STEP_RECORDS or not self._device_settled:
            return 0
        if self.modules and not self._modules.done:
            return 0
        return self._watchers.quiet_steps()

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
            self._records.note(
                f"the GPU the program works on could not be followed ({type(exc).__name__}: {exc})"
            )
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
        self._source.end_quiet()
        self._source.take_quiet()  # steps of the device left
        self._watchers.move_to(dev)
        self._steps = self._quiet = self._quiet_run = 0
        self._leak_written = False
        self._timeline.clear()
        why = ""
        if self._gpus is not None:
            sets = [s for s in self._gpus.evidence.get("set_device", ()) if s.get("index") == dev.index]
            if sets:
                why = f" (torch.cuda.set_device({dev.index}) at {sets[-1].get('site') or '?'})"
        self._records.record(
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
            w = self._watchers.watcher
            if w is None:
                return
            replay = self._source.take_replay()
            observe = self._figure.observe if self.device.type == "cpu" else None
            n, read_now, value = self._watchers.step(replay, observe)
            self._steps = n
            self._overhead.add_parts(*self._watchers.times)
            # One step record per reading the watcher took, at most one per 10 ms (a loop of thousands of
            # steps per second must not pay a JSON line per step); the sampler keeps the timeline.
            if n <= _EVERY_STEP_RECORDS or read_now:
                now = time.perf_counter()
                if n <= _EVERY_STEP_RECORDS or now - self._last_step_write >= 0.01:
                    self._last_step_write = now
                    self._records.keep_step(n, value)
            if w.leaking and not self._leak_written and w.culprits:
                self._leak_written = True
                self._records.record("leak", report=self._labelled(w.report()).to_dict())
            if self.modules and not self._modules.done:
                self._modules.step(self._steps, self.device, self._source.last_optimizer)
            if self._ooms.pending:
                self._ooms.flush(caught_by=None)  # the program went on: it caught them
        except Exception as exc:  # never break the program
            self._records.note(f"step bookkeeping failed: {type(exc).__name__}: {exc}")

    # -- the sampler's tick --------------------------------------------------------------------------
    def _tick(self) -> float | None:
        """One tick of the sampler thread: the kept step records written, the timeline's reading, the
        checks that poll, the status line. The seconds of the DataLoader checks, or ``None`` when torchmem's
        own step work is running on the CPU's figure (no reading then)."""
        t_w = 0.0
        self._records.flush_steps()
        if not self._ranks.group_written:
            self._ranks.write_group_facts()
        if self._gpus is not None:
            self._gpus.poll()
            if not self._device_settled and self._source.kind is None and self._steps == 0:
                self._settle_device()  # no step yet: the timeline follows the program's GPU
        if self.device.type == "cpu" and self._own_work:
            return None  # torchmem's own step work is running on the C heap: not the program's figure
        r = self._sample()
        now = time.perf_counter()
        if r.allocated is not None:
            self._timeline.keep(now - self._t0, r.allocated)
        self._source.poll(bool(self._followers.children))
        if self._worker_checks is not None:
            t0 = time.thread_time()
            self._worker_checks.poll(now)
            t_w = time.thread_time() - t0
        if self._ranks.watching:
            self._ranks.check()
        if self.status and self._status.due(now):
            self._status.show(self.status_text(r.allocated, r.reserved, r.peak_allocated))
        return t_w

    def _sample(self) -> Any:
        """A reading, written as a ``sample`` record; returned."""
        r = self._reading()
        self._records.record(
            "sample",
            step=self._step_count(),
            allocated=r.allocated,
            reserved=r.reserved,
            peak_allocated=r.peak_allocated,
            peak_reserved=r.peak_reserved,
        )
        return r

    def status_text(self, allocated: int | None, reserved: int | None, peak: int | None) -> str:
        return self._status.text(
            self._step_count(), allocated, reserved, peak, self._watchers.watcher, self._gpus, self.forecast
        )

    def _worker_warning(self, code: str, text: str) -> None:
        """A DataLoader/worker check's warning (once each): in the capture and on stderr now."""
        self._records.note(text)
        self._status.warn(text)

    # -- verdicts --------------------------------------------------------------------------------
    def _labelled(self, rep: LeakReport) -> LeakReport:
        """The watcher's report with the step boundary it was fed and the switches between boundaries."""
        label = f"return of {self.step_marker}()" if self.step_marker else self._source.label
        return verdicts.labelled(rep, label, self._source.switches)

    def forecast(self, leak: LeakReport | None) -> Any:
        """When the watched device (or the RAM) runs out at the leak's rate (a
        :class:`~torchmem.results.forecast.Forecast`), ``None`` without a leak or a known capacity."""
        if leak is None or not leak.leaking or leak.bytes_per_step <= 0:
            return None
        return verdicts.forecast(leak, self.device, self._reading, self._overhead.median_step())

    # -- end -------------------------------------------------------------------------------------
    def finish(self, exit_code: int | None, reason: str, exc: BaseException | None = None) -> SessionResult:
        """Stop monitoring, explain an OOM, write the final records and close the capture."""
        finish_t = time.perf_counter()
        note = self._records.note
        clear_current(self)
        self._sampler.stop(timeout=2.0)
        self._records.flush_steps()
        if self._worker_checks is not None:
            self._worker_checks.uninstall()
        self._ranks.finish(exc)
        self._status.clear()
        self._status.unwrap_streams()
        self._followers.remove()
        if self._gpus is not None:
            self._gpus.remove()
        undo, self._unwatch_groups = self._unwatch_groups, None
        if undo is not None:
            undo()
        self._source.remove()
        self._take_quiet()  # the last quiet steps, counted by the boundary's hook
        self._modules.finish()  # the program may have ended inside the profiled step
        # the end reading is a sample like the others: the run's summary and `torchmem report` read one peak
        r = self._sample()
        self._records.stats(self.device, "end")
        gpus = _finish_gpus(self._gpus, self._records)
        if self.memory_viz is not None:
            _end_memory_viz(self.memory_viz, note)
        leak = self._watchers.leak()
        if leak is not None:
            leak = self._labelled(leak)
            if self._source.kind is None and not self.step_marker:
                w = self._watchers.watcher
                source = w.source if w is not None else "n/a"
                timeline = timeline_report(self._timeline.points(), self.device, source, self._born_before)
                if timeline is not None:
                    leak = timeline
        survivors = self._watchers.survivors_report(self._steps, self._source.label, leak)
        if leak is not None:
            leak = _named(leak, survivors, self)
            leak = verdicts.bounded_history(leak, _live_optimizers)
            self._records.record("leak", report=leak.to_dict(), final=True)
        forecast = _write_forecast(self, leak)
        final_exc = None
        if exc is not None:
            from torchmem.analysis.oom import is_oom

            if is_oom(exc):
                reason = "oom"
                final_exc = exc
        oom = self._ooms.finish(final_exc, self.device, leak)
        if self._observer is not None:
            self._observer.detach()
        marker = f"return of {self.step_marker}()" if self.step_marker else None
        label = marker or (self._source.label or None)
        host = self._watchers.host_report(label, leak, self.device, backward=self._source.backward_ran)
        self._source.write_boundary(self._steps, bool(self._timeline))
        no_steps = None
        if self._steps == 0:
            no_steps = self._source.why_no_steps(self.capture, self._followers)
            note(f"0 steps: {no_steps}")
        overhead = None
        try:
            overhead = self._overhead.finish(self._records, finish_t - self._t0, self._steps, self._sampler)
        except Exception as e:
            note(f"torchmem's own cost could not be estimated ({type(e).__name__}: {e})")
        seconds = time.perf_counter() - self._t0
        self._records.close(exit_code=exit_code, reason=reason, steps=self._steps, seconds=seconds)
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
            children=self._followers.children,
            child_captures=self._followers.followed,
            rank=self._ranks.rank,
            survivors=survivors,
            boundary=self._source.label,
            ooms=self._ooms.events,
            host_leak=host,
            caught_ooms=self._ooms.caught,
            overhead=overhead,
            gpus=gpus,
            forecast=forecast,
        )

    # -- child processes ---------------------------------------------------------------------------
    def _before_process_start(self, proc: Any) -> None:
        """Wrap a training child's target so it records its own capture (see :class:`Followers`)."""
        self._followers.before_start(proc)

    def _in_child(self) -> None:
        # A forked child (DataLoader workers) is not monitored: it must never write the parent's capture.
        if os.getpid() != self._pid:
            self._records.disable()


def _finish_gpus(watch: Any, records: Records) -> Any:
    """The GPUs' figures (``watch``: the session's ``capture/gpus.GpuWatch``), written; ``None`` when the
    process used no GPU besides the watched one."""
    gpus = None
    if watch is not None:
        try:
            gpus = watch.report()
            if gpus.rows or gpus.children:
                records.record("gpus", report=gpus.to_dict())
            else:
                gpus = None
        except Exception as e:
            records.note(f"the GPUs' figures could not be written ({type(e).__name__}: {e})")
    return gpus


def _write_forecast(session: Session, leak: LeakReport | None) -> Any:
    """When the memory runs out at the leak's rate, written (``None`` where it cannot be said)."""
    try:
        forecast = session.forecast(leak)
        if forecast is not None:
            session._records.record("forecast", forecast=forecast.to_dict())
        return forecast
    except Exception as e:
        session._records.note(f"when the memory runs out could not be forecast ({type(e).__name__}: {e})")
        return None


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


def _end_memory_viz(path: str, note: Callable[[str], None]) -> None:
    """``--memory-viz``: the allocator's history written to ``path`` and turned off; said in a note."""
    from torchmem.devices import _ops

    problem = _ops.dump_history_snapshot(path)
    _ops.record_history(False)
    note(f"--memory-viz: {problem}" if problem else f"allocator history snapshot: {path}")


def _live_optimizers() -> list[Any]:
    """The program's live optimizers (one pass over the heap)."""
    import gc

    optim = torch.optim.Optimizer
    # type() rather than isinstance(): some objects warn or raise when __class__ is read
    return [o for o in gc.get_objects() if issubclass(type(o), optim)]


def _named(leak: LeakReport, survivors: Any, s: Session) -> LeakReport:
    """The run's leak, named where the watcher could not (``verdicts.named``), with what the step source
    knows of the program's loop (the variables it carries, whether a backward ran)."""
    try:
        return verdicts.named(
            leak,
            survivors,
            s.device,
            s._born_before,
            carried=s._source.carried,
            backward=s._source.backward_ran,
        )
    except Exception as e:
        s._records.note(f"the leak could not be named ({type(e).__name__}: {e})")
        return leak


__all__ = ["Session", "SessionResult"]
