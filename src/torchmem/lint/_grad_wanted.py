"""Where an evaluation loop wants autograd on although it calls a model in eval() mode (TM002's exemptions
read from data flow): the loop hands the model an input the code made require grad — forces as ``-dE/dx``
(a force field's forward differentiates its energy with respect to the coordinates it was given), saliency
maps, adversarial examples. Under the ``no_grad`` TM002 would advise, such a forward breaks (round Q:
deepmd-kit's energy models, four findings)."""

from __future__ import annotations

import ast

from torchmem.lint._walk import Scope


def grad_inputs(scope: Scope) -> set[str]:
    """The names the scope makes require grad: ``x.requires_grad_()`` (or ``(True)``), ``x =
    t.requires_grad_(True)``, ``x.requires_grad = True``, ``x = torch.tensor(..., requires_grad=True)``."""
    out: set[str] = set()
    for node in ast.walk(scope.node):
        if isinstance(node, ast.Call) and _enables_grad(node):
            recv = node.func.value if isinstance(node.func, ast.Attribute) else None
            if isinstance(recv, ast.Name) and _is_requires_grad_call(node):
                out.add(recv.id)
        elif isinstance(node, ast.Assign):
            value = node.value
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            if isinstance(value, ast.Call) and _enables_grad(value):
                out.update(names)
            for t in node.targets:
                if (
                    isinstance(t, ast.Attribute)
                    and t.attr == "requires_grad"
                    and isinstance(t.value, ast.Name)
                    and isinstance(value, ast.Constant)
                    and value.value is True
                ):
                    out.add(t.value.id)
    return out


def feeds_grad_input(call: ast.Call, names: set[str]) -> bool:
    """Whether one of the call's arguments is (or is computed from) a name in ``names``."""
    if not names:
        return False
    args = [*call.args, *(k.value for k in call.keywords)]
    return any(isinstance(n, ast.Name) and n.id in names for a in args for n in ast.walk(a))


def _is_requires_grad_call(call: ast.Call) -> bool:
    return isinstance(call.func, ast.Attribute) and call.func.attr == "requires_grad_"


def _enables_grad(call: ast.Call) -> bool:
    """``<x>.requires_grad_()`` / ``(True)`` (also at the end of a chain), or a call with
    ``requires_grad=True`` (``torch.tensor(..., requires_grad=True)``)."""
    if _is_requires_grad_call(call):
        if not call.args and not call.keywords:
            return True
        arg = call.args[0] if call.args else call.keywords[0].value
        return isinstance(arg, ast.Constant) and arg.value is True
    return any(
        k.arg == "requires_grad" and isinstance(k.value, ast.Constant) and k.value.value is True
        for k in call.keywords
    )
