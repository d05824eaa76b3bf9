"""Merging a distributed job's captures (pure): per-rank rows, imbalance and its cause, the first OOM with
every rank's state then, and the ranks that stopped early (:func:`merge_captures`).

Also :func:`gather_rows`: the spread of live :class:`~torchmem.results.ranks.RankStats` (``gather_stats``).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from torchmem._errors import TorchmemError
from torchmem._format import fmt_bytes
from torchmem.results.capture import Capture, final_leak, run_facts, stats_record
from torchmem.results.ranks import FirstOOM, MergedReport, NcclEstimate, RankRow, RankState, ended_text
from torchmem.results.stats import MemoryStats

# An imbalance worth saying: the largest figure this much above the median, and by at least this many bytes.
IMBALANCE_RATIO = 1.10
IMBALANCE_MIN_BYTES = 1024 * 1024
CACHE_SKEW_RATIO = 2.0  # one rank's cached (reserved - allocated) vs the median's
CACHE_SKEW_MIN_BYTES = 64 * 1024 * 1024


def _label(cap: Capture) -> tuple[str, int | None, int | None]:
    """The rank's label, its rank and the world size (the process group's own word first)."""
    head = cap.rank or {}
    pg = cap.ranks[-1] if cap.ranks else None
    launcher = str(head.get("launcher") or "")
    rank = head.get("rank") if isinstance(head.get("rank"), int) else None
    world = head.get("world_size") if isinstance(head.get("world_size"), int) else None
    if launcher == "spawn":
        label = f"proc {rank}"
        if pg is not None and pg.rank is not None:
            label += f" (rank {pg.rank})"
            return label, pg.rank, pg.world_size
        return label, None, None
    if pg is not None and pg.rank is not None:
        return f"rank {pg.rank}", pg.rank, pg.world_size or world
    if rank is not None:
        return f"rank {rank}", rank, world
    return "main", None, None


def _timeline(cap: Capture) -> str:
    known = [s for s in cap.samples if s.allocated is not None]
    if not known:
        return ""
    top = max(known, key=lambda s: s.allocated or 0)
    return (
        f"allocated {fmt_bytes(known[0].allocated)} at {known[0].t:.2f} s -> "
        f"{fmt_bytes(known[-1].allocated)} at {known[-1].t:.2f} s "
        f"(highest {fmt_bytes(top.allocated)} at {top.t:.2f} s, {len(known)} samples)"
    )


def _end_stats(cap: Capture) -> MemoryStats | None:
    rec = stats_record(cap, "end")
    return rec.as_stats() if rec is not None else None


def _row(cap: Capture) -> RankRow:
    label, rank, world = _label(cap)
    head = cap.rank or {}
    facts = run_facts(cap)
    st = _end_stats(cap)
    leak = final_leak(cap)
    leak_text = (
        str(leak) if leak is not None else ("leak verdict: recorded, not readable" if cap.leaks else "")
    )
    if cap.end is None:
        ended = "stopped early (no end record)"
    else:
        ended = ended_text(cap.end.reason, cap.end.exit_code)
    nccl = None
    if cap.ranks and cap.ranks[-1].nccl:
        try:
            nccl = NcclEstimate.from_dict(cap.ranks[-1].nccl)
        except Exception:
            nccl = None
    measured = [
        st2
        for st2 in (rec.as_stats() for rec in reversed(cap.stats))
        if st2 is not None and st2.nccl_method in ("measured", "growth") and st2.nccl_buffers is not None
    ]
    nccl_now = max(measured, key=lambda x: x.nccl_communicators or 0) if measured else None
    pid = cap.header.get("pid")
    return RankRow(
        label=label,
        capture=cap.path,
        rank=rank,
        world_size=world,
        local_rank=head.get("local_rank") if isinstance(head.get("local_rank"), int) else None,
        host=str(head.get("host") or ""),
        pid=pid if isinstance(pid, int) else None,
        device=str(cap.device or "?"),
        finished=cap.finished,
        ended=ended,
        exit_code=cap.end.exit_code if cap.end is not None else None,
        stopped_at=_stopped_at(cap),
        steps=facts.steps,
        seconds=facts.seconds,
        peak_allocated=cap.peak_allocated,
        peak_reserved=cap.peak_reserved,
        process_used=st.process_used if st is not None else None,
        leaking=bool(leak is not None and leak.leaking),
        leak_per_step=float(leak.bytes_per_step) if leak is not None and leak.leaking else 0.0,
        slow_growth=(
            float(leak.trend_per_step)
            if leak is not None and not leak.leaking and leak.verdict == "below_threshold"
            else 0.0
        ),
        leak_text=leak_text,
        timeline=_timeline(cap),
        nccl=nccl,
        nccl_measured=None if nccl_now is None else nccl_now.nccl_buffers,
        nccl_method=None if nccl_now is None else nccl_now.nccl_method,
        nccl_communicators=None if nccl_now is None else nccl_now.nccl_communicators,
    )


def _contexts(caps: Sequence[Capture], rows: list[RankRow]) -> list[RankRow]:
    """Per rank's device: which other ranks of the job hold a context there (NVML's process list)."""
    import dataclasses

    by_pid = {(r.host, r.pid): r for r in rows if r.pid is not None}
    out = []
    for cap, row in zip(caps, rows):
        st = _end_stats(cap)
        if st is None or st.platform == "cpu" or st.other_processes is None:
            out.append(row)
            continue
        # A rank that works on this same GPU is not a stray context here (ranks sharing a GPU are said
        # apart): only ranks whose own GPU is another one count.
        others = tuple(
            by_pid[(row.host, p.pid)].label
            for p in st.other_processes
            if (row.host, p.pid) in by_pid and by_pid[(row.host, p.pid)].device != row.device
        )
        out.append(dataclasses.replace(row, contexts=1 + len(others), context_of=others))
    return out


def _imbalance(caps: Sequence[Capture], rows: list[RankRow]) -> list[str]:
    out: list[str] = []
    live = [r for r in rows if r.peak_allocated is not None]
    sharing: dict[tuple[str, str], list[str]] = {}
    for r in rows:
        if r.device and r.device.startswith("cuda"):
            sharing.setdefault((r.host or "", r.device), []).append(r.label)
    for (host, device), labels in sharing.items():
        if len(labels) > 1:
            who = f"{', '.join(labels[:-1])} and {labels[-1]} {'both' if len(labels) == 2 else 'all'}"
            out.append(
                f"{who} work on {device}{f' of {host}' if host else ''}: they share one GPU's memory (one "
                "process per GPU: torch.cuda.set_device(local_rank) in each)"
            )
    # contexts of other ranks on one GPU: the usual cause of "GPU 0 uses more than the others"
    for r in rows:
        if r.context_of:
            extra = _context_bytes(caps[rows.index(r)], rows, r)
            out.append(
                f"{r.device} ({r.label}'s) also holds CUDA contexts of {', '.join(r.context_of)}"
                + (f" ({fmt_bytes(extra)})" if extra else "")
                + ": those ranks created a CUDA context on this GPU (a torch.load of a checkpoint saved "
                "from this GPU without map_location, or a CUDA call before torch.cuda.set_device). Fix: "
                'torch.load(path, map_location=f"cuda:{local_rank}") (or "cpu"), and '
                "torch.cuda.set_device(local_rank) before the first CUDA call"
            )
    if len(live) >= 2:
        peaks = [r.peak_allocated or 0 for r in live]
        med = float(statistics.median(peaks))
        top = max(live, key=lambda r: r.peak_allocated or 0)
        gap = (top.peak_allocated or 0) - med
        if med > 0 and (top.peak_allocated or 0) >= IMBALANCE_RATIO * med and gap >= IMBALANCE_MIN_BYTES:
            leakers = [r for r in live if r.leaking]
            if leakers and len(leakers) < len(live):
                cause = (
                    "a leak on "
                    + ", ".join(f"{r.label} only (+{fmt_bytes(int(r.leak_per_step))}/step)" for r in leakers)
                    + ": its leak report below names what grows"
                )
            elif top.context_of:
                cause = f"other ranks' contexts on {top.device}"
            elif top.slow_growth > 0 and top.slow_growth * (top.steps or 0) >= 0.5 * gap:
                grown = fmt_bytes(int(top.slow_growth * (top.steps or 0)))
                cause = (
                    f"{top.label}'s memory grows by {fmt_bytes(int(top.slow_growth))}/step, below its leak "
                    f"threshold ({grown} over {top.steps} steps): its report below says how to have it "
                    "named (min_bytes_per_step; `torchmem run --min-growth`)"
                )
            else:
                cause = (
                    "no cause torchmem can see: uneven data (sequence lengths, batch split) or rank-0 work"
                )
            out.append(
                f"{top.label} peaked at {fmt_bytes(top.peak_allocated)} allocated, "
                f"{fmt_bytes(int(gap))} above the median rank ({fmt_bytes(int(med))}): {cause}"
            )
        cached = [
            (r, (r.peak_reserved or 0) - (r.peak_allocated or 0)) for r in live if r.peak_reserved is not None
        ]
        if len(cached) >= 2:
            med_c = float(statistics.median([c for _, c in cached]))
            r, c = max(cached, key=lambda rc: rc[1])
            if c >= CACHE_SKEW_MIN_BYTES and c >= CACHE_SKEW_RATIO * max(med_c, 1.0):
                out.append(
                    f"{r.label} reserves {fmt_bytes(c)} more than it allocates at its peak (median rank "
                    f"{fmt_bytes(int(med_c))}): its caching allocator holds freed blocks (fragmentation or "
                    "a larger transient on that rank); PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
                    "or a smaller transient"
                )
    return out


def _context_bytes(cap: Capture, rows: list[RankRow], row: RankRow) -> int:
    st = _end_stats(cap)
    if st is None or not st.other_processes:
        return 0
    pids = {r.pid for r in rows if r.label in row.context_of}
    return sum(p.used or 0 for p in st.other_processes if p.pid in pids)


def _stopped_at(cap: Capture) -> float | None:
    """When the rank stopped (wall clock): its end reading (taken as the program ended), else the end
    record, else (killed) its last record."""
    if cap.started is None:
        return None
    end_reading = [r.t for r in cap.stats if r.when == "end"]
    if end_reading:
        return cap.started + end_reading[-1]
    if cap.end is not None:
        return cap.started + cap.end.t
    return cap.started + (cap.duration or 0.0)


def _abnormal(r: RankRow) -> bool:
    return not r.finished or r.exit_code not in (0, None)


def _by_signal(r: RankRow) -> bool:
    return r.finished and r.ended.startswith("terminated by ")


def _launched(cap: Capture) -> bool:
    """A rank its launcher started (torchrun, SLURM, MPI): when one fails, the launcher stops the others.
    Followed child processes are not: their program stops them, for its own reasons."""
    return str((cap.rank or {}).get("launcher") or "") not in ("", "spawn")


def _first_stopped(caps: Sequence[Capture], rows: list[RankRow]) -> RankRow | None:
    """The rank that stopped first when other ranks of its launcher stopped after it: killed (no end
    record) or failed, never one terminated by a signal (a launcher's SIGTERM to every rank has no cause
    among them)."""
    timed = [r for c, r in zip(caps, rows) if _launched(c) and _abnormal(r) and r.stopped_at is not None]
    causes = sorted((r for r in timed if not _by_signal(r)), key=lambda r: r.stopped_at or 0.0)
    if not causes:
        return None
    first = causes[0]
    after = [r for r in timed if r is not first and (r.stopped_at or 0.0) >= (first.stopped_at or 0.0)]
    return first if after else None


def _gap(first: RankRow | None, r: RankRow) -> float | None:
    """Seconds ``r`` stopped after ``first`` (``None``: it is the first, or not known to be after it)."""
    if first is None or r is first or first.stopped_at is None or r.stopped_at is None:
        return None
    return r.stopped_at - first.stopped_at if r.stopped_at >= first.stopped_at else None


def _stopped(
    caps: Sequence[Capture], rows: list[RankRow], world: int | None, first: RankRow | None
) -> list[str]:
    out: list[str] = []
    done = [r for r in rows if r.finished]
    pairs = sorted(zip(caps, rows), key=lambda cr: cr[1] is not first)  # the first rank to stop goes first
    for cap, r in pairs:
        at = f" at step {r.steps}" if r.steps is not None else ""
        after = ""
        gap = _gap(first, r) if _abnormal(r) and _launched(cap) else None
        if first is not None and gap is not None:
            after = f", {gap:.1f} s after {first.label} {'stopped' if not first.finished else 'failed'}"
        cause = ": the first rank to stop" if r is first else ""
        if not r.finished:
            last = max([s.t for s in cap.samples] + [s.t for s in cap.steps] + [0.0])
            others = " (other ranks wrote their end record)" if done and not after and not cause else ""
            out.append(
                f"{r.label} stopped early{at} (killed: no end record, last reading at {last:.2f} s){others}"
                f"{after}{cause}; SIGKILL, a crash or the kernel's OOM killer ends a process without one"
            )
        elif _by_signal(r):
            why = " (a launcher stops the other ranks when one fails)" if after else ""
            out.append(f"{r.label} {r.ended}{at}{after}{why}")
        elif r.exit_code not in (0, None):
            out.append(f"{r.label} failed: {r.ended}{at}{after}{cause}")
    if world:
        seen = {r.rank for r in rows if r.rank is not None}
        missing = [k for k in range(world) if k not in seen]
        if missing and seen:
            out.append(
                f"no capture for rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} "
                f"of the {world}: not given, or never written (it did not start)"
            )
    return out


def _wall(cap: Capture, t: float) -> float | None:
    return None if cap.started is None else cap.started + t


def _oom_wall(cap: Capture, rec: Any) -> float | None:
    """When an OOM happened (``time.time()``): its event's timestamp, taken when it was raised; else its
    record's time (written once the program caught it or ended: seconds later on a loaded machine)."""
    ev = rec.event if isinstance(rec.event, Mapping) else {}
    ts = ev.get("timestamp")
    if isinstance(ts, (int, float)) and not isinstance(ts, bool):
        return float(ts)
    return _wall(cap, rec.t)


