"""Reference cycles that keep tensors alive: what kind of cycle, whether ``gc.collect()`` frees it, the path
round the loop and the fix. Pure: it reads holder paths (:class:`~torchmem.results.holders.HolderPath`) and
the steps :func:`~torchmem.analysis.holders.autograd.grad_cycles` found.

A cycle through autograd's C++ graph (a tensor's ``.grad``/``._base``, a node's saved tensors or its leaf's
``AccumulateGrad.variable``) is invisible to Python's garbage collector: ``gc.collect()`` never frees it.
The usual one is ``x.grad = g`` with ``g`` from ``torch.autograd.grad(..., create_graph=True)`` (or
``loss.backward(create_graph=True)``): ``g``'s graph saved ``x`` itself, so ``x -> .grad -> g.grad_fn -> ...
-> x``. Such a cycle is a trap even while the program still refers to ``x``: dropping that reference frees
nothing. A plain ``.grad`` from ``backward()`` has no graph and is never one.

Example:
    >>> from torchmem.results.holders import HolderPath, HolderStep, StepKind
    >>> p = HolderPath("cycle", (), typed_steps=(
    ...     HolderStep(StepKind.ROOT, "<reference cycle through Tensor>", "Tensor"),
    ...     HolderStep(StepKind.ATTRIBUTE, ".grad", "grad", "Tensor"),
    ...     HolderStep(StepKind.GRAD_FN, ".grad_fn", "AddBackward0", "Tensor")))
    >>> kind, collectable, fix = classify_cycle(p)
    >>> kind, collectable, fix_rank(fix)
    ('autograd', False, 0)
"""

from __future__ import annotations

from torchmem.results.holders import HolderPath, HolderStep, StepKind

AUTOGRAD = "autograd"
PYTHON = "python"

_THROUGH_AUTOGRAD = (StepKind.GRAD_FN, StepKind.AUTOGRAD_EDGE, StepKind.SAVED_TENSOR)
_NAME_STEPS = (StepKind.MODULE_GLOBAL, StepKind.FRAME_LOCAL, StepKind.CLASS_ATTRIBUTE)


def is_cycle(path: HolderPath) -> bool:
    """Whether the path is a reference cycle no root reaches."""
    return path.root == "cycle"


def expression(path: HolderPath | None) -> str | None:
    """The Python expression a path names, from its variable on (``model.fc.weight``, ``losses[3]``), or
    ``None`` when it does not start at a variable (a cycle, an object held outside Python).

    Example:
        >>> p = HolderPath.of("module", (
        ...     HolderStep(StepKind.ROOT, "__main__", "__main__"),
        ...     HolderStep(StepKind.MODULE_GLOBAL, ".model", "model", "dict"),
        ...     HolderStep(StepKind.ATTRIBUTE, ".fc", "fc", "Net"),
        ...     HolderStep(StepKind.ATTRIBUTE, ".weight", "weight", "Linear")), 3)
        >>> expression(p)
        'model.fc.weight'
    """
    if path is None or path.root in ("cycle", "gc-orphan"):
        return None
    steps = path.typed_steps
    if len(steps) < 2 or steps[1].kind not in _NAME_STEPS or not steps[1].name.isidentifier():
        return None
    out = steps[1].name
    for s in steps[2:]:
        if s.kind not in (StepKind.ATTRIBUTE, StepKind.ITEM) or " " in s.text.strip():
            return out if s.kind is StepKind.GRAD_FN else None
        out += s.text
    return out


def grad_cycle_fix(name: str | None = None) -> str:
    """The fix of a ``.grad`` cycle, naming the tensor's expression where it is known (``x`` otherwise)."""
    x = name or "x"
    return (
        f"`{x}.grad` holds a gradient made with create_graph=True whose graph saved `{x}` itself: they keep "
        f"each other alive, and gc.collect() cannot free them. Store `{x}.grad = g.detach()` (or compute g "
        f"with create_graph=False) when the second-order graph is not needed; else set `{x}.grad = None` "
        "once it is used (`optimizer.zero_grad(set_to_none=True)`)"
    )


def loop_text(start: str, steps: tuple[HolderStep, ...]) -> str:
    """The path round a ``.grad`` cycle, from the tensor round to itself: ``start`` names it (a holder path,
    or ``<Tensor (4, 4) float32>`` when nothing else holds it), ``steps`` how its gradient's graph keeps it.

    Example:
        >>> loop_text("__main__.x", (HolderStep(StepKind.SAVED_TENSOR,
        ...     " -> saved tensor of MulBackward0 (_saved_other)", "_saved_other", "MulBackward0"),))
        '__main__.x.grad.grad_fn -> saved tensor of MulBackward0 (_saved_other) -> the same tensor'
    """
    return f"{start}.grad.grad_fn{''.join(s.text for s in steps)} -> the same tensor"


def classify_cycle(path: HolderPath) -> tuple[str, bool, str]:
    """``(kind, collectable, fix)`` of a cycle path (see the module's docstring). Of several paths round
    the same kind of cycle, the one whose fix :func:`fix_rank` ranks lowest says the most."""
    steps = path.typed_steps
    autograd = any(s.kind in _THROUGH_AUTOGRAD for s in steps) or any(
        s.kind == StepKind.ATTRIBUTE and s.name in ("grad", "_base") and s.holder_type.endswith("Tensor")
        for s in steps
    )
    if autograd:
        via_grad = any(s.kind == StepKind.ATTRIBUTE and s.name == "grad" for s in steps)
        if via_grad:
            fix = grad_cycle_fix()
        else:
            fix = (
                "an autograd graph holds a tensor that holds the graph (a tensor stored on its own graph's "
                "node or custom Function `ctx`): drop the reference (`del`, `= None`) or store `.detach()`"
            )
        return AUTOGRAD, False, fix
    top = next((s.name for s in steps if s.kind == StepKind.ROOT), "") or "objects"
    fix = (
        f"a reference cycle ({top}) keeps it until the garbage collector runs: break it (a `weakref`, or "
        "drop the back-reference when done), or call `gc.collect()`"
    )
    return PYTHON, True, fix


def fix_rank(fix: str) -> int:
    """0 for the fix of a ``.grad`` cycle (the most specific), 1 for the others."""
    return 0 if "create_graph=True" in fix else 1


__all__ = [
    "AUTOGRAD",
    "PYTHON",
    "classify_cycle",
    "expression",
    "fix_rank",
    "grad_cycle_fix",
    "is_cycle",
    "loop_text",
]
