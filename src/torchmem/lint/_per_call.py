"""Whether a total that a loop keeps across its iterations lives for one call of a function that steps no
optimizer: TM001's per-call "backward-in-step" form (round EE: modulus-sym's ``adam_compute_gradients``,
``loss = 0`` then ``loss += loss_minibatch`` over ``grad_agg_freq`` micro-batches, stepped by its caller).
Pure standard library: no torch import.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from torchmem.lint._syntax import node_line, optimizer_step, optimizer_steps
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


def per_call_form(
    w: Walker, flow: DataFlow, scope: Scope, key: str, chain: list[Loop], form: str, bound: str
) -> tuple[str, str]:
    """TM001's form and its words once the call that makes the value afresh is known: the total of a
    function that steps no optimizer ("backward-in-step", round EE), or a value kept over the members of
    an ensemble, each stepping its own optimizer, in one call (round FF)."""
    if form == "backward-ran" and fresh_per_call(w, flow, scope, key, chain):
        return "backward-in-step", per_call_words(key, scope)
    if form in ("output-kept", "backward-ran"):
        member = _member_loop(scope, key, chain)
        if member is not None:
            return ("output-in-step" if form == "output-kept" else "backward-in-step"), (
                f"; but `{key}` is made afresh before the loop at line {node_line(member.node)}, whose "
                "iterations each step their own optimizer (one per member of the collection it walks, an "
                "ensemble): it holds one value per member until the call ends, not one per step of the run"
            )
    return form, bound


def _member_loop(scope: Scope, key: str, chain: list[Loop]) -> Loop | None:
    """The loop that keeps ``key`` when it walks the members of an ensemble: a ``for`` whose every optimizer
    step is on its own target (``for critic, opt in zip(self.critics, self.optimizers): ... opt.step()``),
    the outermost loop of ``chain`` that keeps ``key``, a local bound before it and neither returned nor
    stored elsewhere. Each iteration is one member's update, not a step of the run: what the loop keeps is
    one value per member of a fixed collection (UoA-CARES' ensemble critics, round FF). Kept across a loop
    around it (``history = []`` before ``for batch in loader:``), it grows with the run."""
    if "." in key or key in scope.params or key in scope.declared:
        return None
    keeping = [lp for lp in chain if key not in lp.rebound and key not in lp.cleared]
    if not keeping:
        return None
    outer = keeping[-1]
    node = outer.node
    if not isinstance(node, (ast.For, ast.AsyncFor)) or not outer.steps:
        return None
    if not any(b.line < node.lineno and b.value is not None for b in scope.bindings.get(key, ())):
        return None
    steps = optimizer_steps(node)
    if not steps or not all(_own_target(c, _members(scope, outer)) for c in steps):
        return None
    return None if _handed_out(scope.node, key) else outer


def _members(scope: Scope, loop: Loop) -> set[str]:
    """The loop's targets and the names its body binds to an element they index (``opt = opts[i]``)."""
    node = loop.node
    first, last = node_line(node), getattr(node, "end_lineno", 0) or 0
    out = set(loop.targets)
    for name, bound in scope.bindings.items():
        for b in bound:
            value = b.value
            if (
                first < b.line <= last
                and b.index is None
                and isinstance(value, ast.Subscript)
                and isinstance(value.slice, ast.Name)
                and value.slice.id in loop.targets
            ):
                out.add(name)
    return out


def _own_target(step: ast.Call, targets: set[str]) -> bool:
    """``opt.step()``, ``opts[i].step()`` or ``scaler.step(opt)`` with ``opt`` or ``i`` one of ``targets``."""
    func = step.func
    assert isinstance(func, ast.Attribute)
    for opt in (func.value, *step.args[:1]):
        if isinstance(opt, ast.Subscript):
            opt = opt.slice
        if isinstance(opt, ast.Name) and opt.id in targets:
            return True
    return False


def _handed_out(fn: ast.AST, key: str) -> bool:
    """Whether ``key`` leaves the call: returned or yielded (as itself or in a display), assigned to an
    attribute or an entry, or given to a container's ``append``/``extend``/``update``/``add``."""
    for node in ast.walk(fn):
        if isinstance(node, (ast.Return, ast.Yield, ast.YieldFrom)):
            given = [node.value]
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            given = [node.value] if any(not isinstance(t, ast.Name) for t in targets) else []
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("append", "extend", "update", "add", "insert", "setdefault")
        ):
            given = [*node.args, *(k.value for k in node.keywords)]
        else:
            continue
        for g in given:
            elts = g.elts if isinstance(g, (ast.Tuple, ast.List)) else [g]
            if any(isinstance(e, ast.Name) and e.id == key for e in elts):
                return True
    return False


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


__all__ = ["fresh_per_call", "per_call_form", "per_call_words"]
