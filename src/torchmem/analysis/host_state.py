"""Host growth that is not an autograd chain: Python lines that keep what they allocate, and native growth
explained by the process's state.

Pure functions over what :class:`torchmem.capture.host.HostWatcher` captured during one scan sequence
(three scans a few steps apart, once the host grows): nothing here reads memory or touches torch.

- **Lines that keep what they allocate.** While the sequence runs, ``tracemalloc`` traces every Python
  allocation (numpy's array buffers too: numpy reports them to it). The bytes still alive per user line at
  the second and third scans give each line's growth per step (:func:`growing_lines`); a line that keeps
  growing in both intervals keeps what it makes.
- **The process's state.** A ``torch.profiler`` that is recording (every op adds an event), anomaly mode
  (every autograd node keeps the Python stack that made it), the CUDA allocator's history recording (every
  allocation and free keeps a trace entry), ``cudnn.benchmark`` fed new shapes (every new convolution shape
  is benchmarked and its plan cached) make native memory grow while they are on. :func:`state_culprits`
  names the ones that were on through the sequence and explain growth that the named culprits do not
  (:class:`HostAccount`), with the fix; one that is on while the growth is explained otherwise is a note,
  never a culprit.
- **Nothing explains it.** :func:`checked_note` says what was looked at.

Cost: linear in the lines and states given.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from torchmem._format import fmt_bytes
from torchmem.analysis.leaks import holder_name
from torchmem.results.holders import HolderPath
from torchmem.results.leaks import Culprit

PROFILER = "profiler_running"
ANOMALY = "anomaly_mode"
MEMORY_HISTORY = "memory_history"
CUDNN_BENCHMARK = "cudnn_benchmark"
PYTHON_LINE = "python_objects"

# A state is named only when the growth that nothing else explains is at least this share of the growth.
STATE_SHARE = 0.25


@dataclass(frozen=True)
class ProcessState:
    """The process-wide switches that make host memory grow while they are on, read at one scan.

    Attributes:
        profiler: An autograd profiler (``torch.profiler.profile``, ``torch.autograd.profiler.profile``) is
            recording.
        anomaly: Anomaly mode is on (``torch.autograd.set_detect_anomaly(True)``).
        memory_history: The CUDA allocator records its history (``torch.cuda.memory._record_memory_history``);
            ``None`` without CUDA.
        cudnn_benchmark: ``torch.backends.cudnn.benchmark`` is on in a process that uses CUDA; ``None``
            without CUDA (the flag does nothing then).

    Example:
        >>> ProcessState(profiler=True, anomaly=True).on()
        ('profiler_running', 'anomaly_mode')
    """

    profiler: bool = False
    anomaly: bool = False
    memory_history: bool | None = None
    cudnn_benchmark: bool | None = None

    def on(self) -> tuple[str, ...]:
        """The names of the states that are on (culprit kinds)."""
        out = []
        if self.profiler:
            out.append(PROFILER)
        if self.anomaly:
            out.append(ANOMALY)
        if self.memory_history:
            out.append(MEMORY_HISTORY)
        if self.cudnn_benchmark:
            out.append(CUDNN_BENCHMARK)
        return tuple(out)


def state_through(states: Sequence[ProcessState]) -> ProcessState:
    """The states that were on at every reading of ``states`` (a switch turned on or off during the
    sequence explains no steady growth).

    Example:
        >>> state_through([ProcessState(profiler=True, anomaly=True), ProcessState(profiler=True)]).on()
        ('profiler_running',)
    """
    if not states:
        return ProcessState()
    return ProcessState(
        profiler=all(s.profiler for s in states),
        anomaly=all(s.anomaly for s in states),
        memory_history=all(bool(s.memory_history) for s in states),
        cudnn_benchmark=all(bool(s.cudnn_benchmark) for s in states),
    )


@dataclass(frozen=True)
class LineGrowth:
    """A user line whose traced allocations still alive grow from scan to scan.

    Attributes:
        site: ``"file.py:12"``.
        bytes_per_step: Growth per step of the bytes it allocated that are still alive (the later interval).
        live: Bytes it allocated since tracing started that are alive at the last scan.
    """

    site: str
    bytes_per_step: float
    live: int


def growing_lines(
    first: Mapping[str, int],
    second: Mapping[str, int],
    first_steps: int,
    second_steps: int,
    *,
    min_bytes_per_step: float = 1024.0,
) -> list[LineGrowth]:
    """The lines that keep what they allocate: ``first`` holds, per line, the bytes still alive
    ``first_steps`` steps after tracing started among those allocated since; ``second`` the same
    ``second_steps`` steps later. A line that keeps ``B`` bytes per step has about ``B * first_steps`` then
    ``B * (first_steps + second_steps)``; a line of temporaries freed at each step keeps about the same alive
    at both (whatever is alive at a step boundary) and is left out. A line must have kept about as much in
    the first interval (half of the second's rate or more). Largest first.

    Example:
        >>> growing_lines({"a.py:3": 2048, "a.py:9": 4096}, {"a.py:3": 4096, "a.py:9": 4096}, 2, 2)
        [LineGrowth(site='a.py:3', bytes_per_step=1024.0, live=4096)]
    """
    if first_steps <= 0 or second_steps <= 0:
        return []
    out: list[LineGrowth] = []
    for site, now in second.items():
        before = first.get(site, 0)
        r2 = (now - before) / second_steps
        if r2 >= min_bytes_per_step and before / first_steps >= 0.5 * r2:
            out.append(LineGrowth(site, r2, int(now)))
    out.sort(key=lambda g: (-g.bytes_per_step, g.site))
    return out


def closest_line(lines: Sequence[LineGrowth], bytes_per_step: float) -> str | None:
    """The growing line whose rate is closest to ``bytes_per_step`` (within a factor of 2), ``None`` where
    none is.

    Example:
        >>> closest_line([LineGrowth("a.py:3", 1000.0, 0), LineGrowth("a.py:9", 9000.0, 0)], 1200.0)
        'a.py:3'
    """
    best: tuple[float, str] | None = None
    for g in lines:
        if bytes_per_step <= 0 or g.bytes_per_step <= 0:
            continue
        ratio = max(g.bytes_per_step, bytes_per_step) / min(g.bytes_per_step, bytes_per_step)
        if ratio <= 2.0 and (best is None or ratio < best[0]):
            best = (ratio, g.site)
    return best[1] if best is not None else None


def line_culprits(
    lines: Sequence[LineGrowth], named_sites: Sequence[str], *, min_bytes_per_step: float
) -> tuple[Culprit, ...]:
    """``python_objects`` culprits for growing lines that no named culprit accounts for: the line is known
    (tracemalloc), what keeps its objects is not (a single object re-allocated larger, objects held from C).

    Example:
        >>> c = line_culprits([LineGrowth("a.py:3", 65536.0, 0)], (), min_bytes_per_step=4096)[0]
        >>> c.site, c.holder
        ('a.py:3', None)
        >>> print(c.fix)
        what `a.py:3` allocates stays alive (+64.00 KiB/step, traced by tracemalloc) and no container of it \
was found growing: keep less of what it makes (a bounded window, `del` what is done), or write it out
    """
    taken = set(named_sites)
    out = []
    for g in lines:
        if g.site in taken or g.bytes_per_step < min_bytes_per_step:
            continue
        fix = (
            f"what `{g.site}` allocates stays alive ({_rate(g.bytes_per_step)}, traced by tracemalloc) and "
            "no container of it was found growing: keep less of what it makes (a bounded window, `del` what "
            "is done), or write it out"
        )
        out.append(
            Culprit(
                PYTHON_LINE, g.site, ((g.site, g.bytes_per_step),), None, g.live, g.bytes_per_step, 0.0, fix
            )
        )
    return tuple(out)


NODE_BYTES = 600  # a typical autograd node on the host (measured 0.4-0.8 KiB), for estimates only


@dataclass(frozen=True)
class HostAccount:
    """What the host growth is made of, per step, during the scans.

    Attributes:
        heap: The C heap's growth per step (what torchmem's own work left there taken out); the resident
            set's where there is no C heap figure.
        traced: Python allocations still alive per step (tracemalloc: objects and numpy buffers), ``None``
            where tracing was not on.
        traced_heap: The part of ``traced`` in blocks larger than Python's small objects (512 B): in the C
            heap; the rest lives in Python's arenas, which the C heap does not count.
        tensors: CPU tensor storages kept per step (not traced by tracemalloc).
        nodes_per_step: Live autograd nodes added per step (``None``: not counted).
        python_named: What the named Python-object culprits account for, per step.
        native_named: What the named autograd chains account for, per step.

    Example:
        >>> a = HostAccount(heap=40_000.0, traced=2_000.0, traced_heap=1_000.0, tensors=4_096.0)
        >>> a.native, a.python_unnamed
        (34904.0, 2000.0)
    """

    heap: float
    traced: float | None = None
    traced_heap: float = 0.0
    tensors: float = 0.0
    nodes_per_step: float | None = None
    python_named: float = 0.0
    native_named: float = 0.0

    @property
    def growth(self) -> float:
        """All the host growth per step: the C heap's, plus Python's small objects (in arenas)."""
        small = max(0.0, (self.traced or 0.0) - self.traced_heap)
        return max(0.0, self.heap) + small

    @property
    def native(self) -> float:
        """C heap growth that no Python allocation, CPU tensor, autograd node or named chain accounts for."""
        nodes = max(0.0, self.nodes_per_step or 0.0) * NODE_BYTES
        return max(0.0, self.heap - self.traced_heap - self.tensors - max(nodes, self.native_named))

    @property
    def python_unnamed(self) -> float:
        """Python allocations kept per step that the named culprits do not account for."""
        return max(0.0, (self.traced or 0.0) - self.python_named)


@dataclass(frozen=True)
class StateEvidence:
    """What the scans saw of each state beyond its switch (inputs of :func:`state_culprits`).

    Attributes:
        profilers: Holder paths of the running profiler objects (``prof``).
        graph_paths: Holder paths of tensors kept step after step whose graphs stay alive (``losses[*]``).
        new_shapes: For ``cudnn.benchmark``: ``(steps watched, steps that ran a convolution shape not seen
            before in the window, distinct shapes)``; ``None`` where no shape window ran.
        history_by_torchmem: torchmem turned the history recording on itself (``torchmem run --memory-viz``).
    """

    profilers: tuple[HolderPath, ...] = ()
    graph_paths: tuple[HolderPath, ...] = ()
    new_shapes: tuple[int, int, int] | None = None
    history_by_torchmem: bool = False


def _rate(b: float) -> str:
    return f"+{fmt_bytes(int(max(b, 0.0)))}/step"


def _first_name(paths: Sequence[HolderPath], default: str) -> tuple[str, HolderPath | None]:
    """The holder the sampled paths share most (a container beats the loop variable that holds only the
    last step's object: the device culprits' rule), ``(default, None)`` where no path is rooted."""
    from torchmem.analysis.culprits import _main_pattern, holder_pattern

    rooted = [p for p in paths if p.root not in ("gc-orphan", "cycle")]
    if not rooted:
        return default, None
    key = _main_pattern(rooted)
    p = next(p for p in rooted if holder_pattern(p) == key)
    return holder_name(p), p


def profiler_fix(name: str, bytes_per_step: float) -> str:
    """The fix for a profiler left recording.

    Example:
        >>> print(profiler_fix("prof", 342016))
        the profiler `prof` is recording every op of every step (+334.00 KiB/step of events on the host): \
