"""Where an evaluation loop wants autograd on although it calls a model in eval() mode (TM002's exemptions
read from data flow): the loop hands the model an input the code made require grad — forces as ``-dE/dx``
(a force field's forward differentiates its energy with respect to the coordinates it was given), saliency
maps, adversarial examples. Under the ``no_grad`` TM002 would advise, such a forward breaks (round Q:
deepmd-kit's energy models, four findings)."""

from __future__ import annotations

import ast

from torchmem.lint._syntax import short
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


# The methods an attack object runs an attack with: advertorch's `perturb`, ART's `generate`, AutoAttack's
# `run_standard_evaluation` (a torchattacks attack is called: `atk(images, labels)`).
_ATTACK_METHODS = frozenset({"perturb", "generate", "run_standard_evaluation"})


def attack_call(scope: Scope, loop_node: ast.AST, attack_names: set[str]) -> ast.Call | None:
    """The first call in the loop that runs an adversarial attack, in a file that imports an attack library
    (``attack_names``: the names it imported from one): ``adversary.perturb(x, y)``, ``attack.generate(x)``,
    an attack object made here and called (``atk = torchattacks.PGD(model); atk(x, y)``), or an attack class
    called in the loop. The attack backwards a loss to its input: the loop needs autograd on, only the model
    calls around it do not (round R: ReMoS's robustness evaluation)."""
    if not attack_names:
        return None
    made = {
        key
        for key, bound in scope.bindings.items()
        if any(isinstance(b.value, ast.Call) and _from_attack(b.value.func, attack_names) for b in bound)
    }
    methods = {
        m.name: m for m in (scope.cls.body if scope.cls is not None else ()) if isinstance(m, ast.FunctionDef)
    }
    for node in ast.walk(loop_node):
        if not isinstance(node, ast.Call):
            continue
        if _runs_attack(node, made, attack_names):
            return node
        # one call into a method of the same class (DeepRobust's `self.adv_data(...)`, round S)
        func = node.func
        if (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and func.value.id == "self"
            and func.attr in methods
        ):
            body = methods[func.attr]
            inner = {
                t.id
                for n in ast.walk(body)
                if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
                if _from_attack(n.value.func, attack_names)
                for t in n.targets
                if isinstance(t, ast.Name)
            }
            if any(isinstance(n, ast.Call) and _runs_attack(n, inner, attack_names) for n in ast.walk(body)):
                return node
    return None


def _runs_attack(call: ast.Call, made: set[str], attack_names: set[str]) -> bool:
    """``call`` runs an attack: an attack method, an attack object made here (``made``) called, or an attack
    class of the libraries (``attack_names``) called."""
    func = call.func
    if isinstance(func, ast.Attribute) and func.attr in _ATTACK_METHODS:
        return True
    if isinstance(func, ast.Name) and func.id in made:
        return True
    return _from_attack(func, attack_names)


def attack_fix(scope: Scope, loop_node: ast.AST, attack_names: set[str], model: str) -> tuple[str, str]:
    """What a TM002 finding adds to its message, and its own fix, where the loop runs an adversarial attack
    (``("", "")`` where it does not): ``no_grad`` around the loop would make the attack raise, so the fix is
    ``no_grad`` around the calls of ``model``."""
    attack = attack_call(scope, loop_node, attack_names)
    if attack is None:
        return "", ""
    also = (
        f"; the loop also runs an adversarial attack (`{short(attack.func)}`), which backwards a loss to its "
        "input and needs autograd"
    )
    fix = (
        f"put each call of `{model}` under `with torch.no_grad():` inside the loop, not the whole loop: the "
        "attack needs autograd"
    )
    return also, fix


def _from_attack(func: ast.expr, attack_names: set[str]) -> bool:
    """``func`` is a name imported from an attack library, or an attribute of one (``torchattacks.PGD``)."""
    while isinstance(func, ast.Attribute):
        func = func.value
    return isinstance(func, ast.Name) and func.id in attack_names
