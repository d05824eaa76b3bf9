"""The report of :class:`torchmem.capture.host.HostWatcher`: the verdict over the whole run, the culprits
the scans named, and the notes, built from a :class:`HostView` of the watcher (its settings and its
parts)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from torchmem._format import fmt_bytes
from torchmem.analysis.growth import STEADY_READINGS
from torchmem.analysis.host import PYTHON_OBJECTS
from torchmem.analysis.host_state import (
    ANOMALY,
    CUDNN_BENCHMARK,
    MEMORY_HISTORY,
    NODE_BYTES,
    PROFILER,
    checked_note,
)
from torchmem.analysis.leak_fixes import RETAINED_GRAPH
from torchmem.analysis.leaks import detect_growth, detect_run_growth
from torchmem.capture.host_readings import HostReadings
from torchmem.capture.host_scan import HostNodeCounts, HostScanner
from torchmem.capture.host_schedule import HostSchedule
from torchmem.capture.host_trace import HostTracer
from torchmem.capture.host_walk import short
from torchmem.results.leaks import Culprit, LeakReport

_STATE_KINDS = frozenset({ANOMALY, CUDNN_BENCHMARK, MEMORY_HISTORY, PROFILER})


@dataclasses.dataclass(frozen=True)
class HostView:
    """What a report reads of the watcher now: its settings, its state, and its parts."""

    steps: int
    warmup: int
    min_bytes_per_step: int
    source: str
    secondary: bool  # the RSS is read beside the heap
    running: bool
    foreign: bool  # a step came from another thread
    gap: int
    boundary: str
    unit: str
    notes: tuple[str, ...]
    readings: HostReadings
    schedule: HostSchedule
    scanner: HostScanner
    nodes: HostNodeCounts
    tracer: HostTracer


def build_report(v: HostView) -> LeakReport:
    """The verdict, culprits and readings now (a frozen :class:`~torchmem.results.leaks.LeakReport` with
    ``device="host"``)."""
    rd, scanner = v.readings, v.scanner
    notes = list(v.notes)
    source, series = v.source, rd.series.pairs()
    leaking, per_step = False, 0.0
    culprits: tuple[Culprit, ...] = ()
    trend, confidence = 0.0, 0.0
    verdict, reason = early_verdict(v)
    if not verdict:
        # The threshold never hides growth that is large over the run: reported with its total.
        g = detect_run_growth(
            list(rd.ps),
            list(rd.pv),
            first=rd.run_first,
            min_bytes_per_step=v.min_bytes_per_step,
        )
        if not g.leaking:
            # growth every N steps (outputs kept at each validation pass) read densely after each rise: the
            # window's tail is flat for as many readings as a one-time rise's; the jumps over the run are not
            g = rd.stairs() or g
        verdict, reason, trend, confidence = g.verdict, g.reason, g.trend_per_step, g.confidence
        if g.leaking:
            leaking, per_step = True, g.bytes_per_step
        elif v.secondary and len(rd.rv) >= STEADY_READINGS:
            if v.running:
                rd.read_blocks(v.steps)
            r = rd.python_growth(
                detect_growth(list(rd.rs), list(rd.rv), min_bytes_per_step=v.min_bytes_per_step)
            )
            if rd.rss_unexplained:
                notes.append(
                    f"the resident memory grows by {fmt_bytes(rd.rss_unexplained)}/step while neither "
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
                verdict, source, series = "leak", "rss", rd.rss_series.pairs()
                reason = (
                    f"the C heap grows by {fmt_bytes(max(g.trend_per_step, 0.0))}/step at most, but the "
                    f"resident memory grows: {r.reason} (Python's objects live in arenas the C heap does "
                    "not count)"
                )
        chain_rate = sum(f.nodes_per_step for f in scanner.chain_facts)
        if not leaking and chain_rate > 0 and scanner.facts_at is not None:
            lasted = v.nodes.lasted(scanner.facts_at, chain_rate)
            nodes = v.nodes.trend()
            if lasted or (
                lasted is None and verdict in ("below_threshold", "noisy") and nodes is not None and nodes > 0
            ):
                # The scans saw the chain grow, and the node counts since say it went on (or, with none
                # since, they rose and the figure's own test is unsure): a chain never stops growing. The
                # figure may have been read too rarely since (a loaded machine: a reading's cost sets the
                # stride) for its own test to say so.
                leaking, verdict = True, "leak"
                per_step = max(trend, chain_rate * NODE_BYTES)
                confidence = max(confidence, 0.9 if lasted else 0.7)
                last = v.nodes.counts[-1]
                counted = (
                    f"{'at least ' if last[0] in v.nodes.lower else ''}{last[1]:,} live autograd nodes at "
                    f"step {last[0]}"
                    if lasted
                    else f"live autograd nodes +{nodes:.1f}/step"
                )
                reason = (
                    f"an autograd chain grows by {chain_rate:.1f} nodes/step (scans at step "
                    f"{scanner.facts_at}; {counted}) while the figure's own test does not find a leak "
                    f"({_figure_said(reason)}): a chain never stops growing"
                )
        if not leaking and scanner.object_facts:
            growing = scanner.objects_still_growing(v.steps)
            objs = [c for c in scanner.culprits(v.steps) if c.kind in (PYTHON_OBJECTS, RETAINED_GRAPH)]
            if growing and objs and scanner.grew is not None:
                leaking, verdict = True, "leak"
                per_step = sum(c.bytes_per_step for c in objs)
                # The verdict rests on the instance counts, not on the figure: its confidence is theirs
                # (as for a chain: 0.9 where every type still grows as fast as the scans saw, else 0.7),
                # not the concordance of a figure that Python's reuse of freed memory keeps flat.
                scanned = scanner.grew[2]
                lasted = all(r >= scanned.get(k, 0.0) for k, r in growing.items())
                confidence = max(confidence, 0.9 if lasted else 0.7)
                what = ", ".join(f"{short(k)} +{r:.1f}/step" for k, r in list(growing.items())[:3])
                reason = (
                    f"Python objects keep growing ({what} from step {scanner.grew[0]} to {v.steps}; "
                    f"about {fmt_bytes(per_step)}/step from their sizes); the figure shows less of it "
                    f"now: Python reuses memory freed earlier before it takes more ({_figure_said(reason)})"
                )
        if not leaking and scanner.facts_at is not None:
            states = [c for c in scanner.culprits(v.steps) if c.kind in _STATE_KINDS]
            still = _states_still_growing(v, states, trend)
            if still:
                leaking, verdict = True, "leak"
                per_step = sum(c.bytes_per_step for c in states)
                reason = (
                    f"{still} since step {scanner.facts_at}, as it grew when the scans named "
                    f"{', '.join(c.kind for c in states)} (about {fmt_bytes(per_step)}/step); the "
                    f"figure's own test: {_figure_said(reason)}"
                )
        if leaking:
            culprits = scanner.culprits(v.steps)
            notes.extend(scanner.state_notes)
            if not culprits:
                notes.append(_unexplained_note(v))
        else:
            if rd.detected_at is not None:
                verdict = "stopped"
            if scanner.facts_at is not None:
                seen = scanner.culprits(v.steps)
                notes.append(
                    f"growth was seen at step {scanner.facts_at} "
                    f"({'; '.join(c.fix for c in seen[:2])}), and did not last"
                )
    stride_note = v.schedule.note()
    if stride_note:
        notes.append(stride_note)
    if v.source == "heap":
        notes.append(
            "figure: the C heap in use (glibc mallinfo2: autograd nodes, CPU tensors, C++ state), with "
            "the resident set size for Python's own objects"
        )
    nodes_note = v.nodes.note()
    if nodes_note:
        notes.append(nodes_note)
    notes.extend(v.tracer.text())
    scan_steps = scanner.scan_steps
    if scan_steps:
        notes.append(
            f"culprit scans at steps {', '.join(map(str, scan_steps[:6]))}"
            f"{' ...' if len(scan_steps) > 6 else ''} took {scanner.seconds * 1e3:.0f} ms in all"
        )
    return LeakReport(
        device="host",
        source=source,
        mode="light",
        steps=v.steps,
        warmup=v.warmup,
        leaking=leaking,
        bytes_per_step=per_step,
        confidence=confidence,
        detected_at=rd.detected_at,
        stopped_at=None if leaking else rd.stopped_at,
        reason=reason,
        culprits=culprits,
        series=series,
        notes=tuple(notes),
        verdict=verdict,
        trend_per_step=trend,
        min_bytes_per_step=v.min_bytes_per_step,
        boundary=v.boundary,
        unit=v.unit,
    )


def _unexplained_note(v: HostView) -> str:
    """Why growth found leaking has no culprit: what the last sequence checked, or why none looked."""
    scanner = v.scanner
    if scanner.checked is not None:
        state, account = scanner.checked
        return checked_note(
            account,
            state,
            types_counted=scanner.types_counted,
            containers=scanner.containers_seen,
        )
    if scanner.scan_steps:
        tensors = (
            "tensor storages on the CPU that no growing container keeps"
            if scanner.cpu_tensors  # a GPU run: no device report watches the CPU
            else "tensor storages on the CPU (see the device report)"
        )
        return (
            f"no growing autograd chain or Python objects explain it: {tensors}, or C/C++ allocations of a "
            "library"
        )
    where = (
        "steps came from another thread than the one that started the watch"
        if v.foreign
        else "the growth was found too late in the run"
    )
    return f"what grows was not looked for: {where}"


def _states_still_growing(v: HostView, states: Sequence[Culprit], trend: float) -> str:
    """Why the growth that ``states`` explained goes on (``""`` when it does not): anomaly mode while the
    live autograd nodes keep rising; another state while the host figure's trend is still up."""
    facts_at = v.scanner.facts_at
    if not states or v.steps - (facts_at or v.steps) < 2 * v.gap:
        return ""
    kinds = {c.kind for c in states}
    if kinds == {ANOMALY}:
        counts = v.nodes.counts
        last = counts[-1] if counts else None
        rate = v.nodes.trend()
        if last is None or last[0] <= (facts_at or 0) or rate is None or rate <= 0:
            return ""
        return f"live autograd nodes keep rising ({rate:+.1f}/step)"
    if trend <= 0:
        return ""
    return f"host memory keeps growing ({fmt_bytes(int(trend))}/step)"


