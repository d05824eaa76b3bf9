"""The step watchers of a session, made anew when a better step boundary is found or the program's GPU is
another: the device watcher, the loop's survivors and the host-memory watcher, with the session's budgets."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from torchmem.capture.watch import Watcher, watch
from torchmem.results.leaks import LeakReport
from torchmem.run.verdicts import host_verdict, labelled, survivors_beside

# The share of the run the loop survivors' recording may add beyond their first two steps (issue 12: <= 2 %
# for all of torchmem).
SURVIVORS_BUDGET = 0.01
# The host watcher's readings after this many, and their share of the run then (see new_host).
HOST_RELAX_AFTER = 64
HOST_RELAXED_SHARE = 0.0005


def new_watcher(
    device: torch.device, warmup: int, note: Callable[[str], None], min_growth: int | None = None
) -> Watcher[Any]:
    """The device watcher, entered (``min_growth``: its leak threshold in bytes per step, ``--min-growth``;
    ``None``: ``watch()``'s default)."""
    more: dict[str, Any] = {} if min_growth is None else {"min_bytes_per_step": min_growth}
    # On the CPU the figure is the C heap in use (one ~1 µs read per step); the exact ledger only runs in
    # attribution windows, once the figure grows. Elsewhere the allocator's counters.
    source = "heap" if device.type == "cpu" else "auto"
    try:
        w: Watcher[Any] = watch(device=device, warn=False, warmup=warmup, source=source, **more)
    except Exception as exc:  # a watcher without the heap figure: the exact ledger, as before
        note(f"the {source} figure is unavailable ({exc}); using the exact tensor ledger")
        w = watch(device=device, warn=False, warmup=warmup, **more)
    w._exclusive = False  # the monitored program may use torchmem.watch() itself
    # After the first 64 readings (a short loop is read every step or two), the stride follows the
    # readings' cost in the loop: a CUDA reading is 25-130 µs, 3-10 % of a 1-4 ms step if read each step.
    w._relax_after = 64
    w.__enter__()
    return w


def new_host(
    warmup: int, boundary: str, own_history: bool, note: Callable[[str], None], device: torch.device
) -> Any:
    """The host-memory watcher (RSS and C heap per step; autograd chains and Python objects), started;
    ``None`` when it cannot run (said in a note). A short run keeps the readings of a verdict
    (``short_runs``) on every device: on a GPU the host is where a loop's CPU tensors, arrays and Python
    objects grow, and a 30-step loop read every 47 steps was never judged."""
    try:
        from torchmem.capture.host import HostWatcher

        # Node counts and readings within 0.2 % of the run each (its own default: 0.5 %): the run's
        # budget is shared with the device readings, the sampler and the loop survivors. The first
        # count after 30 s (a count walks the whole heap: ~0.1 s with a framework imported), so a short
        # run pays none; a scan for growing host memory counts them anyway.
        host = HostWatcher(
            warmup=warmup,
            boundary=boundary,
            node_interval=6.0,
            node_overhead=0.002,
            own_history=own_history,  # --memory-viz turned the allocator's history on
            share=0.002,
            # No ramp: with readings from the first steps, scans (tracemalloc on) start within a short
            # run and cost it seconds, and kept host data with no culprit named reads as a leak (H100,
            # session 8: a 24-step run took 37.8 s; an inference control that keeps its outputs on the
            # host was called a leak).
            ramp=False,
            # A 150-step CPU loop of 2 ms steps read every 44 steps ended with 4 readings, "not enough to
            # judge" (CI, session 10); a 30-step GPU loop keeping 1 MiB of CPU tensors a step, read every
            # 47, "the first verdict needs 238 steps" (H100, session 13). Session 8 left GPU runs out for
            # the scans' cost and for results gathered on the host being called a leak: the scans name
            # CPU tensors now and an inference loop's gathered results get their own verdict (run/verdicts).
            short_runs=True,
        )
        host.cpu_tensors = device.type != "cpu"  # no device report watches the CPU's tensors
        # A long run's readings (after 64, as the device watcher's) within 0.05 % of it: on a GPU host a
        # reading takes 40-200 µs (the RSS, the C heap's mallinfo2) and the step after it pays 2-3x that
        # again refilling its caches (H100, session 17: the MLP's readings were most of its 2.4 %).
        host.relax(HOST_RELAX_AFTER, HOST_RELAXED_SHARE)
        return host.start()
    except Exception as exc:
        note(f"host memory is not watched ({type(exc).__name__}: {exc})")
        return None


def new_survivors(device: torch.device, spent_s: float = 0.0, since: float | None = None) -> Any:
    """The loop's survivors recorder (``spent_s``, ``since``: what an earlier recorder of the run spent)."""
    from torchmem.capture.survivors import LoopSurvivors

    # A quarter of the leak threshold per step: a short loop's site that keeps less (predicted labels,
    # a few scalars) is not a leak, as it would not be for the growth detector.
    # Within ~1 % of the run (after a small fixed allowance: a loop of a few ms per step is covered
    # fully); a long run's verdict comes from the growth detector, the survivors are for short loops.
    return LoopSurvivors(
        str(device),
        min_bytes_per_step=64 * 1024,
        budget=SURVIVORS_BUDGET,
        spent_s=spent_s,
        since=since,
    )


def _holders_named(culprits: Any) -> bool:
    """Culprits that name the holder of every part of the growth."""
    return bool(culprits) and all(c.holder for c in culprits)


class StepWatchers:
    """The watchers a session feeds at each step: the device watcher (its readings and leak verdict), the
    loop's survivors and the host watcher; made anew on a better step boundary or another device, reported
    at the end. ``records``: the session's :class:`~torchmem.run.records.Records`; ``own_history``:
    ``--memory-viz`` turned the allocator's history on."""

    def __init__(self, records: Any, warmup: int, own_history: bool, min_growth: int | None = None) -> None:
        self._records = records
        self._warmup = warmup
        self._min_growth = min_growth
        self._own_history = own_history
        self._watcher: Watcher[Any] | None = None
        self._survivors: Any = None
        self._host: Any = None
        self.times = (0.0, 0.0, 0.0)
        """The seconds of the last step's parts: the watcher's reading, the loop survivors, the host
        watcher."""
        self._quiet_failed = False  # quiet_steps() raised once: the full path from then on

    @property
    def watcher(self) -> Watcher[Any] | None:
        return self._watcher

    @property
    def survivors(self) -> Any:
        """The loop's survivors recorder (``capture/survivors.LoopSurvivors``), ``None`` before
        :meth:`start`."""
        return self._survivors

    @property
    def instrumenting(self) -> bool:
        """The host watcher's scan is on for the step under way."""
        return self._host is not None and bool(self._host.instrumenting)

    def start(self, device: torch.device) -> None:
        note = self._records.note
        self._watcher = new_watcher(device, self._warmup, note, self._min_growth)
        self._survivors = new_survivors(device)
        self._host = new_host(self._warmup, "", self._own_history, note, device)
        self._share_heap(device)

    def _share_heap(self, device: torch.device) -> None:
        """On the CPU both watchers read the C heap: the device watcher leaves out what the host watcher's
        own work (its scans, its tracing) does to it, as the host watcher does (a traced step's figure,
        tracemalloc's tables in it, made a leaking run's last readings 'noisy')."""
        w, host = self._watcher, self._host
        cpu = device.type == "cpu"
        if w is not None:
            w._others_work = host.own_work if host is not None and cpu else None
        if host is not None:
            # and the host watcher's scans are spared once the device report names the holders: it covers
            # this growth (verdicts.host_verdict)
            covered = (lambda: w.leaking and _holders_named(w.culprits)) if w is not None and cpu else None
            host.covered = covered
            # both read at the same steps (the host's stride a multiple of the device watcher's): the steps
            # between are quiet for both, one reading step instead of two (on a GPU host a reading step
            # costs its step 3-5x the readings' own time)
            host.read_with((lambda: w.stride) if w is not None else None)
            # and on the CPU, where both read the C heap, the host watcher takes the device watcher's
            # reading of the same step instead of reading it again (one reading serves both)
            host.figure_from(w.figure_read_now if w is not None and cpu else None)

    def fresh(self) -> bool:
        """The watcher is there and counted no step yet."""
        w = self._watcher
        return w is not None and not w.steps

    def reading(self) -> int:
        """The watcher's figure now."""
        w = self._watcher
        assert w is not None
        return w._reader()

    def restart(self, device: torch.device, boundary: str) -> None:
        """A better step boundary (``boundary``: its label) took over: every watcher starts again on it."""
        note = self._records.note
        if self._watcher is not None:
            self._watcher.stop()
        self._watcher = new_watcher(device, self._warmup, note, self._min_growth)
        spent, since = 0.0, None
        if self._survivors is not None:  # its recorded steps were steps of the old kind
            self._survivors.stop()
            try:  # the new recorder shares the run's budget: the old one's cost is spent
                spent, since = self._survivors.spent, self._survivors.first_boundary
            except Exception:
                pass
        self._survivors = new_survivors(device, spent, since)
        if self._host is not None:
            self._host.stop()
        self._host = new_host(self._warmup, boundary, self._own_history, note, device)
        self._share_heap(device)

    def move_to(self, device: torch.device) -> None:
        """Watch ``device`` from now on: the device watcher and the loop's survivors start again on it."""
        w = self._watcher
        if w is not None:
            w.stop()
        self._watcher = new_watcher(device, self._warmup, self._records.note, self._min_growth)
        if self._survivors is not None:
            self._survivors.stop()
            self._survivors = new_survivors(device)
        if self._host is not None:
            self._host.cpu_tensors = device.type != "cpu"
        self._share_heap(device)

    def step(self, replay: int | None, observe: Callable[[int], None] | None) -> tuple[int, bool, int | None]:
        """One step ended (``replay``: its figure, read at the boundary's first event, else ``None``): the
        watcher's reading (given to ``observe`` if any: on the CPU every reading counts towards the peak),
        the loop's survivors, the host watcher. Returns the step count, whether the watcher read at this
        step, and what it read; the seconds of each part go to :attr:`times`."""
        w = self._watcher
        assert w is not None
        pc = time.perf_counter
        t0 = pc()
        if replay is None:
            w.step()
        else:
            w.step_at(replay)
        n = w.steps
        series = w._series
        read_now = bool(series) and series[-1][0] == n
        value = series[-1][1] if read_now else None
        if read_now and observe is not None:
            observe(series[-1][1])
        t1 = pc()
        # (A replayed first step: the loop survivors and the host watcher saw nothing of it; their first
        # boundary is the next one.)
        if self._survivors is not None and replay is None:
            self._survivors.boundary(n)
        t2 = pc()
        if self._host is not None and replay is None:
            self._host.step()
        t3 = pc()
        self.times = (t1 - t0, t2 - t1, t3 - t2)
        return n, read_now, value

    def quiet_steps(self) -> int:
        """How many of the next steps no watcher needs called for (the fewest of the device watcher's and
        the host watcher's; none while the loop's survivors record): the session counts them with
        :meth:`count` instead of :meth:`step`. Valid until the next :meth:`step`. An error here is said
        once, and every step takes the full path from then on."""
        w = self._watcher
        if w is None or self._quiet_failed or (self._survivors is not None and not self._survivors.quiet):
            return 0
        try:
            quiet = w.quiet_steps()
            host = self._host
            if quiet and host is not None:
                quiet = min(quiet, host.quiet_steps())
        except Exception as exc:
            self._quiet_failed = True
            self._records.note(f"step bookkeeping: every step is read in full ({type(exc).__name__}: {exc})")
            return 0
        return quiet

    def count(self, steps: int = 1) -> int:
        """``steps`` quiet steps ended: counted by each watcher (their readings come at a later step).
        Returns the step count."""
        w = self._watcher
        assert w is not None
        n = w.steps = w.steps + steps
        host = self._host
        if host is not None:
            host.steps += steps
        return n

    def leak(self) -> LeakReport | None:
        """The watcher stopped, its report (``None`` without a watcher)."""
        w = self._watcher
        if w is None:
            return None
        w.stop()
        return w.report()

    def survivors_report(self, steps: int, boundary: str, leak: LeakReport | None) -> Any:
        """The loop's survivors at the end, written (``None`` when they could not be reported)."""
        if self._survivors is None:
            return None
        survivors = None
        try:
            self._survivors.stop()
            # The holder search (up to 2 s at the run's end) only where the growth detector's culprits do
            # not already name every holder: the survivors then are listed for information.
            named = leak is not None and leak.leaking and _holders_named(leak.culprits)
            survivors = self._survivors.report(
                total_steps=steps, boundary=boundary, time_limit=0.0 if named else 2.0
            )
            survivors = survivors_beside(survivors, leak, steps)
            self._records.record("survivors", report=survivors.to_dict())
        except Exception as e:
            self._records.note(f"the loop's survivors could not be reported ({type(e).__name__}: {e})")
        return survivors

    def host_report(
        self,
        label: str | None,
        leak: LeakReport | None,
        device: torch.device,
        backward: bool | None = None,
    ) -> LeakReport | None:
        """The host-memory verdict at the end (``label``: the step boundary, if any; ``backward``: whether
        the program ran a backward, ``None``: not known), written."""
        if self._host is None:
            return None
        host = None
        try:
            self._host.stop()
            host = self._host.report()
            if label is not None:
                host = labelled(host, label)
            host = host_verdict(
                host,
                leak,
                device,
                backward=backward,
                graphs=self._host.graphs_rising,
                data=self._host.data_holders,
            )
            self._records.record("host_leak", report=host.to_dict(), final=True)
        except Exception as e:
            self._records.note(f"the host memory verdict could not be made ({type(e).__name__}: {e})")
        return host
