"""The scans of :class:`torchmem.capture.host.HostWatcher`: the live autograd nodes' counts
(:class:`HostNodeCounts`) and the scan sequences that name what grows (:class:`HostScanner`).

A sequence is three scans a few steps apart (on the thread that started the watch). They compare the live
tensors' autograd graphs (by the sequence numbers of their nodes, so no graph is kept alive between scans),
the Python objects' counts per type and the lengths of the program's lists, dicts and deques, and read the
process's state; between them tracemalloc and a function mode trace what the program does
(:mod:`torchmem.capture.host_trace`, :mod:`torchmem.capture.host_windows`). The third scan searches the
holders of what grew and keeps the facts the culprits are named from (:mod:`torchmem.capture.host_naming`).
"""

from __future__ import annotations

import collections
import dataclasses
import gc
import math
import time
from typing import Any

import torch

from torchmem._format import fmt_bytes
from torchmem.analysis.holders import find_holders
from torchmem.analysis.host import (
    AUTOGRAD_CHAIN,
    ChainFact,
    ChainGrowth,
    ObjectFact,
    chain_culprits,
    chain_growth,
    chain_lasted,
    confirmed_chains,
    node_trend,
    object_culprits,
    standalone_graphs,
    type_growth,
)
from torchmem.analysis.host_state import (
    ANOMALY,
    NODE_BYTES,
    HostAccount,
    ProcessState,
    StateEvidence,
    line_culprits,
    state_culprits,
    state_through,
)
from torchmem.analysis.leak_fixes import RETAINED_GRAPH
from torchmem.capture.host_naming import MAX_TYPES, HostKept, kept_items, name_facts
from torchmem.capture.host_objects import container_lengths, cpu_storage_bytes, still_growing
from torchmem.capture.host_readings import HostReadings, HostSeries
from torchmem.capture.host_schedule import HostSchedule
from torchmem.capture.host_trace import HostNotes, HostTracer
from torchmem.capture.host_walk import (
    NO_SEQ,
    SAMPLES_PER_TYPE,
    Heap,
    HostScan,
    count_nodes,
    count_types,
    heads,
    ids_of,
    is_node_type,
    new_instances,
    tensors_in,
    type_name,
)
from torchmem.capture.host_windows import HostInstruments, HostSiteWindow
from torchmem.capture.process_state import read_state, running_profilers
from torchmem.results.leaks import Culprit

# Host culprits that keep autograd graphs (their nodes are the live nodes that rise).
_GRAPH_KINDS = frozenset({AUTOGRAD_CHAIN, RETAINED_GRAPH, ANOMALY})
_MAX_ATTEMPTS = 4  # scan sequences that found nothing before scanning stops
# Steps between two scans of a sequence at most (a figure that rises in stairs: see sequence_gap).
_MAX_GAP = 100


