"""What an out-of-memory diagnosis returns, and its plain-text rendering.

* :class:`OOMEvent` — one out-of-memory error at the moment it was raised, caught by the program or not: the
  device, the request, the user's line, the OOM being handled when it was raised, and its diagnosis.
* :class:`OOMDiagnosis` — the ranked :class:`Cause` s, each with its evidence and :class:`Fix` es, the fields
  of the message (:class:`ParsedOOM`), the allocator state it used (:class:`AllocatorState`, its segments and
  blocks) and what that state says about fragmentation (:class:`FragmentationReport`), and the host memory a
  CPU out-of-memory was judged against (:class:`MachineMemory`).
* :class:`OOMRecovery` — what an OOM handler found and freed.

The parts live beside this module and are re-exported here: the allocator state in
:mod:`torchmem.results.allocator`, the message's fields in :mod:`torchmem.results.oom_message`, the evidence a
caller hands to the diagnosis in :mod:`torchmem.results.oom_evidence` (:class:`PinnedTensor`,
:class:`WorkingSetItem`, :class:`LeakEvidence`, :class:`MachineMemory`) and who held the memory in
:mod:`torchmem.results.oom_holders`.

Every type is a frozen dataclass with ``to_dict()`` and a classmethod ``from_dict()`` (its inverse, through
:func:`torchmem.results._dicts.from_mapping`), and ``str()`` gives its plain text: ``str(diagnosis)`` is
what ``torchmem explain`` prints, :func:`render_diagnosis` with ``fields=True`` adds the message's fields.
The stored form of a diagnosis keeps a summary of its allocator state, not the segments: ``from_dict()``
gives ``state=None``. Nothing here touches torch or a device; rendering costs one pass over the causes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from torchmem._format import fmt_bytes
from torchmem.results._dicts import from_mapping
from torchmem.results.allocator import (
    ALLOCATED,
    FREE,
    PENDING,
    AllocatorState,
    Block,
    FragmentationReport,
    OtherProcess,
    PoolFree,
    Segment,
)
from torchmem.results.oom_evidence import LeakEvidence, LeakSite, MachineMemory, PinnedTensor, WorkingSetItem
from torchmem.results.oom_holders import HolderFix, MemoryHolder, OOMHolders, Situation
from torchmem.results.oom_message import (
    ALLOCATOR_SOURCES,
    FORMAT_WORDS,
    SOURCE_WORDS,
    ParsedOOM,
    field_lines,
    render_fields,
)

# ---------------------------------------------------------------------------------------------------------
# causes and fixes


@dataclass(frozen=True)
class Fix:
    """One concrete change, with the exact setting or code where there is one.

    Attributes:
        kind: ``"alloc_conf"``, ``"batch_size"``, ``"dtype"``, ``"checkpointing"``, ``"no_grad"``,
            ``"zero_grad"``, ``"item"``, ``"release"``, ``"processes"``, ``"limit"``, ``"chunk"``,
            ``"empty_cache"``, ``"leak"``.
        text: What to do and why, in a sentence.
        setting: The exact environment variable or code
            (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``).
    """

    kind: str
    text: str
    setting: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "text": self.text, "setting": self.setting}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Fix:
        return from_mapping(cls, d)

    def __str__(self) -> str:
        return "\n".join(_fix_lines(self, ""))


#: Every kind of cause, in the order the documentation lists them.
CAUSE_KINDS = (
    "too_large",
    "fragmentation",
    "other_processes",
    "leak",
    "pinned_by_exception",
    "working_set",
    "outside_allocator",
    "training_graph",
    "previous_outputs",
    "orphaned_optimizer",
    "autograd_cycle",
)

#: A cause's kind, in words.
CAUSE_TITLES = {
    "too_large": "request too large",
    "fragmentation": "fragmentation",
    "other_processes": "other processes",
    "leak": "leak",
    "pinned_by_exception": "memory pinned by an exception's frames / notebook output",
    "working_set": "working set",
    "outside_allocator": "memory error outside PyTorch's allocator",
    "training_graph": "a training graph kept alive during evaluation",
    "previous_outputs": "the previous batch's outputs kept",
    "orphaned_optimizer": "an optimizer of a deleted model",
    "autograd_cycle": "a cycle through autograd",
}


@dataclass(frozen=True)
class Cause:
    """One cause of the OOM with its evidence.

    Attributes:
        kind: ``"too_large"``, ``"fragmentation"``, ``"other_processes"``, ``"leak"``,
            ``"pinned_by_exception"``, ``"working_set"``, ``"outside_allocator"``, or a situation the
            holders of the memory show (:data:`~torchmem.results.oom_holders.SITUATION_KINDS`):
            ``"training_graph"``, ``"previous_outputs"``, ``"orphaned_optimizer"``, ``"autograd_cycle"``.
        summary: One sentence.
        evidence: The figures behind it, one per line.
        bytes: The bytes this cause accounts for (shortfall, free cache, other processes' use...).
        confidence: ``"high"``, ``"medium"`` or ``"low"``.
        fixes: The fixes this evidence supports.
        score: How strongly the evidence points at this cause; the diagnosis ranks causes by it.
    """

    kind: str
    summary: str
    evidence: tuple[str, ...]
    bytes: int | None
    confidence: str
    fixes: tuple[Fix, ...] = ()
    score: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "summary": self.summary,
            "evidence": list(self.evidence),
            "bytes": self.bytes,
            "confidence": self.confidence,
            "fixes": [f.to_dict() for f in self.fixes],
            "score": self.score,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Cause:
        return from_mapping(cls, d)

    def __str__(self) -> str:
        return "\n".join(_cause_lines(self))


def _cause_lines(c: Cause) -> list[str]:
    return [f"[{c.confidence}] {CAUSE_TITLES.get(c.kind, c.kind)}: {c.summary}"] + [
        f"     {e}" for e in c.evidence
    ]


def _fix_lines(f: Fix, indent: str) -> list[str]:
    return [f"{indent}- {f.text}"] + ([f"{indent}    {f.setting}"] if f.setting else [])


# ---------------------------------------------------------------------------------------------------------
# the diagnosis


@dataclass(frozen=True)
class OOMDiagnosis:
    """Why an allocation failed, ranked, with evidence and fixes. ``str()`` explains it in plain words.

    Attributes:
        is_oom: The input was an out-of-memory error.
        parsed: The fields of the message (``None`` when no message was given or found).
        causes: Causes, most likely first.
        fixes: Every cause's fixes, deduplicated, in rank order.
        state: The allocator state the diagnosis used (``None``: the message alone, or a diagnosis read back
            from its stored form, which keeps only a summary of the state).
        fragmentation: Fragmentation figures from the state, when there was one.
        settings: Allocator settings in effect (parsed ``PYTORCH_CUDA_ALLOC_CONF``).
        notes: What could not be known, and why.
        machine: The host memory a CPU OOM was judged against (``None``: not a CPU OOM, or unknown).
        holders: Who held the memory of the OOM's device (:class:`~torchmem.results.oom_holders.OOMHolders`:
            the largest holders with their bytes, what has no holder, what no live tensor explains, and the
            situations behind them); ``None`` for a pasted message or where they could not be read.
    """

    is_oom: bool
    parsed: ParsedOOM | None
    causes: tuple[Cause, ...]
    fixes: tuple[Fix, ...]
    state: AllocatorState | None = None
    fragmentation: FragmentationReport | None = None
    settings: Mapping[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    machine: MachineMemory | None = None
    holders: OOMHolders | None = None

    @property
    def cause(self) -> Cause | None:
        """The most likely cause."""
        return self.causes[0] if self.causes else None

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(c.kind for c in self.causes)

    def __str__(self) -> str:
        return render_diagnosis(self)

    def to_dict(self) -> dict[str, Any]:
        """Everything but the state's segments: ``state`` is :meth:`AllocatorState.summary_dict`."""
        return {
            "is_oom": self.is_oom,
            "parsed": None if self.parsed is None else self.parsed.to_dict(),
            "causes": [c.to_dict() for c in self.causes],
            "fixes": [f.to_dict() for f in self.fixes],
            "fragmentation": None if self.fragmentation is None else self.fragmentation.to_dict(),
            "state": None if self.state is None else self.state.summary_dict(),
            "settings": dict(self.settings),
            "notes": list(self.notes),
            "machine": None if self.machine is None else self.machine.to_dict(),
            "holders": None if self.holders is None else self.holders.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> OOMDiagnosis:
        """Inverse of :meth:`to_dict`, but for the allocator state: the stored summary does not hold the
        segments, so ``state`` is ``None``."""
        return from_mapping(cls, d, state=None)


@dataclass(frozen=True)
class OOMEvent:
    """One out-of-memory error, recorded at the moment it was raised — whether the program then caught it
    or not (:func:`torchmem.capture.oom.watch_ooms` delivers these). ``str()`` is two or three lines: where,
    what, and the most likely cause with its first fix.

    Attributes:
        index: The number of this OOM in the process (1, 2, ...), all devices together.
        device: ``"cuda:0"``, ``"cpu"`` (a cap set by ``torchmem.limit()`` / ``budget(hard=True)``)...
        requested: The request that failed, in bytes (the allocator's rounded block on CUDA).
        site: The user's line that raised it, ``"train.py:12"``: the innermost frame outside torch, torchmem
            and the standard library (``None``: no such frame, e.g. autograd's backward thread).
        function: The function of that line.
        filename: The full path of that line's file.
        thread: The name of the thread that raised it.
        timestamp: ``time.time()`` of the OOM.
        while_handling: The type of the out-of-memory error that was being handled on that thread when this
            one was raised (``"torch.OutOfMemoryError"``): a retry inside an ``except`` block, while the
            failed attempt's frames — and their tensors — are still alive. ``None``: none was.
        handling_index: The ``index`` of that earlier OOM, when it was recorded too.
        source: Who raised it: ``"allocator"`` (PyTorch's caching allocator) or ``"torchmem_cap"``.
        detail: ``"full"`` (allocator segments, other processes and pinned memory were read) or ``"brief"``
            (a later OOM of a long run of them: the figures of the moment only, to keep each one cheap).
        diagnosis: The :class:`OOMDiagnosis` made at that moment (``None`` if it could not be made). Who held
            the memory is looked for where the error reached the program (the ``except`` that caught it), not
            at the moment, inside the allocator: the diagnosis is then completed with
            :attr:`OOMDiagnosis.holders` and the causes they show — on this event object, in place (the one
            update a frozen event gets), shortly after its callback ran.
    """

    index: int
    device: str
    requested: int | None = None
    site: str | None = None
    function: str | None = None
    filename: str | None = None
    thread: str | None = None
    timestamp: float | None = None
    while_handling: str | None = None
    handling_index: int | None = None
    source: str | None = None
    detail: str = "full"
    diagnosis: OOMDiagnosis | None = None

    def _complete(self, diagnosis: OOMDiagnosis) -> None:
        """Replace the diagnosis made at the moment by the one completed with the holders of the memory (see
        ``diagnosis``); only :mod:`torchmem.capture.oom` calls this."""
        object.__setattr__(self, "diagnosis", diagnosis)

    @property
    def kind(self) -> str | None:
        """The most likely cause's kind (``"pinned_by_exception"``, ``"fragmentation"``...), if any."""
        d = self.diagnosis
        return d.causes[0].kind if d is not None and d.causes else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "device": self.device,
            "requested": self.requested,
            "site": self.site,
            "function": self.function,
            "filename": self.filename,
            "thread": self.thread,
            "timestamp": self.timestamp,
            "while_handling": self.while_handling,
            "handling_index": self.handling_index,
            "source": self.source,
            "detail": self.detail,
            "diagnosis": None if self.diagnosis is None else self.diagnosis.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> OOMEvent:
        """Inverse of :meth:`to_dict` (the diagnosis comes back without its allocator state's segments)."""
        return from_mapping(cls, d)

    def __str__(self) -> str:
        where = f" at {self.site}" if self.site else ""
        if self.site and self.function:
            where += f" in {self.function}()"
        head = f"OOM #{self.index} on {self.device}{where}"
        if self.requested is not None:
            head += f": {fmt_bytes(self.requested)} requested"
        if self.while_handling:
            earlier = f" (OOM #{self.handling_index})" if self.handling_index is not None else ""
            head += f", raised while handling an earlier {self.while_handling}{earlier}"
        lines = [head]
        d = self.diagnosis
        if d is not None and d.causes:
            lines.append("  " + _cause_lines(d.causes[0])[0])
        if d is not None and d.fixes:
            lines += _fix_lines(d.fixes[0], "  ")
        return "\n".join(lines)


def render_diagnosis(d: OOMDiagnosis, fields: bool = False) -> str:
    """The diagnosis in plain words: the causes ranked with their evidence, then the fixes; with ``fields``,
    every field of the message first (what ``torchmem explain`` prints)."""
    if not d.is_oom:
        lines = ["Not an out-of-memory error."]
        if d.parsed is not None and d.parsed.error_code:
            lines.append(f"  ({d.parsed.error_code})")
        lines += [f"note: {n}" for n in d.notes]
        return "\n".join(lines)
    p = d.parsed
    head = "Out of memory"
    if p is not None:
        where = f" on GPU {p.device_index}" if p.device_index is not None else ""
        if p.source == "torchmem_cap":
            where = f" on {p.backend}" + (f":{p.device_index}" if p.device_index is not None else "")
        req = f": {fmt_bytes(p.requested)} requested" if p.requested is not None else ""
        head += f"{where}{req} ({SOURCE_WORDS.get(p.source or '', p.source or 'unknown')})"
    elif d.state is not None:
        head += f" on {d.state.device}"
        if d.state.requested is not None:
            head += f": {fmt_bytes(d.state.requested)} requested"
    lines = [head]
    if fields and p is not None:
        lines.append("")
        lines.append("What the message says:")
        lines.append(render_fields(p))
    if d.causes:
        lines.append("")
        lines.append("Causes, most likely first:")
        for i, c in enumerate(d.causes, 1):
            first, *evidence = _cause_lines(c)
            lines.append(f"{i}. {first}")
            lines += evidence
    else:
        lines.append("No cause can be judged from what is known.")
    if d.holders is not None:
        lines.append("")
        lines += d.holders.lines()
    if d.fixes:
        lines.append("")
        lines.append("Fixes:")
        for f in d.fixes:
            lines += _fix_lines(f, "  ")
    if d.settings:
        lines.append("")
        lines.append("Allocator settings in effect: " + ",".join(f"{k}:{v}" for k, v in d.settings.items()))
    if d.state is not None and d.state.snapshot_file:
        lines.append(f"Snapshot for https://pytorch.org/memory_viz: {d.state.snapshot_file}")
    for n in d.notes:
        lines.append(f"note: {n}")
    return "\n".join(lines)


@dataclass(frozen=True)
class OOMRecovery:
    """What an OOM handler found and freed.

    Attributes:
        error: ``"OutOfMemoryError: CUDA out of memory. Tried to allocate ..."`` (first line).
        devices: The devices recovered (the OOM's device kind).
        diagnosis: The :class:`OOMDiagnosis` (``None`` if it could not be made).
        freed_bytes: Bytes of tensor storages the cleared frames (and notebook history) held that are now
            freed. Exact: each storage is followed by a weak reference.
        allocated_before / allocated_after: The device's allocated bytes when the handler started and
            ended (first device; ``None`` where unknown, e.g. the CPU without the ledger).
        reserved_before / reserved_after: Likewise for the allocator's reserved bytes.
        frames_cleared: Finished frames of the program (not torch's or torchmem's) whose locals were dropped.
        actions: What was done, in order.
        errors: Steps that failed (recovery goes on after each).
        reraised: Whether the exception was re-raised after recovery.
        seconds: Time the handler took.
    """

    error: str
    devices: tuple[str, ...]
    diagnosis: OOMDiagnosis | None
    freed_bytes: int
    allocated_before: int | None
    allocated_after: int | None
    reserved_before: int | None
    reserved_after: int | None
    frames_cleared: int
    actions: tuple[str, ...]
    errors: tuple[str, ...]
    reraised: bool
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        diag = self.diagnosis
        return {
            "error": self.error,
            "devices": list(self.devices),
            "diagnosis": diag.to_dict() if diag is not None else None,
            "freed_bytes": self.freed_bytes,
            "allocated_before": self.allocated_before,
            "allocated_after": self.allocated_after,
            "reserved_before": self.reserved_before,
            "reserved_after": self.reserved_after,
            "frames_cleared": self.frames_cleared,
            "actions": list(self.actions),
            "errors": list(self.errors),
            "reraised": self.reraised,
            "seconds": self.seconds,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> OOMRecovery:
        """The recovery stored as :meth:`to_dict` wrote it."""
        return from_mapping(cls, d)

    def summary(self) -> str:
        """One line: what came back and how it was measured, or why nothing did."""
        dev = self.devices[0] if self.devices else "the device"
        if self.freed_bytes:
            text = (
                f"torchmem: freed {fmt_bytes(self.freed_bytes)} on {dev}: tensor storages the finished "
                "frames of the error held (each followed by a weak reference)"
            )
        elif self.frames_cleared:
            n = self.frames_cleared
            text = (
                f"torchmem: freed nothing on {dev}: the {n} finished frame{'s' if n > 1 else ''} of the "
                "error held no tensor that nothing else holds"
            )
        else:
            text = (
                f"torchmem: freed nothing on {dev}: the error was raised in a frame still running (the one "
                "with the `with` block), whose variables stay alive; put the work in a function to free them"
            )
        if self.allocated_before is not None and self.allocated_after is not None:
            # On the CPU the figure is torchmem's tensor ledger (on under limit()/cpu_tracking()).
            what = "torchmem's CPU tensor ledger" if dev == "cpu" else "allocated"
            text += (
                f" ({what} {fmt_bytes(self.allocated_before)} -> {fmt_bytes(self.allocated_after)}"
                + (
                    f", reserved {fmt_bytes(self.reserved_before)} -> {fmt_bytes(self.reserved_after)}"
                    if self.reserved_before is not None
                    else ""
                )
                + ")"
            )
        return text + "."

    def __str__(self) -> str:
        lines = []
        if self.diagnosis is not None:
            lines.append(str(self.diagnosis).rstrip())
        else:
            lines.append(self.error)
        lines.append(self.summary())
        lines.extend(f"torchmem: recovery step failed: {e}" for e in self.errors)
        return "\n".join(lines)


__all__ = [
    "ALLOCATED",
    "ALLOCATOR_SOURCES",
    "CAUSE_KINDS",
    "CAUSE_TITLES",
    "FORMAT_WORDS",
    "FREE",
    "PENDING",
    "SOURCE_WORDS",
    "AllocatorState",
    "Block",
    "Cause",
    "Fix",
    "FragmentationReport",
    "HolderFix",
    "LeakEvidence",
    "LeakSite",
    "MachineMemory",
    "MemoryHolder",
    "OOMDiagnosis",
    "OOMEvent",
    "OOMHolders",
    "OOMRecovery",
    "OtherProcess",
    "ParsedOOM",
    "PinnedTensor",
    "PoolFree",
    "Segment",
    "Situation",
    "WorkingSetItem",
    "field_lines",
    "render_diagnosis",
    "render_fields",
]