def early_verdict(v: HostView) -> tuple[str, str]:
    """``("no_steps" | "too_few", reason)`` before there are readings enough for a verdict, else
    ``("", "")``."""
    first = v.warmup + STEADY_READINGS * v.schedule.stride
    if v.steps == 0:
        return "no_steps", "no steps were recorded: step() was never called"
    readings = max(len(v.readings.pv), len(v.readings.rv))
    if v.steps <= v.warmup or readings < STEADY_READINGS:
        return (
            "too_few",
            f"{v.steps} step(s), {readings} reading(s) after the {v.warmup}-step warm-up: not "
            f"enough to judge; the first verdict needs {first} steps",
        )
    return "", ""


# The figure's own test ends its "no leak" with advice on how to make it report one; where the instance
# counts, a chain or a state found the leak anyway, that advice contradicts the verdict it is quoted in.
_ADVICE = (": no leak of min_bytes_per_step or more;", ": pass min_bytes_per_step=")


def _figure_said(reason: str) -> str:
    """What the figure's own test found, without its advice for finding a leak (quoted where the leak was
    found by other evidence).

    Example:
        >>> _figure_said("memory grows by 1 KiB/step, below the reporting threshold of 4 KiB/step "
        ...              "(min_bytes_per_step=4096): pass min_bytes_per_step=512 (...) to report it")
        'memory grows by 1 KiB/step, below the reporting threshold of 4 KiB/step (min_bytes_per_step=4096)'
    """
    for marker in _ADVICE:
        head, found, _ = reason.partition(marker)
        if found:
            return head
    return reason
