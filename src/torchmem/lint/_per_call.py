"""Whether a total that a loop keeps across its iterations lives for one call of a function that steps no
optimizer: TM001's per-call "backward-in-step" form (round EE: modulus-sym's ``adam_compute_gradients``,
``loss = 0`` then ``loss += loss_minibatch`` over ``grad_agg_freq`` micro-batches, stepped by its caller).
Pure standard library: no torch import.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from torchmem.lint._syntax import optimizer_step
from torchmem.lint._walk import Loop, Scope

if TYPE_CHECKING:
    from torchmem.lint._flow import DataFlow
    from torchmem.lint._walk import Walker


def fresh_per_call(w: Walker, flow: DataFlow, scope: Scope, key: str, chain: list[Loop]) -> bool:
    """Whether ``key``, kept across the iterations of the loops ``chain`` (innermost first), lives for one
    call of ``scope``: a plain local bound before the loop, in a function with no optimizer step (nor a call
    of one of this file's functions that steps), called by a loop of this file that steps. The loop's
    backwards then all feed one optimizer step, the caller's."""
    if scope.kind != "function" or "." in key or key in scope.params or key in scope.declared:
        return False
    if scope.steps or any(lp.steps for lp in chain):
        return False
    start = getattr(chain[-1].node, "lineno", 0)
    if not any(b.line < start and b.value is not None for b in scope.bindings.get(key, ())):
        return False
    for node in ast.walk(scope.node):
        if isinstance(node, ast.Call) and _steps(flow, node, scope):
            return False
    return _called_per_step(w, flow, scope)


def per_call_words(key: str, scope: Scope) -> str:
    """What TM001's message adds for the per-call form."""
    return (
        f"; `{key}` is made afresh on every call of `{scope.name}`, which steps no optimizer (its caller "
        "does): what it keeps is one optimizer step's micro-batches, released when the call's result is "
        "dropped, so it does not grow with the run"
    )


def _steps(flow: DataFlow, call: ast.Call, scope: Scope) -> bool:
    """``opt.step()``, or a call of a function of this file that steps an optimizer."""
    if optimizer_step(call):
        return True
    callee = flow.function_of(call, scope)
    return callee is not None and callee is not scope and callee.steps


def _called_per_step(w: Walker, flow: DataFlow, fn: Scope) -> bool:
    """Whether this file calls ``fn`` inside a loop that also steps an optimizer (each call is one step's
    work): without such a caller, a loop that runs backward and never steps may be a whole dataset's
    (gradients of an evaluation, saliency), not one step's micro-batches."""
    for caller in (*w.functions.values(), w.module):
        if caller is fn:
            continue
        for loop in ast.walk(caller.node):
            if not isinstance(loop, (ast.For, ast.While, ast.AsyncFor)):
                continue
            calls = [n for n in ast.walk(loop) if isinstance(n, ast.Call)]
            if any(flow.function_of(c, caller) is fn for c in calls) and any(
                _steps(flow, c, caller) for c in calls
            ):
                return True
    return False


__all__ = ["fresh_per_call", "per_call_words"]