class HostNodeCounts:
    """The live autograd nodes (reachable from live tensors), counted at each scan, at the end, and otherwise
    rarely (the first after ``5 * interval`` s, then spaced so that counting takes ``overhead`` of the run).
    """

    def __init__(
        self, tracer: HostTracer, notes: HostNotes, *, interval: float, overhead: float, budget: float
    ) -> None:
        self._tracer = tracer
        self._notes = notes
        self._interval = interval
        self._overhead = overhead
        self._budget = budget
        self.counts: list[tuple[int, int]] = []  # (step, nodes)
        self.lower: set[int] = set()  # the steps whose count stopped at its budget (at least that many)
        self.capped = False
        self._next_t = 0.0
        self.wait = interval
        self.seconds = 0.0  # time in counts

    def start(self, now: float) -> None:
        # The first count comes late (its cost is not known yet): 5 x node_interval, 10 s by default.
        self._next_t = now + 5 * self._interval

    def due(self, now: float) -> bool:
        return now >= self._next_t

    def sample(self, n: int) -> None:
        t0 = time.perf_counter()
        try:
            with self._tracer.own_work():
                tensors = tensors_in(gc.get_objects())
                count, capped = count_nodes(tensors, budget=max(0.01, self._budget / 4))
                tensors.clear()
        except Exception as exc:
            self._notes.error("autograd node count", exc)
            self._next_t = float("inf")
            return
        cost = time.perf_counter() - t0
        self.seconds += cost
        self.add(n, count, capped)
        # Spaced so that counting stays under its share of the run.
        self.wait = max(self._interval, cost / self._overhead)
        self._next_t = time.perf_counter() + self.wait

    def add(self, n: int, count: int, capped: bool) -> None:
        if self.counts and self.counts[-1][0] == n:
            return
        self.capped = self.capped or capped
        self.counts.append((n, count))
        if capped:
            self.lower.add(n)
        if len(self.counts) > 512:
            self.counts = self.counts[::2]
            kept = {s for s, _ in self.counts}
            self.lower &= kept

    def trend(self) -> float | None:
        """Nodes added per step over the last counts (``node_trend``; a count cut short is a lower bound)."""
        return node_trend(self.counts, lower_bounds=self.lower)

    def lasted(self, since: int, nodes_per_step: float) -> bool | None:
        """Whether a chain seen growing at step ``since`` went on growing (``chain_lasted``)."""
        return chain_lasted(self.counts, since, nodes_per_step, lower_bounds=self.lower)

    def rising(self) -> bool:
        rate = self.trend()
        return rate is not None and rate >= 0.5

    def note(self) -> str:
        if not self.counts:
            return ""
        (s0, c0), (s1, c1) = self.counts[0], self.counts[-1]
        at_least = "at least " if self.capped else ""
        text = f"{at_least}{c1:,} autograd nodes alive at step {s1}"
        top = max(self.counts, key=lambda sc: sc[1])
        if s1 in self.lower and top[1] > c1:
            # the last count stopped at its budget below an earlier one: a lower bound, not a fall
            text += f" (the count stopped at its time budget; {top[1]:,} were counted at step {top[0]})"
        elif s1 > s0:
            text += f" ({(c1 - c0) / (s1 - s0):+.1f}/step since step {s0})"
        return text + f"; counted every {self.wait:.0f} s or more"


