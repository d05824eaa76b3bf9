"""The per-module memory profile: rows, totals and the reconciliation with the measured peak (pure).

:mod:`torchmem.capture.profile` records raw figures with module hooks; :func:`build_profile` turns them into
a frozen :class:`ProfileReport`. Nothing here touches a device: every function takes plain numbers, so the
table logic (inclusive totals, display order, reconciliation arithmetic) is testable with data.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from torchmem.results.profile import ROW_KEYS, ModuleProfile, ProfileReconciliation, ProfileReport


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
