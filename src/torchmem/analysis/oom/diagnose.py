"""The OOM diagnosis: :func:`diagnose` merges what is known, runs the cause rules and ranks their answers.

Given the parsed message and/or the allocator state (and what else the caller knows: a leak measured by a
watcher, memory pinned by old exceptions, the working set's holders, the batch size, the host's memory for a
CPU OOM), it merges the figures (:mod:`~torchmem.analysis.oom.figures`), judges fragmentation on the state's
segments (:func:`~torchmem.analysis.fragmentation.analyze_fragmentation`), runs the rules of
:mod:`~torchmem.analysis.oom.causes`, ranks the causes by score and deduplicates their fixes into one list.
A request that can never fit is the only cause: nothing that frees memory would help.

Pure: nothing here reads a device; :func:`torchmem.explain_oom` gathers the live evidence and calls this.
Cost: the rules are arithmetic, plus one pass over the segments when a state is given.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torchmem._format import fmt_bytes
from torchmem.analysis.fragmentation import analyze_fragmentation
from torchmem.analysis.oom import causes as rules
from torchmem.analysis.oom.figures import limited, merge_figures, parse_alloc_conf
from torchmem.results.oom import (
    AllocatorState,
    Cause,
    Fix,
    FragmentationReport,
    LeakEvidence,
    LeakSite,
    MachineMemory,
    OOMDiagnosis,
    OOMHolders,
    ParsedOOM,
    PinnedTensor,
    WorkingSetItem,
)


def _get(obj: Any, name: str) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


def as_leak_evidence(obj: Any) -> LeakEvidence | None:
    """Read the growth a watcher measured from its report, a plain object or a dict with
    ``bytes_per_step`` and ``culprits`` (each with ``site``, ``holder``, ``bytes``, ``fix``, ``kind``).
    ``None`` (and a :class:`~torchmem.results.oom.LeakEvidence`) passes through.

    Example:
        >>> as_leak_evidence({"bytes_per_step": 4096, "culprits": [{"site": "train.py:42", "bytes": 4096}]})
        ... # doctest: +ELLIPSIS
        LeakEvidence(bytes_per_step=4096.0, culprits=(LeakSite(site='train.py:42', ...),), ...)
    """
    if obj is None or isinstance(obj, LeakEvidence):
        return obj
    bps = _get(obj, "bytes_per_step")
    if bps is None:
        return None
    culprits = tuple(
        LeakSite(
            site=None if _get(c, "site") is None else str(_get(c, "site")),
            holder=None if _get(c, "holder") is None else str(_get(c, "holder")),
            bytes=None if _get(c, "bytes") is None else int(_get(c, "bytes")),
            fix=None if _get(c, "fix") is None else str(_get(c, "fix")),
            kind=None if _get(c, "kind") is None else str(_get(c, "kind")),
        )
        for c in (_get(obj, "culprits") or ())
    )
    leaking = _get(obj, "leaking")
    steps = _get(obj, "steps")
    return LeakEvidence(
        float(bps),
        culprits,
        None if leaking is None else bool(leaking),
        None if steps is None else int(steps),
    )


def diagnose(
    parsed: ParsedOOM | None,
    state: AllocatorState | None = None,
    *,
    alloc_conf: str | None = None,
    leak: Any = None,
    pinned: Sequence[PinnedTensor] = (),
    working_set: Sequence[WorkingSetItem] = (),
    batch_size: int | None = None,
    grad_enabled: bool | None = None,
    notes: Sequence[str] = (),
    machine: MachineMemory | None = None,
    while_handling: str | None = None,
    holders: OOMHolders | None = None,
) -> OOMDiagnosis:
    """Classify an OOM from its parsed message and whatever else is known. Pure: no device is read.

    Args:
        parsed: The parsed message (:func:`parse_oom_message`), or ``None`` when only a state is known.
        state: The allocator state at (or near) the OOM; its figures win over the message's rounded ones.
        alloc_conf: ``PYTORCH_CUDA_ALLOC_CONF`` (or the HIP one) in effect; fixes already in effect are never
            suggested. ``None``: the state's, else none.
        leak: A leak trend: a watcher report, object or dict with ``bytes_per_step`` and ``culprits``.
        pinned: Device memory held by finished exceptions' frames or notebook output history.
        working_set: The biggest holders, categories or allocation sites at the OOM.
        batch_size: The batch size of the failing step, to suggest a smaller one.
        grad_enabled: Whether autograd was recording (``False``: no ``no_grad`` fix is suggested).
        notes: Notes to carry into the diagnosis (what capture could not read).
        machine: The host's memory (total RAM, container limit), for an OOM of the CPU allocator, whose
            message gives only the request: a request larger than it is ``too_large``.
        while_handling: The type of an earlier OOM that was being handled when this one was raised (a retry
            inside ``except``): ``pinned`` then lists what that exception's frames hold, and the cause is
            ``pinned_by_exception`` with the fix of retrying after the ``except`` block.
        holders: Who held the memory at the OOM (:func:`torchmem.analysis.oom.holders.oom_holders`): the
            working set's evidence names the largest and its fixes follow from what they hold; each named
            situation is a cause of its own (``training_graph``, ``previous_outputs``,
            ``orphaned_optimizer``, ``autograd_cycle``), and the failed attempt's frames of a retry inside
            ``except`` are counted with their graphs. Kept in the diagnosis (``diagnosis.holders``).

    Example:
        >>> from torchmem.analysis.oom import parse_oom_message
        >>> p = parse_oom_message(
        ...     "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of "
        ...     "which 1.20 GiB is free. Including non-PyTorch memory, this process has 77.98 GiB memory in "
        ...     "use. Of the allocated memory 60.00 GiB is allocated by PyTorch, and 17.00 GiB is reserved "
        ...     "by PyTorch but unallocated.")
        >>> diagnose(p).causes[0].kind
        'fragmentation'
    """
    out_notes = list(notes)
    if parsed is not None:
        out_notes.extend(parsed.notes)
    if parsed is not None and not parsed.is_oom:
        return OOMDiagnosis(False, parsed, (), (), state, None, {}, tuple(out_notes))
    if parsed is None and state is None:
        out_notes.append("No out-of-memory message and no allocator state: nothing to diagnose.")
        return OOMDiagnosis(False, None, (), (), None, None, {}, tuple(out_notes))
    conf_text = alloc_conf if alloc_conf is not None else (state.alloc_conf if state is not None else None)
    settings = parse_alloc_conf(conf_text)
    f = merge_figures(parsed, state, machine)
    frag: FragmentationReport | None = None
    if state is not None and state.segments is not None:
        frag = analyze_fragmentation(state.segments, f.requested, f.free)
    if parsed is not None and parsed.truncated:
        out_notes.append("The message is cut short: causes that need the missing figures are not judged.")
    leak_evidence = as_leak_evidence(leak)
    if (
        f.source == "allocator"
        and not limited(f)
        and f.requested is not None
        and f.free is not None
        and f.free > f.requested + f.tol
    ):
        out_notes.append(
            f"The device reported {fmt_bytes(f.free)} free, more than the {fmt_bytes(f.requested)} "
            "requested, yet the driver refused it: on Windows (WDDM) and with unified memory the driver "
            "can refuse earlier, and a per-allocation size limit or another process allocating at the same "
            "moment has the same effect."
        )

    causes: list[Cause] = []
    if f.source in ("driver", "cublas", "cudnn", "nccl"):
        causes.append(rules.outside_allocator(parsed, f))
    else:
        big = rules.too_large(f, batch_size)
        if big is not None:
            # The request can never fit, even with every tensor freed: nothing that frees memory (the working
            # set, a leak, pinned memory, fragmentation, other processes) is a cause or a fix.
            causes.append(big)
        else:
            for c in (
                rules.fragmentation(f, frag, settings, parsed),
                rules.other_processes(f),
                rules.working_set(f, working_set, batch_size, grad_enabled, holders),
            ):
                if c is not None:
                    causes.append(c)
            for s in holders.situations if holders is not None else ():
                if s.kind != "retry_in_except":  # the retry is pinned_by_exception's, below
                    causes.append(rules.situation(s, f))
    if not any(c.kind == "too_large" for c in causes):
        lc = rules.leak(leak_evidence)
        if lc is not None:
            causes.append(lc)
        retry = next(
            (s for s in (holders.situations if holders is not None else ()) if s.kind == "retry_in_except"),
            None,
        )
        pc = rules.pinned(pinned, f, while_handling, retry)
        if pc is not None:
            causes.append(pc)
        elif while_handling:
            out_notes.append(
                f"Raised while an earlier {while_handling} was being handled (a retry inside the except "
                "block), but that exception's frames hold no tensors on this device."
            )
    elif while_handling:
        out_notes.append(
            f"Raised while an earlier {while_handling} was being handled; no freeing would help, as the "
            "request can never fit."
        )
    if f.source == "cpu_allocator" and f.total is None:
        out_notes.append(
            "The CPU allocator's message gives only the request size, and the machine's memory is not known."
        )
    if f.machine is not None and f.machine.read_here:
        out_notes.append(
            "The CPU allocator's message gives only the request size: the machine's memory was read on "
            "this machine. If the message comes from another machine, judge it against that one's RAM."
        )
    causes.sort(key=lambda c: -c.score)
    # a cause that explains everything makes weaker ones secondary; keep them (ranked) but drop duplicates
    fixes: list[Fix] = []
    seen: set[tuple[str, str | None]] = set()
    for c in causes:
        for fx in c.fixes:
            key = (fx.kind, fx.setting or fx.text)
            if fx.kind == "batch_size" and fx.setting is None and any(x.kind == "batch_size" for x in fixes):
                continue  # one "use a smaller batch" is enough
            if key not in seen:
                seen.add(key)
                fixes.append(fx)
    return OOMDiagnosis(
        is_oom=True,
        parsed=parsed,
        causes=tuple(causes),
        fixes=tuple(fixes),
        state=state,
        fragmentation=frag,
        settings=settings,
        notes=tuple(dict.fromkeys(out_notes)),
        machine=f.machine,
        holders=holders,
    )


__all__ = ["as_leak_evidence", "diagnose"]
