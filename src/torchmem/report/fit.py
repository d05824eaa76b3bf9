"""Text rendering of the "what fits" reports: :class:`BatchSizeResult` and :class:`MemoryEstimate`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchmem._format import fmt_bytes

if TYPE_CHECKING:
    from torchmem.actions.batch_size import BatchSizeResult
    from torchmem.analysis.estimate import MemoryEstimate


def render_batch_size(r: BatchSizeResult) -> str:
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


def render_estimate(e: MemoryEstimate) -> str:
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
