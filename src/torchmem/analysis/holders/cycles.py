"""Tensors that only a reference cycle keeps alive: what kind of cycle, whether ``gc.collect()`` frees it,
and the fix. Pure: it reads holder paths (:class:`~torchmem.results.holders.HolderPath`) only.

A cycle through autograd's C++ graph (a tensor's ``.grad``/``._base``, a node's saved tensors or its leaf's
``AccumulateGrad.variable``) is invisible to Python's garbage collector: ``gc.collect()`` never frees it.
The usual one is ``x.grad = g`` with ``g`` from ``torch.autograd.grad(..., create_graph=True)`` (or
``loss.backward(create_graph=True)``): ``g``'s graph saved ``x`` itself.

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

from torchmem.results.holders import HolderPath, StepKind

AUTOGRAD = "autograd"
PYTHON = "python"

_THROUGH_AUTOGRAD = (StepKind.GRAD_FN, StepKind.AUTOGRAD_EDGE, StepKind.SAVED_TENSOR)


def is_cycle(path: HolderPath) -> bool:
    """Whether the path is a reference cycle no root reaches."""
    return path.root == "cycle"


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
            fix = (
                "a gradient made with create_graph=True is stored in `.grad`, and its graph saved the tensor "
                "itself: they keep each other alive. Set `.grad = None` when done (or "
                "`optimizer.zero_grad(set_to_none=True)`), or store `g.detach()` when the second-order graph "
                "is not needed"
            )
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


__all__ = ["AUTOGRAD", "PYTHON", "classify_cycle", "fix_rank", "is_cycle"]