def _first_oom(caps: Sequence[Capture], rows: list[RankRow]) -> FirstOOM | None:
    events = []
    for cap, r in zip(caps, rows):
        for o in cap.ooms:
            w = _oom_wall(cap, o)
            events.append((w if w is not None else float("inf"), o.t, cap, r, o))
    if not events:
        return None
    # The first OOM the program did not catch (the one that matters); else the first caught one.
    wall, _, cap, row, rec = min(events, key=lambda e: (bool(e[4].caught), e[0], e[1]))
    rank_of = row.rank
    d = rec.as_diagnosis()
    summary = "\n".join([x for x in str(d).splitlines() if x.strip()][:4]) if d is not None else ""
    states: list[RankState] = []
    for c, r in zip(caps, rows):
        snap = next((x for x in c.rank_states if _same_oom(x.trigger, rank_of, row.pid, wall)), None)
        if snap is not None:
            delay = None if snap.wall is None or wall == float("inf") else snap.wall - wall
            states.append(
                RankState(
                    r.label, snap.step, snap.allocated, snap.reserved, snap.peak_allocated, "snapshot", delay
                )
            )
            continue
        near = None
        if wall != float("inf") and c.started is not None and c.samples:
            t = wall - c.started
            before = [s for s in c.samples if s.t <= t + 0.05]
            near = before[-1] if before else None
        if near is not None and c.started is not None:
            states.append(
                RankState(
                    r.label,
                    near.step,
                    near.allocated,
                    near.reserved,
                    near.peak_allocated,
                    "sample",
                    c.started + near.t - wall,
                )
            )
        else:
            states.append(RankState(r.label, None, None, None, None, "none"))
    return FirstOOM(row.label, rec.step, rec.site, rec.caught, summary, tuple(states))


