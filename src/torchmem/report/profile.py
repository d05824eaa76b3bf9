"""Text rendering of :class:`~torchmem.analysis.profile.ProfileReport` (``str(report)``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchmem._format import fmt_bytes

if TYPE_CHECKING:
    from torchmem.analysis.profile import ProfileReport

MAX_ROWS = 60
_NAME_WIDTH = 44


def _name(module: str, type_: str, depth: int) -> str:
    label = f"{module.rsplit('.', 1)[-1]} ({type_})" if module else f"{type_} (model)"
    text = "  " * depth + label
    return text if len(text) <= _NAME_WIDTH else text[: _NAME_WIDTH - 1] + "…"


def render_profile(p: ProfileReport, max_rows: int = MAX_ROWS) -> str:
    """The per-module table (tree order, larger siblings first, indented by depth) and the reconciliation."""
    lines = [
        f"per-module memory of {p.model} on {p.device} ({p.steps} forward pass(es))",
        f"  {'module':<{_NAME_WIDTH}} {'params':>11} {'grads':>11} {'optim':>11} {'activations':>11} "
        f"{'fwd peak':>11} {'bwd peak':>11}",
    ]
    for r in p.rows[:max_rows]:
        calls = f" x{r.calls}" if r.calls > 1 else ""
        lines.append(
            f"  {_name(r.module, r.type, r.depth) + calls:<{_NAME_WIDTH}} {fmt_bytes(r.params):>11} "
            f"{fmt_bytes(r.grads):>11} {fmt_bytes(r.optimizer_state):>11} {fmt_bytes(r.activations):>11} "
            f"{fmt_bytes(r.forward_peak):>11} {fmt_bytes(r.backward_peak):>11}"
        )
    if len(p.rows) > max_rows:
        lines.append(f"  ... {len(p.rows) - max_rows} more module(s) (see .to_dict()['rows'])")
    if p.saved_outside:
        lines.append(
            f"  saved for backward outside every module (e.g. the loss): {fmt_bytes(p.saved_outside)}"
        )
    c = p.reconciliation
    lines.append(f"reconciliation of the peak ({c.where}):")
    for label, value in (
        ("parameters", c.parameters),
        ("buffers", c.buffers),
        ("gradients", c.gradients),
        ("optimizer state", c.optimizer_state),
        ("saved activations", c.activations),
        ("transient (rise in that interval)", c.transient),
        *([("other memory at entry (not the model's)", c.other_at_entry)] if c.other_at_entry else []),
    ):
        lines.append(f"  {label:<36} {fmt_bytes(value):>11}")
    lines.append(f"  {'sum of parts':<36} {fmt_bytes(c.sum_of_parts):>11}")
    lines.append(f"  {'measured peak':<36} {fmt_bytes(c.measured_peak):>11}")
    lines.append(
        f"  {'unexplained':<36} {fmt_bytes(c.unexplained):>11}"
        "  (inputs, outputs, loss, gradients flowing between modules, other temporaries, rounding)"
    )
    for r in p.rows:
        for n in r.notes:
            lines.append(f"  note [{r.module or p.model}]: {n}")
    for n in p.notes:
        lines.append(f"  note: {n}")
    return "\n".join(lines)
