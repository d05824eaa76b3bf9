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
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import gc
import itertools
import logging
import math
import os
import sys
import threading
import time
import tracemalloc
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import Any

import torch

from torchmem._format import fmt_bytes
from torchmem.analysis.holders import find_holders
from torchmem.analysis.host import (
    PYTHON_OBJECTS,
    ChainFact,
    ChainGrowth,
    ChainHead,
    ObjectFact,
    chain_culprits,
    chain_growth,
    confirmed_chains,
    node_trend,
    object_culprits,
    type_growth,
)
from torchmem.analysis.host_state import (
    ANOMALY,
    CUDNN_BENCHMARK,
    MEMORY_HISTORY,
    PROFILER,
    HostAccount,
    LineGrowth,
    ProcessState,
    StateEvidence,
    checked_note,
    closest_line,
    growing_lines,
    line_culprits,
    state_culprits,
    state_through,
)
from torchmem.analysis.leaks import detect_growth, detect_run_growth, holder_name, holder_pattern
from torchmem.capture.host_objects import (
    container_lengths,
    cpu_storage_bytes,
    creation_line,
    kept_entries,
    measure,
    minus,
    newest,
    still_growing,
    traced_lines,
    type_label,
)
from torchmem.capture.process_state import ShapeWindow, read_state, running_profilers
from torchmem.devices._host import heap_in_use, process_rss
from torchmem.devices._ledger import Site, birth_site
from torchmem.results.holders import HolderPath, HolderStep, StepKind
from torchmem.results.leaks import Culprit, Growth, LeakReport

_log = logging.getLogger("torchmem")

DEFAULT_MIN_BYTES_PER_STEP = 4096
"""The default reporting threshold, 4 KiB per step. An EMA of a 4-parameter model updated from parameters
that require grad grows the heap by ~6.5 KiB per step (two autograd nodes of ~0.8 KiB per parameter per
step); an ordinary training loop's heap moves by tens of bytes per step at its boundaries (a list of
``loss.item()`` floats: ~8 B/step of list growth plus 24 B floats in Python's arenas), and a per-step dict of
a few metrics (~0.6 KiB) stays below it too. Growth of 4 KiB/step is 400 MB over 100,000 steps."""

STEADY_READINGS = 5  # readings after the warm-up that detect_growth's steady test needs
_WINDOW = 32  # the detector's window
_EVAL_EVERY = 16  # readings between two verdicts (sooner when the figure rises)
_QUICK = 12  # readings the steady test looks at on a rising reading between two verdicts
_SERIES_MAX = 4096
_MAX_STRIDE = 1024
_MAX_HEAP_EVERY = 64
_READ_OVERHEAD = 1.5e-6  # the Python work around one reading, verdicts amortized (measured: 1-2 µs)
_NO_SEQ = 1 << 63  # AccumulateGrad (and other leaves) have sequence number UINT64_MAX
_FIRST_PASS_NODES = 256  # nodes walked per graph before the others are walked at all
_MAX_ATTEMPTS = 4  # scan sequences that found nothing before scanning stops
_MAX_IDS = 2_000_000  # ids remembered per scan, to tell new instances from old ones
_SAMPLES_PER_TYPE = 4
_MAX_TYPES = 6  # growing types whose new instances are sampled, most new instances per step first
_MAX_SITES = 200_000
_BYTES_PER_BLOCK = 1024  # Python's largest small object (512 B), doubled for pools and arenas
_NODE_BYTES = 600  # a typical autograd node on the host (measured 0.4-0.8 KiB), for estimates only


def _cost(fn: Any) -> float:
    """The least time of five calls of ``fn``."""
    costs = []
    for _ in range(5):
        t0 = time.perf_counter()
        fn()
        costs.append(time.perf_counter() - t0)
    return min(costs)


def _type_name(t: type) -> str:
    mod = getattr(t, "__module__", "") or ""
    name = getattr(t, "__qualname__", None) or t.__name__
    return name if mod in ("builtins", "") else f"{mod}.{name}"


def _is_node_type(t: type) -> bool:
    """An autograd node's wrapper type (by its members: ``issubclass`` with the ``Node`` ABC would fill the
    ABC's caches with weak references, objects the type counts would then see growing)."""
    return hasattr(t, "next_functions") and hasattr(t, "_sequence_nr")


