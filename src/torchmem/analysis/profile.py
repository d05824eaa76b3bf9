"""The per-module memory profile: rows, totals and the reconciliation with the measured peak (pure).

:mod:`torchmem.capture.profile` records raw figures with module hooks; :func:`build_profile` turns them into
a frozen :class:`ProfileReport`. Nothing here touches a device: every function takes plain numbers, so the
table logic (inclusive totals, display order, reconciliation arithmetic) is testable with data.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

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
            "rows": [r.to_row() for r in self.rows],
            "totals": self.totals.to_row(),
            "saved_outside": self.saved_outside,
            "reconciliation": self.reconciliation.to_dict(),
            "notes": list(self.notes),
        }

    def __str__(self) -> str:
        from torchmem.report.profile import render_profile

        return render_profile(self)


@dataclass
class RawModule:
    """What capture recorded for one module (mutable, filled while the block runs)."""

    name: str
    type: str
    params: tuple[int, ...] = ()  # indices into the parameter table, its whole subtree
    calls: int = 0
    activations: int | None = 0
    forward_peak: int | None = None
    backward_peak: int | None = None
    notes: list[str] = field(default_factory=list)


def _depth(name: str) -> int:
    return 0 if name == "" else name.count(".") + 1


def _parent(name: str, names: set[str]) -> str | None:
    if name == "":
        return None
    head = name
    while "." in head:
        head = head.rsplit(".", 1)[0]
        if head in names:
            return head
    return "" if "" in names else None


def display_order(rows: Sequence[ModuleProfile]) -> list[ModuleProfile]:
    """Tree order with each module's children sorted largest first (ties keep the model's order)."""
    names = {r.module for r in rows}
    children: dict[str | None, list[ModuleProfile]] = {}
    for r in rows:
        children.setdefault(_parent(r.module, names), []).append(r)
    out: list[ModuleProfile] = []

    def visit(parent: str | None) -> None:
        kids = children.get(parent, [])
        for r in sorted(kids, key=lambda r: (-r.size, -(r.forward_peak or 0))):
            out.append(r)
            visit(r.module)

    visit(None)
    return out


def build_rows(
    modules: Iterable[RawModule],
    param_bytes: Sequence[int],
    grad_bytes: Sequence[int],
    state_bytes: Sequence[int] | None,
) -> list[ModuleProfile]:
    """Rows from raw records: each module's figures summed over the parameters of its subtree.

    ``param_bytes[i]``, ``grad_bytes[i]``, ``state_bytes[i]``: figures of parameter ``i`` (each parameter
    is listed once, so shared parameters are never counted twice inside one module).
    """
    rows = []
    for m in modules:
        rows.append(
            ModuleProfile(
                module=m.name,
                type=m.type,
                depth=_depth(m.name),
                calls=m.calls,
                params=sum(param_bytes[i] for i in m.params),
                grads=sum(grad_bytes[i] for i in m.params),
                optimizer_state=None if state_bytes is None else sum(state_bytes[i] for i in m.params),
                activations=m.activations,
                forward_peak=m.forward_peak,
                backward_peak=m.backward_peak,
                notes=tuple(m.notes),
            )
        )
    return display_order(rows)


def reconcile(
    measured_peak: int | None,
    level: int | None,
    parts: Mapping[str, int],
    where: str,
    other_at_entry: int = 0,
) -> ProfileReconciliation:
    """Split ``measured_peak`` into the parts alive at the start of its interval (``level``) and the rise.

    Args:
        measured_peak: Highest allocated bytes of the block (``None``: unknown).
        level: Allocated bytes at the start of the interval that held the peak.
        parts: ``parameters``, ``buffers``, ``gradients``, ``optimizer_state``, ``activations`` alive then.
        where: Where the interval was.
    """
    get = parts.get
    p, b, g, o, a = (
        int(get("parameters", 0)),
        int(get("buffers", 0)),
        int(get("gradients", 0)),
        int(get("optimizer_state", 0)),
        int(get("activations", 0)),
    )
    transient = None if measured_peak is None or level is None else max(measured_peak - level, 0)
    total = None if transient is None else p + b + g + o + a + transient + other_at_entry
    return ProfileReconciliation(
        measured_peak=measured_peak,
        where=where,
        parameters=p,
        buffers=b,
        gradients=g,
        optimizer_state=o,
        activations=a,
        transient=transient,
        sum_of_parts=total,
        unexplained=None if total is None or measured_peak is None else measured_peak - total,
        other_at_entry=other_at_entry,
    )


def build_profile(
    *,
    device: str,
    model: str,
    steps: int,
    modules: Sequence[RawModule],
    param_bytes: Sequence[int],
    grad_bytes: Sequence[int],
    state_bytes: Sequence[int] | None,
    saved_outside: int | None,
    reconciliation: ProfileReconciliation,
    notes: Sequence[str] = (),
) -> ProfileReport:
    """The frozen report. The row named ``""`` (the model) is the totals row."""
    rows = build_rows(modules, param_bytes, grad_bytes, state_bytes)
    totals = next((r for r in rows if r.module == ""), None)
    if totals is None:  # pragma: no cover - capture always records the model itself
        raise ValueError("the profile has no row for the model itself")
    return ProfileReport(
        device=device,
        model=model,
        steps=steps,
        rows=tuple(rows),
        totals=totals,
        saved_outside=saved_outside,
        reconciliation=reconciliation,
        notes=tuple(dict.fromkeys(notes)),
    )


__all__ = [
    "ROW_KEYS",
    "ModuleProfile",
    "ProfileReconciliation",
    "ProfileReport",
    "RawModule",
    "build_profile",
    "build_rows",
    "display_order",
    "reconcile",
]
