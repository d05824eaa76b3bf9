"""Stores that replace the entries a container already holds rather than add to it: ``out[k] =
out[k].float()`` over the keys of one step's output dict (round FF: rf-detr's fp16 evaluation). Pure
standard library: no torch import.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from torchmem.lint._syntax import TENSOR, node_line
from torchmem.lint._walk import Loop, Scope

if TYPE_CHECKING:
    from torchmem.lint._flow import DataFlow


def rewrites_entries(
    store: ast.Subscript, value: ast.expr, key: str, loop: Loop, flow: DataFlow, scope: Scope
) -> bool:
    """Whether ``store = value`` converts the entry it replaces: ``value`` is that same entry (the same
    text) through method calls or torch's functions given no other tensor (``.float()``,
    ``.to(torch.float32)``, ``.cpu()``, ``torch.clamp(d[k], min=0.0)``), and every loop of ``chain`` that
    keeps the container changes the subscript (one of its targets is in it: ``for k in out.keys():``), so
    each pass replaces each entry once. The container holds as many entries as before, and nothing another
    forward made: it does not grow. A subscript a loop around it does not change (``for batch in loader:``
    around ``d[k] = d[k].mul(2)`` with ``d`` kept) chains each pass's value onto the last one's, and a value
    that brings in another tensor (``d[k].add(out)``) keeps it: both stay findings. ``loop`` is the
    innermost loop around the store."""
    node = value
    given: list[ast.expr] = []
    while isinstance(node, ast.Call):
        if isinstance(node.func, ast.Attribute) and _torch_function(node.func) and node.args:
            # torch's own function of the entry: `pred[ix] = torch.clamp(pred[ix], min=0.0)` (granite-tsfm's
            # forecast wrapper, round II); its other arguments are checked as a method's are
            given.extend((*node.args[1:], *(k.value for k in node.keywords)))
            node = node.args[0]
        elif isinstance(node.func, ast.Attribute):
            given.extend((*node.args, *(k.value for k in node.keywords)))
            node = node.func.value
        else:
            return False
    if not isinstance(node, ast.Subscript) or ast.unparse(node) != ast.unparse(store):
        return False
    for arg in given:
        for n in ast.walk(arg):
            if isinstance(n, (ast.Call, ast.Subscript, ast.Starred)):
                return False
            if isinstance(n, (ast.Name, ast.Attribute)) and flow.kind(n, scope, node_line(store)) == TENSOR:
                return False
    indexes: set[str] = set()
    sub: ast.expr = store
    while isinstance(sub, ast.Subscript):
        indexes.update(n.id for n in ast.walk(sub.slice) if isinstance(n, ast.Name))
        sub = sub.value
    return all(lp.targets & indexes for lp in loop.chain() if key not in lp.rebound and key not in lp.cleared)


def _torch_function(func: ast.Attribute) -> bool:
    """``torch.clamp``, ``F.relu``, ``torch.nn.functional.normalize``: a function of torch's own modules
    (not a method of a value, not the program's function, which may run a model)."""
    root: ast.expr = func.value
    while isinstance(root, ast.Attribute):
        root = root.value
    return isinstance(root, ast.Name) and root.id in _TORCH_MODULES


_TORCH_MODULES = frozenset({"torch", "F", "nnf"})

__all__ = ["rewrites_entries"]