class HostScanner:
    """The scan sequences: when one is due, its three scans, and the facts the last one named.

    Args:
        owner: The object whose state is torchmem's (the watcher): its objects are left out of the counts.
        readings, schedule, tracer, instruments, nodes, notes: The watcher's other parts, which the scans
            read (the figures' growth, the steps' time) and drive (tracing, windows, node counts, notes).
        warmup, min_bytes_per_step: The watcher's warm-up and threshold.
        gap: Steps between two scans of a sequence.
        budget: Seconds one scan may spend walking autograd graphs.
        holder_time: Seconds the holder search may take.
        own_history: torchmem turned the CUDA allocator's history recording on.
    """

    def __init__(
        self,
        owner: object,
        *,
        readings: HostReadings,
        schedule: HostSchedule,
        tracer: HostTracer,
        instruments: HostInstruments,
        nodes: HostNodeCounts,
        notes: HostNotes,
        warmup: int,
        min_bytes_per_step: int,
        gap: int,
        budget: float,
        holder_time: float,
        own_history: bool,
    ) -> None:
        self._owner = owner
        self._readings = readings
        self._schedule = schedule
        self._tracer = tracer
        self._instruments = instruments
        self._nodes = nodes
        self._notes = notes
        self._warmup = warmup
        self._min_bytes = min_bytes_per_step
        self._gap = gap
        self._seq_gap = gap  # the sequence's under way (wider for a figure that rises in stairs)
        self._stairs_noted = False
        self._budget = budget
        self._holder_time = holder_time
        self._own_history = own_history
        self._source = "n/a"
        self.due: int | None = None
        self._scans: list[HostScan] = []
        self._attempts = 0
        self._quiet_until = 0
        self._quiet_t = 0.0
        self._found_on: set[str] = set()  # the growth the culprits were found on
        self._scanning_for: set[str] = set()
        self.seconds = 0.0
        self.scan_steps: list[int] = []
        self.chain_facts: tuple[ChainFact, ...] = ()
        self.object_facts: tuple[ObjectFact, ...] = ()
        self.facts_at: int | None = None
        # The growing types of the last scans: (step, instances then, growth per step), by type name.
        self.grew: tuple[int, dict[str, int], dict[str, float]] | None = None
        self._recount: tuple[int, dict[str, float]] | None = None
        # Host growth of other kinds (one scan sequence's facts): the process's state at each scan, Python
        # objects found through the containers that keep them, and what the growth is made of.
        self._states: list[ProcessState] = []
        self._state_facts: tuple[ProcessState, StateEvidence, HostAccount] | None = None
        self.types_counted = 0
        self.containers_seen = 0
        self._account = HostAccount(heap=0.0)
        self._own_ids: set[int] = set()  # torchmem's objects at the second scan
        # The containers found growing: id -> (their entries' type, length then, entries per step)
        self._kept_lens: dict[int, tuple[str, int, float]] = {}
        self.checked: tuple[ProcessState, HostAccount] | None = None  # the last sequence's, for the notes
        self.state_notes: tuple[str, ...] = ()
        # CPU tensors kept in a growing container are host memory to name (a run that watches a GPU); on the
        # CPU they are the device report's.
        self.cpu_tensors = False
        self.data_paths: frozenset[str] = frozenset()  # the last naming's containers of plain data
        self._tensors_noted = False  # said once: the growth was CPU tensor storages (see _tensors_explain)

    def start(self, source: str) -> None:
        """The watch started with ``source`` as its figure (``"heap"`` or ``"rss"``)."""
        self._source = source

    def ready(self, n: int, now: float) -> bool:
        """No sequence is under way, and the last ones that found nothing were long enough ago."""
        return (
            self.due is None
            and self._attempts < _MAX_ATTEMPTS
            and n >= self._quiet_until
            and now >= self._quiet_t
        )

    def scan_for(self, n: int, triggers: set[str]) -> None:
        """Growth of a kind the last culprits were not found on (the heap after the RSS...) is scanned again,
        at most at twice the step of the last scans."""
        new = triggers - self._found_on
        if new == {"rss"} and "heap" in self._found_on and self._rss_is_the_heap():
            return  # the RSS holds the C heap: rising with the growth already named, it is that growth
        if new and (self.facts_at is None or n >= 2 * self.facts_at):
            self._scanning_for = triggers
            self.scan(n)

    def _rss_is_the_heap(self) -> bool:
        """The C heap's growth makes up most (3/4 or more) of the RSS's since the last sequence ended: the RSS
        rises with the heap (or not at all yet). The whole run's RSS series would not do: it holds the scans'
        own memory (tens of MB at once, then flat while the program reuses it), which made a second sequence
        name the same autograd chain again, seconds later."""
        heap, rss = self._readings.heap_rate(), self._readings.fresh_rss_rate()
        if rss is None:
            return True  # too few readings since: judged at a later step
        return rss <= 0 or (heap > 0 and heap >= 0.75 * rss)

    def scan(self, n: int) -> None:
        t0 = time.perf_counter()
        try:
            with self._tracer.own_work():
                try:
                    self._scan_now(n)
                except Exception as exc:
                    self._notes.error("scan", exc)
                    self._end_sequence(n, found=False)
        finally:
            self.seconds += time.perf_counter() - t0
            self.scan_steps.append(n)

    def _scan_now(self, n: int) -> None:
        phase = len(self._scans)
        scan = HostScan(n)
        prev = self._scans[-1] if self._scans else None
        tracer = self._tracer
        # Where the program allocated what is still alive since tracing started (before this scan allocates),
        # then tracing stops: the scan runs untraced (tracing makes every allocation slow).
        tracer.trace_cost(n)
        lines = tracer.end_line_window() if phase == 1 else None
        self._states.append(read_state())
        c0 = time.thread_time()
        objs = Heap(gc.get_objects())  # each object's type read once, for every pass below
        tensors: list[torch.Tensor] = []
        samples: dict[str, list[Any]] = {}
        created: dict[str, str | None] = {}
        kept: list[HostKept] = []
        profilers: list[Any] = []
        try:
            if phase == 2:
                # New instances of the types that grew, and where they were made, while tracing is on (the
                # ids of torchmem's objects from the second scan: working them out again would be traced); the
                # rest of the scan runs without tracing.
                second = self._scans[1]
                if second.ids:
                    samples = new_instances(objs, second.ids, second.ids, self._own_ids)
                    created = tracer.creation_sites(samples)
                # The newest entries of the containers that grew at every scan, and the line that made them
                # (tracemalloc knows only while it traces: a CPU tensor's storage is not a Python
                # allocation, so its line is known from the tensor object's trace alone).
                scan.lens, found = still_growing(objs, second.lens)
                kept = kept_items(found, scan.lens, n - self._scans[0].step, self.cpu_tensors)
                tracer.stop()
                self._own_ids = set()
            own = own_objects(self._owner)
            if phase == 2 and self._states[-1].profiler:
                profilers = running_profilers(objs)
            counts = count_types(objs)
            tensors = tensors_in(objs, counts)
            scan.cpu_bytes = cpu_storage_bytes(tensors)
            nodes, capped = count_nodes(tensors, budget=max(0.01, self._budget / 4))
            self._nodes.add(n, nodes, capped)
            scan.nodes = None if capped else nodes
            for o in own:
                t = type(o)
                if t in counts:
                    counts[t] -= 1
            named: dict[str, int] = {}
            for t, c in counts.items():
                if is_node_type(t):  # autograd nodes' wrappers: chains are judged by their graphs
                    continue
                k = type_name(t)
                named[k] = named.get(k, 0) + c
            scan.counts = named
            self.types_counted = len(named)
            live, scan.heads, scan.watermark = heads(tensors, prev, self._budget)
            if prev is not None:
                scan.chains = chain_growth(live, n - prev.step)
            if phase == 1:
                # Types and containers that grew since the first scan: remember which instances exist now.
                scan.lens, _ = still_growing(objs, prev.lens if prev is not None else {})
                grew = type_growth([self._scans[0].counts, named], [self._scans[0].step, n])
                top = sorted(grew, key=lambda k: -grew[k])[: 2 * MAX_TYPES]
                if top:
                    scan.ids = ids_of(objs, {k: grew[k] for k in top}, own)
                if scan.chains:
                    self._instruments.open_window()
            elif phase == 0 and time.thread_time() - c0 > self._budget * 5:
                # A heap this big would stall the program at each scan: say so, and stop here. The scan's
                # CPU time decides (its wall time on a loaded machine is the other processes' too).
                self._attempts = _MAX_ATTEMPTS
                self._notes.add(
                    f"the heap holds {len(objs):,} objects: one scan took "
                    f"{time.thread_time() - c0:.1f} s of CPU, so what grows is not named"
                )
                self._end_sequence(n, found=False)
                return
            elif phase == 0:
                scan.lens = {k: (v,) for k, v in container_lengths(objs, own).items()}
                self.containers_seen = len(scan.lens)
        finally:
            objs.clear()
            del objs
        if phase == 1 and self._tensors_explain(prev, scan):
            self._end_sequence(n, found=False)
            return
        if phase == 0:
            tracer.begin(n, lines=True, step_time=self._schedule.step_time())
        elif phase == 1:
            tracer.line_growth(self._scans[0].step, scan.step, lines)
        if phase < 2:
            self._scans.append(scan)
            if phase == 0:
                self._seq_gap, note = sequence_gap(self._readings.stair_spacing(), self._gap, n)
                if note and not self._stairs_noted:
                    self._stairs_noted = True
                    self._notes.add(note)
            self.due = n + self._seq_gap
            if phase == 1:
                self._instruments.watch_shapes(bool(self._states and self._states[-1].cudnn_benchmark))
                if scan.ids:
                    # torchmem's objects now (the next scan runs traced until it has sampled), then trace
                    # where the new instances are made
                    self._own_ids = {id(o) for o in own_objects(self._owner)}
                    tracer.begin(n, lines=False, step_time=self._schedule.step_time())
            return
        # Third scan: confirm, sample, name.
        first, second = self._scans
        confirmed = confirmed_chains(second.chains, scan.chains)
        grew = type_growth([first.counts, second.counts, named], [first.step, second.step, n])
        top = sorted((k for k in grew if k in samples), key=lambda k: -grew[k])[:MAX_TYPES]
        grew = {k: grew[k] for k in top}
        self.grew = (n, {k: named.get(k, 0) for k in grew}, dict(grew))
        for k in list(samples):
            if k not in grew:
                del samples[k]
        self._account_scans(first, second, scan)
        graphs: list[Any] = []
        if self._states[-1].anomaly:
            # Tensors whose graphs were made since the first scan and are still alive: who keeps them keeps
            # the anomaly stacks (oldest first; see standalone_graphs).
            fresh = standalone_graphs(live, first.watermark, NO_SEQ, 2 * SAMPLES_PER_TYPE)
            graphs = [tensors[h.index] for h in fresh]
        window = self._instruments.close_window(on_thread=True)  # scans run on the watch's thread only
        evidence = self._instruments.close_shapes()
        chain_tensors = [tensors[g.index] for g in confirmed]
        tensors.clear()
        self._name_culprits(
            n, confirmed, chain_tensors, grew, samples, created, window, kept, profilers, graphs, evidence
        )

    def _tensors_explain(self, first: HostScan | None, second: HostScan) -> bool:
        """On a run whose device report watches the CPU (``cpu_tensors`` off), C-heap growth that the CPU
        tensor storages kept between the first two scans account for (three quarters of it or more), with no
        autograd chain growing and no other figure rising, is the device report's: the third scan, which would
        only leave those tensors to it, is spared (a quiet inference loop keeping its predicted labels paid
        three scans for nothing), and the note says what the growth is."""
        if self.cpu_tensors or first is None or second.step <= first.step or second.chains:
            return False
        if not self._scanning_for or not self._scanning_for <= {"heap"}:
            return False
        rise = (second.cpu_bytes - first.cpu_bytes) / (second.step - first.step)
        heap = self._readings.heap_rate()
        if not (rise > 0 and heap > 0 and rise >= 0.75 * heap):
            return False
        if not self._tensors_noted:
            self._tensors_noted = True
            self._notes.add(
                f"host growth of {fmt_bytes(int(heap))}/step is CPU tensor storages "
                f"(+{fmt_bytes(int(rise))}/step between the scans at steps {first.step} and {second.step}): "
                "the device report's on the CPU, not scanned further"
            )
        return True

    def _account_scans(self, first: HostScan, second: HostScan, third: HostScan) -> None:
        """What the host growth is made of during the sequence."""
        steps = third.step - first.step
        # CPU tensor storages kept (rising at each scan: what is alive at a step boundary varies)
        b0, b1, b2 = first.cpu_bytes, second.cpu_bytes, third.cpu_bytes
        tensors = (b2 - b0) / steps if steps > 0 and b2 > b1 > b0 else 0.0
        nodes: float | None = None
        counts = (first.nodes, second.nodes, third.nodes)
        if all(c is not None for c in counts) and steps > 0:
            c0, c1, c2 = (int(c or 0) for c in counts)
            nodes = (c2 - c0) / steps if c2 > c1 > c0 else 0.0
        traced, traced_heap = self._tracer.traced if self._tracer.traced is not None else (None, 0.0)
        self._account = HostAccount(
            heap=self._readings.heap_rate(),
            traced=traced,
            traced_heap=traced_heap,
            tensors=tensors,
            nodes_per_step=nodes,
        )

    def _name_culprits(
        self,
        n: int,
        confirmed: list[ChainGrowth],
        chain_tensors: list[torch.Tensor],
        grew: dict[str, float],
        samples: dict[str, list[Any]],
        created: dict[str, str | None],
        window: HostSiteWindow | None,
        kept: list[HostKept],
        profilers: list[Any],
        graphs: list[Any],
        new_shapes: tuple[int, int, int] | None,
    ) -> None:
        # One holder search for all: the chains' tensors, the new instances of each growing type, the newest
        # entries of each growing container, the running profilers, the tensors whose graphs stay alive.
        flat: list[Any] = list(chain_tensors)
        for k in list(samples):
            flat.extend(samples[k])
        flat.extend(row.container for row in kept)
        flat.extend(profilers)
        flat.extend(graphs)
        paths: list[Any] = []
        if flat:
            search = find_holders(
                flat,
                max_paths=3,
                time_limit=self._holder_time,
                exclude=[flat, chain_tensors, samples, *samples.values(), kept, profilers, graphs],
            )
            paths = list(search.paths)
            if search.truncated and not any(paths):
                self._notes.add(
                    f"the holder search stopped ({search.reason}) after {search.seconds:.1f} s: holders "
                    "are not named"
                )
        named = name_facts(
            paths,
            confirmed=confirmed,
            window=window,
            grew=grew,
            samples=samples,
            created=created,
            kept=kept,
            profilers=len(profilers),
            graphs=len(graphs),
            lines=self._tracer.line_facts,
            first=self._scans[0].step if self._scans else n,
            third=n,
            new_shapes=new_shapes,
            own_history=self._own_history,
        )
        self._kept_lens = named.kept_lens
        flat.clear()
        chain_tensors.clear()
        samples.clear()
        kept.clear()
        profilers.clear()
        graphs.clear()
        if window is not None:
            if window.error is not None:
                self._notes.error("site window", window.error)
            self._instruments.release_window(window)
        self._state_facts = (state_through(self._states), named.evidence, self._account)
        self.chain_facts, self.object_facts, self.facts_at = named.chains, named.objects, n
        self.data_paths = named.data_paths
        culprits = self.culprits(n)
        self._end_sequence(n, found=bool(culprits), graphs=any(c.kind in _GRAPH_KINDS for c in culprits))
        if not culprits:
            self.chain_facts, self.object_facts, self.facts_at = (), (), None
            self._tracer.forget_lines()
            self._kept_lens = {}

    def culprits(self, steps_now: int) -> tuple[Culprit, ...]:
        """The culprits from the last scans' facts, with the figures' growth now (at step ``steps_now``);
        ``state_notes`` then holds the notes on the process's state that came with them (kept from the last
        call that had facts)."""
        if self.facts_at is None:
            return ()
        steps = max(0, steps_now - self._warmup)
        heap = self._readings.heap_rate()
        culprits: list[Culprit] = []
        chains: tuple[Culprit, ...] = ()
        if self.chain_facts:
            rate, estimated = heap, False
            nodes = sum(f.nodes_per_step for f in self.chain_facts)
            if rate <= 0 or self._source != "heap":
                rate, estimated = nodes * NODE_BYTES, True
            chains = chain_culprits(self.chain_facts, bytes_per_step=rate, steps=steps, estimated=estimated)
            culprits += chains
        # 2 % of the growth (the RSS moves with the scans): of the smaller of the two figures that grow. The
        # scans' own allocations raise the RSS of a large heap by far more than the program's growth (a
        # 52,000-container heap: a 16 KiB/step list of CPU tensors was dropped under a floor made of it).
        rates = [r for r in (heap, self._readings.rss_series.rate()) if r > 0]
        floor = max(256.0, 0.02 * min(rates)) if rates else 256.0
        objects: tuple[Culprit, ...] = ()
        if self.object_facts:
            objects = object_culprits(self.object_facts, min_bytes_per_step=floor, steps=steps)
            culprits += objects
        self.state_notes = ()
        if self._state_facts is not None:
            state, evidence, account = self._state_facts
            account = dataclasses.replace(
                account,
                heap=heap if heap > 0 else account.heap,  # the figure's growth now, as for the chains
                python_named=sum(c.bytes_per_step for c in objects),
                native_named=sum(c.bytes_per_step for c in chains),
            )
            states, self.state_notes = state_culprits(
                state, account, evidence, min_bytes_per_step=self._min_bytes, steps=steps
            )
            culprits += states
            if not any(c.kind == ANOMALY for c in states):  # else the lines are where the stacks were made
                named = [s for c in culprits for s, _ in c.sites] + [c.site for c in culprits if c.site]
                culprits += line_culprits(
                    self._tracer.line_facts, named, min_bytes_per_step=max(1024.0, 0.1 * account.growth)
                )
        culprits.sort(key=lambda c: -c.bytes_per_step)
        return tuple(culprits)

    def _end_sequence(self, n: int, *, found: bool, graphs: bool = False) -> None:
        """The end of a scan sequence (``found``: it named culprits; ``graphs``: one of them keeps autograd
        graphs, so the live nodes rising with it are the same growth)."""
        self._scans = []
        self.due = None
        self._instruments.close_window(on_thread=True)  # scans run on the watch's thread only
        self._instruments.close_shapes()
        self._tracer.stop()
        if self._state_facts is not None:
            self.checked = (self._state_facts[0], self._account)
        self._states = []
        self._tracer.reset()
        # The scans' memory stays resident after it is freed, and the program reuses it before the RSS grows
        # again: the RSS is judged afresh from here.
        self._readings.afresh(figure=self._source == "rss")
        if found:
            self._found_on |= self._scanning_for
            if self.chain_facts or graphs:
                # the live autograd nodes keep rising with the chain, kept graphs or anomaly stacks just
                # named: not a new kind of growth to scan for again (a second sequence named the same
                # culprit, seconds later: twice the naming cost on a big heap)
                self._found_on.add("nodes")
            return
        # Nothing found: wait longer before the next try, and as long again as the scans took, x200.
        self._attempts += 1
        self._quiet_until = n + 64 * 2**self._attempts
        self._quiet_t = time.perf_counter() + 200 * self.seconds

    def objects_still_growing(self, steps: int) -> dict[str, float]:
        """The growing types of the last scans whose instances kept growing since (one heap scan, cached
        per step, ``steps`` the steps now): ``{type name: new instances per step}``."""
        if self.grew is None:
            return {}
        at, counts, rates = self.grew
        if steps - at < 2 * self._gap:
            return {}
        cached = self._recount
        if cached is not None and cached[0] == steps:
            return cached[1]
        out: dict[str, float] = {}
        try:
            objs = gc.get_objects()
            try:
                now = count_types(objs)
                for o in own_objects(self._owner):
                    if type(o) in now:
                        now[type(o)] -= 1
            finally:
                del objs
            named: dict[str, int] = {}
            for t, c in now.items():
                k = type_name(t)
                if k in counts:
                    named[k] = named.get(k, 0) + c
            for k, c in counts.items():
                rate = (named.get(k, 0) - c) / (steps - at)
                if rate >= 0.5 * max(1.0, rates.get(k, 0.0)):  # a few transient ones at the scan aside
                    out[k] = rate
            if self._kept_lens:  # the containers that kept untracked objects: still longer?
                objs = gc.get_objects()
                try:
                    grown, _ = still_growing(objs, {i: (v[1],) for i, v in self._kept_lens.items()})
                finally:
                    del objs
                for i, lens in grown.items():
                    label, _, per_step = self._kept_lens[i]
                    rate = (lens[-1] - lens[0]) / (steps - at)
                    if rate >= 0.5 * per_step:
                        out[label] = max(out.get(label, 0.0), rate)
        except Exception as exc:
            self._notes.error("recount", exc)
        self._recount = (steps, out)
        return out