def _same_oom(trigger: Mapping[str, Any], rank: int | None, pid: int | None, wall: float) -> bool:
    """Whether a ``rank_state`` snapshot was taken for this OOM: the flag was raised by the process that ran
    out (its pid), else by its rank within 2 s of the OOM (the flag is raised when the OOM is seen)."""
    if pid is not None and trigger.get("pid") == pid:
        return True
    t = trigger.get("wall")
    if isinstance(t, (int, float)) and wall != float("inf") and abs(float(t) - wall) > 2.0:
        return False
    return trigger.get("rank") == rank or rank is None


class MergeError(TorchmemError):
    """The captures given to :func:`merge_captures` are not of one job (exit code 2 on the command line)."""

    exit_code = 2


# A followed child starts while its parent runs: its start within the parent's run, give or take this much.
_CHILD_SLACK_S = 5.0


def _job_of(cap: Capture) -> str:
    """Which job a capture is of, as its header says: a launched rank's job key (else its launcher and world
    size), ``children:<key>`` for a followed child process (the key its parent gave it), or the run itself
    (``run:path``) for a single process."""
    head = cap.rank or {}
    launcher, job = str(head.get("launcher") or ""), str(head.get("job") or "")
    if not launcher:
        return f"run:{cap.path}"
    if launcher == "spawn":
        return f"children:{job}"
    return f"job:{job}" if job else f"{launcher}:{head.get('world_size')}"