stop it (`prof.stop()`), or profile a few steps only: `with torch.profiler.profile(schedule=\
torch.profiler.schedule(wait=1, warmup=1, active=3), on_trace_ready=...) as prof:` with `prof.step()` at \
each step
    """
    return (
        f"the profiler `{name}` is recording every op of every step ({_rate(bytes_per_step)} of events on "
        f"the host): stop it (`{name}.stop()`), or profile a few steps only: `with torch.profiler.profile("
        "schedule=torch.profiler.schedule(wait=1, warmup=1, active=3), on_trace_ready=...) as prof:` with "
        "`prof.step()` at each step"
    )


def anomaly_fix(holder: str | None, nodes_per_step: float | None, bytes_per_step: float) -> str:
    """The fix for anomaly mode with graphs kept alive.

    Example:
        >>> print(anomaly_fix("losses", 7.0, 18000))
        anomaly mode is on: every autograd node keeps the Python stack that created it, and `losses` keeps \
the graphs alive (+7 nodes/step, +17.58 KiB/step with their stacks): turn it off \
(`torch.autograd.set_detect_anomaly(False)`; `with torch.autograd.detect_anomaly():` around the one step you \
debug), and keep `loss.item()` (or `.detach()`), not the tensors with their graphs
    """
    nodes = f"+{nodes_per_step:.0f} nodes/step, " if nodes_per_step else ""
    who = f"`{holder}` keeps the graphs alive" if holder else "graphs are kept alive from step to step"
    return (
        f"anomaly mode is on: every autograd node keeps the Python stack that created it, and {who} "
        f"({nodes}{_rate(bytes_per_step)} with their stacks): turn it off "
        "(`torch.autograd.set_detect_anomaly(False)`; `with torch.autograd.detect_anomaly():` around the one "
        "step you debug), and keep `loss.item()` (or `.detach()`), not the tensors with their graphs"
    )


def history_fix(bytes_per_step: float, *, by_torchmem: bool = False) -> str:
    """The fix for the CUDA allocator's history recording.

    Example:
        >>> print(history_fix(65536))
        the CUDA allocator's memory history is recording (`torch.cuda.memory._record_memory_history()`): \
every allocation and free keeps a trace entry with its stack on the host (+64.00 KiB/step): stop it after \
the snapshot (`torch.cuda.memory._record_memory_history(enabled=None)`), or bound it \
(`max_entries=100_000`)
    """
    if by_torchmem:
        return (
            f"`torchmem run --memory-viz` records the CUDA allocator's history ({_rate(bytes_per_step)} of "
            "trace entries on the host, up to its 100,000 entries): drop --memory-viz when the snapshot is "
            "not needed"
        )
    return (
        "the CUDA allocator's memory history is recording (`torch.cuda.memory._record_memory_history()`): "
        "every allocation and free keeps a trace entry with its stack on the host "
        f"({_rate(bytes_per_step)}): stop it after the snapshot "
        "(`torch.cuda.memory._record_memory_history(enabled=None)`), or bound it (`max_entries=100_000`)"
    )


def cudnn_fix(bytes_per_step: float, new_shapes: tuple[int, int, int] | None) -> str:
    """The fix for ``cudnn.benchmark`` fed new shapes.

    Example:
        >>> print(cudnn_fix(40960, (2, 2, 5)))
        `torch.backends.cudnn.benchmark = True` with new input shapes: each new convolution shape is \
