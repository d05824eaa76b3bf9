"""Distributed runs' results: one rank's figures, the merged report of a job's captures, NCCL's buffers.

* :class:`RankStats`: one rank's memory figures with its identity (``torchmem.distributed.local_stats()``,
  ``gather_stats()``), and :class:`DistributedStats`, every rank's, with the spread between them.
* :class:`MergedReport` (``torchmem report run.rank*.jsonl``): a row per rank, the imbalance and its cause
  when torchmem can see it, each rank's leak verdict, the first OOM with every rank's state at that
  moment, and the ranks that stopped early.
* :func:`estimate_nccl`: NCCL's communication buffers estimated from its environment (pure).
"""

from __future__ import annotations

import signal
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from torchmem._format import fmt_bytes, text_table
from torchmem.results._dicts import from_mapping

NCCL_BUFFSIZE_DEFAULT = 4 * 1024 * 1024
"""NCCL's default ``NCCL_BUFFSIZE``: the SIMPLE protocol's buffer per channel and connection."""
NCCL_CHANNELS_DEFAULT = 2
"""Channels assumed when the environment does not set them (NCCL's lowest; NVLink systems use more)."""


@dataclass(frozen=True)
class NcclEstimate:
    """NCCL's device buffers, estimated from its environment: a lower bound outside the caching allocator.

    ``bytes = communicators * channels * 2 * buffsize`` (ring and tree receive buffers of the SIMPLE
    protocol, the largest; the LL and LL128 buffers and the proxy's are left out).
    """

    communicators: int
    channels: int
    buffsize: int
    bytes: int
    channels_from_env: bool = False
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> NcclEstimate:
        return from_mapping(cls, d)

    def __str__(self) -> str:
        how = "" if self.channels_from_env else " (assumed: NCCL picks more on NVLink)"
        return (
            f"NCCL buffers >= {fmt_bytes(self.bytes)}: {self.communicators} communicator"
            f"{'s' if self.communicators != 1 else ''} x {self.channels} channels{how} x 2 x NCCL_BUFFSIZE "
            f"{fmt_bytes(self.buffsize)}"
        )


def _env_int(env: Mapping[str, str], name: str) -> int | None:
    try:
        v = int(str(env[name]).strip(), 0)
    except (KeyError, ValueError):
        return None
    return v if v > 0 else None


def estimate_nccl(env: Mapping[str, str], communicators: int) -> NcclEstimate | None:
    """NCCL's buffers for ``communicators`` communicators under the environment ``env`` (``None`` for 0).

    Reads ``NCCL_BUFFSIZE`` (default 4 MiB) and the channel count from ``NCCL_MIN_NCHANNELS`` /
    ``NCCL_MAX_NCHANNELS`` (default 2, NCCL's lowest: the estimate is then a lower bound).

    Example:
        >>> estimate_nccl({"NCCL_BUFFSIZE": "8388608"}, 1).bytes == 2 * 2 * 8 * 1024 * 1024
        True
    """
    if communicators <= 0:
        return None
    buffsize = _env_int(env, "NCCL_BUFFSIZE") or NCCL_BUFFSIZE_DEFAULT
    lo, hi = _env_int(env, "NCCL_MIN_NCHANNELS"), _env_int(env, "NCCL_MAX_NCHANNELS")
    channels = lo if lo is not None else (min(hi, NCCL_CHANNELS_DEFAULT) if hi is not None else None)
    from_env = channels is not None
    channels = channels or NCCL_CHANNELS_DEFAULT
    notes = []
    if "NCCL_BUFFSIZE" not in env:
        notes.append("NCCL_BUFFSIZE unset: NCCL's default 4 MiB")
    return NcclEstimate(
        communicators, channels, buffsize, communicators * channels * 2 * buffsize, from_env, tuple(notes)
    )


def nccl_note(unexplained: int | None, estimate: NcclEstimate | None) -> str | None:
    """Words for the breakdown's "unexplained" row when NCCL's buffers can account for it (``None`` when
    there is no NCCL communicator or nothing unexplained). Pure: the breakdown calls it with its figure."""
    if estimate is None or unexplained is None or unexplained <= 0:
        return None
    share = min(estimate.bytes, unexplained)
    if estimate.bytes > 2 * unexplained:
        return f"NCCL: {estimate.communicators} communicator(s), buffers not (all) allocated yet"
    return f"of which NCCL buffers ~{fmt_bytes(share)} ({estimate})"