def _started_during(child: Capture, parent: Capture) -> bool:
    if child.started is None or parent.started is None:
        return True  # nothing says otherwise
    end = None if not parent.finished or parent.duration is None else parent.started + parent.duration
    after = child.started >= parent.started - _CHILD_SLACK_S
    return after and (end is None or child.started <= end + _CHILD_SLACK_S)


def _what(caps: Sequence[Capture]) -> str:
    """The captures of one job, in words: "a.jsonl (a single-process run of train.py)"."""
    paths = ", ".join(c.path for c in caps)
    head = caps[0].rank or {}
    launcher = str(head.get("launcher") or "")
    if not launcher:
        argv = caps[0].header.get("argv")
        prog = f" of {argv[0]}" if isinstance(argv, list) and argv and isinstance(argv[0], str) else ""
        return f"{paths} (a single-process run{prog})"
    if launcher == "spawn":
        return f"{paths} (child process{'es' if len(caps) > 1 else ''} a program started)"
    ranks = sorted({r for c in caps if isinstance(r := (c.rank or {}).get("rank"), int)})
    world = head.get("world_size")
    job = str(head.get("job") or "")
    return (
        f"{paths} (rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"
        + (f" of a job of {world}" if isinstance(world, int) else "")
        + f", {launcher}"
        + (f" job {job}" if job else "")
        + ")"
    )