benchmarked and its plan cached on the host for good (2 of 2 steps ran a shape not seen before, 5 shapes; \
+40.00 KiB/step): set `torch.backends.cudnn.benchmark = False` for varying shapes, or pad/bucket the inputs \
to a few fixed shapes
    """
    seen = ""
    if new_shapes is not None:
        steps, new, distinct = new_shapes
        seen = f"{new} of {steps} steps ran a shape not seen before, {distinct} shapes; "
    return (
        "`torch.backends.cudnn.benchmark = True` with new input shapes: each new convolution shape is "
        f"benchmarked and its plan cached on the host for good ({seen}{_rate(bytes_per_step)}): set "
        "`torch.backends.cudnn.benchmark = False` for varying shapes, or pad/bucket the inputs to a few "
        "fixed shapes"
    )


_ORIGIN = {
    PROFILER: "a torch.profiler that is recording",
    ANOMALY: "anomaly mode (autograd's stack per node)",
    MEMORY_HISTORY: "the CUDA allocator's history recording",
    CUDNN_BENCHMARK: "cuDNN benchmark plans for new shapes",
}


def state_culprits(
    state: ProcessState,
    account: HostAccount,
    evidence: StateEvidence,
    *,
    min_bytes_per_step: float,
    steps: int = 0,
) -> tuple[tuple[Culprit, ...], tuple[str, ...]]:
    """The culprits the process's state explains, and notes for states that are on but explain nothing.

    ``state`` holds the switches that were on through the scans. Each explains only the growth nothing else
    does, and only when that rest is at least ``min_bytes_per_step`` and :data:`STATE_SHARE` of all the
    growth: anomaly mode the Python objects no holder names (the stacks, held by autograd nodes from C++),
    and only while graphs stay alive (live autograd nodes rise); a recording profiler, the allocator's
    history and ``cudnn.benchmark`` the C heap's growth that no Python object, CPU tensor or autograd node
    accounts for, ``cudnn.benchmark`` only when new convolution shapes kept coming in the shape window.
    Native states that fit together share the rest equally (said in the fix). A state that is on but does
    not fit is a note.

    Example:
        >>> st = ProcessState(profiler=True)
        >>> cs, notes = state_culprits(st, HostAccount(heap=300_000.0), StateEvidence(),
        ...                            min_bytes_per_step=4096)
        >>> cs[0].kind, round(cs[0].bytes_per_step)
        ('profiler_running', 300000)
        >>> cs, notes = state_culprits(st, HostAccount(heap=1_000_000.0, traced=990_000.0,
        ...                            traced_heap=990_000.0, python_named=990_000.0), StateEvidence(),
        ...                            min_bytes_per_step=4096)
        >>> cs, notes[0].startswith("a torch.profiler is recording too")
        ((), True)
    """
    on = state.on()
    if not on:
        return (), ()
    growth = account.growth
    fits: list[str] = []
    notes: list[str] = []
    for kind in on:
        rest = account.python_unnamed if kind == ANOMALY else account.native
        why = ""
        if rest < min_bytes_per_step or rest < STATE_SHARE * growth:
            what = "Python objects no holder names" if kind == ANOMALY else "native growth"
            why = f"the growth is explained otherwise ({what}: {_rate(rest)} of {_rate(growth)} in all)"
        elif kind == ANOMALY and not (account.nodes_per_step and account.nodes_per_step > 0):
            why = "no autograd graph stays alive (the live nodes do not rise): its stacks go with them"
        elif kind == CUDNN_BENCHMARK and (evidence.new_shapes is None or evidence.new_shapes[1] == 0):
            why = (
                "no convolution ran a new shape while it was watched"
                if evidence.new_shapes is not None
                else "the convolutions' shapes were not watched"
            )
        if why:
            notes.append(f"{_ORIGIN_ON[kind]} too, not named as a cause: {why}")
        else:
            fits.append(kind)
    native = [k for k in fits if k != ANOMALY]
    out: list[Culprit] = []
    for kind in fits:
        holder: HolderPath | None = None
        share = account.python_unnamed if kind == ANOMALY else account.native / len(native)
        shared = (
            f" (shared equally by {len(native)} states: not measured apart)"
            if kind != ANOMALY and len(native) > 1
            else ""
        )
        if kind == PROFILER:
            name, holder = _first_name(evidence.profilers, "prof")
            fix = profiler_fix(name, share)
        elif kind == ANOMALY:
            name, holder = _first_name(evidence.graph_paths, "")
            fix = anomaly_fix(name or None, account.nodes_per_step, share)
        elif kind == MEMORY_HISTORY:
            fix = history_fix(share, by_torchmem=evidence.history_by_torchmem)
        else:
            fix = cudnn_fix(share, evidence.new_shapes)
        out.append(
            Culprit(
                kind=kind,
                site=None,
                sites=(),
                holder=str(holder) if holder is not None else None,
                bytes=int(share * max(steps, 0)),
                bytes_per_step=share,
                graph_bytes=0.0,
                fix=fix + shared,
                origin=_ORIGIN[kind],
            )
        )
    return tuple(out), tuple(notes)


_ORIGIN_ON = {
    PROFILER: "a torch.profiler is recording",
    ANOMALY: "anomaly mode is on",
    MEMORY_HISTORY: "the CUDA allocator's history is recording",
    CUDNN_BENCHMARK: "cudnn.benchmark is on",
}


def origin_of(kind: str) -> str:
    """What makes memory grow for a state culprit's ``kind`` (``""`` for other kinds).

    Example:
        >>> origin_of("profiler_running")
        'a torch.profiler that is recording'
    """
    return _ORIGIN.get(kind, "")


def checked_note(
    account: HostAccount,
    state: ProcessState,
    *,
    types_counted: int,
    containers: int,
) -> str:
    """What was looked at when nothing explains the host growth.

    Example:
        >>> print(checked_note(HostAccount(heap=8192.0, traced=0.0, nodes_per_step=0.0), ProcessState(),
        ...                    types_counted=2400, containers=900))
        nothing torchmem can see explains +8.00 KiB/step of host growth; checked: autograd chains (none \
growing; live nodes +0.0/step), instance counts of 2,400 Python types and the lengths of 900 containers \
(none growing with a holder), Python allocations traced by tracemalloc (+0 B/step kept), CPU tensor storages \
(+0 B/step), the profiler, anomaly mode, the CUDA allocator's history and cudnn.benchmark (all off): native \
memory of a library (C/C++), or memory torch's allocators keep
    """
    nodes = f"; live nodes {account.nodes_per_step:+.1f}/step" if account.nodes_per_step is not None else ""
    parts = [
        f"autograd chains (none growing{nodes})",
        f"instance counts of {types_counted:,} Python types and the lengths of {containers:,} containers "
        "(none growing with a holder)",
    ]
    if account.traced is not None:
        parts.append(f"Python allocations traced by tracemalloc ({_rate(account.traced)} kept)")
    else:
        parts.append("Python allocations (tracemalloc was not on)")
    parts.append(f"CPU tensor storages ({_rate(account.tensors)})")
    on = state.on()
    states = "the profiler, anomaly mode, the CUDA allocator's history and cudnn.benchmark"
    parts.append(f"{states} ({'on: ' + ', '.join(on) if on else 'all off'})")
    left = max(account.native, account.python_unnamed)
    return (
        f"nothing torchmem can see explains {_rate(left)} of host growth; checked: "
        f"{', '.join(parts)}: native memory of a library (C/C++), or memory torch's allocators keep"
    )


__all__ = [
    "ANOMALY",
    "CUDNN_BENCHMARK",
    "MEMORY_HISTORY",
    "NODE_BYTES",
    "PROFILER",
    "STATE_SHARE",
    "HostAccount",
    "LineGrowth",
    "ProcessState",
    "StateEvidence",
    "anomaly_fix",
    "checked_note",
    "closest_line",
    "cudnn_fix",
    "growing_lines",
    "history_fix",
    "line_culprits",
    "origin_of",
    "profiler_fix",
    "state_culprits",
    "state_through",
]
