"""The per-module memory profile: :class:`ProfileReport` (``torchmem.profile()``), its rows, the
reconciliation of the measured peak, and the plain-text table."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from torchmem._format import count, fmt_bytes, fmt_remainder
from torchmem.results._dicts import from_mapping

ROW_KEYS = ("module", "params", "grads", "optimizer_state", "activations", "forward_peak", "backward_peak")


@dataclass(frozen=True)
class ModuleProfile:
    """The memory figures of one module, in bytes. Figures of a module include its submodules'.

    Attributes:
        module: Qualified name as ``model.named_modules()`` gives it (``""`` is the model itself).
        type: The module's class name.
        depth: Nesting depth (0 for the model itself).
        calls: How many times its forward ran inside the block (recomputations not counted).
        params: ``numel * element_size`` of its parameters (each parameter once).
        grads: Bytes of those parameters' ``.grad`` (the most seen at any observation point).
        optimizer_state: Bytes of the optimizer-state tensors of those parameters (``None``: no optimizer
            was given).
        activations: Bytes of tensors autograd saved for backward during its forward and still alive when
            its forward returned, each storage once (``None``: not measured, e.g. inside a compiled module).
        forward_peak: Highest allocated bytes above the level at its forward's entry, during its forward
            (the most over its calls; ``None``: not measured).
        backward_peak: Highest allocated bytes above the level at the start of its backward, during its
            backward (``None``: no backward ran through it, or not measured).
        notes: What is special about this row (compiled, checkpointed, aliases).
    """

    module: str
    type: str
    depth: int
    calls: int
    params: int
    grads: int
    optimizer_state: int | None
    activations: int | None
    forward_peak: int | None
    backward_peak: int | None
    notes: tuple[str, ...] = ()

    @property
    def size(self) -> int:
        """What the table sorts by: parameters + gradients + optimizer state + activations."""
        return self.params + self.grads + (self.optimizer_state or 0) + (self.activations or 0)

    def to_row(self) -> dict[str, Any]:
        """The capture file's ``"modules"`` row: exactly :data:`ROW_KEYS`."""
        return {k: getattr(self, k) for k in ROW_KEYS}

    def to_dict(self) -> dict[str, Any]:
        """Every field (a superset of :meth:`to_row`, so capture readers that want the row keys find them)."""
        d = asdict(self)
        d["notes"] = list(self.notes)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ModuleProfile:
        """A row stored by :meth:`to_dict`, or by :meth:`to_row` (then type, depth and calls are unknown:
        ``""``, the dots in the name, 0)."""
        name = str(d.get("module") or "")
        return from_mapping(
            cls,
            d,
            **{
                k: v
                for k, v in (("type", ""), ("depth", name.count(".") + 1 if name else 0), ("calls", 0))
                if k not in d
            },
        )


@dataclass(frozen=True)
class ProfileReconciliation:
    """The measured peak of the block, split into what was alive when it happened.

    The peak fell in one interval between two hook events (a module's forward or backward, the optimizer
    step, or between modules). The parts are the figures alive at the start of that interval, plus the
    rise inside it; ``unexplained`` is what no category names (inputs, outputs, the loss, temporaries alive
    across a module boundary, allocator rounding on CUDA).

    Attributes:
        measured_peak: Highest allocated bytes during the block (``None``: not measured).
        where: Where the peak happened, e.g. ``"backward of 'layers.1'"``.
        parameters / buffers / gradients / optimizer_state / activations: Bytes alive at the start of the
            peak's interval (storages, each once).
        transient: The rise above the level at the start of that interval.
        other_at_entry: Bytes already allocated when the block began that are not the model's (other models,
            data, tensors of earlier code; CUDA only — on the CPU the ledger counts from the block on).
        sum_of_parts: The sum of the parts above.
        unexplained: ``measured_peak - sum_of_parts``.
    """

    measured_peak: int | None
    where: str
    parameters: int
    buffers: int
    gradients: int
    optimizer_state: int
    activations: int
    transient: int | None
    sum_of_parts: int | None
    unexplained: int | None
    other_at_entry: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ProfileReconciliation:
        return from_mapping(cls, d)


@dataclass(frozen=True)
class ProfileReport:
    """What ``torchmem.profile()`` measured: one :class:`ModuleProfile` per module, totals, reconciliation.

    Attributes:
        device: The device measured.
        model: The model's class name.
        steps: Forward passes of the model inside the block.
        rows: One row per module, in display order (tree order, larger siblings first).
        totals: The model's row (figures of the whole model, each storage once).
        saved_outside: Bytes saved for backward outside every module (e.g. by the loss), the most seen.
        reconciliation: The measured peak split into parts.
        notes: What is approximate and why.
    """

    device: str
    model: str
    steps: int
    rows: tuple[ModuleProfile, ...]
    totals: ModuleProfile
    saved_outside: int | None
    reconciliation: ProfileReconciliation
    notes: tuple[str, ...] = field(default=())

    def row(self, name: str) -> ModuleProfile:
        """The row of the module with qualified name ``name`` (``""`` is the model).

        Raises:
            KeyError: no module has that name.
        """
        for r in self.rows:
            if r.module == name:
                return r
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "model": self.model,
            "steps": self.steps,
            "rows": [r.to_dict() for r in self.rows],
            "totals": self.totals.to_dict(),
            "saved_outside": self.saved_outside,
            "reconciliation": self.reconciliation.to_dict(),
            "notes": list(self.notes),
        }

    def __str__(self) -> str:
        return render_profile(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ProfileReport:
        """The report stored by :meth:`to_dict`."""
        return from_mapping(cls, d)


# -- plain text ----------------------------------------------------------------------------------------

MAX_ROWS = 60
_NAME_WIDTH = 44


def _name(module: str, type_: str, depth: int) -> str:
    label = f"{module.rsplit('.', 1)[-1]} ({type_})" if module else f"{type_} (model)"
    text = "  " * depth + label
    return text if len(text) <= _NAME_WIDTH else text[: _NAME_WIDTH - 1] + "…"


def render_profile(p: ProfileReport, max_rows: int = MAX_ROWS) -> str:
    """The per-module table (tree order, larger siblings first, indented by depth) and the reconciliation."""
    lines = [
        f"per-module memory of {p.model} on {p.device} ({count(p.steps, 'forward pass', 'forward passes')})",
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
        f"  {'unexplained':<36} {fmt_remainder(c.unexplained):>11}"
        "  (inputs, outputs, loss, gradients flowing between modules, other temporaries, rounding)"
    )
    for r in p.rows:
        for n in r.notes:
            lines.append(f"  note [{r.module or p.model}]: {n}")
    for n in p.notes:
        lines.append(f"  note: {n}")
    return "\n".join(lines)


__all__ = [
    "MAX_ROWS",
    "ROW_KEYS",
    "ModuleProfile",
    "ProfileReconciliation",
    "ProfileReport",
    "render_profile",
]