def _short(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def _no_torch_function() -> Any:
    """Reading ``grad_fn`` without running a tensor subclass's or a mode's ``__torch_function__``."""
    cls = getattr(torch._C, "DisableTorchFunction", None)
    return cls() if cls is not None else contextlib.nullcontext()


def _seq(node: Any) -> int:
    return int(node._sequence_nr())


def _pop_mode(mode: Any) -> bool:
    """Pop ``mode`` off the torch function mode stack if it is on top; ``False`` when it is not (another mode
    is above it, or this runs inside its own handler, which takes it off the stack meanwhile)."""
    ours = True
    try:
        n = torch._C._len_torch_function_stack()
        ours = n > 0 and torch._C._get_function_stack_at(n - 1) is mode
    except Exception:  # private reads: if they fail, trust the order
        pass
    if ours:
        mode.__exit__(None, None, None)
    return ours


def _inside_backward() -> bool:
    """This call runs inside ``Tensor.backward`` or ``torch.autograd.backward`` (a backward step boundary)."""
    torch_dir = os.path.dirname(torch.__file__)
    f: Any = sys._getframe(1)
    while f is not None:
        code = f.f_code
        if code.co_name == "backward" and code.co_filename.startswith(torch_dir):
            return True
        f = f.f_back
    return False


def _compiled_program() -> bool:
    """torch.compile has compiled frames in this process (a function mode would make them recompile)."""
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return False
    try:
        return int(utils.counters["frames"]["total"]) > 0
    except Exception:
        return True  # cannot tell: do not risk a recompilation


try:  # public since torch 1.13
    from torch.overrides import TorchFunctionMode as _TorchFunctionMode
except ImportError:  # pragma: no cover - a torch without it: no sites, the rest works
    _TorchFunctionMode = None  # type: ignore[assignment,misc]


class _SiteWindow:
    """A few steps during which the user's line of every op that makes an autograd node is recorded, by the
    node's sequence number (a function mode: it sees the op above autograd, with its ``grad_fn`` set)."""

    def __init__(self) -> None:
        self.by_seq: dict[int, int] = {}  # node sequence number -> index in sites
        self.index: dict[Site, int] = {}
        self.sites: list[Site] = []
        self.active = True
        self.mode: Any = None
        self.error: BaseException | None = None

    def note(self, out: Any) -> None:
        if isinstance(out, torch.Tensor):
            g = out.grad_fn
        elif isinstance(out, (tuple, list)):
            g = next((o.grad_fn for o in out if isinstance(o, torch.Tensor) and o.grad_fn is not None), None)
        else:
            return
        if g is None:
            return
        seq = _seq(g)
        if seq in self.by_seq:
            return
        if len(self.by_seq) >= _MAX_SITES:
            self.active = False
            return
        site = birth_site(2)
        if site is None:
            return
        i = self.index.get(site)
        if i is None:
            i = self.index[site] = len(self.sites)
            self.sites.append(site)
        self.by_seq[seq] = i

    def site_of(self, seqs: Sequence[int]) -> Site | None:
        for s in seqs:
            i = self.by_seq.get(s)
            if i is not None:
                return self.sites[i]
        return None


if _TorchFunctionMode is not None:

    class _SiteMode(_TorchFunctionMode):
        def __init__(self, window: _SiteWindow) -> None:
            super().__init__()
            self._window = window

        def __torch_function__(
            self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
        ) -> Any:
            out = func(*args, **(kwargs or {}))
            w = self._window
            if w.active:
                try:
                    w.note(out)
                except Exception as exc:  # never break the user's op
                    w.error = exc
                    w.active = False
            return out


class _Scan:
    """What one scan keeps until the next: type counts, autograd heads (numbers only, no object)."""

    def __init__(self, step: int) -> None:
        self.step = step
        self.counts: dict[str, int] = {}
        self.heads: dict[int, str] = {}  # head sequence number -> node type name
        self.watermark = 0
        self.chains: list[ChainGrowth] = []
        self.ids: dict[str, set[int]] = {}  # candidate type -> ids of its instances now
        self.lens: dict[int, tuple[int, ...]] = {}  # container id -> its lengths at the scans so far
        self.cpu_bytes = 0  # CPU tensor storages alive
        self.nodes: int | None = None  # live autograd nodes (None: the count was capped)


class _Kept:
    """A container that grew at every scan: its lengths then, its newest entries (keys and values), their
    mean size, and where tracemalloc says they were made (a program that traces on its own)."""

    __slots__ = ("cid", "container", "inside", "items", "keys", "lens", "site", "size")

    def __init__(
        self, container: Any, entries: list[tuple[Any, Any]], lens: tuple[int, ...], site: str | None
    ) -> None:
        self.cid, self.container, self.lens, self.site = id(container), container, lens, site
        self.keys = [k for k, _ in entries]
        self.items = [v for _, v in entries]
        sizes = [measure(o) for o in self.items]
        self.size = sum(b for b, _ in sizes) / len(sizes) if sizes else 0.0
        inside: collections.Counter[str] = collections.Counter()
        for _, counts in sizes:
            inside.update(counts)
        self.inside = {k: v / len(sizes) for k, v in inside.most_common(3)}  # per entry


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
        scan_budget: Seconds one scan may spend walking autograd graphs.
        holder_time_limit: Seconds the holder search may take (once, when culprits are named).
        scan_gap: Steps between two scans of a sequence.
        max_stride: The most steps between two readings of each figure (``None``: as the readings' cost
            demands, so that they take ``share`` of the run at most). ``1`` reads both figures at every step.
        share: The largest share of a step the readings may take (0.5 %).
        ramp: The strides at most double every 16 readings, from 1 (a short run of fast steps gets readings
            enough for a verdict); ``False``: the budget's stride from the first choice (``torchmem run`` on
            the CPU, where the device watcher reads the same heap at every step).
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
        self._node_interval = float(node_interval)
        self._node_overhead = float(node_overhead)
        self._scan_budget = float(scan_budget)
        self._holder_time = float(holder_time_limit)
        self._gap = scan_gap
        self._max_stride = max_stride
        self._running = False
        self._started = False
        self._thread: int | None = None
        self._read: Any = None
        self._secondary = False
        # What readings cost: the figure's reads (timed every 4th), the RSS's (at the start), all included.
        self._figure_costs: collections.deque[float] = collections.deque(maxlen=16)
        self._figure_reads = 0
        self._rss_cost = 0.0
        self._heap_every = 1  # with the heap as the figure, it is read every m-th reading
        self._first_post = self.warmup + 1  # the first reading after the warm-up (stride 1 until then)
        self._spent = 0.0
        self._spent_n = 0
        self._work_seconds = 0.0  # time in scans and node counts
        # readings
        self._stride = 1
        self._share = float(share)  # the readings' share of a step (torchmem run: less)
        self._ramp = bool(ramp)
        self._stride_why = (0.0, 0.0)  # (step time, reading cost) the stride was chosen from
        self._nreads = 0
        self._last_t: float | None = None
        self._last_n = 0
        self._step_times: collections.deque[float] = collections.deque(maxlen=16)
        # The series for the report, as parallel lists of ints (no per-step object for gc to track).
        self._series = _Series()
        self._rss_series = _Series()
        self._ps: collections.deque[int] = collections.deque(maxlen=_WINDOW)
        self._run_first: tuple[int, int] | None = None  # the first reading after the warm-up (step, bytes)
        self._pv: collections.deque[int] = collections.deque(maxlen=_WINDOW)
        self._rs: collections.deque[int] = collections.deque(maxlen=_WINDOW)
        self._rv: collections.deque[int] = collections.deque(maxlen=_WINDOW)
        self._growth = Growth(False, 0.0, 0.0, "none", 0, "no steps yet")
        self._rss_growth = Growth(False, 0.0, 0.0, "none", 0, "no steps yet")
        # Python's allocated small-object blocks (``sys.getallocatedblocks()``), read with the occasional part
        # of a reading: growth of the RSS alone is Python's only when these grow too.
        self._blocks: collections.deque[tuple[int, int]] = collections.deque(maxlen=_WINDOW)
        self._rss_unexplained = 0.0  # RSS growth per step that no allocator's in-use figure shows
        self._detected_at: int | None = None
        self._since: int | None = None  # the reading since which growth is seen without a break
        self._foreign = False  # a step came from another thread (scans run on the watch's own thread only)
        self._stopped_at: int | None = None
        # scans
        self._due: int | None = None
        self._scans: list[_Scan] = []
        self._window: _SiteWindow | None = None
        self._attempts = 0
        self._quiet_until = 0
        self._quiet_t = 0.0
        self._found_on: set[str] = set()  # the growth the culprits were found on
        self._scanning_for: set[str] = set()
        self._scan_seconds = 0.0
        self._scan_steps: list[int] = []
        # What torchmem's own work left on the C heap: subtracted from the readings.
        self._offset = 0
        self._excluded_primary = 0
        self._chain_facts: tuple[ChainFact, ...] = ()
        self._object_facts: tuple[ObjectFact, ...] = ()
        self._facts_at: int | None = None
        self._tracing = ""  # "ours": torchmem started tracemalloc; "theirs": the program did
        self._tm_mark = 0
        # The growing types of the last scans: (step, instances then, growth per step), by type name.
        self._grew: tuple[int, dict[str, int], dict[str, float]] | None = None
        self._recount: tuple[int, dict[str, float]] | None = None
        # autograd node counts
        self._nodes: list[tuple[int, int]] = []
        self._nodes_capped = False
        self._next_node_t = 0.0
        self._node_wait = self._node_interval
        # Host growth of other kinds (one scan sequence's facts): the process's state at each scan, the
        # lines that keep what they allocate (tracemalloc, on from the first scan to the third), Python
        # objects found through the containers that keep them, and what the growth is made of.
        self._own_history = bool(own_history)
        self._states: list[ProcessState] = []
        self._lines0: dict[str, tuple[int, int]] = {}  # at the start of tracing (a program that traces)
        self._lines1: tuple[int, dict[str, tuple[int, int]]] | None = None  # at the first step traced
        self._line_window = False  # tracing from the first scan to the second, to find growing lines
        self._line_facts: tuple[LineGrowth, ...] = ()
        self._state_facts: tuple[ProcessState, StateEvidence, HostAccount] | None = None
        self._shapes: ShapeWindow | None = None
        self._traced_from: tuple[int, float, float] | None = None  # step, time, step time before
        self._trace_notes: list[tuple[float, list[tuple[int, int, float]]]] = []  # step time before, windows
        self._traced: tuple[float, float] | None = None  # Python allocations kept per step (all, in the heap)
        self._types_counted = 0
        self._containers_seen = 0
        self._account = HostAccount(heap=0.0)
        self._stale_modes: list[Any] = []  # torchmem's function modes left on the stack, inactive
        self._own_ids: set[int] = set()  # torchmem's objects at the second scan
        # The containers found growing: id -> (their entries' type, length then, entries per step)
        self._kept_lens: dict[int, tuple[str, int, float]] = {}
        self._checked: tuple[ProcessState, HostAccount] | None = None  # the last sequence's, for the notes
        self._state_notes: tuple[str, ...] = ()
        # notes and errors
        self._notes: list[str] = []
        self._errors: set[str] = set()

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
                self._notes.append("the C heap cannot be read here (no glibc mallinfo2): the RSS is watched")
            self.source, self._read, self._secondary = "rss", process_rss, False
        self._figure_costs.append(_cost(self._read))
        self._rss_cost = _cost(process_rss) if self._secondary else 0.0
        now = time.perf_counter()
        # The first count comes late (its cost is not known yet): 5 x node_interval, 10 s by default.
        self._next_node_t = now + 5 * self._node_interval
        self._running = True
        return self

    def stop(self) -> None:
        """End the watch (idempotent): a window still open is closed. The report stays readable."""
        if not self._running:
            return
        self._running = False
        try:
            self._close_window()
            if self._stale_modes and threading.get_ident() == self._thread:
                self._pop_stale_modes()
            if self._shapes is not None:
                self._close_shapes()
            self._stop_tracing()
            if self._secondary:
                self._read_blocks(self.steps)
            if threading.get_ident() == self._thread and self.steps > self.warmup:
                self._sample_nodes(self.steps)  # the count at the end, for the report
        except Exception as exc:
            self._report_error("stop", exc)

    @property
    def leaking(self) -> bool:
        """Whether the host figure grows steadily as of the last verdict."""
        return self._growth.leaking or self._rss_growth.leaking

    @property
    def instrumenting(self) -> bool:
        """Whether a site window (a function mode that sees every op) is on now."""
        w = self._window
        return w is not None and w.active

    @property
    def autograd_nodes(self) -> tuple[tuple[int, int], ...]:
        """The sampled counts of live autograd nodes (reachable from live tensors), as ``(step, nodes)``."""
        return tuple(self._nodes)

    # -- the per-step work ---------------------------------------------------------------------------
    def step(self) -> None:
        """Mark the end of one step: one reading (every ``stride`` steps). Never raises."""
        if not self._running:
            return
        n = self.steps = self.steps + 1
        if self._due is None and n % self._stride:
            return
        t0 = time.perf_counter()
        work = self._work_seconds
        try:
            self._step(n)
        except Exception as exc:  # never break the user's loop
            self._report_error("step", exc)
        # What readings cost, all included but the scans and node counts (they keep to their own budgets).
        self._spent += time.perf_counter() - t0 - (self._work_seconds - work)
        self._spent_n += 1

    def _step(self, n: int) -> None:
        shapes = self._shapes
        if shapes is not None:
            shapes.mark()
        if self._stale_modes and threading.get_ident() == self._thread:
            self._pop_stale_modes()
        if self._line_window and self._lines1 is None and n < (self._due or 0):
            self._mid_snapshot(n)
        if self._due is not None and n >= self._due and threading.get_ident() == self._thread:
            self._scan(n)
        if n % self._stride:
            return
        if self._tracing == "ours" or self._window is not None or self._shapes is not None:
            # torchmem's tracing or function mode is on: the figures and the step's time are not the
            # program's (tracemalloc's tables grow with every allocation): this step is not read.
            self._last_t = None
            return
        if not self._foreign and threading.get_ident() != self._thread:
            self._foreign = True
        self._nreads = k = self._nreads + 1
        warm = n <= self.warmup
        rising = False
        if self._secondary:
            rss = process_rss()
            if rss is not None:
                self._rss_series.add(n, rss)
                if not warm:
                    rs, rv = self._rs, self._rv
                    rs.append(n)
                    rv.append(rss)
                    rising = (
                        len(rv) > 2
                        and rss > rv[-2] > rv[-3]
                        and rss - rv[-3] >= self.min_bytes_per_step * (n - rs[-3])
                    )
            read_figure = warm or k % self._heap_every == 0
        else:
            read_figure = True
        if read_figure:
            # mallinfo2 walks the heap's free chunks: its cost depends on the program; timed now and then.
            self._figure_reads = m = self._figure_reads + 1
            t0 = time.perf_counter() if m % 4 == 0 else 0.0
            v = self._read()
            if t0:
                self._figure_costs.append(time.perf_counter() - t0)
            if v is None:
                self._report_error("reading", RuntimeError(f"the {self.source} figure could not be read"))
                return
            v -= self._offset
            self._series.add(n, v)
            if not warm:
                ps, pv = self._ps, self._pv
                ps.append(n)
                pv.append(v)
                if self._run_first is None:
                    self._run_first = (n, v)
                rising = rising or (
                    len(pv) > 2
                    and v > pv[-2] > pv[-3]
                    and v - pv[-3] >= self.min_bytes_per_step * (n - ps[-3])
                )
        if warm:
            self._time(n, time.perf_counter())
            return
        if rising or k % _EVAL_EVERY == 0 or k == self._first_post:
            self._slow(n, k)

    def _slow(self, n: int, k: int) -> None:
        """The occasional part of a reading (every 16 readings, or when the figure rises): timing, verdicts,
        node counts, scans."""
        now = time.perf_counter()
        self._time(n, now)
        if k % _EVAL_EVERY == 0 or k == self._first_post:
            self._choose_stride()
        # Every 16 readings the full test; on a rising reading in between only the steady one (the last
        # readings: the robust test's Theil-Sen slope costs ~0.1 ms), which may find growth but never
        # withdraws a verdict.
        full = k % _EVAL_EVERY == 0 or k == self._first_post
        if self._secondary:
            # Python's allocated blocks (sys.getallocatedblocks walks every arena: ~0.5 ms on a framework's
            # heap) are read with the full test, and when the RSS grows: what tells Python's growth apart.
            g = self._judge(self._rs, self._rv, full) if len(self._rv) > 1 else None
            if full or (g is not None and g.leaking):
                self._read_blocks(n)
            if g is not None and (full or g.leaking):
                self._rss_growth = self._python_growth(g)
        self._evaluate(n, full)
        if threading.get_ident() != self._thread:
            return
        if now >= self._next_node_t:
            self._sample_nodes(n)
        if (
            self._due is None
            and self._attempts < _MAX_ATTEMPTS
            and n >= self._quiet_until
            and now >= self._quiet_t
        ):
            # Growth of a kind the last culprits were not found on (the heap after the RSS...) is scanned
            # again, at most at twice the step of the last scans.
            # Growth must last a while first (10 steps, 2 readings or more): a warm-up that grows for a few
            # steps is not worth a scan.
            lasting = (
                self._since is not None
                and self._nreads - self._since >= 2
                and (self._nreads - self._since) * self._stride >= 10
            )
            triggers = self._triggers() if lasting or self._nodes_rising() else set()
            new = triggers - self._found_on
            if new and (self._facts_at is None or n >= 2 * self._facts_at):
                self._scanning_for = triggers
                self._scan(n)

    def _read_blocks(self, n: int) -> None:
        if n <= self.warmup or (self._blocks and self._blocks[-1][0] == n):
            return
        self._blocks.append((n, sys.getallocatedblocks()))

    def _blocks_per_step(self) -> float | None:
        """How many of Python's small-object blocks were added per step since the first reading after the
        warm-up (least squares over the readings kept); ``None`` with fewer than two readings."""
        pts = list(self._blocks)
        if len(pts) < 2 or pts[-1][0] == pts[0][0]:
            return None
        mx = sum(x for x, _ in pts) / len(pts)
        my = sum(y for _, y in pts) / len(pts)
        den = sum((x - mx) ** 2 for x, _ in pts)
        return sum((x - mx) * (y - my) for x, y in pts) / den if den else None

    def _python_growth(self, g: Growth) -> Growth:
        """RSS growth with a flat C heap counts as a leak only when Python's allocated blocks grow enough
        to make it (a small block is 512 B at most; twice that for pools and arenas). Otherwise the RSS
        grows by memory no allocator holds: pages of memory freed earlier touched again, or a library's own
        mappings. That is not claimed as a leak; it is said in a note."""
        if not g.leaking:
            return g
        per_block = self._blocks_per_step()
        if per_block is None or per_block * _BYTES_PER_BLOCK >= g.bytes_per_step:
            self._rss_unexplained = 0.0
            return g
        self._rss_unexplained = g.bytes_per_step
        return Growth(
            False,
            0.0,
            g.confidence,
            g.method,
            g.samples,
            g.reason,
            "below_threshold",
            g.trend_per_step,
            g.min_bytes_per_step,
        )

    def _time(self, n: int, now: float) -> None:
        if self._last_t is not None and n > self._last_n:
            self._step_times.append((now - self._last_t) / (n - self._last_n))
        self._last_t, self._last_n = now, n

    def _judge(self, xs: Sequence[int], ys: Sequence[int], full: bool = True) -> Growth:
        tail = 0 if full else -_QUICK
        return detect_growth(
            list(xs)[tail:], list(ys)[tail:], min_bytes_per_step=self.min_bytes_per_step, explain=False
        )

    def _evaluate(self, n: int, full: bool = True) -> None:
        g = self._judge(self._ps, self._pv, full)
        if not full and not g.leaking:
            return  # the steady test alone: it finds growth, the full test withdraws it
        self._growth = g
        if g.leaking or self._rss_growth.leaking:
            if self._detected_at is None:
                self._detected_at = n
            if self._since is None:
                self._since = self._nreads
            self._stopped_at = None
            return
        self._since = None
        if self._detected_at is not None and self._stopped_at is None:
            self._stopped_at = n

    def _triggers(self) -> set[str]:
        """Which figures show growth now: ``"heap"``/``"rss"`` (the detector), ``"nodes"`` (live autograd
        nodes rising)."""
        out = set()
        if self._growth.leaking:
            out.add(self.source)
        if self._rss_growth.leaking:
            out.add("rss")
        if self._nodes_rising():
            out.add("nodes")
        return out

    def _nodes_rising(self) -> bool:
        rate = node_trend(self._nodes)
        return rate is not None and rate >= 0.5

    def _choose_stride(self) -> None:
        """Read every step, or every k-th step, so that readings take 0.5 % of the run at most: with the heap
        as the figure, half for the RSS (read at each reading) and the Python around it, half for the heap
        (read every m-th reading: mallinfo2's cost varies with the heap, from 0.5 µs to hundreds)."""
        if not self._step_times:
            return
        step_time = sorted(self._step_times)[len(self._step_times) // 2]
        if step_time <= 0:
            return
        figure = sorted(self._figure_costs)[len(self._figure_costs) // 2]
        every = self._heap_every if self._secondary else 1
        # All a reading costs (measured since the last choice), the figure's share aside.
        if self._spent_n >= 3:
            rest = max(0.0, self._spent / self._spent_n - figure / every)
        else:
            rest = self._rss_cost + _READ_OVERHEAD if self._secondary else _READ_OVERHEAD
        self._spent, self._spent_n = 0.0, 0
        cap = self._max_stride or _MAX_STRIDE
        share = self._share
        # The strides at most double at each choice (every 16 readings): a short run of fast steps still
        # gets readings enough for a verdict (30 steps: ~16 readings), and the readings' cost, a few ms in
        # all before the strides reach the budget's, stays the same share of a long run.
        old_k, old_heap = self._stride, self._stride * self._heap_every
        if not self._ramp:
            old_k = old_heap = cap
        if self._secondary:
            k = min(cap, max(1, math.ceil(rest / (share / 2 * step_time))))
            m = max(1, math.ceil(figure / (share / 2 * step_time * k)))
            heap = k * min(m, _MAX_HEAP_EVERY, max(1, cap // k))  # steps between two heap readings
            k = min(k, 2 * old_k)
            self._heap_every = max(1, min(heap, 2 * old_heap) // k)
        else:
            k = min(cap, max(1, math.ceil((rest + figure) / (share * step_time))), 2 * old_k)
        self._stride = k
        self._stride_why = (step_time, rest + figure / (self._heap_every if self._secondary else 1))

    def _report_error(self, where: str, exc: BaseException) -> None:
        if where in self._errors:
            return
        self._errors.add(where)
        note = (
            f"internal error in the host watcher's {where} ({type(exc).__name__}: {exc}); the program went on"
        )
        self._notes.append(note)
        _log.warning("torchmem: %s", note)

    # -- live autograd nodes --------------------------------------------------------------------------
    def _sample_nodes(self, n: int) -> None:
        t0 = time.perf_counter()
        try:
            with self._own_work():
                tensors = _tensors(gc.get_objects())
                count, capped = _count_nodes(tensors, budget=max(0.01, self._scan_budget / 4))
                tensors.clear()
        except Exception as exc:
            self._report_error("autograd node count", exc)
            self._next_node_t = float("inf")
            return
        cost = time.perf_counter() - t0
        self._work_seconds += cost
        self._add_nodes(n, count, capped)
        # Spaced so that counting stays under its share of the run.
        self._node_wait = max(self._node_interval, cost / self._node_overhead)
        self._next_node_t = time.perf_counter() + self._node_wait

    def _add_nodes(self, n: int, count: int, capped: bool) -> None:
        if self._nodes and self._nodes[-1][0] == n:
            return
        self._nodes_capped = self._nodes_capped or capped
        self._nodes.append((n, count))
        if len(self._nodes) > 512:
            self._nodes = self._nodes[::2]

    # -- scans ---------------------------------------------------------------------------------------
    def _scan(self, n: int) -> None:
        t0 = time.perf_counter()
        try:
            with self._own_work():
                try:
                    self._scan_now(n)
                except Exception as exc:
                    self._report_error("scan", exc)
                    self._end_sequence(n, found=False)
        finally:
            self._scan_seconds += time.perf_counter() - t0
            self._work_seconds += time.perf_counter() - t0
            self._scan_steps.append(n)

    def _scan_now(self, n: int) -> None:
        phase = len(self._scans)
        scan = _Scan(n)
        prev = self._scans[-1] if self._scans else None
        # Where the program allocated what is still alive since tracing started (before this scan allocates),
        # then tracing stops: the scan runs untraced (tracing makes every allocation slow).
        lines = None
        self._trace_cost(n)
        if phase == 1 and self._line_window:
            lines = self._snapshot_lines()
            self._stop_tracing()
        self._states.append(read_state())
        t0 = time.perf_counter()
        objs = gc.get_objects()
        tensors: list[torch.Tensor] = []
        samples: dict[str, list[Any]] = {}
        created: dict[str, str | None] = {}
        kept: list[_Kept] = []
        profilers: list[Any] = []
        try:
            if phase == 2:
                # New instances of the types that grew, and where they were made, while tracing is on (the
                # ids of torchmem's objects from the second scan: working them out again would be traced); the
                # rest of the scan runs without tracing.
                second = self._scans[1]
                if second.ids:
                    samples = _new_instances(objs, second.ids, second.ids, self._own_ids)
                    created = self._creation_sites(samples)
                self._stop_tracing()
                self._own_ids = set()
            own = _own_objects(self)
            if phase == 2:
                # The newest entries of the containers that grew at every scan, the running profilers.
                scan.lens, found = still_growing(objs, second.lens)
                kept = self._kept_items(found, scan.lens, n - self._scans[0].step)
                if self._states[-1].profiler:
                    profilers = running_profilers(objs)
            counts = _count_types(objs)
            tensors = _tensors(objs, counts)
            scan.cpu_bytes = cpu_storage_bytes(tensors)
            nodes, capped = _count_nodes(tensors, budget=max(0.01, self._scan_budget / 4))
            self._add_nodes(n, nodes, capped)
            scan.nodes = None if capped else nodes
            for o in own:
                t = type(o)
                if t in counts:
                    counts[t] -= 1
            named: dict[str, int] = {}
            for t, c in counts.items():
                if _is_node_type(t):  # autograd nodes' wrappers: chains are judged by their graphs
                    continue
                k = _type_name(t)
                named[k] = named.get(k, 0) + c
            scan.counts = named
            self._types_counted = len(named)
            heads, scan.heads, scan.watermark = _heads(tensors, prev, self._scan_budget)
            if prev is not None:
                scan.chains = chain_growth(heads, n - prev.step)
            if phase == 1:
                # Types and containers that grew since the first scan: remember which instances exist now.
                scan.lens, _ = still_growing(objs, prev.lens if prev is not None else {})
                grew = type_growth([self._scans[0].counts, named], [self._scans[0].step, n])
                top = sorted(grew, key=lambda k: -grew[k])[: 2 * _MAX_TYPES]
                if top:
                    scan.ids = _ids_of(objs, {k: grew[k] for k in top}, own)
                if scan.chains:
                    self._open_window()
            elif phase == 0 and time.perf_counter() - t0 > self._scan_budget * 5:
                # A heap this big would stall the program at each scan: say so, and stop here.
                self._attempts = _MAX_ATTEMPTS
                self._notes.append(
                    f"the heap holds {len(objs):,} objects: one scan took "
                    f"{time.perf_counter() - t0:.1f} s, so what grows is not named"
                )
                self._end_sequence(n, found=False)
                return
            elif phase == 0:
                scan.lens = {k: (v,) for k, v in container_lengths(objs, own).items()}
                self._containers_seen = len(scan.lens)
        finally:
            del objs
        if phase == 0:
            self._begin_tracing(n, lines=True)
        elif phase == 1:
            self._line_growth(self._scans[0], scan, lines)
        if phase < 2:
            self._scans.append(scan)
            self._due = n + self._gap
            if phase == 1:
                self._watch_shapes()
                if scan.ids:
                    # torchmem's objects now (the next scan runs traced until it has sampled), then trace
                    # where the new instances are made
                    self._own_ids = {id(o) for o in _own_objects(self)}
                    self._begin_tracing(n, lines=False)
            return
        # Third scan: confirm, sample, name.
        first, second = self._scans
        confirmed = confirmed_chains(second.chains, scan.chains)
        grew = type_growth([first.counts, second.counts, named], [first.step, second.step, n])
        top = sorted((k for k in grew if k in samples), key=lambda k: -grew[k])[:_MAX_TYPES]
        grew = {k: grew[k] for k in top}
        self._grew = (n, {k: named.get(k, 0) for k in grew}, dict(grew))
        for k in list(samples):
            if k not in grew:
                del samples[k]
        self._account_scans(first, second, scan)
        graphs: list[Any] = []
        if self._states[-1].anomaly:
            # Tensors whose graphs were made since the second scan and are still alive (not a chain: a graph
            # of its own): who keeps them keeps the anomaly stacks.
            fresh = [h for h in heads if second.watermark < h.seq < _NO_SEQ and not h.reached]
            fresh.sort(key=lambda h: -h.new_nodes)
            graphs = [tensors[h.index] for h in fresh[: 2 * _SAMPLES_PER_TYPE]]
        window = self._window
        self._close_window()
        evidence = self._close_shapes()
        chain_tensors = [tensors[g.index] for g in confirmed]
        tensors.clear()
        self._name_culprits(
            n, confirmed, chain_tensors, grew, samples, created, window, kept, profilers, graphs, evidence
        )

    def _watch_shapes(self) -> None:
        """After the first scan, where ``cudnn.benchmark`` is on in a CUDA process: watch the convolutions'
        shapes until the third."""
        if not (self._states and self._states[-1].cudnn_benchmark) or _compiled_program():
            return
        shapes = ShapeWindow()
        try:
            if shapes.open():
                self._shapes = shapes
        except Exception as exc:
            self._report_error("shape window", exc)

    def _begin_tracing(self, n: int, *, lines: bool) -> None:
        """Trace Python allocations (tracemalloc) until the next scan: after the first scan to find the lines
        that keep what they make (``lines``: a snapshot at the next step boundary and one at the second scan
        tell them from those whose objects are freed), after the second to learn where the new instances of
        growing types are made. The scans themselves run untraced."""
        step_time = sorted(self._step_times)[len(self._step_times) // 2] if self._step_times else 0.0
        self._start_tracing()
        if self._tracing:
            if lines or not self._trace_notes:
                self._trace_notes.append((step_time, []))
                del self._trace_notes[:-2]
            self._line_window = lines
            self._lines0 = (self._snapshot_lines() or {}) if lines and self._tracing == "theirs" else {}
            self._traced_from = (n, time.perf_counter(), step_time)

    def _mid_snapshot(self, n: int) -> None:
        """The first step boundary while tracing for lines: what the traced lines keep after one step."""
        t0 = time.perf_counter()
        try:
            with self._own_work():
                lines = self._snapshot_lines()
                if lines is not None:
                    self._lines1 = (n, lines)
        finally:
            self._work_seconds += time.perf_counter() - t0

    def _close_shapes(self) -> tuple[int, int, int] | None:
        shapes, self._shapes = self._shapes, None
        if shapes is None:
            return None
        shapes.close()
        if shapes.error is not None:
            self._report_error("shape window", shapes.error)
        return shapes.result()

    def _trace_cost(self, n: int) -> None:
        """The time of the steps traced since ``_begin_tracing`` (with torchmem's own work in them)."""
        if self._traced_from is None or self._tracing != "ours":
            return
        n0, t0, _ = self._traced_from
        self._traced_from = None
        if n > n0 and self._trace_notes:
            self._trace_notes[-1][1].append((n0 + 1, n, (time.perf_counter() - t0) / (n - n0)))

    def _snapshot_lines(self) -> dict[str, tuple[int, int]] | None:
        try:
            return traced_lines(tracemalloc.take_snapshot())
        except Exception as exc:
            self._report_error("tracemalloc snapshot", exc)
            return None

    def _line_growth(self, first: _Scan, second: _Scan, lines: dict[str, tuple[int, int]] | None) -> None:
        """The lines that keep what they make, from the snapshots of the first window (first scan -> second),
        and the Python allocations kept per step."""
        mid, self._lines1 = self._lines1, None
        base, self._lines0 = self._lines0, {}
        self._line_window = False
        self._line_facts, self._traced = (), None
        if lines is None or mid is None or not first.step < mid[0] < second.step:
            return
        a, b = minus(mid[1], base), minus(lines, base)
        gap = second.step - mid[0]
        self._line_facts = tuple(
            growing_lines(
                {k: v[0] for k, v in a.items()},
                {k: v[0] for k, v in b.items()},
                mid[0] - first.step,
                gap,
                min_bytes_per_step=min(1024.0, self.min_bytes_per_step),
            )
        )
        traced = max(0.0, sum(v[0] for v in b.values()) - sum(v[0] for v in a.values())) / gap
        traced_heap = max(0.0, sum(v[1] for v in b.values()) - sum(v[1] for v in a.values())) / gap
        self._traced = (traced, traced_heap)

    def _account_scans(self, first: _Scan, second: _Scan, third: _Scan) -> None:
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
        traced, traced_heap = self._traced if self._traced is not None else (None, 0.0)
        self._account = HostAccount(
            heap=self._heap_rate(),
            traced=traced,
            traced_heap=traced_heap,
            tensors=tensors,
            nodes_per_step=nodes,
        )

    def _kept_items(self, found: dict[int, Any], lens: dict[int, tuple[int, ...]], steps: int) -> list[_Kept]:
        """The containers that grew at every scan and keep at least 256 B per step (a few, most bytes per step
        first), with their newest entries (numpy arrays, strings, lists, dicts, ...; tensors are the device
        report's): instance counts per type cannot see untracked objects, and mix a type's new instances
        of every holder."""
        rows: list[_Kept] = []
        for i, ls in lens.items():
            if len(ls) < 3 or not ls[2] > ls[1] > ls[0]:
                continue
            c = found[i]
            entries = kept_entries(newest(c, min(ls[-1] - ls[1], _SAMPLES_PER_TYPE)))
            if not entries:
                continue
            exact = [o for _, o in entries if type(o).__module__ != "builtins"]
            sites = collections.Counter(s for s in map(creation_line, exact) if s)
            row = _Kept(c, entries, ls, sites.most_common(1)[0][0] if sites else None)
            if row.size * (ls[-1] - ls[0]) / max(1, steps) >= 256:
                rows.append(row)
        rows.sort(key=lambda r: -r.size * (r.lens[-1] - r.lens[0]))
        return rows[:_MAX_TYPES]

    def _name_culprits(
        self,
        n: int,
        confirmed: list[ChainGrowth],
        chain_tensors: list[torch.Tensor],
        grew: dict[str, float],
        samples: dict[str, list[Any]],
        created: dict[str, str | None],
        window: _SiteWindow | None,
        kept: list[_Kept],
        profilers: list[Any],
        graphs: list[Any],
        new_shapes: tuple[int, int, int] | None,
    ) -> None:
        sample_types = list(samples)
        per_type = [len(samples[k]) for k in sample_types]
        # One holder search for all: the chains' tensors, the new instances of each growing type, the newest
        # entries of each growing container, the running profilers, the tensors whose graphs stay alive.
        flat: list[Any] = list(chain_tensors)
        for k in sample_types:
            flat.extend(samples[k])
        flat.extend(row.container for row in kept)
        flat.extend(profilers)
        flat.extend(graphs)
        paths: list[tuple[HolderPath, ...]] = []
        if flat:
            search = find_holders(
                flat,
                max_paths=3,
                time_limit=self._holder_time,
                exclude=[flat, chain_tensors, samples, *samples.values(), kept, profilers, graphs],
            )
            paths = list(search.paths)
            if search.truncated and not any(paths):
                self._notes.append(
                    f"the holder search stopped ({search.reason}) after {search.seconds:.1f} s: holders "
                    "are not named"
                )
        sizes = {k: [_mean_size([o]) for o in v] for k, v in samples.items()}
        is_tensor = {k: bool(v) and isinstance(v[0], torch.Tensor) for k, v in samples.items()}
        chain_facts = []
        for i, g in enumerate(confirmed):
            site = window.site_of((g.seq, *g.new_seqs)) if window is not None else None
            chain_facts.append(
                ChainFact(g.nodes_per_step, g.node_names, paths[i] if i < len(paths) else (), _site(site))
            )
        object_facts = []
        j = len(confirmed)

        def each(count: int) -> list[tuple[HolderPath, ...]]:
            nonlocal j
            out = [tuple(p for p in group if not _through_torchmem(p)) for group in paths[j : j + count]]
            j += count
            return out + [()] * (count - len(out))

        def take(count: int) -> tuple[HolderPath, ...]:
            return tuple(p for group in each(count) for p in group)

        for k, count in zip(sample_types, per_type):
            ps, size = _majority(each(count), sizes[k])
            where = created.get(k) or closest_line(self._line_facts, grew[k] * size)
            object_facts.append(ObjectFact(_short(k), grew[k], size, ps, is_tensor[k], where))
        first, third = self._scans[0].step if self._scans else n, n
        self._kept_lens = {}
        held: list[ObjectFact] = []
        for row, found in zip(kept, each(len(kept))):
            per_step = (row.lens[-1] - row.lens[0]) / max(1, third - first)
            where = row.site or closest_line(self._line_facts, per_step * row.size)
            label = type_label(row.items)
            entry_paths = tuple(_entry_path(p, row.container, row.keys[-1]) for p in found)
            held.append(ObjectFact(label, per_step, row.size, entry_paths, False, where))
            # what each entry holds: named in the fix (their bytes are in the entry's size)
            held += [ObjectFact(k, per_step * c, 0.0, entry_paths) for k, c in row.inside.items()]
            self._kept_lens[row.cid] = (label, row.lens[-1], per_step)
        # A container found growing names its entries exactly, with what they hold: the new instances of any
        # type held by the same variable (sampled among every new instance of the type) are left out.
        names = {holder_name(f.paths[0]) for f in held if f.paths}
        object_facts = [f for f in object_facts if not (f.paths and holder_name(f.paths[0]) in names)]
        object_facts += held
        evidence = StateEvidence(
            profilers=take(len(profilers)),
            graph_paths=_majority(each(len(graphs)), [0.0] * len(graphs))[0],
            new_shapes=new_shapes,
            history_by_torchmem=self._own_history,
        )
        flat.clear()
        chain_tensors.clear()
        samples.clear()
        kept.clear()
        profilers.clear()
        graphs.clear()
        if window is not None:
            if window.error is not None:
                self._report_error("site window", window.error)
            self._release_window(window)
        self._state_facts = (state_through(self._states), evidence, self._account)
        self._chain_facts, self._object_facts, self._facts_at = tuple(chain_facts), tuple(object_facts), n
        culprits = self._culprits_now()
        self._end_sequence(n, found=bool(culprits))
        if not culprits:
            self._chain_facts, self._object_facts, self._facts_at = (), (), None
            self._line_facts, self._kept_lens = (), {}

    def _culprits_now(self) -> tuple[Culprit, ...]:
        """The culprits from the last scans' facts, with the figures' growth now."""
        if self._facts_at is None:
            return ()
        steps = max(0, self.steps - self.warmup)
        heap = self._heap_rate()
        culprits: list[Culprit] = []
        chains: tuple[Culprit, ...] = ()
        if self._chain_facts:
            rate, estimated = heap, False
            nodes = sum(f.nodes_per_step for f in self._chain_facts)
            if rate <= 0 or self.source != "heap":
                rate, estimated = nodes * _NODE_BYTES, True
            chains = chain_culprits(self._chain_facts, bytes_per_step=rate, steps=steps, estimated=estimated)
            culprits += chains
        floor = max(256.0, 0.02 * max(heap, self._rss_series.rate()))  # 2 %: the RSS moves with the scans
        objects: tuple[Culprit, ...] = ()
        if self._object_facts:
            objects = object_culprits(self._object_facts, min_bytes_per_step=floor, steps=steps)
            culprits += objects
        self._state_notes = ()
        if self._state_facts is not None:
            state, evidence, account = self._state_facts
            account = dataclasses.replace(
                account,
                heap=heap if heap > 0 else account.heap,  # the figure's growth now, as for the chains
                python_named=sum(c.bytes_per_step for c in objects),
                native_named=sum(c.bytes_per_step for c in chains),
            )
            states, self._state_notes = state_culprits(
                state, account, evidence, min_bytes_per_step=self.min_bytes_per_step, steps=steps
            )
            culprits += states
            if not any(c.kind == ANOMALY for c in states):  # else the lines are where the stacks were made
                named = [s for c in culprits for s, _ in c.sites] + [c.site for c in culprits if c.site]
                culprits += line_culprits(
                    self._line_facts, named, min_bytes_per_step=max(1024.0, 0.1 * account.growth)
                )
        culprits.sort(key=lambda c: -c.bytes_per_step)
        return tuple(culprits)

    def _release_window(self, window: _SiteWindow) -> None:
        """Free what a site window recorded, leaving it out of the figures' offsets (it grew during the
        program's steps, where the offsets did not see it)."""
        h0 = self._figures()
        window.by_seq.clear()
        window.index.clear()
        window.sites.clear()
        self._exclude(h0)

    def _figures(self) -> int | None:
        """The C heap now, raw (``None`` where it is not the figure or cannot be read). Only the heap gets
        offsets: the RSS keeps what torchmem's work touched and gives it back when it likes (the program
        reuses it first), so after a scan the RSS is judged afresh instead."""
        if self.source != "heap":
            return None
        try:
            return int(self._read())
        except Exception:  # reported by the reading itself
            return None

    @contextlib.contextmanager
    def _own_work(self) -> Iterator[None]:
        """torchmem's own work inside a step: what it leaves on the heap (and in the RSS) is not the
        program's, so it is subtracted from later readings."""
        h0 = self._figures()
        self._excluded_primary = 0
        self._tm_mark = _traces_memory()
        try:
            yield
        finally:
            self._exclude_traces()
            h1 = self._figures()
            if h0 is not None and h1 is not None:
                self._offset += h1 - h0 - self._excluded_primary

    def _heap_rate(self) -> float:
        """The host figure's growth per step now (also below the threshold), 0 when it is not growing."""
        if len(self._pv) < 2:
            return 0.0
        g = detect_growth(list(self._ps), list(self._pv), min_bytes_per_step=self.min_bytes_per_step)
        return max(g.bytes_per_step, g.trend_per_step, 0.0)

    def _end_sequence(self, n: int, *, found: bool) -> None:
        self._scans = []
        self._due = None
        self._close_window()
        if self._shapes is not None:
            self._close_shapes()
        self._stop_tracing()
        if self._state_facts is not None:
            self._checked = (self._state_facts[0], self._account)
        self._states = []
        self._lines0, self._lines1, self._traced_from, self._line_window = {}, None, None, False
        # The scans' memory stays resident after it is freed, and the program reuses it before the RSS grows
        # again: the RSS is judged afresh from here.
        self._rs.clear()
        self._rv.clear()
        if self.source == "rss":
            self._ps.clear()
            self._pv.clear()
        if found:
            self._found_on |= self._scanning_for
            return
        # Nothing found: wait longer before the next try, and as long again as the scans took, x200.
        self._attempts += 1
        self._quiet_until = n + 64 * 2**self._attempts
        self._quiet_t = time.perf_counter() + 200 * self._scan_seconds

    def _start_tracing(self) -> None:
        """Trace Python allocations until the next scan, to learn where new objects are created (unless the
        program traces them itself: then its traces are read)."""
        if self._tracing:
            return
        if tracemalloc.is_tracing():
            self._tracing = "theirs"
            return
        h0 = self._figures()
        tracemalloc.start(16)
        self._tracing = "ours"
        self._exclude(h0)
        self._tm_mark = _traces_memory()

    def _stop_tracing(self) -> None:
        mode, self._tracing = self._tracing, ""
        if mode == "ours":
            self._exclude_traces()
            h0 = self._figures()
            tracemalloc.stop()
            self._exclude(h0)
            self._tm_mark = 0

    def _exclude_traces(self) -> None:
        """What tracemalloc's own tables grew by during torchmem's work is not torchmem's state: it goes
        when tracing stops (and is left out of the offsets there)."""
        if self._tracing == "ours":
            now = _traces_memory()
            self._excluded_primary += now - self._tm_mark
            self._tm_mark = now

    def _exclude(self, h0: int | None) -> None:
        """Leave what changed since ``h0``/``r0`` out of the offsets: memory that lives during the program's
        steps (a trace, a site window), which the readings see come and go."""
        h1 = self._figures()
        if h0 is not None and h1 is not None:
            self._excluded_primary += h1 - h0

    def _creation_sites(self, samples: dict[str, list[Any]]) -> dict[str, str | None]:
        """For each sampled type, the user's line that created most of its sampled new instances (``None``
        where tracemalloc has no exact trace of them: objects reused from a free list, such as dicts, lists
        and floats, whose line is then the growing line closest to their rate)."""
        if not self._tracing or not samples:
            return {}
        out: dict[str, str | None] = {}
        for k, objs in samples.items():
            # Built-in types reuse freed objects (free lists): the trace at their address may be another's.
            exact = [o for o in objs if type(o).__module__ != "builtins"]
            found = collections.Counter(s for s in map(creation_line, exact) if s)
            out[k] = found.most_common(1)[0][0] if found else None
        return out

    def _open_window(self) -> None:
        if _TorchFunctionMode is None or self._window is not None:
            return
        if _compiled_program():
            self._notes.append(
                "the line that extends an autograd chain is not recorded in a program that uses "
                "torch.compile (a function mode would make its compiled code recompile)"
            )
            return
        if _inside_backward():
            # The steps end inside Tensor.backward(): with a function mode on, that call runs in the mode's
            # handler, which takes the mode off the stack meanwhile, so no step boundary could remove it.
            self._notes.append(
                "the line that extends an autograd chain is not recorded when the steps end inside "
                "backward() (a function mode could not be removed at a step boundary)"
            )
            return
        w = _SiteWindow()
        w.mode = _SiteMode(w)
        w.mode.__enter__()
        self._window = w

    def _close_window(self) -> None:
        w, self._window = self._window, None
        if w is None or w.mode is None:
            return
        w.active = False
        mode: Any = w.mode
        w.mode = None
        if threading.get_ident() != self._thread:
            self._notes.append("a site window stayed on the program's thread (stopped from another thread)")
            return
        if not _pop_mode(mode):
            # The program pushed a mode of its own and has not popped it yet (or this step ends inside a
            # torch call): ours stays, inactive, and is removed at the first step boundary where it can be.
            self._stale_modes.append(mode)
            self._notes.append(
                "a function mode of the program was above torchmem's when its window closed: torchmem's "
                "stayed, inactive, until it could be removed"
            )

    def _pop_stale_modes(self) -> None:
        """Remove torchmem's inactive function modes that could not be removed before (newest first)."""
        while self._stale_modes and _pop_mode(self._stale_modes[-1]):
            self._stale_modes.pop()

    # -- the report ----------------------------------------------------------------------------------
    def report(self) -> LeakReport:
        """The verdict, culprits and readings now (a frozen :class:`~torchmem.results.leaks.LeakReport`
        with ``device="host"``). Never raises for the watcher's own state; can be called at any time."""
        notes = list(self._notes)
        source, series = self.source, self._series.pairs()
        leaking, per_step = False, 0.0
        culprits: tuple[Culprit, ...] = ()
        trend, confidence = 0.0, 0.0
        verdict, reason = self._early_verdict()
        if not verdict:
            # The threshold never hides growth that is large over the run: reported with its total.
            g = detect_run_growth(
                list(self._ps),
                list(self._pv),
                first=self._run_first,
                min_bytes_per_step=self.min_bytes_per_step,
            )
            verdict, reason, trend, confidence = g.verdict, g.reason, g.trend_per_step, g.confidence
            if g.leaking:
                leaking, per_step = True, g.bytes_per_step
            elif self._secondary and len(self._rv) >= STEADY_READINGS:
                if self._running:
                    self._read_blocks(self.steps)
                r = self._python_growth(
                    detect_growth(list(self._rs), list(self._rv), min_bytes_per_step=self.min_bytes_per_step)
                )
                if self._rss_unexplained:
                    notes.append(
                        f"the resident memory grows by {fmt_bytes(self._rss_unexplained)}/step while neither "
                        "the C heap nor Python's object allocator holds more: pages of memory freed earlier "
                        "being touched again, or a library's own mappings; not counted as a leak"
                    )
                if r.leaking:
                    leaking, per_step, trend, confidence = (
                        True,
                        r.bytes_per_step,
                        r.trend_per_step,
                        r.confidence,
                    )
                    verdict, source, series = "leak", "rss", self._rss_series.pairs()
                    reason = (
                        f"the C heap grows by {fmt_bytes(max(g.trend_per_step, 0.0))}/step at most, but the "
                        f"resident memory grows: {r.reason} (Python's objects live in arenas the C heap does "
                        "not count)"
                    )
            chain_rate = sum(f.nodes_per_step for f in self._chain_facts)
            if not leaking and chain_rate > 0 and verdict in ("below_threshold", "noisy"):
                nodes = node_trend(self._nodes)
                if nodes is not None and nodes > 0:
                    leaking, verdict = True, "leak"
                    per_step = max(trend, chain_rate * _NODE_BYTES)
                    reason = (
                        f"an autograd chain grows by {chain_rate:.1f} nodes/step (live autograd nodes "
                        f"+{nodes:.1f}/step) while the heap grows less than the threshold ({reason}): a "
                        "chain never stops growing"
                    )
            if not leaking and self._object_facts:
                growing = self._objects_still_growing()
                objs = [c for c in self._culprits_now() if c.kind == PYTHON_OBJECTS]
                if growing and objs and self._grew is not None:
                    leaking, verdict = True, "leak"
                    per_step = sum(c.bytes_per_step for c in objs)
                    what = ", ".join(f"{_short(k)} +{r:.1f}/step" for k, r in list(growing.items())[:3])
                    reason = (
                        f"Python objects keep growing ({what} from step {self._grew[0]} to {self.steps}; "
                        f"about {fmt_bytes(per_step)}/step from their sizes); the figure shows less of it "
                        f"now: Python reuses memory freed earlier before it takes more ({reason})"
                    )
            if not leaking and self._facts_at is not None:
                states = [c for c in self._culprits_now() if c.kind in _STATE_KINDS]
                still = self._states_still_growing(states, trend)
                if still:
                    leaking, verdict = True, "leak"
                    per_step = sum(c.bytes_per_step for c in states)
                    reason = (
                        f"{still} since step {self._facts_at}, as it grew when the scans named "
                        f"{', '.join(c.kind for c in states)} (about {fmt_bytes(per_step)}/step); the "
                        f"figure's own test: {reason}"
                    )
            if leaking:
                culprits = self._culprits_now()
                notes.extend(self._state_notes)
                if not culprits:
                    if self._checked is not None:
                        state, account = self._checked
                        notes.append(
                            checked_note(
                                account,
                                state,
                                types_counted=self._types_counted,
                                containers=self._containers_seen,
                            )
                        )
                    elif self._scan_steps:
                        notes.append(
                            "no growing autograd chain or Python objects explain it: tensor storages on the "
                            "CPU (see the device report), or C/C++ allocations of a library"
                        )
                    else:
                        where = (
                            "steps came from another thread than the one that started the watch"
                            if self._foreign
                            else "the growth was found too late in the run"
                        )
                        notes.append(f"what grows was not looked for: {where}")
            else:
                if self._detected_at is not None:
                    verdict = "stopped"
                if self._facts_at is not None:
                    seen = self._culprits_now()
                    notes.append(
                        f"growth was seen at step {self._facts_at} "
                        f"({'; '.join(c.fix for c in seen[:2])}), and did not last"
                    )
        if self._stride > 1 or self._heap_every > 1:
            step_time, cost = self._stride_why
            every = f" (the C heap every {self._heap_every * self._stride})" if self._heap_every > 1 else ""
            notes.append(
                f"a step takes {step_time * 1e6:.1f} µs and a reading {cost * 1e6:.1f} µs: the host "
                f"figures are read every {self._stride} steps{every}, to stay under {self._share * 100:g} % "
                "of the run"
            )
        if self.source == "heap":
            notes.append(
                "figure: the C heap in use (glibc mallinfo2: autograd nodes, CPU tensors, C++ state), with "
                "the resident set size for Python's own objects"
            )
        nodes_note = self._nodes_note()
        if nodes_note:
            notes.append(nodes_note)
        notes.extend(self._trace_text())
        if self._scan_steps:
            notes.append(
                f"culprit scans at steps {', '.join(map(str, self._scan_steps[:6]))}"
                f"{' ...' if len(self._scan_steps) > 6 else ''} took {self._scan_seconds * 1e3:.0f} ms in all"
            )
        return LeakReport(
            device="host",
            source=source,
            mode="light",
            steps=self.steps,
            warmup=self.warmup,
            leaking=leaking,
            bytes_per_step=per_step,
            confidence=confidence,
            detected_at=self._detected_at,
            stopped_at=None if leaking else self._stopped_at,
            reason=reason,
            culprits=culprits,
            series=series,
            notes=tuple(notes),
            verdict=verdict,
            trend_per_step=trend,
            min_bytes_per_step=self.min_bytes_per_step,
            boundary=self.boundary,
            unit=self.unit,
        )

    def _trace_text(self) -> list[str]:
        """What tracing cost, per scan sequence: the steps traced and their time against the steps before."""
        out = []
        for before, windows in self._trace_notes:
            steps = sum(b - a + 1 for a, b, _ in windows)
            if not steps:
                continue
            each = sum((b - a + 1) * t for a, b, t in windows) / steps
            which = ", ".join(f"{a}-{b}" if b > a else str(a) for a, b, _ in windows)
            compared = f", against {before * 1e3:.2f} ms before" if before > 0 else ""
            out.append(
                f"tracemalloc traced Python allocations for {steps} steps (steps {which}) to find what keeps "
                f"growing: a step took {each * 1e3:.2f} ms with it{compared}"
            )
        return out

    def _states_still_growing(self, states: Sequence[Culprit], trend: float) -> str:
        """Why the growth that ``states`` explained goes on (``""`` when it does not): anomaly mode while the
        live autograd nodes keep rising; another state while the host figure's trend is still up."""
        if not states or self.steps - (self._facts_at or self.steps) < 2 * self._gap:
            return ""
        kinds = {c.kind for c in states}
        if kinds == {ANOMALY}:
            last = self._nodes[-1] if self._nodes else None
            rate = node_trend(self._nodes)
            if last is None or last[0] <= (self._facts_at or 0) or rate is None or rate <= 0:
                return ""
            return f"live autograd nodes keep rising ({rate:+.1f}/step)"
        if trend <= 0:
            return ""
        return f"host memory keeps growing ({fmt_bytes(int(trend))}/step)"

    def _objects_still_growing(self) -> dict[str, float]:
        """The growing types of the last scans whose instances kept growing since (one heap scan, cached
        per step): ``{type name: new instances per step}``."""
        if self._grew is None:
            return {}
        at, counts, rates = self._grew
        if self.steps - at < 2 * self._gap:
            return {}
        cached = self._recount
        if cached is not None and cached[0] == self.steps:
            return cached[1]
        out: dict[str, float] = {}
        try:
            objs = gc.get_objects()
            try:
                now = _count_types(objs)
                for o in _own_objects(self):
                    if type(o) in now:
                        now[type(o)] -= 1
            finally:
                del objs
            named: dict[str, int] = {}
            for t, c in now.items():
                k = _type_name(t)
                if k in counts:
                    named[k] = named.get(k, 0) + c
            for k, c in counts.items():
                rate = (named.get(k, 0) - c) / (self.steps - at)
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
                    rate = (lens[-1] - lens[0]) / (self.steps - at)
                    if rate >= 0.5 * per_step:
                        out[label] = max(out.get(label, 0.0), rate)
        except Exception as exc:
            self._report_error("recount", exc)
        self._recount = (self.steps, out)
        return out

    def _early_verdict(self) -> tuple[str, str]:
        first = self.warmup + STEADY_READINGS * self._stride
        if self.steps == 0:
            return "no_steps", "no steps were recorded: step() was never called"
        readings = max(len(self._pv), len(self._rv))
        if self.steps <= self.warmup or readings < STEADY_READINGS:
            return (
                "too_few",
                f"{self.steps} step(s), {readings} reading(s) after the {self.warmup}-step warm-up: not "
                f"enough to judge; the first verdict needs {first} steps",
            )
        return "", ""

    def _nodes_note(self) -> str:
        if not self._nodes:
            return ""
        (s0, c0), (s1, c1) = self._nodes[0], self._nodes[-1]
        at_least = "at least " if self._nodes_capped else ""
        text = f"{at_least}{c1:,} autograd nodes alive at step {s1}"
        if s1 > s0:
            text += f" ({(c1 - c0) / (s1 - s0):+.1f}/step since step {s0})"
        return text + f"; counted every {self._node_wait:.0f} s or more"


# -- helpers (module level: they run inside step(), each bounded) ---------------------------------------
class _Series:
    """Readings for the report: every one up to 4096, then every 2nd, 4th, ... (bounded)."""

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.values: list[int] = []
        self.keep_every = 1
        self.added = 0

    def add(self, n: int, v: int) -> None:
        self.added += 1
        if n % self.keep_every:
            return
        self.steps.append(n)
        self.values.append(v)
        if len(self.steps) >= _SERIES_MAX:
            self.steps[:] = self.steps[::2]
            self.values[:] = self.values[::2]
            self.keep_every *= 2

    def pairs(self) -> tuple[tuple[int, int], ...]:
        return tuple(zip(self.steps, self.values))

    def rate(self) -> float:
        """Growth per step over the last readings (0 when falling or unknown)."""
        if len(self.steps) < 2:
            return 0.0
        i = max(0, len(self.steps) - _WINDOW)
        s0, v0, s1, v1 = self.steps[i], self.values[i], self.steps[-1], self.values[-1]
        return max(0.0, (v1 - v0) / (s1 - s0)) if s1 > s0 else 0.0


def _site(site: Site | None) -> str | None:
    return str(site) if site is not None else None


_STATE_KINDS = frozenset({ANOMALY, CUDNN_BENCHMARK, MEMORY_HISTORY, PROFILER})
_OWN_TYPES: list[frozenset[str]] = []


def _own_type_names() -> frozenset[str]:
    """The names of the classes torchmem's capture layer defines (its session, watchers, scans, samplers)."""
    if not _OWN_TYPES:
        names = set()
        for name, mod in list(sys.modules.items()):
            if name.startswith("torchmem.capture") and mod is not None:
                for v in list(vars(mod).values()):
                    if isinstance(v, type) and getattr(v, "__module__", "") == name:
                        names.add(v.__name__)
        _OWN_TYPES.append(frozenset(names))
    return _OWN_TYPES[0]


def _through_torchmem(p: HolderPath) -> bool:
    """A path from torchmem's own state (its session, its watchers, its threads) names nothing of the
    program."""
    steps = p.typed_steps
    if not steps:
        return False
    if steps[0].name.startswith("torchmem") or steps[0].text.startswith("thread 'torchmem"):
        return True
    own = _own_type_names()
    return any(s.holder_type in own for s in steps[1:])


def _entry_path(path: HolderPath, container: Any, key: Any) -> HolderPath:
    """``path`` (to a container) and the item ``key`` of it: ``__main__.rows`` -> ``__main__.rows[57]``."""
    if isinstance(container, dict):
        text, name = f"[{key!r}]", repr(key)
    else:
        text, name = f"[{key}]", str(key)
    step = HolderStep(StepKind.ITEM, text, name, type(container).__name__, type(key).__name__)
    return HolderPath.of(path.root, (*path.typed_steps, step), path.depth + 1)


def _majority(
    groups: Sequence[tuple[HolderPath, ...]], sizes: Sequence[float]
) -> tuple[tuple[HolderPath, ...], float]:
    """The holder paths and mean size of the sampled instances whose holder most of them share (new
    instances of a type include a few transient ones held elsewhere, whose sizes say nothing of what
    grows); all of them where no holder is shared."""
    keys = []
    for group in groups:
        rooted = [p for p in group if p.root not in ("gc-orphan", "cycle")]
        keys.append(holder_pattern(rooted[0]) if rooted else None)
    counts = collections.Counter(k for k in keys if k is not None)
    if not counts:
        chosen = list(range(len(groups)))
    else:
        top = counts.most_common(1)[0][0]
        chosen = [i for i, k in enumerate(keys) if k == top]
    paths = tuple(p for i in chosen for p in groups[i])
    picked = [sizes[i] for i in chosen if i < len(sizes)]
    return paths, (sum(picked) / len(picked) if picked else 0.0)


def _mean_size(objs: Sequence[Any]) -> float:
    """Mean size of ``objs`` with what only they hold: the object plus its numbers and strings (objects gc
    does not track, which no type count sees); contained containers are counted as their own types."""
    sizes = []
    for o in objs:
        try:
            size = sys.getsizeof(o)
            for r in gc.get_referents(o):
                if not gc.is_tracked(r) and not isinstance(r, type):
                    size += sys.getsizeof(r)
            sizes.append(size)
        except Exception:
            continue
    return sum(sizes) / len(sizes) if sizes else 0.0


def _traces_memory() -> int:
    """Bytes tracemalloc uses for its own tables (0 when not tracing)."""
    return tracemalloc.get_tracemalloc_memory() if tracemalloc.is_tracing() else 0


def _own_objects(watcher: HostWatcher) -> list[Any]:
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
        if isinstance(o, (dict, list, tuple, collections.deque, _Scan, _SiteWindow, _Series)):
            stack.extend(gc.get_referents(o))
    return out


def _count_types(objs: list[Any]) -> dict[type, int]:
    """Instances per type, at C speed where CPython's counting helper exists (``Counter(...)`` itself
    would ask the ``Mapping`` ABC about the iterator, and refill its caches: objects the counts see)."""
    counts: dict[type, int] = {}
    helper = getattr(collections, "_count_elements", None)
    if helper is not None:
        helper(counts, map(type, objs))
        return counts
    for o in objs:  # pragma: no cover - other Pythons
        t = type(o)
        counts[t] = counts.get(t, 0) + 1
    return counts


def _of_types(objs: list[Any], names: Collection[str]) -> tuple[set[type], Iterator[Any]]:
    """The types named in ``names`` present in ``objs`` and an iterator over their instances (C-speed)."""
    types = {t for t in set(map(type, objs)) if _type_name(t) in names}
    return types, itertools.compress(objs, map(types.__contains__, map(type, objs)))


def _ids_of(objs: list[Any], types: Collection[str], own: list[Any]) -> dict[str, set[int]]:
    """The ids of the instances of ``types`` now (bounded), by type name."""
    mine = {id(o) for o in own}
    out: dict[str, set[int]] = {k: set() for k in types}
    present, instances = _of_types(objs, types)
    names = {t: _type_name(t) for t in present}
    for total, o in enumerate(instances):
        if total >= _MAX_IDS:
            break
        if id(o) not in mine:
            out[names[type(o)]].add(id(o))
    return out


def _new_instances(
    objs: list[Any], types: Collection[str], old: Mapping[str, set[int]], mine: Collection[int]
) -> dict[str, list[Any]]:
    """A few instances of each type that did not exist at the previous scan, spread over those found
    (``mine``: the ids of torchmem's own objects)."""
    found: dict[str, list[Any]] = {k: [] for k in types}
    present, instances = _of_types(objs, types)
    names = {t: _type_name(t) for t in present}
    full = 0
    for o in instances:
        k = names[type(o)]
        lst = found[k]
        if len(lst) < 64 and id(o) not in old[k] and id(o) not in mine:
            lst.append(o)
            if len(lst) == 64:
                full += 1
                if full == len(found):
                    break
    out: dict[str, list[Any]] = {}
    for k, lst in found.items():
        if lst:
            step = max(1, len(lst) // _SAMPLES_PER_TYPE)
            out[k] = lst[::step][:_SAMPLES_PER_TYPE]
        lst.clear()
    return out


def _heads(
    tensors: Sequence[torch.Tensor], prev: _Scan | None, budget: float
) -> tuple[list[ChainHead], dict[int, str], int]:
    """Each live tensor's autograd head, the nodes made since ``prev`` that it reaches and which of
    ``prev``'s heads it reaches: a walk from the head that stops at nodes older than ``prev`` (a node's
    inputs are always older than the node), so a long chain costs only its newest part."""
    roots: list[tuple[int, Any]] = []
    with _no_torch_function():
        for i, t in enumerate(tensors):
            try:
                g = t.grad_fn
            except Exception:
                continue
            if g is not None:
                roots.append((i, g))
    heads: dict[int, str] = {}
    wm = prev.watermark if prev is not None else 0
    top = wm
    out: list[ChainHead] = []
    pending: list[tuple[int, Any, int]] = []
    for i, g in roots:
        try:
            s = _seq(g)
        except Exception:
            continue
        heads.setdefault(s, type(g).__name__)
        if s < _NO_SEQ:
            top = max(top, s)
        if prev is None:
            continue
        if s <= wm or s >= _NO_SEQ:
            reached = (s,) if prev.heads.get(s) == type(g).__name__ else ()
            out.append(ChainHead(i, s, type(g).__name__, 0, reached))
        else:
            pending.append((i, g, s))
    if prev is None:
        return out, heads, top
    deadline = time.perf_counter() + budget
    again: list[tuple[int, Any, int]] = []
    for cap, work in ((_FIRST_PASS_NODES, pending), (None, again)):
        for i, g, s in work:
            h, capped, newest = _walk(i, g, s, prev, cap, deadline)
            top = max(top, newest)
            if capped and cap is not None and time.perf_counter() < deadline:
                again.append((i, g, s))
            else:
                out.append(h)
    return out, heads, top


def _walk(
    index: int, head: Any, seq: int, prev: _Scan, cap: int | None, deadline: float
) -> tuple[ChainHead, bool, int]:
    wm = prev.watermark
    seen: dict[int, Any] = {id(head): head}
    stack = [head]
    names: collections.Counter[str] = collections.Counter()
    names[type(head).__name__] += 1
    new_seqs = [seq]
    reached: dict[int, None] = {}
    capped = False
    newest = seq
    visited = 0
    while stack:
        node = stack.pop()
        visited += 1
        if (cap is not None and len(seen) > cap) or (visited % 256 == 0 and time.perf_counter() > deadline):
            capped = True
            break
        for child, _ in node.next_functions:
            if child is None or id(child) in seen:
                continue
            seen[id(child)] = child
            s = _seq(child)
            if s >= _NO_SEQ:
                continue
            if s <= wm:
                if prev.heads.get(s) == type(child).__name__:
                    reached[s] = None
                continue
            newest = max(newest, s)
            names[type(child).__name__] += 1
            if len(new_seqs) < 8:
                new_seqs.append(s)
            stack.append(child)
    new_nodes = sum(names.values())
    seen.clear()
    h = ChainHead(
        index,
        seq,
        type(head).__name__,
        new_nodes,
        tuple(reached),
        tuple(k for k, _ in names.most_common(4)),
        tuple(new_seqs),
        capped,
    )
    return h, capped, newest


def _tensors(objs: list[Any], counts: Mapping[type, int] | None = None) -> list[torch.Tensor]:
    """The tensors among ``objs`` (C-speed filtering by type)."""
    types = counts.keys() if counts is not None else set(map(type, objs))
    ttypes = {t for t in types if torch.Tensor in t.__mro__}
    return list(itertools.compress(objs, map(ttypes.__contains__, map(type, objs))))


def _count_nodes(tensors: Sequence[torch.Tensor], budget: float) -> tuple[int, bool]:
    """Autograd nodes reachable from ``tensors`` (a walk bounded by ``budget`` s: ``(count, capped)``)."""
    roots = []
    with _no_torch_function():
        for t in tensors:
            try:
                g = t.grad_fn
            except Exception:
                continue
            if g is not None:
                roots.append(g)
    seen: dict[int, Any] = {id(r): r for r in roots}
    stack = list(seen.values())
    roots.clear()
    deadline = time.perf_counter() + budget
    capped = False
    k = 0
    while stack:
        node = stack.pop()
        k += 1
        if k % 512 == 0 and time.perf_counter() > deadline:
            capped = True
            break
        for child, _ in node.next_functions:
            if child is not None and id(child) not in seen:
                seen[id(child)] = child
                stack.append(child)
    n = len(seen)
    seen.clear()
    stack.clear()
    return n, capped


__all__ = ["DEFAULT_MIN_BYTES_PER_STEP", "HostWatcher"]