# The classes of the watcher's own state whose contents are torchmem's too.
_OWN_STATE = (
    dict,
    list,
    tuple,
    collections.deque,
    HostScan,
    HostSiteWindow,
    HostSeries,
    HostReadings,
    HostSchedule,
    HostNotes,
    HostTracer,
    HostInstruments,
    HostNodeCounts,
    HostScanner,
)


def sequence_gap(spacing: float | None, gap: int, n: int) -> tuple[int, str]:
    """Steps between the scans of a sequence starting at step ``n``, and a note where they are not ``gap``:
    where the figure rises in stairs ``spacing`` steps apart (a validation pass every 20 steps that keeps its
    outputs), 1.5x that (up to :data:`_MAX_GAP`). Two scans between two rises see nothing grow, and a sequence
    that found nothing would say that nothing torchmem can see explains the growth."""
    if spacing is None or spacing <= gap:
        return gap, ""
    # 1.5x: the spacing is read on the readings' grid (a rise every 20 steps read as 18 on a GPU run, where
    # the readings around a rise are denser): scans 18 apart left one interval without a rise
    wide = min(_MAX_GAP, math.ceil(1.5 * spacing))
    return wide, (
        f"the host figure rises every {spacing:.0f} steps with flat stretches between: the scans from step "
        f"{n} on are {wide} steps apart, so that a rise falls between each two"
    )


def own_objects(watcher: object) -> list[Any]:
    """The gc-tracked objects of the watcher's own state (not the program's): left out of type counts."""
    out: list[Any] = [watcher, watcher.__dict__]
    seen = {id(watcher), id(watcher.__dict__)}
    stack: list[Any] = list(watcher.__dict__.values())
    while stack and len(out) < 10_000:
        o = stack.pop()
        if id(o) in seen or not gc.is_tracked(o) or isinstance(o, (type, torch.Tensor)):
            continue
        seen.add(id(o))
        out.append(o)
        if isinstance(o, (list, collections.deque)) and (not o or not gc.is_tracked(o[0])):
            continue  # numbers (the series): nothing more of ours is inside
        if isinstance(o, _OWN_STATE):
            # (numbers and strings, untracked, are skipped at C speed)
            stack.extend(filter(gc.is_tracked, gc.get_referents(o)))
    return out
