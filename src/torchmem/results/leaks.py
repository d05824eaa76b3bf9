"""What ``torchmem.watch()`` finds: :class:`LeakReport`, its :class:`Culprit` s, and the facts behind them.

:class:`Growth` is the verdict of the growth detector on a series of per-step figures; :class:`SiteGrowth`
the captured facts about one growing allocation site (its growth, its live storages and the typed
:class:`~torchmem.results.holders.HolderPath` s of what holds them), the input of the attribution;
:class:`Culprit` one reason memory grows (kind, allocation site, the readable holder path, the fix);
:class:`LeakReport` the whole watch. Each has ``to_dict()`` and ``from_dict()`` (``LeakReport.from_dict``
also reads reports stored before ``verdict``, ``trend_per_step`` and ``min_bytes_per_step`` existed), and
``str(report)`` is the terminal text: the verdict, the figures, then each culprit with its site, holder and
fix.

Plain frozen data: the detection and attribution rules live in :mod:`torchmem.analysis.leaks`; nothing here
imports torch or reads a device.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from torchmem._format import fmt_bytes
from torchmem.results._dicts import ResultFormatError, from_mapping
from torchmem.results.holders import HolderPath


def fmt_rate(b: float, unit: str = "step") -> str:
    """A growth rate with its sign and unit: ``"step"``, or ``"s"`` (a :class:`LeakReport` with ``unit="s"``,
    decided per second of a timeline).

    Example:
        >>> fmt_rate(2**20), fmt_rate(-1536, "s")
        ('+1.00 MiB/step', '-1.50 KiB/s')
    """
    sign = "+" if b >= 0 else "-"
    return f"{sign}{fmt_bytes(int(abs(b)))}/{unit}"


_rate = fmt_rate


@dataclass(frozen=True)
class Growth:
    """The verdict of :func:`torchmem.analysis.leaks.detect_growth` on a series of per-step figures.

    Attributes:
        leaking: Steady growth per step was found.
        bytes_per_step: Estimated steady-state growth (0 when not leaking).
        confidence: 0..1: how consistently the figure rises over the window (Kendall's concordance).
        method: ``"steady"`` (every recent step grew by a similar amount), ``"robust"`` (a long window whose
            floors rise in each third, beyond the noise), ``"staircase"`` (a short run whose figure never fell
            and rose at about the same rate in each quarter: growth that comes every few steps),
            ``"periodic"`` (jumps of a similar size at a regular interval, none given back: a validation pass
            every N steps that keeps its outputs; its confidence grows from 0.75 at 4 jumps to 1 at 8),
            ``"short"`` (a run too short for these, each step rising by the same large amount), or ``"none"``.
        samples: Samples after the warm-up that were considered.
        reason: Why it is or is not a leak, in words, with what to do next when nothing was found.
        verdict: ``"leak"``; or why nothing was reported: ``"below_threshold"`` (real, steady growth, smaller
            than ``min_bytes_per_step``), ``"too_few"`` (not enough readings to judge), ``"flat"``,
            ``"shrinking"``, ``"noisy"`` (the figure moves, with no sustained upward trend); ``""`` where the
            series was not explained (``explain=False``).
        trend_per_step: The growth per step that was measured, also when it is below the threshold
            (``bytes_per_step`` stays 0 unless leaking).
        min_bytes_per_step: The reporting threshold the series was judged against.

    Example:
        >>> print(Growth(True, 2**20, 1.0, "steady", 5, "grew by 1048576 B/step", "leak", 2**20, 2**18))
        leak: +1.00 MiB/step (steady, confidence 1.00, 5 samples): grew by 1048576 B/step
    """

    leaking: bool
    bytes_per_step: float
    confidence: float
    method: str
    samples: int
    reason: str
    verdict: str = ""
    trend_per_step: float = 0.0
    min_bytes_per_step: float = 0.0

    def __str__(self) -> str:
        if self.leaking:
            return (
                f"leak: {_rate(self.bytes_per_step)} ({self.method}, confidence {self.confidence:.2f}, "
                f"{self.samples} samples): {self.reason}"
            )
        return f"no leak ({self.verdict or 'not explained'}): {self.reason}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Growth:
        return from_mapping(cls, d)


@dataclass(frozen=True)
class Culprit:
    """One reason memory grows: an allocation site and the object that keeps what it allocates.

    Attributes:
        kind: One of ``retained_graph`` (a container keeps tensors with their autograd graphs),
            ``graph_chain`` (one variable's graph grows from step to step: ``total += loss``, a
            recurrent state not detached), ``exception`` (stored exceptions keep their frames' tensors),
            ``cycle`` (a reference cycle that only ``gc`` frees), ``hook`` (a hook's closure keeps
            outputs), ``growing_tensor`` (one tensor re-allocated larger every step, such as ``torch.cat``
            onto a cache), ``global_registry`` (a module-level container), ``cache`` (a dict that never
            evicts), ``device_accumulation`` (a list of device tensors), ``kept_optimizer`` (a container of
            optimizers, each keeping the state its ``step()`` made), ``unknown``.
        site: The allocation site that grows most, ``"file.py:42"`` (the user's line, not torch internals).
        sites: Every growing site of this culprit with its bytes per step.
        holder: The readable path of the object that keeps the memory (from :func:`torchmem.holders`).
        bytes: Bytes this culprit retained over the attribution window.
        bytes_per_step: Growth per step attributed to it.
        graph_bytes: Bytes of autograd-saved tensors among them (retained graphs), per step.
        fix: The one-line fix.
        origin: What makes the memory grow where no allocation site does: a process state, such as ``"a
            torch.profiler that is recording"`` (the host watcher's state culprits); ``""`` otherwise.

    Example:
        >>> c = Culprit("cache", "train.py:12", (("train.py:12", 2.0**20),), "__main__.cache['k3']", 2**23,
        ...             2.0**20, 0.0, "the cache `cache` never evicts (+1.0 MiB/step): bound it")
        >>> print(c)
        cache: +1.00 MiB/step born at train.py:12
          held by __main__.cache['k3']
          fix: the cache `cache` never evicts (+1.0 MiB/step): bound it
    """

    kind: str
    site: str | None
    sites: tuple[tuple[str, float], ...]
    holder: str | None
    bytes: int
    bytes_per_step: float
    graph_bytes: float
    fix: str
    origin: str = ""

    def lines(self, unit: str = "step") -> list[str]:
        """Its lines: what and where, then (indented by two) holder, graph bytes, other sites and fix
        (``unit``: ``"step"``, or ``"s"`` for a per-second timeline verdict).

        With several sites, each one's rate is its own share: the first line gives the culprit's total
        (``in all``) and the first site's share, each other site its own.
        """
        where = self.site or "an unknown site"
        total = _rate(self.bytes_per_step, unit)
        if len(self.sites) > 1:
            first_site, first_share = self.sites[0]
            out = [f"{self.kind}: {total} in all; {_rate(first_share, unit)} born at {first_site}"]
        elif self.origin and not self.site:
            out = [f"{self.kind}: {total} from {self.origin}"]
        else:
            out = [f"{self.kind}: {total} born at {where}"]
        if self.holder:
            out.append(f"  held by {self.holder}")
        if self.graph_bytes:
            out.append(f"  of which autograd-saved tensors: {_rate(self.graph_bytes, unit)}")
        for site, per in self.sites[1:4]:
            out.append(f"  also born at {site}: {_rate(per, unit)}")
        if len(self.sites) > 4:
            rest = self.sites[4:]
            out.append(
                f"  also born at {len(rest)} more site{'s' if len(rest) > 1 else ''}: "
                f"{_rate(sum(per for _, per in rest), unit)}"
            )
        out.append(f"  fix: {self.fix}")
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["sites"] = [{"site": s, "bytes_per_step": b} for s, b in self.sites]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Culprit:
        if not isinstance(d, Mapping):
            raise ResultFormatError(f"a stored Culprit must be an object, got {type(d).__name__}")
        sites = d.get("sites") or ()
        try:
            pairs = tuple((str(s["site"]), float(s["bytes_per_step"])) for s in sites)
        except (KeyError, TypeError, ValueError) as e:
            raise ResultFormatError(f"Culprit.sites: {sites!r} is not a list of site/bytes_per_step") from e
        return from_mapping(cls, d, sites=pairs)


@dataclass(frozen=True)
class SiteGrowth:
    """Captured facts about one growing allocation site (input of :func:`torchmem.analysis.leaks.attribute`).

    Attributes:
        site: The allocation site (``"file.py:42"``), ``None`` where unknown.
        bytes_per_step: How much its live bytes grow per step.
        live_bytes: Its live bytes at the end of the attribution window.
        storages: Live storages born there (sampled for holder paths).
        storages_per_step: How many more live storages it has per step (below 0.5: one tensor growing).
        paths: Typed holder paths of the sampled storages (what keeps them).
        saved_bytes: Bytes of its live storages that autograd saved for backward.
        in_cycle: Its storages are held only by unreachable reference cycles.
        cycle_types: Type names of the objects in those cycles.

    Example:
        >>> print(SiteGrowth("train.py:12", 2.0**20, 2**23, 8, 1.0, ()))
        train.py:12: +1.00 MiB/step, 8.00 MiB live in 8 storages (+1.0/step), no holder found
    """

    site: str | None
    bytes_per_step: float
    live_bytes: int
    storages: int
    storages_per_step: float
    paths: tuple[HolderPath, ...]
    saved_bytes: int = 0
    in_cycle: bool = False
    cycle_types: tuple[str, ...] = ()

    def __str__(self) -> str:
        site = self.site or "an unknown site"
        head = (
            f"{site}: {_rate(self.bytes_per_step)}, {fmt_bytes(self.live_bytes)} live in {self.storages} "
            f"storages ({self.storages_per_step:+.1f}/step)"
        )
        if self.in_cycle:
            return f"{head}, held by an unreachable cycle of {', '.join(self.cycle_types[:3]) or 'objects'}"
        if not self.paths:
            return f"{head}, no holder found"
        return "\n".join([f"{head}, held by:"] + [f"  {p}" for p in self.paths])

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["paths"] = [p.to_dict() for p in self.paths]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SiteGrowth:
        return from_mapping(cls, d)


@dataclass(frozen=True)
class LeakReport:
    """What :func:`torchmem.watch` found.

    Attributes:
        device: The device watched.
        source: Where the per-step figure comes from: ``"allocator"`` (the caching allocator's allocated
            bytes) or ``"ledger"`` (torchmem's exact tensor accounting, used where the device has no
            allocator statistics, such as the CPU).
        mode: ``"light"`` or ``"deep"``.
        steps: Steps seen.
        warmup: Steps ignored at the start.
        leaking: Memory grows steadily (as of the last reading).
        bytes_per_step: Growth per step (0 when not leaking).
        confidence: 0..1 (see :class:`Growth`).
        detected_at: The step at which growth was first detected, if ever.
        stopped_at: The step at which growth detected earlier was no longer seen (a cache that filled up).
        reason: The detector's verdict in words; when nothing was reported, why (growth below the threshold,
            too few steps, flat, shrinking, noisy) and what to do next.
        culprits: Who makes it grow, largest first (filled once growth is found, or in deep mode).
        series: ``(step, bytes)`` readings.
        notes: Anything the user should know about the figures (sampling stride, errors in hooks).
        verdict: ``"leak"``, ``"stopped"`` (growth seen earlier stopped), or why nothing is reported:
            ``"below_threshold"``, ``"no_steps"``, ``"too_few"``, ``"flat"``, ``"shrinking"``, ``"noisy"``
            (see :class:`Growth`), ``"inner_growth"`` (the peak grows inside each call), ``"gathered"`` (a
            GPU run's host memory holds what an inference loop gathers: its culprits say where),
            ``"device_graphs"`` (a GPU run's host growth is held by the autograd graphs the device's leak
            report names: the same leak, said once), ``"bounded"`` (the growth is held where its owner bounds
            it: ``torch.optim.LBFGS``'s curvature history, ``history_size`` pairs at most; ``torchmem run``);
            ``""`` in reports written before it existed.
        trend_per_step: The measured growth per step, also below the threshold (``bytes_per_step`` stays 0
            unless leaking).
        min_bytes_per_step: The reporting threshold the watch used (0: unknown).
        boundary: What one step was (``torchmem run`` chooses it): ``"optimizer step"``, ``"backward()
            call"``, ``"top-level Model() call"``, ``"DataLoader batch"``, ``"generate() call"``, ``"return
            of f()"`` (``--step-marker``), ``"second"`` (no repeating step: the sampled timeline, and the
            figures are per second); ``""``: steps counted by ``watch()``'s caller.
        unit: ``"step"``, or ``"s"`` when the figures are per second of the timeline.

    Example:
        >>> r = LeakReport("cpu", "ledger", "light", 8, 3, False, 0.0, 0.0, None, None, "flat", (), ((4, 0),))
        >>> print(r)
        no leak on cpu over 8 steps: flat
          ledger figure: 0 B at step 4 -> 0 B at step 4 (warm-up 3 steps, light mode)
    """

    device: str
    source: str
    mode: str
    steps: int
    warmup: int
    leaking: bool
    bytes_per_step: float
    confidence: float
    detected_at: int | None
    stopped_at: int | None
    reason: str
    culprits: tuple[Culprit, ...]
    series: tuple[tuple[int, int], ...]
    notes: tuple[str, ...] = field(default=())
    verdict: str = ""
    trend_per_step: float = 0.0
    min_bytes_per_step: int = 0
    boundary: str = ""
    unit: str = "step"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["culprits"] = [c.to_dict() for c in self.culprits]
        d["series"] = [list(p) for p in self.series]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LeakReport:
        """The report stored as ``to_dict()``; one stored before ``verdict``, ``trend_per_step`` and
        ``min_bytes_per_step`` existed reads with ``""``, ``0.0`` and ``0``."""
        return from_mapping(cls, d)

    def __str__(self) -> str:
        """The terminal text: verdict, figures, then each culprit with site, holder and fix."""
        timeline = self.unit == "s"
        over = f"{self.steps} s of the timeline" if timeline else f"{self.steps} steps"
        if self.leaking and timeline:
            head = (
                f"LEAK on {self.device}: {_rate(self.bytes_per_step, 's')} over {over} "
                f"(no repeating step was found; confidence {self.confidence:.2f})"
            )
        elif self.leaking:
            detected = f", detected at step {self.detected_at}" if self.detected_at is not None else ""
            head = (
                f"LEAK on {self.device}: {_rate(self.bytes_per_step)} over {over} "
                f"(confidence {self.confidence:.2f}{detected})"
            )
        elif self.verdict == "inner_growth":
            head = f"no leak on {self.device}, but the peak grows inside each call over {over}: {self.reason}"
        elif self.stopped_at is not None:
            head = (
                f"no leak now on {self.device}: growth seen at step {self.detected_at} stopped at step "
                f"{self.stopped_at} ({self.steps} steps)"
            )
        elif self.verdict == "below_threshold":
            head = f"growth below the leak threshold on {self.device} over {over}: {self.reason}"
        elif self.verdict == "gathered":
            head = f"no leak on {self.device}, results gathered over {over}: {self.reason}"
        elif self.verdict == "device_graphs":
            head = f"no other leak on {self.device} over {over}: {self.reason}"
        elif self.verdict in ("no_steps", "too_few"):
            head = f"not enough steps to judge on {self.device}: {self.reason}"
        elif self.verdict == "noisy":
            head = f"no steady growth on {self.device} over {over}: {self.reason}"
        else:
            head = f"no leak on {self.device} over {over}: {self.reason}"
        lines = [head]
        if self.boundary and not timeline:
            lines.append(f"  one step = one {self.boundary}")
        if self.series:
            (first_step, first), (last_step, last) = self.series[0], self.series[-1]
            if timeline:
                lines.append(
                    f"  {self.source} figure: {fmt_bytes(first)} at {first_step} s -> {fmt_bytes(last)} at "
                    f"{last_step} s of the sampled timeline"
                )
            else:
                lines.append(
                    f"  {self.source} figure: {fmt_bytes(first)} at step {first_step} -> {fmt_bytes(last)} "
                    f"at step {last_step} (warm-up {self.warmup} steps, {self.mode} mode)"
                )
        if self.leaking:
            lines.append(f"  {self.reason}")
        elif self.stopped_at is not None and self.reason and self.verdict != "inner_growth":
            lines.append(f"  now: {self.reason}")
        for i, c in enumerate(self.culprits, 1):
            first_line, *rest = c.lines(self.unit)
            lines.append(f"  [{i}] {first_line}")
            lines.extend(f"    {line}" for line in rest)
        if self.leaking and not self.culprits:
            lines.append(
                "  no allocation site was attributed (memory outside tensor storages, or other threads)"
            )
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def no_steps_text(leak: LeakReport | None, why: str) -> str:
    """The end-of-run line for a run that counted 0 steps, in agreement with its leak verdict.

    ``why`` says why no step was counted. Where the verdict was made per second of the sampled timeline
    (``leak.unit == "s"``) the run *has* a verdict: the line says 0 steps without denying it, after the
    timeline's verdict when that is not a leak (a leak is printed in full before it, with what holds it);
    otherwise no verdict could be made.

    Example:
        >>> no_steps_text(None, "no repeating step was found")
        'no leak verdict: 0 steps: no repeating step was found'
    """
    if leak is None or leak.unit != "s":
        return f"no leak verdict: 0 steps: {why}"
    if leak.leaking or leak.detected_at is not None:
        return f"0 steps: {why}"
    return f"{str(leak).splitlines()[0]}\n0 steps: {why}"


__all__ = ["Culprit", "Growth", "LeakReport", "SiteGrowth", "fmt_rate", "no_steps_text"]
