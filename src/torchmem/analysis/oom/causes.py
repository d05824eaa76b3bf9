"""The cause rules of the OOM diagnosis: one function per cause kind, each judging the merged
:class:`~torchmem.analysis.oom.figures.Figures` (and the evidence handed in) and returning a
:class:`~torchmem.results.oom.Cause` — its summary, the figures behind it, a confidence and score, and only
the fixes those figures support — or ``None`` when the evidence does not point at it.

The kinds: ``too_large``, ``fragmentation``, ``other_processes``, ``working_set``, ``leak``,
``pinned_by_exception`` and ``outside_allocator``, and the situations the holders of the memory show
(:func:`situation`: ``training_graph``, ``previous_outputs``, ``orphaned_optimizer``, ``autograd_cycle``; a
retry inside ``except`` is ``pinned_by_exception``) (:data:`~torchmem.results.oom.CAUSE_KINDS`). Where the
holders are known, the working set's fixes follow from what holds it, not from a generic list. Which rules
run, and in what order the causes rank, is :func:`~torchmem.analysis.oom.diagnose.diagnose`'s business. Pure
arithmetic on the figures; the cost is a sort of the evidence lists.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from torchmem._format import fmt_bytes
from torchmem.analysis.fragmentation import round_request
from torchmem.analysis.oom.figures import (
    Figures,
    limited,
    room_left,
    torch_room,
    used_outside,
)
from torchmem.analysis.oom.figures import non_torch as outside_torch
from torchmem.analysis.oom.fixes import (
    CHECKPOINT,
    ITEM,
    NO_GRAD,
    ZERO_GRAD,
    alloc_conf_fix,
    autocast_fix,
    batch_fix,
    limit_fix,
    max_split_mb,
)
from torchmem.results.oom import (
    Cause,
    Fix,
    FragmentationReport,
    LeakEvidence,
    OOMHolders,
    ParsedOOM,
    PinnedTensor,
    Situation,
    WorkingSetItem,
)

#: What a CUDA context and library handles typically take (H100, torch 2.11: ~0.5 GiB; smaller GPUs less).
_CONTEXT_ALLOWANCE = 1 << 30


def too_large(f: Figures, batch_size: int | None) -> Cause | None:
    """``too_large``: the single request is more than the device (or the limit, or the host's memory for a
    CPU OOM) can ever give PyTorch, even with every tensor freed."""
    r, ceiling = f.requested, f.ceiling
    if r is None or ceiling is None:
        return None
    non_torch = outside_torch(f)
    most = torch_room(f)
    if most is None or r <= most + f.tol:
        return None
    ev = [f"requested: {fmt_bytes(r)}"]
    limit_set = f.source == "torchmem_cap" or (
        f.limit is not None and f.total is not None and f.limit < f.total
    )
    if r > ceiling and f.machine is not None:
        what = f.machine.what
        summary = f"The single request of {fmt_bytes(r)} is larger than {what}, {fmt_bytes(ceiling)}."
        ev.extend(f.machine.evidence())
    elif r > ceiling:
        what = (
            f"the cap set by {f.cap_owner or 'torchmem'}"
            if f.source == "torchmem_cap"
            else ("the per-process limit" if limit_set else "the whole device")
        )
        summary = f"The single request of {fmt_bytes(r)} is larger than {what} ({fmt_bytes(ceiling)})."
        ev.append(f"{what}: {fmt_bytes(ceiling)}")
    else:
        base = f.total if limited(f) and f.total is not None else ceiling
        summary = (
            f"The single request of {fmt_bytes(r)} is more than PyTorch can ever get on this device "
            f"({fmt_bytes(most)}: {fmt_bytes(base)} less {fmt_bytes(non_torch)} outside PyTorch's "
            "allocator)."
        )
        ev.append(f"device total{' (limit)' if limit_set and base == ceiling else ''}: {fmt_bytes(base)}")
        ev.append(
            f"this process outside PyTorch's allocator (CUDA context, libraries): {fmt_bytes(non_torch)}"
        )
    ev.append(f"short by {fmt_bytes(r - most)} even if every tensor were freed")
    fixes = [
        batch_fix(batch_size, most * 0.9 / r, "the request scales with the batch if it is an activation"),
        Fix(
            "chunk",
            "Split the operation that needs it into chunks (e.g. loop over the batch or sequence; "
            "chunked attention/loss), or shard it across devices.",
        ),
        autocast_fix(f.backend),
    ]
    if limit_set:
        fixes.insert(0, limit_fix(f))
    m = f.machine
    if m is not None and m.limited_by_cgroup and (m.physical is None or r <= m.physical):
        fixes.insert(
            0,
            Fix(
                "limit",
                "The request would fit in the machine's RAM but not under the container's memory limit: "
                "raise the limit (docker run --memory, Kubernetes resources.limits.memory) if the machine "
                "can spare it.",
            ),
        )
    return Cause("too_large", summary, tuple(ev), r - most, "high", tuple(fixes), score=10.0)


def fragmentation(
    f: Figures, frag: FragmentationReport | None, settings: Mapping[str, str], parsed: ParsedOOM | None
) -> Cause | None:
    """``fragmentation``: the cache holds the request in free pieces, but no block is large enough (judged
    on the segments when a state is known, else on the message's reserved-but-unallocated figure)."""
    r = f.requested
    cached = frag.cached_free if frag is not None else f.cached
    if r is None or cached is None or cached <= 0:
        return None
    rr = round_request(r)
    ev: list[str] = []
    if frag is not None:
        if frag.fits_now:
            return None
        largest = frag.largest_free_in_pool or 0
        enough = cached >= rr
        ev.append(
            f"free in PyTorch's cache: {fmt_bytes(cached)} in all, but the largest free block "
            f"of the {frag.pool} pool is {fmt_bytes(largest)} < {fmt_bytes(rr)} requested"
        )
        for p in frag.pools:
            if p.free:
                ev.append(
                    f"  {p.pool} pool, stream {p.stream}{' (private pool)' if p.private else ''}: "
                    f"{p.segments} segment(s), {fmt_bytes(p.free)} free, largest free block "
                    f"{fmt_bytes(p.largest_free)}"
                )
        ev.append(f"external waste (free pieces of partly used segments): {fmt_bytes(frag.external_waste)}")
        if frag.internal_waste is not None:
            ev.append(f"internal waste (rounding inside allocated blocks): {fmt_bytes(frag.internal_waste)}")
        if frag.pending_free:
            ev.append(f"freed but awaiting another stream: {fmt_bytes(frag.pending_free)}")
        if frag.fits_after_empty_cache is not None:
            ev.append(
                "after empty_cache(): "
                + ("it would fit" if frag.fits_after_empty_cache else "it would still not fit")
                + f" (device free {fmt_bytes(f.free)} + whole free segments {fmt_bytes(frag.whole_free)})"
            )
        if frag.fits_with_expandable is not None and not frag.expandable_in_use:
            ev.append(
                "with expandable_segments: "
                + ("it would fit" if frag.fits_with_expandable else "it would not fit either")
                + f" (device free {fmt_bytes(f.free)} + the cache's free pages)"
            )
        if enough:
            conf, score = "high", 8.0
            summary = (
                f"Fragmentation: the cache holds {fmt_bytes(cached)} free, enough for the "
                f"{fmt_bytes(r)} request, but no free block is large enough."
            )
        elif frag.fits_with_expandable:
            conf, score = "medium", 5.0
            summary = (
                f"Fragmentation: device free memory plus the cache's {fmt_bytes(cached)} of free pieces "
                f"would cover the {fmt_bytes(r)} request if they were contiguous."
            )
        else:
            return None
        fits_exp = frag.fits_with_expandable
    else:
        free = f.free
        if cached + f.tol >= r and r <= (2 << 20):
            conf, score = "medium", 4.0
            summary = (
                f"Possibly fragmentation: {fmt_bytes(cached)} is cached free, more than the {fmt_bytes(r)} "
                "requested, but small requests are served only from the small-block pool and the free "
                "pieces may all be in the large one."
            )
        elif cached + f.tol >= r:
            conf, score = "high", 8.0
            summary = (
                f"Fragmentation: {fmt_bytes(cached)} is reserved by PyTorch but unallocated — more than the "
                f"{fmt_bytes(r)} requested — yet no cached block was large enough."
            )
        elif free is not None and cached + free + f.tol >= r and cached >= r // 4:
            conf, score = "medium", 4.0
            summary = (
                f"Fragmentation: {fmt_bytes(cached)} reserved but unallocated plus {fmt_bytes(free)} free on "
                f"the device would cover the {fmt_bytes(r)} request, had they been one block."
            )
        else:
            return None
        ev.append(f"requested: {fmt_bytes(r)}")
        ev.append(f"reserved by PyTorch but unallocated (cached free pieces): {fmt_bytes(cached)}")
        if free is not None:
            ev.append(f"free on the device: {fmt_bytes(free)}")
        ev.append(
            "PyTorch already returned every entirely free segment to the driver before raising, so what "
            "remains cached are pieces of segments that still hold tensors: empty_cache() cannot help."
        )
        fits_exp = None if free is None else free + cached >= rr
    fixes: list[Fix] = []
    exp = alloc_conf_fix(
        f,
        settings,
        "expandable_segments",
        "True",
        "Let segments grow and map freed pages again instead of splitting fixed segments "
        "(the cache's free pieces become usable for large requests).",
    )
    if exp is not None and (fits_exp is None or fits_exp):
        fixes.append(exp)
    n = max_split_mb(r)
    if n is not None:
        ms = alloc_conf_fix(
            f,
            settings,
            "max_split_size_mb",
            str(n),
            f"Stop the allocator from splitting blocks of {n} MiB or more, so blocks that large stay whole "
            f"for requests like this {fmt_bytes(r)} one (an alternative to expandable_segments, which "
            "ignores it: use one or the other).",
        )
        if ms is not None:
            fixes.append(ms)
    if f.limit is not None and (f.total is None or f.limit < f.total):
        gc = alloc_conf_fix(
            f,
            settings,
            "garbage_collection_threshold",
            "0.8",
            "With a memory fraction set, reclaim unused cached blocks once usage passes 80 % of the limit, "
            "before the allocator gives up.",
        )
        if gc is not None:
            fixes.append(gc)
    if frag is not None and frag.fits_after_empty_cache and frag.whole_free:
        fixes.append(
            Fix(
                "empty_cache",
                "Whole free segments are cached: return them to the driver before the big allocation.",
                "torch.cuda.empty_cache()",
            )
        )
    if parsed is not None and parsed.private_pools:
        ev.append(f"allocated in private pools (CUDA graphs): {fmt_bytes(parsed.private_pools)}")
    return Cause("fragmentation", summary, tuple(ev), cached, conf, tuple(fixes), score=score)


def other_processes(f: Figures) -> Cause | None:
    """``other_processes``: other processes (or memory outside this PyTorch) hold what the request lacked."""
    r, free = f.requested, f.free
    listed = sum(b for _, b in f.others)
    outside = used_outside(f)
    ev = [f"process {pid}: {fmt_bytes(b)}" for pid, b in sorted(f.others, key=lambda p: -p[1])]
    if f.self_guessed is not None:
        ev.append(f"(process {f.self_guessed}, with {fmt_bytes(f.process_used)}, is taken to be this one)")
    others = listed
    who = "Other processes"
    if outside is not None and outside[0] > listed + max(f.tol, 64 << 20):
        others = outside[0]
        allowance = 0 if f.process_used is not None else _CONTEXT_ALLOWANCE
        others = max(0, others - allowance)
        ev.append(
            f"used on the device outside this PyTorch: {fmt_bytes(outside[0])} ({outside[1]}"
            + (f"; {fmt_bytes(allowance)} of it allowed for this process's CUDA context" if allowance else "")
            + ")"
        )
        if listed == 0:
            who = "Memory outside this PyTorch (" + outside[1] + ")"
    if others <= 0:
        return None
    if r is not None and free is not None:
        if free + f.tol >= r:
            return None
        short = r - free
        if others + f.tol >= short:
            big = others >= (f.ceiling or others) * 0.1
            conf, score = ("high", 7.0) if big and listed else (("medium", 4.5) if big else ("low", 2.5))
            summary = (
                f"{who} use {fmt_bytes(others)} of this device; without them the {fmt_bytes(r)} "
                f"request would have found room (only {fmt_bytes(free)} was free)."
            )
        else:
            conf, score = "low", 2.0
            summary = f"{who} use {fmt_bytes(others)} of this device, less than the shortfall."
    else:
        conf, score = "low", 1.5
        summary = f"{who} use {fmt_bytes(others)} of this device."
    fixes = (
        Fix(
            "processes",
            "Stop or move the other processes on this GPU (nvidia-smi lists them), or run on a free GPU.",
            "CUDA_VISIBLE_DEVICES=<free gpu index>",
        ),
    )
    return Cause("other_processes", summary, tuple(ev), others, conf, fixes, score=score)


_CATEGORY_KIND = {
    "parameter": "parameter",
    "gradient": "gradient",
    "optimizer state": "optimizer_state",
    "saved for backward": "activation",
    "buffer": "parameter",
    "other": "other",
}


def holder_items(holders: OOMHolders, top: int = 8) -> list[WorkingSetItem]:
    """The working set by category, from the holders of the memory (what ``working_set`` scales the batch
    by), with the ``top`` holders first as evidence."""
    return [
        WorkingSetItem(f"{c} (all holders)", b, _CATEGORY_KIND.get(c, "other"))
        for c, b in sorted(_categories(holders).items(), key=lambda kv: -kv[1])
        if b
    ]


def _categories(holders: OOMHolders, rest: bool = False) -> dict[str, int]:
    """Bytes per tensor category of every holder (what graphs saved as ``saved for backward``); with
    ``rest``, of what no named situation explains."""
    if rest and (holders.rest or holders.situations):
        return dict(holders.rest)
    cats: dict[str, int] = {}
    for h in holders.holders:
        for c, b in h.categories.items():
            cats[c] = cats.get(c, 0) + b
        if h.graph:
            cats["saved for backward"] = cats.get("saved for backward", 0) + h.graph
    return cats


def _holder_fixes(
    f: Figures, holders: OOMHolders, batch_size: int | None, fraction: float | None, why: str
) -> list[Fix]:
    """The working set's fixes as its holders call for them: what the memory no situation explains is
    decides the lever."""
    cats = _categories(holders, rest=True)
    total = max(sum(cats.values()), 1)
    acts, params = cats.get("saved for backward", 0), cats.get("parameter", 0) + cats.get("buffer", 0)
    grads, state = cats.get("gradient", 0), cats.get("optimizer state", 0)
    grad_on = holders.grad_enabled is not False
    fixes = [batch_fix(batch_size, fraction, why)]
    if acts >= 0.2 * total and grad_on:
        fixes.append(CHECKPOINT)
    if acts >= 0.2 * total or params >= 0.3 * total:
        fixes.append(autocast_fix(f.backend))
    if acts and grad_on and holders.training is False:
        fixes.append(NO_GRAD)  # every model is in eval() mode, yet autograd records: evaluation with a graph
    if grads >= 0.2 * total:
        fixes.append(ZERO_GRAD)
    if state >= 0.3 * total:
        fixes.append(
            Fix(
                "dtype",
                "Optimizer state is a large share: use an 8-bit or factored optimizer, or shard it "
                "(ZeRO/FSDP).",
            )
        )
    if any(h.kind == "container" and h.categories.get("saved for backward") for h in holders.holders):
        fixes.append(ITEM)  # a list or dict of tensors that keep their graphs
    return fixes


def working_set(
    f: Figures,
    items: Sequence[WorkingSetItem],
    batch_size: int | None,
    grad_enabled: bool | None,
    holders: OOMHolders | None = None,
) -> Cause | None:
    """``working_set``: tensors and the request together exceed the room PyTorch has (high), or tensors
    fill most of the device; the fixes scale the batch by what does scale with it. With the ``holders``
    known, the evidence names the largest and the fixes follow from what they hold; when named situations
    explain most of the memory, the working set is a lesser cause."""
    if holders is not None and not items:
        items = holder_items(holders)
    r, alloc, ceiling = f.requested, f.allocated, f.ceiling
    if alloc is None and not items:
        if r is None:
            return None
        # CPU / bare messages: only the request is known
        ev0 = [f"requested: {fmt_bytes(r)}"]
        if f.machine is not None:
            ev0.extend(f.machine.evidence())
        return Cause(
            "working_set",
            f"The allocation of {fmt_bytes(r)} did not fit in what was left; the message gives no breakdown.",
            tuple(ev0),
            r,
            "low",
            (batch_fix(batch_size, None, "the usual lever"), autocast_fix(f.backend), NO_GRAD),
            score=1.0,
        )
    total_items = sum(i.bytes for i in items)
    alloc = alloc if alloc is not None else total_items
    ev = [f"allocated to tensors by PyTorch: {fmt_bytes(alloc)}"]
    share = None
    room: int | None = None
    own_room: int | None = None
    if ceiling:
        share = alloc / ceiling
        ev[0] += f" ({share:.0%} of the {fmt_bytes(ceiling)} {'limit' if f.limit else 'device'})"
        outside = used_outside(f)
        others = max(sum(b for _, b in f.others), 0 if outside is None else outside[0])
        room = torch_room(f, others)
        own_room = torch_room(f)
    if r is not None:
        ev.append(f"requested on top: {fmt_bytes(r)}")
    if f.process_used is not None and f.reserved is not None and f.process_used > f.reserved:
        what = (
            "other allocations outside PyTorch's MPS heaps"
            if f.source == "mps_allocator"
            else "this process outside PyTorch's allocator (CUDA context, libraries)"
        )
        ev.append(f"{what}: {fmt_bytes(f.process_used - f.reserved)}")
    need = alloc + (r or 0)
    if room is not None and r is not None:
        ev.append(
            f"tensors + request = {fmt_bytes(need)}; room for PyTorch with the device to itself: "
            f"{fmt_bytes(own_room)}, with the other users as they were: {fmt_bytes(room)}"
        )
    by_kind: dict[str, int] = {}
    if holders is not None:
        ev.extend(f"  {h.label}: {fmt_bytes(h.bytes)} ({h.kind})" for h in holders.holders[:6])
    else:
        for it in sorted(items, key=lambda i: -i.bytes)[:10]:
            ev.append(f"  {it.label}: {fmt_bytes(it.bytes)}" + (f" ({it.kind})" if it.kind else ""))
    for it in items:
        if it.kind:
            by_kind[it.kind] = by_kind.get(it.kind, 0) + it.bytes
    if own_room is not None and r is not None and need + f.tol >= own_room:
        conf, score = "high", 9.0
    elif share is None:
        conf, score = "low", 2.0
    elif share >= 0.9:
        conf, score = "high", 6.0 + share
    elif share >= 0.6:
        conf, score = "medium", 3.0 + share
    else:
        conf, score = "low", 1.0 + share
    summary = (
        f"The working set is too large: tensors hold {fmt_bytes(alloc)}"
        + (f" of {fmt_bytes(ceiling)}" if ceiling else "")
        + (f", and the step asked for {fmt_bytes(r)} more." if r is not None else ".")
    )
    explained = sum(s.bytes for s in holders.situations) if holders is not None else 0
    if explained and alloc and explained * 2 >= alloc:
        # named holders that no step needs hold most of it: the working set proper is not the cause
        conf, score = "medium", min(score, 4.5)
        ev.append(f"of which {fmt_bytes(explained)} is held by the situations above, not by the step itself")
    if conf == "low":
        summary = f"Tensors hold {fmt_bytes(alloc)}" + (f" of {fmt_bytes(ceiling)}" if ceiling else "") + "."
    fixes: list[Fix] = []
    fraction: float | None = None
    if room is not None and r is not None:
        fixed = sum(by_kind.get(k, 0) for k in ("parameter", "gradient", "optimizer_state"))
        variable = alloc - fixed + r
        if variable > 0 and room - fixed > 0:
            fraction = (room - fixed) * 0.9 / variable
    why = (
        "assuming activations scale with the batch; parameters, gradients and optimizer state do not"
        if by_kind
        else "assuming all allocated memory scales with the batch, an upper bound"
    )
    if holders is not None:
        left = room_left(f)
        if r is not None and left is not None and explained and explained + left + f.tol >= r:
            fixes = []  # the situations' own fixes make room for the request: nothing else to change
        else:
            fixes = _holder_fixes(f, holders, batch_size, fraction, why)
        if f.source == "torchmem_cap":
            fixes.append(limit_fix(f))
        return Cause("working_set", summary, tuple(ev), alloc, conf, tuple(fixes), score=score)
    fixes.append(batch_fix(batch_size, fraction, why))
    act = by_kind.get("activation")
    if not by_kind or act:
        fixes.append(autocast_fix(f.backend))
        if grad_enabled is not False:
            fixes.append(CHECKPOINT)
    if grad_enabled is not False:
        fixes.append(NO_GRAD)
    if not by_kind or by_kind.get("gradient"):
        fixes.append(ZERO_GRAD)
    if by_kind.get("optimizer_state") and by_kind["optimizer_state"] >= alloc * 0.3:
        fixes.append(
            Fix(
                "dtype",
                "Optimizer state is a large share: use an 8-bit or factored optimizer, "
                "or shard it (ZeRO/FSDP).",
            )
        )
    fixes.append(ITEM)
    if f.source == "torchmem_cap":
        fixes.append(limit_fix(f))
    return Cause("working_set", summary, tuple(ev), alloc, conf, tuple(fixes), score=score)


def leak(trend: LeakEvidence | None) -> Cause | None:
    """``leak``: a watcher measured growth per step; the OOM is where it ran out of room."""
    if trend is None or trend.bytes_per_step <= 0 or trend.leaking is False:
        return None
    bps = int(trend.bytes_per_step)
    ev = [
        f"memory grows by {fmt_bytes(bps)} per step" + (f" over {trend.steps} steps" if trend.steps else "")
    ]
    fixes: list[Fix] = []
    for c in trend.culprits[:10]:
        where = " ".join(x for x in (c.site, f"held by {c.holder}" if c.holder else None) if x)
        ev.append(f"  {where or 'unknown site'}: {fmt_bytes(c.bytes)}" + (f" ({c.kind})" if c.kind else ""))
        if c.fix:
            fixes.append(Fix("leak", f"{where}: {c.fix}" if where else c.fix))
    if not fixes:
        fixes.append(ITEM)
        fixes.append(
            Fix(
                "leak",
                "Do not keep tensors that carry a graph across steps; store .detach() or .item() values.",
            )
        )
    conf = "high" if trend.leaking else "medium"
    return Cause(
        "leak",
        f"Memory leaks {fmt_bytes(bps)} per step: the OOM is where the growth ran out of room.",
        tuple(ev),
        bps,
        conf,
        tuple(fixes),
        score=7.5 if trend.leaking else 5.0,
    )


def pinned(
    tensors: Sequence[PinnedTensor],
    f: Figures,
    while_handling: str | None = None,
    retry: Situation | None = None,
) -> Cause | None:
    """``pinned_by_exception``: an exception's frames (a finished one's, or — ``while_handling`` — the one
    being handled when this OOM was raised, i.e. a retry inside ``except``) or notebook outputs still hold
    device memory. ``retry``: what the failed attempt's frames hold as the holders of the memory counted it
    (their tensors' autograd graphs included); a retry whose failed attempt holds most of what is allocated
    ranks first."""
    held = sum(p.bytes for p in tensors)
    if retry is not None and while_handling and retry.bytes > held:
        held = retry.bytes
        ev = [
            *retry.evidence,
            "(with what their tensors' autograd graphs saved, as the holders of the memory counted them)",
        ]
    else:
        ev = [f"{p.where}: {fmt_bytes(p.bytes)}" for p in sorted(tensors, key=lambda p: -p.bytes)[:10]]
    if held <= 0:
        return None
    r = f.requested
    if while_handling:
        left = room_left(f)
        fits = r is not None and (held >= r or (left is not None and held + left + f.tol >= r))
        if left is not None and r is not None:
            ev.append(
                f"free at the OOM: {fmt_bytes(left)}; with the failed attempt's {fmt_bytes(held)} freed: "
                f"{fmt_bytes(left + held)} for the {fmt_bytes(r)} request"
            )
        summary = (
            f"Raised while an earlier {while_handling} was being handled (a retry inside the except "
            f"block): the exception's traceback keeps the failed attempt's frames alive, and they hold "
            f"{fmt_bytes(held)}"
            + (f" — without them the {fmt_bytes(r)} request would have fit." if fits else ".")
        )
        retry_fixes = (
            Fix(
                "release",
                "Retry after the except block, not inside it: while `except` runs, the exception's "
                "traceback keeps every frame of the failed attempt, and the tensors they hold, alive. Only "
                "note the failure in the except block (e.g. `failed = True`) and retry below it.",
            ),
            Fix(
                "release",
                "Or free the failed attempt's frames before retrying inside the except block "
                "(`except torch.OutOfMemoryError as e:`), then empty the cache.",
                "traceback.clear_frames(e.__traceback__)",
            ),
        )
        most = bool(f.allocated) and held * 2 >= (f.allocated or 0)
        if most:
            ev.append(f"that is {held / (f.allocated or 1):.0%} of the {fmt_bytes(f.allocated)} allocated")
        return Cause(
            "pinned_by_exception",
            summary,
            tuple(ev),
            held,
            "high" if fits or most else "medium",
            retry_fixes,
            # the failed attempt holding most of the memory is the cause, ahead of the working set it is in
            score=9.9 if most else (9.8 if fits else 5.0),
        )
    big = r is not None and held >= r
    summary = (
        f"{fmt_bytes(held)} of device memory is still held by a finished exception's frames or notebook "
        f"output history" + (" — enough to fit the request." if big else ".")
    )
    fixes = (
        Fix(
            "release",
            "Free what the old traceback / notebook outputs hold "
            "(torchmem clears the frames and empties the cache).",
            "torchmem.release()",
        ),
        Fix("release", "Or drop the references by hand.", "sys.last_traceback = None; %reset -f out"),
    )
    return Cause(
        "pinned_by_exception",
        summary,
        tuple(ev),
        held,
        "high" if big else "medium",
        fixes,
        score=9.5 if big else 4.5,
    )


def situation(s: Situation, f: Figures) -> Cause:
    """A situation the holders of the memory show (``training_graph``, ``previous_outputs``,
    ``orphaned_optimizer``, ``autograd_cycle``) as a cause: high when freeing what it holds would make the
    request fit, or when it holds most of what is allocated; its fixes are its own (``del out, loss``)."""
    r, left = f.requested, room_left(f)
    fits = r is not None and (s.bytes >= r or (left is not None and s.bytes + left + f.tol >= r))
    most = s.share is not None and s.share >= 0.5
    ev = list(s.evidence)
    if r is not None and left is not None:
        ev.append(
            f"free at the OOM: {fmt_bytes(left)}; with these {fmt_bytes(s.bytes)} freed: "
            f"{fmt_bytes(left + s.bytes)} for the {fmt_bytes(r)} request"
        )
    share = s.share or 0.0
    conf, score = ("high", 9.6 + 0.2 * share) if fits or most else ("medium", 5.0 + share)
    fixes = tuple(
        Fix("no_grad" if "no_grad" in (x.setting or "") else "release", x.text, x.setting) for x in s.fixes
    )
    return Cause(s.kind, s.summary, tuple(ev), s.bytes, conf, fixes, score=score)


def outside_allocator(parsed: ParsedOOM | None, f: Figures) -> Cause:
    """``outside_allocator``: the driver, cuBLAS, cuDNN or NCCL ran out, not PyTorch's allocator."""
    src = f.source or "driver"
    what = {
        "driver": "a CUDA call outside PyTorch's caching allocator (the driver or a kernel launch)",
        "cublas": "cuBLAS (its handle or workspace)",
        "cudnn": "cuDNN (its workspace)",
        "nccl": "NCCL (its communication buffers)",
    }.get(src, src)
    code = parsed.error_code if parsed is not None else None
    ev = [f"error: {code}" if code else f"source: {src}"]
    ev.append(
        "PyTorch's allocator did not fail: device memory ran out for memory it does not manage, usually "
        "because PyTorch's cache or other processes already hold the device."
    )
    fixes = [
        Fix(
            "empty_cache",
            "Return PyTorch's cached free blocks to the driver before the library needs memory "
            "(e.g. before creating the NCCL communicator or the first matmul).",
            "torch.cuda.empty_cache()",
        ),
        batch_fix(None, None, "less of the device held by tensors leaves room for library buffers"),
    ]
    if src == "nccl":
        fixes.append(Fix("processes", "Reduce NCCL's buffers if the job allows it.", "NCCL_BUFFSIZE=2097152"))
    if src == "driver":
        fixes.append(
            Fix(
                "processes",
                "Run with synchronous launches to find the call that really failed.",
                "CUDA_LAUNCH_BLOCKING=1",
            )
        )
    return Cause(
        "outside_allocator",
        f"Memory ran out in {what}, not in PyTorch's allocator.",
        tuple(ev),
        None,
        "high",
        tuple(fixes),
        score=6.0,
    )


__all__ = [
    "fragmentation",
    "holder_items",
    "leak",
    "other_processes",
    "outside_allocator",
    "pinned",
    "situation",
    "too_large",
    "working_set",
]
