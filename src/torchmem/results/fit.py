"""What fits: the batch-size search's result (:class:`BatchSizeResult` and its :class:`Trial` s) and the
memory estimate (:class:`MemoryEstimate`, its :class:`EstimateRow` s and the :class:`StepMeasurement` s
behind it), each with ``to_dict()``, ``from_dict()`` and, for the two reports, its plain-text rendering as
``str()``.

Frozen dataclasses only: building one costs its fields, ``to_dict()`` a copy of them, ``from_dict()`` one
pass over the stored dict (``torchmem.results._dicts.from_mapping``); ``str()`` formats one line per trial or
row. Nothing here imports torch or measures anything.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from torchmem._format import fmt_bytes
from torchmem.results._dicts import ResultFormatError, from_mapping


# -- the batch-size search (torchmem.find_batch_size) ----------------------------------------------------
@dataclass(frozen=True)
class Trial:
    """One call of the step at one batch size.

    Attributes:
        batch_size: The size tried.
        ok: It ran without running out of memory and (with a margin or a capacity) within the budget.
        oom: It raised ``torch.OutOfMemoryError`` (on any rank, under torch.distributed).
        peak: Its peak, in bytes, of the figure the search models (``metric`` of the result), absolute;
            ``None`` when it ran out of memory.
        seconds: Wall time of the call.
        note: ``"warm-up"`` (it left live tensors behind, e.g. optimizer state created by the first
            step), ``"over budget"``, ``"out of memory"``, ``"stopped after its optimizer steps"``
            (decorator probes), ``"closing run"`` (the answer run once more at the end, after an
            out-of-memory call left tensors behind) or empty.
        allocated_peak: CUDA: its peak of allocated (live tensor) bytes, absolute, which the search
            models beside the reserved peak; ``None`` on the CPU (the ledger is exact) or when it did not
            run.
    """

    batch_size: int
    ok: bool
    oom: bool
    peak: int | None
    seconds: float
    note: str = ""
    allocated_peak: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Trial:
        """The trial stored as :meth:`to_dict` wrote it."""
        return from_mapping(cls, d)


@dataclass(frozen=True)
class BatchSizeResult:
    """What :func:`torchmem.find_batch_size` found.

    Attributes:
        batch_size: The largest size that ran within the budget (the answer).
        trials: Every call of the step, in order.
        predicted: The model's last prediction of the largest size within the budget (before clamping to
            ``max_size`` or to the sizes known to fail; on CUDA with ``margin=0``, the top of the band:
            where the allocated-peak line reaches the capacity); ``None`` if no model could be fitted.
        true_max_upper_bound: The smallest size that ran out of memory (the true maximum is below it);
            ``None`` if nothing ran out of memory.
        seconds: Wall time of the whole search.
        device: The device measured.
        metric: The figure modelled: ``"reserved"`` (CUDA allocator), ``"allocated"`` or ``"ledger"``
            (exact CPU tensor bytes).
        capacity: Bytes that figure may reach: the device's free memory plus what this process holds, or
            the :func:`torchmem.limit` in force, or ``capacity=``; ``None`` if unknown.
        budget: ``capacity`` less ``margin`` of the headroom above ``baseline``.
        baseline: The figure before the first trial.
        margin: The safety margin asked for.
        fixed_bytes / bytes_per_sample: The fitted line ``peak = fixed + per_sample * batch_size``.
        world_size: Ranks that agreed on the result (1 outside torch.distributed).
        note: Why the search stopped where it did, in words.
        extra: Model details for people and tests: ``"band"`` (the ``(lo, hi)`` sizes where the reserved
            and the allocated lines reach the budget) and ``"allocated_line"`` (``(fixed, per_sample)``
            of allocated bytes), where fitted.
    """

    batch_size: int
    trials: tuple[Trial, ...]
    predicted: int | None
    true_max_upper_bound: int | None
    seconds: float
    device: str
    metric: str
    capacity: int | None
    budget: int | None
    baseline: int | None
    margin: float
    fixed_bytes: float | None
    bytes_per_sample: float | None
    world_size: int = 1
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def num_trials(self) -> int:
        return len(self.trials)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["num_trials"] = self.num_trials
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> BatchSizeResult:
        """The result stored as :meth:`to_dict` wrote it (``num_trials`` is computed, so ignored).

        ``extra``'s pairs (``"band"``, ``"allocated_line"``) come back as tuples, as the search wrote
        them, also from JSON, which stores them as lists.
        """
        extra = d.get("extra") if isinstance(d, Mapping) else None
        if extra is not None and not isinstance(extra, Mapping):
            raise ResultFormatError(f"BatchSizeResult.extra: expected an object, got {type(extra).__name__}")
        pairs = {str(k): tuple(v) if isinstance(v, list) else v for k, v in (extra or {}).items()}
        return from_mapping(cls, d, extra=pairs)

    def __str__(self) -> str:
        return render_batch_size(self)


def render_batch_size(r: BatchSizeResult) -> str:
    """The search in plain text: the answer, the budget, the fitted line, then one line per trial."""
    lines = [
        f"batch size {r.batch_size} on {r.device} ({len(r.trials)} trial(s), {r.seconds:.2f} s"
        + (f", agreed by {r.world_size} ranks" if r.world_size > 1 else "")
        + ")",
        f"  budget {fmt_bytes(r.budget)} of capacity {fmt_bytes(r.capacity)} "
        f"(margin {r.margin:.0%} of the headroom over {fmt_bytes(r.baseline)}; {r.metric} bytes)",
    ]
    if r.bytes_per_sample is not None and r.fixed_bytes is not None:
        lines.append(
            f"  model: peak = {fmt_bytes(r.fixed_bytes)} + {fmt_bytes(r.bytes_per_sample)} x batch size"
            + (f"; predicted {r.predicted}" if r.predicted is not None else "")
        )
    if r.true_max_upper_bound is not None:
        lines.append(f"  out of memory at {r.true_max_upper_bound}: the true maximum is below it")
    for t in r.trials:
        state = "ok" if t.ok else ("OOM" if t.oom else "no")
        extra = f" ({t.note})" if t.note else ""
        lines.append(
            f"    {t.batch_size:>8}  {state:<3} peak {fmt_bytes(t.peak):>11}  {t.seconds:.3f} s{extra}"
        )
    if r.note:
        lines.append(f"  {r.note}")
    return "\n".join(lines)


# -- the memory estimate (torchmem.estimate) -------------------------------------------------------------
@dataclass(frozen=True)
class StepMeasurement:
    """The figures of one measured step at one batch size, in bytes above the figure before the model
    copy existed (so parameters, optimizer state and workspaces the step created are all included).

    Attributes:
        batch_size: The batch size measured.
        forward_peak: Peak during forward and loss (training mode, autograd on).
        after_forward: Figure at the end of forward: persistent state + saved activations + outputs.
        before_forward: Figure at the start of forward (persistent state only).
        backward_peak: Peak during ``loss.backward()``.
        step_peak: Peak during ``optimizer.step()`` (``None`` without an optimizer).
        inference_peak: Peak of a forward in eval mode under ``torch.inference_mode()``.
        before_inference: Figure before that forward.
        saved_for_backward: Bytes autograd saved for backward and still held at the end of forward (each
            storage once, the model's parameters and buffers excluded); ``None`` when not measured, and then
            the growth over forward (``after_forward - before_forward``) stands in for it.
    """

    batch_size: int
    forward_peak: int | None
    after_forward: int | None
    before_forward: int | None
    backward_peak: int | None
    step_peak: int | None
    inference_peak: int | None
    before_inference: int | None
    saved_for_backward: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> StepMeasurement:
        """The measurement stored as :meth:`to_dict` wrote it."""
        return from_mapping(cls, d)


@dataclass(frozen=True)
class EstimateRow:
    """The predicted peak of one mode at one batch size, and what it is made of (bytes).

    ``activations`` is what the step saves for backward at this batch size (0 for inference). Where the
    forward or backward holds the peak, ``parameters + gradients + optimizer_state + activations +
    temporaries == peak``: the parts live in that phase, attributed in that order (gradients and activations
    overlap in time during backward; temporaries is what is left). Where the optimizer step holds it, the
    activations were freed before it (``activations_in_peak`` is ``False``) and ``parameters + gradients +
    optimizer_state + temporaries == peak``.

    Attributes:
        batch_size: The batch size.
        mode: ``"training"`` or ``"inference"``.
        peak: Predicted peak.
        phase: The phase that holds it: ``"forward"``, ``"backward"``, ``"optimizer"`` or ``"inference"``.
        measured: Whether this batch size was measured rather than extrapolated.
    """

    batch_size: int
    mode: str
    peak: int
    parameters: int
    gradients: int
    optimizer_state: int
    activations: int
    temporaries: int
    phase: str
    measured: bool

    @property
    def activations_in_peak(self) -> bool:
        """Whether ``activations`` are a part of ``peak`` (not when the optimizer step holds it)."""
        return self.phase in ("forward", "backward")

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["activations_in_peak"] = self.activations_in_peak
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> EstimateRow:
        """The row stored as :meth:`to_dict` wrote it (``activations_in_peak`` is computed, so ignored)."""
        return from_mapping(cls, d)


@dataclass(frozen=True)
class MemoryEstimate:
    """What :func:`torchmem.estimate` predicts.

    Attributes:
        model: The model's class name.
        device: The device the estimate is for (and was measured on).
        measured_on: Where the small steps ran.
        measured_at: The batch sizes measured.
        parameters / gradients / optimizer_state: Batch-independent sizes, in bytes.
        activations_per_sample: Bytes saved for backward per sample (fitted slope of
            :attr:`StepMeasurement.saved_for_backward`).
        rows: One :class:`EstimateRow` per batch size and mode (training first, then inference).
        measurements: The raw measured steps.
        weights_only: The figure weights-only estimators report (parameters and buffers, no optimizer,
            no activations), for comparison.
        notes: Caveats in words.
    """

    model: str
    device: str
    measured_on: str
    measured_at: tuple[int, ...]
    parameters: int
    gradients: int
    optimizer_state: int
    activations_per_sample: float
    rows: tuple[EstimateRow, ...]
    measurements: tuple[StepMeasurement, ...]
    weights_only: int
    notes: tuple[str, ...] = ()

    def peak(self, batch_size: int, mode: str = "training") -> int | None:
        """The predicted peak of ``mode`` at ``batch_size`` (a size in ``rows``), else ``None``."""
        for r in self.rows:
            if r.batch_size == batch_size and r.mode == mode:
                return r.peak
        return None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> MemoryEstimate:
        """The estimate stored as :meth:`to_dict` wrote it."""
        return from_mapping(cls, d)

    def __str__(self) -> str:
        return render_estimate(self)


def render_estimate(e: MemoryEstimate) -> str:
    """The estimate in plain text: the fixed sizes, then one line per batch size and mode, split."""
    head = (
        f"memory estimate for {e.model} on {e.device} (measured at batch sizes "
        f"{', '.join(str(b) for b in e.measured_at)} on {e.measured_on})"
    )
    lines = [
        head,
        f"  parameters {fmt_bytes(e.parameters)}, gradients {fmt_bytes(e.gradients)}, "
        f"optimizer state {fmt_bytes(e.optimizer_state)}",
        f"  {'batch':>8} {'mode':<9} {'peak':>11} {'params':>11} {'grads':>11} {'optim':>11} "
        f"{'activations':>12} {'temporaries':>11}  peak in",
    ]
    freed = False
    for row in e.rows:
        acts = fmt_bytes(row.activations)
        if row.mode == "training" and not row.activations_in_peak:
            acts += "*"
            freed = True
        else:
            acts += " "
        lines.append(
            f"  {row.batch_size:>8} {row.mode:<9} {fmt_bytes(row.peak):>11} {fmt_bytes(row.parameters):>11} "
            f"{fmt_bytes(row.gradients):>11} {fmt_bytes(row.optimizer_state):>11} "
            f"{acts:>12} {fmt_bytes(row.temporaries):>11}  {row.phase}"
        )
    if freed:
        lines.append(
            "  * activations are freed before the optimizer step, which holds the peak: not a part of it"
        )
    for n in e.notes:
        lines.append(f"  note: {n}")
    return "\n".join(lines)


# -- the device-free estimate (torchmem.estimate(..., target=...)) ----------------------------------------
@dataclass(frozen=True)
class Change:
    """One change that lowers a device-free estimate's peak, estimated.

    Attributes:
        kind: ``"dtype"``, ``"checkpoint"``, ``"sharding"`` or ``"batch_size"``.
        what: The change in words (with the modules and the bytes each saves, for checkpointing).
        saves: Bytes the device peak goes down by.
        peak: The device peak with the change.
        fits: Whether that peak fits on the target.
    """

    kind: str
    what: str
    saves: int
    peak: int
    fits: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Change:
        """The change stored as :meth:`to_dict` wrote it."""
        return from_mapping(cls, d)


@dataclass(frozen=True)
class TargetEstimate(MemoryEstimate):
    """A device-free estimate for a target GPU: a :class:`MemoryEstimate` (per rank; its rows are allocated
    bytes, with the allocator's block rounding and the cuBLAS workspace) and the verdict.

    Attributes:
        target: The target GPU's name; ``target_total`` its memory in bytes.
        overhead: Bytes outside the caching allocator: CUDA context, libraries, NCCL buffers.
        workspace: The cuBLAS workspaces in the verdict's row (one in inference, two in training: the main
            thread's and the autograd engine's backward thread's).
        fragmentation: The allowance for reserved above allocated bytes, as a fraction.
        batch_size / mode: What the verdict is for (the largest batch size asked, per rank).
        allocated_peak: The row's peak (or the generate peak, with ``generate_tokens``).
        reserved_peak: With the fragmentation allowance.
        device_peak: ``reserved_peak + overhead``: what ``nvidia-smi`` would show, compared with
            ``target_total``.
        fits: ``device_peak <= target_total``.
        largest_batch_size: The largest per-rank batch size that fits (``None``: not even 1).
        largest_batch_exact: ``False`` when the search for it stopped on a fake run that failed (the notes
            say which): ``largest_batch_size`` is then the largest size known to fit, a lower bound
            (``None``: unknown).
        strategy / world_size: The sharding (``"none"``, ``"ddp"``, ``"fsdp"``, ``"zero1"``-``"zero3"``).
        grad_accum / checkpointed: Gradient accumulation steps; the modules checkpointed.
        kv_cache / generate_tokens: The KV cache of a generate call of that many new tokens (inference).
        changes: When it does not fit: the changes that make it fit (each alone, or, where none does alone,
            combined), most bytes saved first. A change that still does not fit is not one of them.
        closest: When it does not fit and nothing tried fits: the change (or combination) with the smallest
            device peak found (its ``fits`` is ``False``); ``None`` otherwise.
        method: ``"fake-tensor"`` (or ``"meta-device"`` where fake tensors are unavailable).
    """

    target: str = ""
    target_total: int = 0
    overhead: int = 0
    workspace: int = 0
    fragmentation: float = 0.0
    batch_size: int = 0
    mode: str = "training"
    allocated_peak: int = 0
    reserved_peak: int = 0
    device_peak: int = 0
    fits: bool = False
    largest_batch_size: int | None = None
    largest_batch_exact: bool = True
    strategy: str = "none"
    world_size: int = 1
    grad_accum: int = 1
    checkpointed: tuple[str, ...] = ()
    kv_cache: int = 0
    generate_tokens: int = 0
    changes: tuple[Change, ...] = ()
    closest: Change | None = None
    method: str = "fake-tensor"

    @property
    def verdict(self) -> str:
        """One line: fits / does not fit on the target, the peak, the largest batch size."""
        gib = 1 << 30
        head = "fits" if self.fits else "does not fit"
        rank = f" per rank ({self.strategy} x{self.world_size})" if self.strategy != "none" else ""
        if not self.largest_batch_exact:
            largest = (
                f"largest batch size at least {self.largest_batch_size} (the search stopped: see the notes)"
                if self.largest_batch_size is not None
                else "largest batch size unknown (the search stopped: see the notes)"
            )
        elif self.largest_batch_size is not None:
            largest = f"largest batch size {self.largest_batch_size}"
        else:
            largest = "not even batch size 1 fits"
        return (
            f"{head} on {self.target}{rank}: peak {self.device_peak / gib:.2f} of "
            f"{self.target_total / gib:.2f} GiB "
            f"at batch size {self.batch_size} ({self.mode}), {largest}"
        )

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TargetEstimate:
        """The estimate stored as :meth:`to_dict` wrote it."""
        return from_mapping(cls, d)

    def __str__(self) -> str:
        return render_target_estimate(self)


def render_target_estimate(e: TargetEstimate) -> str:
    """The verdict, the per-rank table, what the device adds, then the ranked changes."""
    lines = [e.verdict, render_estimate(e)]
    lines.append(
        f"  device peak {fmt_bytes(e.device_peak)} = allocated {fmt_bytes(e.allocated_peak)} "
        f"+ fragmentation allowance {e.fragmentation:.0%} + context/libraries/NCCL {fmt_bytes(e.overhead)}"
    )
    if e.kv_cache:
        lines.append(f"  KV cache after {e.generate_tokens} new tokens: {fmt_bytes(e.kv_cache)}")
    if e.changes:
        lines.append("  changes that make it fit, most saved first:")
        for c in e.changes:
            lines.append(f"    - {c.what}: peak {fmt_bytes(c.peak)} (saves {fmt_bytes(c.saves)})")
    elif e.closest is not None:
        c = e.closest
        lines.append(
            f"  nothing torchmem tried fits on {e.target}: the smallest peak found is {fmt_bytes(c.peak)} "
            f"of {fmt_bytes(e.target_total)}, with {c.what}"
        )
    return "\n".join(lines)


__all__ = [
    "BatchSizeResult",
    "Change",
    "EstimateRow",
    "MemoryEstimate",
    "StepMeasurement",
    "TargetEstimate",
    "Trial",
    "render_batch_size",
    "render_estimate",
    "render_target_estimate",
]