def check_one_job(caps: Sequence[Capture]) -> None:
    """Raise :class:`MergeError` unless ``caps`` are the captures of one job: the ranks of one launch (one
    job key), or one run and the child processes it started (each started while the run ran).

    A single-process run merged with a job's ranks, two runs, or ranks of two launches would be reported as
    one job ("3 captures merged of a world of 2"): they are refused, with the commands that report each.
    """
    import shlex

    groups: dict[str, list[Capture]] = {}
    for c in caps:
        groups.setdefault(_job_of(c), []).append(c)
    runs = [k for k in groups if k.startswith("run:")]
    for key in [k for k in groups if k.startswith("children:")]:
        job = key.removeprefix("children:")
        if job and f"job:{job}" in groups:  # children of a job's ranks: the key the ranks have
            groups[f"job:{job}"] += groups.pop(key)
        elif len(runs) == 1 and all(_started_during(c, groups[runs[0]][0]) for c in groups[key]):
            groups[runs[0]] += groups.pop(key)  # a run and the children it started while it ran
    if len(groups) <= 1:
        return
    parts = list(groups.values())
    raise MergeError(
        "these captures are not of one job: "
        + "; ".join(_what(g) for g in parts)
        + ". torchmem report merges one job's captures: its ranks, or a run and the child processes it "
        "started.",
        "report them apart: "
        + "; ".join(shlex.join(["torchmem", "report", *(c.path for c in g)]) for g in parts),
    )


def merge_captures(caps: Sequence[Capture]) -> MergedReport:
    """One report from a job's captures (one per rank or followed child process), in rank order.

    Raises:
        MergeError: the captures are not of one job (see :func:`check_one_job`).

    Example:
        >>> from torchmem.capture.file import read_capture  # doctest: +SKIP
        >>> print(merge_captures([read_capture(p) for p in paths]))  # doctest: +SKIP
    """
    check_one_job(caps)
    rows = [_row(c) for c in caps]
    order = sorted(
        range(len(rows)),
        key=lambda i: (
            rows[i].rank is None and rows[i].label != "main",
            rows[i].label != "main",
            rows[i].rank or 0,
            rows[i].label,
        ),
    )
    caps = [caps[i] for i in order]
    rows = _contexts(caps, [rows[i] for i in order])
    worlds = [r.world_size for r in rows if r.world_size]
    world = max(worlds) if worlds else None
    notes: list[str] = []
    dup = {r.label for r in rows if sum(1 for x in rows if x.label == r.label) > 1}
    if dup:
        notes.append(f"several captures of {', '.join(sorted(dup))}: runs of different jobs mixed?")
    first = _first_stopped(caps, rows)
    return MergedReport(
        rows=tuple(rows),
        world_size=world,
        imbalance=tuple(_imbalance(caps, rows)),
        stopped=tuple(_stopped(caps, rows, world, first)),
        first_oom=_first_oom(caps, rows),
        notes=tuple(notes),
        first_stopped=first.label if first is not None else None,
    )


__all__ = ["MergeError", "check_one_job", "merge_captures"]