# ---------------------------------------------------------------------------------------------------------
# one rank, live (torchmem.distributed)


@dataclass(frozen=True)
class RankStats:
    """One rank's memory figures and its identity (small: what ``gather_stats()`` sends to rank 0)."""

    rank: int
    world_size: int
    device: str
    local_rank: int | None = None
    host: str = ""
    pid: int = 0
    allocated: int | None = None
    reserved: int | None = None
    peak_allocated: int | None = None
    peak_reserved: int | None = None
    process_used: int | None = None
    device_used: int | None = None
    device_total: int | None = None
    other_pids: tuple[int, ...] = ()
    """Other processes with a context on this rank's device (NVML)."""
    nccl: NcclEstimate | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RankStats:
        return from_mapping(cls, d)

    def __str__(self) -> str:
        text = (
            f"rank {self.rank}/{self.world_size} on {self.device}: allocated {fmt_bytes(self.allocated)}, "
            f"reserved {fmt_bytes(self.reserved)}, peak allocated {fmt_bytes(self.peak_allocated)}"
        )
        if self.process_used is not None:
            text += f", process {fmt_bytes(self.process_used)}"
        if self.nccl is not None:
            text += f"; {self.nccl}"
        return text


@dataclass(frozen=True)
class DistributedStats:
    """Every rank's :class:`RankStats` (on rank 0, from ``gather_stats()``), with the spread between them."""

    ranks: tuple[RankStats, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"ranks": [r.to_dict() for r in self.ranks]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> DistributedStats:
        return cls(tuple(RankStats.from_dict(r) for r in d.get("ranks") or ()))

    @property
    def contexts(self) -> dict[str, tuple[int, ...]]:
        """Per device (``host:device``): the ranks whose process has a context there."""
        by_pid = {(r.host, r.pid): r.rank for r in self.ranks}
        out: dict[str, tuple[int, ...]] = {}
        for r in self.ranks:
            others = [by_pid[(r.host, p)] for p in r.other_pids if (r.host, p) in by_pid]
            out[f"{r.host}:{r.device}"] = tuple(sorted({r.rank, *others}))
        return out

    def __str__(self) -> str:
        rows = [["rank", "device", "allocated", "peak alloc", "reserved", "process", "contexts"]]
        ctx = self.contexts
        for r in sorted(self.ranks, key=lambda x: x.rank):
            rows.append(
                [
                    str(r.rank),
                    r.device,
                    fmt_bytes(r.allocated),
                    fmt_bytes(r.peak_allocated),
                    fmt_bytes(r.reserved),
                    fmt_bytes(r.process_used),
                    str(len(ctx.get(f"{r.host}:{r.device}", (r.rank,)))),
                ]
            )
        lines = [f"{len(self.ranks)} ranks:", *text_table(rows, set(range(2, 7)))]
        peaks = [r.peak_allocated for r in self.ranks if r.peak_allocated is not None]
        if len(peaks) > 1 and min(peaks) > 0:
            lines.append(
                f"  spread: peak allocated {fmt_bytes(max(peaks) - min(peaks))} between ranks "
                f"({max(peaks) / min(peaks):.2f}x)"
            )
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------
# a job's captures, merged (torchmem report run.rank*.jsonl)


@dataclass(frozen=True)
class RankRow:
    """One rank's (or followed child process's) capture, in short."""

    label: str
    """``"rank 1"``, ``"proc 0"`` (a followed child), or ``"main"`` (the process that started children)."""
    capture: str
    rank: int | None = None
    world_size: int | None = None
    local_rank: int | None = None
    host: str = ""
    pid: int | None = None
    device: str = ""
    finished: bool = True
    ended: str = ""
    """How the run ended, in words (``"exit"``, ``"oom (1)"``, ``"terminated by SIGTERM"``)."""
    exit_code: int | None = None
    stopped_at: float | None = None
    """Wall-clock time (seconds since the epoch) the rank stopped: its end reading, else (killed) its last
    record. ``None`` when the capture has no start time."""
    steps: int | None = None
    seconds: float | None = None
    peak_allocated: int | None = None
    peak_reserved: int | None = None
    process_used: int | None = None
    contexts: int | None = None
    """Processes of this job with a context on this rank's device (``None``: unknown, as on the CPU)."""
    context_of: tuple[str, ...] = ()
    """Labels of the other ranks with a context on this rank's device."""
    leaking: bool = False
    leak_per_step: float = 0.0
    leak_text: str = ""
    """The rank's leak verdict, as its own report says it."""
    slow_growth: float = 0.0
    """Bytes per step the rank's memory grew by below its leak threshold (verdict ``below_threshold``)."""
    timeline: str = ""
    nccl: NcclEstimate | None = None
    nccl_measured: int | None = None
    """NCCL's device memory measured on this rank (growth outside the allocator since its first process
    group, read while the communicators existed), ``None`` where only the estimate is known."""
    nccl_communicators: int | None = None
    nccl_method: str | None = None
    """How ``nccl_measured`` was found (``"measured"``, ``"growth"``: see ``MemoryStats.nccl_method``)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RankRow:
        return from_mapping(cls, d)


@dataclass(frozen=True)
class RankState:
    """What one rank held at the moment of the job's first OOM."""

    label: str
    step: int | None
    allocated: int | None
    reserved: int | None
    peak_allocated: int | None
    how: str
    """``"snapshot"`` (written when the OOM flag was seen), ``"sample"`` (its nearest timeline reading),
    or ``"none"`` (nothing recorded near that moment)."""
    delay: float | None = None
    """Seconds between the OOM and this reading."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class FirstOOM:
    """The job's first out-of-memory error and every rank's state then."""

    label: str
    step: int | None
    site: str | None
    caught: bool | None
    summary: str
    states: tuple[RankState, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class MergedReport:
    """A distributed job's captures merged: see the module docstring."""

    rows: tuple[RankRow, ...]
    world_size: int | None = None
    imbalance: tuple[str, ...] = ()
    """Imbalances between ranks, each with its cause when one is visible."""
    stopped: tuple[str, ...] = ()
    """Ranks that stopped early or failed, and ranks of the world with no capture."""
    first_oom: FirstOOM | None = None
    notes: tuple[str, ...] = field(default=())
    first_stopped: str | None = None
    """The label of the rank that stopped first when others stopped after it (killed or failed): the cause
    of a job the launcher ended; ``None`` when no rank stopped early or failed."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> MergedReport:
        oom = d.get("first_oom")
        return cls(
            rows=tuple(RankRow.from_dict(r) for r in d.get("rows") or ()),
            world_size=d.get("world_size"),
            imbalance=tuple(d.get("imbalance") or ()),
            stopped=tuple(d.get("stopped") or ()),
            first_oom=None
            if not oom
            else FirstOOM(
                label=oom["label"],
                step=oom.get("step"),
                site=oom.get("site"),
                caught=oom.get("caught"),
                summary=oom.get("summary", ""),
                states=tuple(from_mapping(RankState, s) for s in oom.get("states") or ()),
            ),
            notes=tuple(d.get("notes") or ()),
            first_stopped=d.get("first_stopped"),
        )

    def row(self, label: str) -> RankRow | None:
        return next((r for r in self.rows if r.label == label), None)

    def __str__(self) -> str:
        return render_merged(self)


def signal_name(signum: int) -> str:
    """``15`` -> ``"SIGTERM"`` (``"signal 99"`` for a number without a name)."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def end_words(reason: str, exit_code: int | None) -> str:
    """An end record's reason in words: ``"terminated by SIGTERM"`` for a signal (exit code ``-N``), else the
    reason with spaces (``"keyboard interrupt"``)."""
    if reason == "signal" and exit_code is not None and exit_code < 0:
        return f"terminated by {signal_name(-exit_code)}"
    return reason.replace("_", " ")


def ended_text(reason: str, exit_code: int | None) -> str:
    """How a run ended, from its end record: ``"terminated by SIGTERM"`` for a signal (exit code ``-N``),
    else the reason with the exit code when it is not 0.

    Example:
        >>> ended_text("signal", -15)
        'terminated by SIGTERM'
        >>> ended_text("keyboard_interrupt", 130)
        'keyboard interrupt (130)'
    """
    words = end_words(reason, exit_code)
    if reason == "signal" and exit_code is not None and exit_code < 0:
        return words
    return words + (f" ({exit_code})" if exit_code else "")


def _s(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.1f} s"


def render_merged(rep: MergedReport) -> str:
    """The merged report as plain text."""
    world = f" of a world of {rep.world_size}" if rep.world_size else ""
    lines = [f"torchmem: {len(rep.rows)} captures merged{world}"]
    rows = [
        ["", "device", "steps", "ran", "peak alloc", "peak reserved", "process", "contexts", "leak", "ended"]
    ]
    for r in rep.rows:
        rows.append(
            [
                r.label,
                r.device,
                "n/a" if r.steps is None else str(r.steps),
                _s(r.seconds),
                fmt_bytes(r.peak_allocated),
                fmt_bytes(r.peak_reserved),
                fmt_bytes(r.process_used),
                "n/a" if r.contexts is None else str(r.contexts),
                f"+{fmt_bytes(int(r.leak_per_step))}/step" if r.leaking else "no",
                r.ended,
            ]
        )
    lines += text_table(rows, {2, 3, 4, 5, 6, 7})
    if rep.stopped:
        lines.append("")
        lines += [f"STOPPED: {s}" for s in rep.stopped]
    if rep.imbalance:
        lines.append("")
        lines.append("Imbalance between ranks:")
        lines += [f"  - {s}" for s in rep.imbalance]
    if rep.first_oom is not None:
        o = rep.first_oom
        lines.append("")
        at = f" at step {o.step}" if o.step is not None else ""
        where = f", raised at {o.site}" if o.site else ""
        lines.append(f"First OOM: {o.label}{at}{where}{' (caught by the program)' if o.caught else ''}")
        if o.summary:
            lines += ["  " + x for x in o.summary.splitlines()]
        if o.states:
            lines.append("  every rank at that moment:")
            st = [["", "step", "allocated", "reserved", "peak alloc", "read from"]]
            for s in o.states:
                how = {"snapshot": "snapshot at the OOM flag", "sample": "nearest sample", "none": "nothing"}
                when = f" ({s.delay:+.2f} s)" if s.delay is not None and s.how != "none" else ""
                st.append(
                    [
                        s.label,
                        "n/a" if s.step is None else str(s.step),
                        fmt_bytes(s.allocated),
                        fmt_bytes(s.reserved),
                        fmt_bytes(s.peak_allocated),
                        how.get(s.how, s.how) + when,
                    ]
                )
            lines += ["  " + x for x in text_table(st, {1, 2, 3, 4})]
    for r in rep.rows:
        lines.append("")
        lines.append(f"{r.label} ({r.capture}):")
        if r.timeline:
            lines.append(f"  timeline  {r.timeline}")
        if r.nccl_measured is not None:
            n = r.nccl_communicators or 0
            said = (
                "measured through NVML around the calls that created them"
                if r.nccl_method == "measured"
                else "at most: growth since the first process group, kernels loaded since included"
            )
            lines.append(
                f"  NCCL {fmt_bytes(r.nccl_measured)} outside the caching allocator ({n} communicator"
                f"{'s' if n != 1 else ''}; {said})"
            )
        elif r.nccl is not None:
            lines.append(f"  {r.nccl}")
        lines += ["  " + x for x in (r.leak_text or "leak verdict: none recorded").splitlines()]
    if rep.notes:
        lines.append("")
        lines += [f"note: {n}" for n in rep.notes]
    return "\n".join(lines)


def merged_rows_by_rank(rows: Sequence[RankRow]) -> dict[int, RankRow]:
    return {r.rank: r for r in rows if r.rank is not None}


__all__ = [
    "NCCL_BUFFSIZE_DEFAULT",
    "NCCL_CHANNELS_DEFAULT",
    "DistributedStats",
    "FirstOOM",
    "MergedReport",
    "NcclEstimate",
    "RankRow",
    "RankState",
    "RankStats",
    "end_words",
    "ended_text",
    "estimate_nccl",
    "nccl_note",
    "render_merged",
    "signal_name",
]
