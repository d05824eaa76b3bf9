"""``HostWatcher``: host-memory (RAM) leaks of a PyTorch program, found and named per step.

Device memory can stay flat while the process's own memory grows: an autograd chain that grows by a few
nodes per step (an EMA ``shadow.mul_(d).add_(p, alpha=1 - d)`` where ``p`` requires grad), or Python objects
kept per step (a ``history`` of dicts). The watcher reads cheap figures at step boundaries:

- ``"heap"``: the bytes the C heap has handed out (glibc ``mallinfo2``: ~0.5 µs, more on a heap with many
  free chunks, which it walks): autograd nodes, CPU tensor storages, C++ state and Python's large objects,
  without the page-cache and allocator-cache noise of the RSS. Python's small objects live in arenas the C
  heap does not count, so the resident set size is read too (~1.5 µs) and judged on its own (``"rss"``)
  when the heap stays flat;
- ``"rss"``: the resident set size alone, where there is no ``mallinfo2`` (not glibc).

What readings cost is measured as they run; when it would be more than 0.5 % of a step, only every k-th
step is read. Growth is judged with :func:`torchmem.analysis.leaks.detect_growth`. Once it has lasted a
few readings, three scans a few steps apart (on the thread that started the watch) compare the live
tensors' autograd graphs (by the sequence numbers of their nodes, so no graph is kept alive between scans),
the Python objects' counts per type and the lengths of the program's lists, dicts and deques
(:mod:`torchmem.capture.host_objects`: a container that grows at every scan keeps what instance counts
cannot see, numpy arrays and strings), and read the process's state (:mod:`torchmem.capture.process_state`:
a recording profiler, anomaly mode, the CUDA allocator's history, ``cudnn.benchmark``). Between the first
two scans tracemalloc traces Python allocations (the lines that keep what they allocate); between the last
two a function mode records the user's line of each op that makes an autograd node (the line that extends a
chain), tracemalloc where new objects are made, and a module hook the convolutions' shapes where
``cudnn.benchmark`` is on; the scans themselves run untraced. The holders of a growing chain's tensor, of a
few new instances of growing types and of the growing containers are then searched
(:func:`torchmem.analysis.holders.find_holders`), and the growth nothing names is explained by the state
that was on (:func:`torchmem.analysis.host_state.state_culprits`) or said to be unexplained with what was
checked. What torchmem's own work leaves in memory is subtracted from later readings, and no figure is read
while torchmem traces. The live autograd nodes are counted at each scan, at :meth:`HostWatcher.stop`, and
otherwise rarely (the first after 10 s, then spaced so that counting takes under 0.5 % of the run).

Nothing here touches ``torch.cuda``: the same watcher serves CUDA programs, whose host memory it watches (the
CUDA state is read through :mod:`torchmem.devices._state`).

The watcher is a coordinator of parts: the reading schedule (:mod:`torchmem.capture.host_schedule`), the
readings and their verdicts (:mod:`torchmem.capture.host_readings`), the scans
(:mod:`torchmem.capture.host_scan`, with :mod:`~torchmem.capture.host_walk`,
:mod:`~torchmem.capture.host_trace`, :mod:`~torchmem.capture.host_windows` and
:mod:`~torchmem.capture.host_naming`) and the report (:mod:`torchmem.capture.host_report`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from torchmem.capture.host_readings import HostReadings
from torchmem.capture.host_report import HostView, build_report
from torchmem.capture.host_scan import HostNodeCounts, HostScanner
from torchmem.capture.host_schedule import HostSchedule
from torchmem.capture.host_trace import HostNotes, HostTracer
from torchmem.capture.host_windows import HostInstruments
from torchmem.devices._host import heap_in_use, process_rss
from torchmem.results.leaks import LeakReport

DEFAULT_MIN_BYTES_PER_STEP = 4096
"""The default reporting threshold, 4 KiB per step. An EMA of a 4-parameter model updated from parameters
that require grad grows the heap by ~6.5 KiB per step (two autograd nodes of ~0.8 KiB per parameter per
step); an ordinary training loop's heap moves by tens of bytes per step at its boundaries (a list of
``loss.item()`` floats: ~8 B/step of list growth plus 24 B floats in Python's arenas), and a per-step dict of
a few metrics (~0.6 KiB) stays below it too. Growth of 4 KiB/step is 400 MB over 100,000 steps."""

_EVAL_EVERY = 16  # readings between two verdicts (sooner when the figure rises)


class HostWatcher:
    """Watches the process's host memory step by step; finds steady growth and names what grows.

    Create it, :meth:`start` it, call :meth:`step` at each step boundary (on the program's main thread:
    scans run only on the thread that started the watch), :meth:`stop` it, and read :meth:`report`. It is
    also a context manager. Errors inside it never reach the program: each is reported once in the report's
    notes.

    Args:
        warmup: Steps ignored by the detector (lazily built state, the first optimizer step).
        min_bytes_per_step: Smallest growth per step reported as a leak (default 4 KiB, see
            :data:`DEFAULT_MIN_BYTES_PER_STEP`).
        source: ``"auto"`` (the C heap where glibc's ``mallinfo2`` exists, else the RSS), ``"heap"`` or
            ``"rss"``.
        node_interval: Least seconds between two counts of the live autograd nodes.
        node_overhead: The largest share of the run the counts may take (0.5 %): a count that takes long
            (a big heap) spaces the next ones further apart.
        scan_budget: Seconds (of the watching thread's CPU time) one scan may spend walking autograd graphs.
        holder_time_limit: Seconds the holder search may take (once, when culprits are named).
        scan_gap: Steps between two scans of a sequence.
        max_stride: The most steps between two readings of each figure (``None``: as the readings' cost
            demands, so that they take ``share`` of the run at most). ``1`` reads both figures at every step.
        share: The largest share of a step the readings may take (0.5 %).
        ramp: The strides at most double every 16 readings, from 1 (a short run of fast steps gets readings
            enough for a verdict); ``False``: the budget's stride from the first choice (``torchmem run`` on
            the CPU, where the device watcher reads the same heap at every step).
        short_runs: Whatever the budget says, the run so far keeps 8 readings of each figure per doubling of
            its length (every 2nd step at step 16, every 20th at step 160): a loop of a few hundred fast
            steps gets the readings of a verdict, and the scans that name what grows run inside it. A long
            run pays ~120 readings more in all. ``False``: the budget's stride only (``torchmem run`` on a
            GPU, where the host is not the device and scans inside a short run of big steps cost seconds).
        boundary: What one step is (``"optimizer step"``...), copied into the report.
        unit: ``"step"``, or ``"s"`` when :meth:`step` is called once per second of a timeline.
        own_history: torchmem itself turned the CUDA allocator's history recording on (``torchmem run
            --memory-viz``): when it explains growth, the fix says so.

    Example:
        >>> import torch
        >>> from torchmem.capture.host import HostWatcher
        >>> model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 4))
        >>> shadow = {n: p.detach().clone() for n, p in model.named_parameters()}
        >>> with HostWatcher(max_stride=1) as w:
        ...     for _ in range(60):
        ...         for n, p in model.named_parameters():
        ...             _ = shadow[n].mul_(0.99).add_(p, alpha=0.01)  # p requires grad: a chain grows
        ...         w.step()
        >>> r = w.report()
        >>> r.leaking, r.culprits[0].kind
        (True, 'autograd_chain')
        >>> print(r.culprits[0].fix)
        `...` carries an autograd graph from step to step in 4 tensors (+2 nodes/step each: ...): ...
    """

    def __init__(
        self,
        *,
        warmup: int = 3,
        min_bytes_per_step: int = DEFAULT_MIN_BYTES_PER_STEP,
        source: str = "auto",
        node_interval: float = 2.0,
        node_overhead: float = 0.005,
        scan_budget: float = 0.2,
        holder_time_limit: float = 2.0,
        scan_gap: int = 2,
        max_stride: int | None = None,
        share: float = 0.005,
        ramp: bool = True,
        short_runs: bool = True,
        boundary: str = "",
        unit: str = "step",
        own_history: bool = False,
    ) -> None:
        if source not in ("auto", "heap", "rss"):
            raise ValueError(f"source must be 'auto', 'heap' or 'rss', not {source!r}")
        if max_stride is not None and (
            not isinstance(max_stride, int) or isinstance(max_stride, bool) or max_stride < 1
        ):
            raise ValueError(f"max_stride must be a positive integer or None, not {max_stride!r}")
        for name, v, lo in (("warmup", warmup, 0), ("scan_gap", scan_gap, 1)):
            if not isinstance(v, int) or isinstance(v, bool) or v < lo:
                raise ValueError(f"{name} must be an integer >= {lo}, not {v!r}")
        if min_bytes_per_step <= 0:
            raise ValueError(f"min_bytes_per_step must be positive, not {min_bytes_per_step!r}")
        for name, f in (
            ("node_interval", node_interval),
            ("node_overhead", node_overhead),
            ("scan_budget", scan_budget),
            ("holder_time_limit", holder_time_limit),
            ("share", share),
        ):
            if not f > 0:
                raise ValueError(f"{name} must be positive, not {f!r}")
        self.warmup = warmup
        self.min_bytes_per_step = int(min_bytes_per_step)
        self.boundary = boundary
        self.unit = unit
        self.steps = 0
        self.source = "n/a"
        self._source_wanted = source
        self._gap = scan_gap
        self._running = False
        self._started = False
        self._thread: int | None = None
        self._read: Any = None
        self._secondary = False
        self._foreign = False  # a step came from another thread (scans run on the watch's own thread only)
        self._shared: Callable[[], int | None] | None = None  # see figure_from
        # The parts: notes, the readings' schedule, the readings, tracing and torchmem's own work, the
        # windows, the node counts, the scans.
        self._notes = HostNotes()
        self._schedule = HostSchedule(
            warmup=warmup,
            max_stride=max_stride,
            share=float(share),
            ramp=bool(ramp),
            short_runs=bool(short_runs),
        )
        self._readings = HostReadings(warmup=warmup, min_bytes_per_step=self.min_bytes_per_step)
        self._tracer = HostTracer(self._figures, self._notes, min_bytes_per_step=self.min_bytes_per_step)
        self._instruments = HostInstruments(self._notes, self._tracer)
        self._nodes = HostNodeCounts(
            self._tracer,
            self._notes,
            interval=float(node_interval),
            overhead=float(node_overhead),
            budget=float(scan_budget),
        )
        self._scanner = HostScanner(
            self,
            readings=self._readings,
            schedule=self._schedule,
            tracer=self._tracer,
            instruments=self._instruments,
            nodes=self._nodes,
            notes=self._notes,
            warmup=warmup,
            min_bytes_per_step=self.min_bytes_per_step,
            gap=scan_gap,
            budget=float(scan_budget),
            holder_time=float(holder_time_limit),
            own_history=bool(own_history),
        )

    # -- lifecycle ---------------------------------------------------------------------------------
    def __enter__(self) -> HostWatcher:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> HostWatcher:
        """Start watching: choose the figure (heap or RSS) and time one reading. Returns ``self``."""
        if self._started:
            raise RuntimeError("this HostWatcher was already started; create a new one for each run")
        self._started = True
        self._thread = threading.get_ident()
        heap = heap_in_use() if self._source_wanted in ("auto", "heap") else None
        if heap is not None:
            self.source, self._read, self._secondary = "heap", heap_in_use, True
        else:
            if self._source_wanted == "heap":
                self._notes.add("the C heap cannot be read here (no glibc mallinfo2): the RSS is watched")
            self.source, self._read, self._secondary = "rss", process_rss, False
        self._schedule.start(self._read, secondary=self._secondary)
        self._scanner.start(self.source)
        self._nodes.start(time.perf_counter())
        self._running = True
        return self

    def stop(self) -> None:
        """End the watch (idempotent): a window still open is closed. The report stays readable."""
        if not self._running:
            return
        self._running = False
        try:
            on_thread = threading.get_ident() == self._thread
            self._instruments.close_window(on_thread=on_thread)
            if self._instruments.stale and on_thread:
                self._instruments.pop_stale_modes()
            self._instruments.close_shapes()
            self._tracer.stop()
            if self._secondary:
                self._readings.read_blocks(self.steps)
            if on_thread and self.steps > self.warmup:
                self._nodes.sample(self.steps)  # the count at the end, for the report
        except Exception as exc:
            self._notes.error("stop", exc)

    @property
    def leaking(self) -> bool:
        """Whether the host figure grows steadily as of the last verdict."""
        return self._readings.leaking

    @property
    def instrumenting(self) -> bool:
        """Whether a site window (a function mode that sees every op) is on now."""
        return self._instruments.active

    @property
    def autograd_nodes(self) -> tuple[tuple[int, int], ...]:
        """The sampled counts of live autograd nodes (reachable from live tensors), as ``(step, nodes)``."""
        return tuple(self._nodes.counts)

    covered: Callable[[], bool] | None = None
    """``torchmem run`` on the CPU: whether the device watcher, reading the same heap, has named the growth's
    holders already — then a scan (up to seconds in a short run) would name nothing its report does not."""

    def own_work(self) -> int | None:
        """What torchmem's own host work means for a reading of the C heap now: ``None`` while its tracing
        or a site window is on (the figure is not the program's: tracemalloc's tables grow with every
        allocation), else the bytes its scans left on the heap (to subtract). On the CPU the device watcher
        reads the same heap (``torchmem run``)."""
        if self._tracer.mode == "ours" or self._instruments.open:
            return None
        return self._tracer.offset if self.source == "heap" else 0

    @property
    def graphs_rising(self) -> bool:
        """Whether the live autograd nodes counted so far rise steadily (``False`` also when they were not
        counted often enough to say)."""
        return self._nodes.rising()

    @property
    def data_holders(self) -> frozenset[str]:
        """The holder paths (as the culprits write them) of the growing containers the last scans found
        keeping plain data: tensors with no autograd graph, arrays, numbers, strings and tuples, lists or
        dicts of them, reached through no hook."""
        return self._scanner.data_paths

    @property
    def cpu_tensors(self) -> bool:
        """Whether CPU tensors kept in a growing container are named as host culprits (a run that watches a
        GPU, where no device report covers the CPU); off by default: on the CPU they are the device
        report's. Can be changed while the watch runs."""
        return self._scanner.cpu_tensors

    @cpu_tensors.setter
    def cpu_tensors(self, on: bool) -> None:
        self._scanner.cpu_tensors = bool(on)

    @property
    def _scan_steps(self) -> list[int]:
        """The steps the culprit scans ran at."""
        return self._scanner.scan_steps

    # -- the per-step work ---------------------------------------------------------------------------
    def step(self) -> None:
        """Mark the end of one step: one reading (every ``stride`` steps). Never raises."""
        if not self._running:
            return
        n = self.steps = self.steps + 1
        if self._scanner.due is None and n % self._schedule.stride:
            return
        t0 = time.perf_counter()
        work = self._work_seconds()
        try:
            self._step(n)
        except Exception as exc:  # never break the user's loop
            self._notes.error("step", exc)
        # What readings cost, all included but the scans and node counts (they keep to their own budgets).
        self._schedule.charge(time.perf_counter() - t0 - (self._work_seconds() - work))

    def relax(self, after: int | None, share: float) -> None:
        """After ``after`` readings (``None``: never), keep the readings within ``share`` of the run instead
        of the one given at the start (``torchmem run``: a long run's readings cost less, and a late growth
        is found a few hundred steps later)."""
        self._schedule.relax(after, share)

    def read_with(self, stride: Callable[[], int] | None) -> None:
        """Read in step with another watcher whose stride ``stride()`` gives (``torchmem run``: the device
        watcher's): this watcher's stride is then chosen as a multiple of it where its budget and a short
        run's floor allow, so both read at the same steps. ``None``: on its own again."""
        self._schedule.align = stride

    def figure_from(self, now: Callable[[], int | None] | None) -> None:
        """Take the figure from ``now()`` where it gives one at a reading, reading it here only where it gives
        ``None`` (``torchmem run`` on the CPU: the device watcher, stepped just before this one at the same
        boundary and in step with it, reads the same C heap: one reading serves both). Only with the heap as
        the figure; ``None``: always read here."""
        self._shared = now

    def quiet_steps(self) -> int:
        """How many of the next steps need nothing of :meth:`step` but their count (``0``: the next one
        does): the steps before the next reading, none while a scan is due. A caller that skips them adds
        them to :attr:`steps`; valid until the next call of :meth:`step`."""
        instruments = self._instruments
        if not self._running or self._scanner.due is not None or instruments.open or instruments.stale:
            return 0
        k = self._schedule.stride
        return k - 1 - self.steps % k if k > 1 else 0

    def _work_seconds(self) -> float:
        """Time in torchmem's own work so far: scans, node counts, snapshots."""
        return self._scanner.seconds + self._nodes.seconds + self._tracer.seconds

    def _step(self, n: int) -> None:
        instruments, tracer, scanner = self._instruments, self._tracer, self._scanner
        schedule, readings = self._schedule, self._readings
        on_thread = threading.get_ident() == self._thread
        instruments.mark()
        if instruments.stale and on_thread:
            instruments.pop_stale_modes()
        if tracer.wants_snapshot(n, scanner.due):
            tracer.mid_snapshot(n)
        if scanner.due is not None and n >= scanner.due and on_thread:
            scanner.scan(n)
        if n % schedule.stride:
            return
        if tracer.mode == "ours" or instruments.open:
            # torchmem's tracing or function mode is on: the figures and the step's time are not the
            # program's (tracemalloc's tables grow with every allocation): this step is not read.
            schedule.untimed()
            return
        if not self._foreign and not on_thread:
            self._foreign = True
        k = readings.tick()
        warm = n <= self.warmup
        rising = False
        if self._secondary:
            rss = process_rss()
            if rss is not None:
                rising = readings.add_rss(n, rss, warm=warm)
            read_figure = warm or k % schedule.heap_every == 0
        else:
            read_figure = True
        if read_figure:
            shared = self._shared() if self._shared is not None and self.source == "heap" else None
            v = schedule.read(self._read) if shared is None else schedule.took(shared)
            if v is None:
                self._notes.error("reading", RuntimeError(f"the {self.source} figure could not be read"))
                return
            rising = readings.add_figure(n, v - tracer.offset, warm=warm) or rising
            if not warm and schedule.relaxed and readings.rose():
                schedule.alert()  # a relaxed schedule reads more often while the figure rises
        if warm:
            schedule.time(n, time.perf_counter())
            return
        if rising or k % _EVAL_EVERY == 0 or k == schedule.first_post:
            self._slow(n, k)

    def _slow(self, n: int, k: int) -> None:
        """The occasional part of a reading (every 16 readings, or when the figure rises): timing, verdicts,
        node counts, scans."""
        schedule, readings, scanner = self._schedule, self._readings, self._scanner
        now = time.perf_counter()
        schedule.time(n, now)
        # Every 16 readings the full test; on a rising reading in between only the steady one (the last
        # readings: the robust test's Theil-Sen slope costs ~0.1 ms), which may find growth but never
        # withdraws a verdict.
        full = k % _EVAL_EVERY == 0 or k == schedule.first_post
        if full:
            schedule.choose()
        if self._secondary:
            readings.judge_rss(n, full)
        readings.evaluate(n, full)
        if threading.get_ident() != self._thread:
            return
        if self._nodes.due(now):
            self._nodes.sample(n)
        if scanner.ready(n, now) and not (self.covered is not None and self.covered()):
            # Growth must last a while first (10 steps, 2 readings or more): a warm-up that grows for a few
            # steps is not worth a scan.
            lasted = readings.count - readings.since if readings.since is not None else None
            lasting = lasted is not None and lasted >= 2 and lasted * schedule.stride >= 10
            triggers = self._triggers() if lasting or self._nodes.rising() else set()
            scanner.scan_for(n, triggers)

    def _triggers(self) -> set[str]:
        """Which figures show growth now: ``"heap"``/``"rss"`` (the detector), ``"nodes"`` (live autograd
        nodes rising)."""
        out = set()
        if self._readings.growth.leaking:
            out.add(self.source)
        if self._readings.rss_growth.leaking:
            out.add("rss")
        if self._nodes.rising():
            out.add("nodes")
        return out

    def _figures(self) -> int | None:
        """The C heap now, raw (``None`` where it is not the figure or cannot be read): what torchmem's own
        work is measured with."""
        if self.source != "heap":
            return None
        try:
            return int(self._read())
        except Exception:  # reported by the reading itself
            return None

    # -- the report ----------------------------------------------------------------------------------
    def report(self) -> LeakReport:
        """The verdict, culprits and readings now (a frozen :class:`~torchmem.results.leaks.LeakReport`
        with ``device="host"``). Never raises for the watcher's own state; can be called at any time."""
        view = HostView(
            steps=self.steps,
            warmup=self.warmup,
            min_bytes_per_step=self.min_bytes_per_step,
            source=self.source,
            secondary=self._secondary,
            running=self._running,
            foreign=self._foreign,
            gap=self._gap,
            boundary=self.boundary,
            unit=self.unit,
            notes=tuple(self._notes.lines),
            readings=self._readings,
            schedule=self._schedule,
            scanner=self._scanner,
            nodes=self._nodes,
            tracer=self._tracer,
        )
        return build_report(view)


__all__ = ["DEFAULT_MIN_BYTES_PER_STEP", "HostWatcher"]
