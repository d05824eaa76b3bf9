"""One batch-size search: the loop that runs trials, agrees on them across ranks and asks the model where
to go next, until the model converges, ``max_size`` is reached or ``max_trials`` are spent.

Ties the three parts together: :class:`~torchmem.actions.batch_size.trials.TrialMeter` runs and measures
each call, :class:`~torchmem.actions.batch_size.ranks.RankAgreement` makes every rank take the same path,
:class:`~torchmem.actions.batch_size.model.BoundaryModel` decides the next size. Memory is released after
every trial; a search that ends on an out-of-memory call which left tensors behind runs the answer once more
(a *closing run*) so the step releases them itself. Costs ``max_trials`` calls of the step at most, plus
that one closing run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from torchmem._exceptions import clear_exception_frames
from torchmem.actions.batch_size.errors import BatchSizeError, DistributedTrialError
from torchmem.actions.batch_size.model import BoundaryModel
from torchmem.actions.batch_size.ranks import RankAgreement
from torchmem.actions.batch_size.trials import (
    NOISE_BYTES,
    Outcome,
    TrialMeter,
    diagnose_oom,
    left_behind,
    release_after_trial,
    release_memory,
)
from torchmem.devices import DeviceLike, resolve
from torchmem.results.fit import BatchSizeResult, Trial

if TYPE_CHECKING:
    from torchmem.analysis.oom import OOMDiagnosis


def run_search(
    fn: Callable[[int], Any],
    *,
    start: int,
    max_size: int,
    min_size: int,
    margin: float,
    device: DeviceLike,
    distributed: bool | None,
    capacity: int | None,
    max_trials: int,
    tolerance: float,
) -> BatchSizeResult:
    """Search the largest size ``fn`` runs at (arguments as :func:`torchmem.find_batch_size`'s, checked).

    Raises:
        BatchSizeError: even ``min_size`` ran out of memory (its diagnosis attached).
        DistributedTrialError: another rank's trial raised an error that is not an OOM.
        Exception: what ``fn`` raised that is not an OOM, at once.
    """
    t_start = time.perf_counter()
    dev = resolve(device)
    meter = TrialMeter(dev)
    group = RankAgreement(distributed, dev)
    search = BoundaryModel(start, max_size, min_size, tolerance)
    trials: list[Trial] = []
    release_memory(dev)
    baseline = meter.figure()
    low_baseline = meter.allocated()
    cap = meter.capacity(capacity)
    enforce = margin > 0 or capacity is not None
    diagnosis: OOMDiagnosis | None = None

    def budget_now() -> tuple[int | None, int | None]:
        nonlocal cap
        if cap is None:
            cap = meter.capacity(capacity)
        if cap is None:
            return None, None
        base = baseline or 0
        return cap, int(cap - margin * max(cap - base, 0))

    size: int | None = start
    closing = False  # this call is the closing run (see below)
    closed = False  # a closing run has been made
    beyond = False  # a closing run has been made beyond max_trials (one at most)
    limited = False  # the search was cut short by max_trials
    stale_bytes = 0  # what the last out-of-memory call left behind (this rank), before a closing run
    while size is not None and (closing or len(trials) < max_trials):
        with group.local_trials():  # under DDP: no gradient all-reduce inside a trial (see ranks.py)
            out = meter.call(fn, size)
        status = {"ok": 1, "oom": 0, "error": -1}[out.status]
        _, bud = budget_now()
        over = out.status == "ok" and enforce and bud is not None and out.peak is not None and out.peak > bud
        local_ok = 1 if (status == 1 and not over) else 0
        agreed = group.min(status, local_ok, group.rank if status == -1 else group.world)
        if out.status == "error":
            exc = cast(BaseException, out.exc)
            out.exc = None
            raise exc
        if agreed[0] == -1:
            if out.exc is not None:
                clear_exception_frames(out.exc)
            out = Outcome("error", None, None, None, 0.0)
            release_memory(dev)
            raise DistributedTrialError(
                f"Rank {agreed[2]} raised an error that is not an out-of-memory error during the batch-size "
                f"trial at {size}; it re-raises it.",
                "Look at that rank's traceback.",
            )
        oom = agreed[0] == 0
        ok = bool(agreed[1])
        if out.exc is not None:
            if size <= min_size and diagnosis is None:
                diagnosis = diagnose_oom(out.exc, dev, size)
            clear_exception_frames(out.exc)
            out.exc = None
        left = left_behind(out)
        note = "out of memory" if oom else ("over budget" if not ok else "")
        if ok and left:
            note = "warm-up"
        if out.status == "ok" and not out.finished:
            note = (note + "; " if note else "") + "stopped after its optimizer steps"
        if closing:
            note = "closing run" + ("; " + note if note else "")
        trials.append(Trial(size, ok, oom, out.peak, out.seconds, note, out.allocated_peak))
        search.record(size, ok, oom, out.peak, left, out.allocated_peak)
        held_before = out.allocated_before
        live_before = held_before if out.status == "oom" else None  # this rank's own OOM
        out = Outcome("ok", None, None, None, 0.0)
        release_after_trial(meter, held_before)
        # A call stopped by an out-of-memory error skips the rest of the step, and so the step's own
        # clean-up: gradients already accumulated by a partial backward stay set (and would be added to
        # the next real step's). Measured after its frames are cleared and the cache emptied.
        stale = 0
        if live_before is not None:
            now = meter.live()
            # The CPU ledger is exact: any byte counts; CUDA's allocated figure has allocator rounding.
            if now is not None and now - live_before >= (1 if meter.cpu else NOISE_BYTES):
                stale = now - live_before
        was_closing, closing = closing, False
        if was_closing and ok:
            break  # the step ran to its end at the answer: done
        _, bud = budget_now()
        nxt = search.next_size(bud, baseline, low_baseline, enforce)
        # Every rank proposes (a size at or below the largest that fit means "done"), so every rank
        # makes the same number of collective calls and takes the smallest proposal.
        g = max(search.good) if search.good else 0
        agreed_next = group.min(nxt if nxt is not None else g)[0]
        nxt = agreed_next if agreed_next > g else None
        if nxt is not None and len(trials) >= max_trials:
            nxt, limited = None, True
        size = nxt
        # The search ends on a call that ran out of memory and left tensors behind: run the answer once
        # more, so that the step finishes and releases them itself (one call beyond max_trials at most).
        # Any rank's leftovers make every rank take it.
        if size is None and search.good and not beyond and group.min(0 if stale else 1)[0] == 0:
            stale_bytes = stale
            size = max(search.good)
            closing = closed = True
            beyond = len(trials) >= max_trials

    if not search.good:
        tried = trials[-1].batch_size if trials else start
        raise BatchSizeError(
            f"Even batch size {tried} runs out of memory on {dev}"
            + (f" (capacity {cap} bytes)" if cap is not None else "")
            + ".",
            "Free memory held elsewhere (torchmem.release), use bf16/AMP, activation checkpointing or a "
            "smaller model; see the diagnosis attached to this error (.diagnosis).",
            batch_size=tried,
            diagnosis=diagnosis,
            trials=tuple(trials),
        )
    chosen = max(search.good)
    chosen = group.min(chosen)[0]
    synced = group.resync()  # under DDP: rank 0's replica on every rank again (trials ran in no_sync)
    note = search.note
    if limited:
        note = f"stopped after max_trials={max_trials}"
    if closed:
        left_txt = f"{stale_bytes} bytes" if stale_bytes else "tensors"
        note = (note + "; " if note else "") + (
            f"closing run: a call that ran out of memory left {left_txt} behind (e.g. gradients of a "
            "partial backward), so the largest size that fit was run once more to let the step release them"
        )
        if trials[-1].note.startswith("closing run") and not trials[-1].ok:
            note += f" (it ran out of memory: {chosen} is the largest size that fit before it)"
    if search.oom_min is None and not note.startswith("ran within"):
        note = (note + "; " if note else "") + "no trial ran out of memory"
    if synced:
        note = (note + "; " if note else "") + synced
    line = search.line
    _, bud = budget_now()
    return BatchSizeResult(
        batch_size=chosen,
        trials=tuple(trials),
        predicted=search.predicted,
        true_max_upper_bound=search.oom_min,
        seconds=time.perf_counter() - t_start,
        device=str(dev),
        metric=meter.metric,
        capacity=cap,
        budget=bud,
        baseline=baseline,
        margin=margin,
        fixed_bytes=None if line is None else line[0],
        bytes_per_sample=None if line is None else line[1],
        world_size=group.world,
        note=note,
        extra={
            k: v
            for k, v in (("band", search.band), ("allocated_line", search.low_line))
            if v is not None and v != (None, None)
        },
    )


__all__ = ["run_search"]
