"""The local data flow the rules judge values by: whether an expression is a tensor that may carry an autograd
graph (``TENSOR``), surely not one (``SAFE``) or not known (``UNKNOWN``), from the bindings the walk recorded,
and whether an expression or a call names a CUDA device.

Precision over recall: a value counts as a graph-carrying tensor only when the data flow says so (bound from a
model or loss call, a tensor op on such a value, or a name that is ``.backward()``-ed). Pure standard library:
no torch import.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable

from torchmem.lint._syntax import (
    GRAPH_METHODS,
    NUMPY_ROOTS,
    SAFE,
    SAFE_ATTRS,
    SAFE_BUILTINS,
    SAFE_METHODS,
    TENSOR,
    TORCH_FRESH,
    TORCH_ROOTS,
    UNKNOWN,
    container_key,
    dotted,
    is_const,
    is_loss_callee,
    is_model_callee,
    keyword_arg,
    last_name,
)
from torchmem.lint._walk import Binding, Scope


class DataFlow:
    """What a value is, read from one module's walk (:class:`~torchmem.lint._walk.Walker`): :meth:`kind` of
    an expression in a scope at a line, :meth:`cuda_ish` / :meth:`is_cuda_call` against the module-level
    names."""

    def __init__(
        self, module_bindings: dict[str, list[Binding]], functions: dict[str, Scope] | None = None
    ) -> None:
        self._module_bindings = module_bindings
        self._functions = functions or {}
        self._returning: set[int] = set()  # functions whose return kind is being worked out (recursion)
        #: Names taken as graph-carrying tensors whatever their binding (a helper's parameter, a forward's
        #: inputs) while a rule asks about one function.
        self.assume: dict[str, int] = {}
        #: The function ``assume`` is about (its parameters): another function's ``x`` is not this one's.
        self.assume_in: Scope | None = None
        #: Inside a module's forward: ``self.<sub>(x)`` of a tensor is a submodule's output.
        self.forward_mode = False
        #: Models frozen at module level (``model.requires_grad_(False)``).
        self.module_frozen: set[str] = set()

    def function_of(self, call: ast.Call, scope: Scope) -> Scope | None:
        """The function of this file a call runs: ``f(...)`` (a def in the module or an enclosing function)
        or ``self.m(...)`` (a method of the class the caller is a method of)."""
        func = call.func
        if isinstance(func, ast.Name):
            return self._functions.get(func.id)
        if (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and func.value.id == "self"
            and scope.cls is not None
        ):
            return self._functions.get(f"{scope.cls.name}.{func.attr}")
        return None

    def returns_kind(self, fn: Scope, depth: int) -> int:
        """What a function of this file returns: SAFE when it runs under no_grad (decorated) or returns
        only numbers, TENSOR when some return carries a graph, else UNKNOWN."""
        if fn.no_grad_all:
            return SAFE
        if not fn.returns:
            return (
                SAFE
                if not any(isinstance(n, (ast.Yield, ast.YieldFrom)) for n in ast.walk(fn.node))
                else UNKNOWN
            )
        if id(fn) in self._returning:
            return UNKNOWN
        self._returning.add(id(fn))
        try:
            kinds = {
                SAFE if no_grad else self.kind(v, fn, line + 1, depth + 1) for v, line, no_grad in fn.returns
            }
        finally:
            self._returning.discard(id(fn))
        return TENSOR if TENSOR in kinds else (SAFE if kinds == {SAFE} else UNKNOWN)

    def kind(self, expr: ast.AST | None, scope: Scope, line: int, depth: int = 0) -> int:
        if expr is None or depth > 12:
            return UNKNOWN
        if isinstance(expr, (ast.Constant, ast.JoinedStr, ast.Compare)):
            return SAFE
        if isinstance(expr, (ast.Name, ast.Attribute)):
            if isinstance(expr, ast.Attribute) and expr.attr in SAFE_ATTRS:
                return SAFE
            key = dotted(expr)
            if key is not None and key in self.assume and (self.assume_in is None or scope is self.assume_in):
                return self.assume[key]
            if key is not None:
                found = self._binding_kind(key, scope, line, depth)
                if found != UNKNOWN:
                    return found
                if key in scope.backwarded and _backwarded_since_bound(key, scope, line):
                    return TENSOR
            if isinstance(expr, ast.Attribute):
                if expr.attr not in _TENSOR_ATTRS and self._loss_object(expr.value, scope, line):
                    return UNKNOWN  # a field of what a loss function returned: not a tensor's attribute
                return TENSOR if self.kind(expr.value, scope, line, depth + 1) == TENSOR else UNKNOWN
            return UNKNOWN
        if isinstance(expr, ast.Subscript):
            base = self.kind(expr.value, scope, line, depth + 1)
            if base == SAFE and self._filled_later(expr.value, scope, line):
                return UNKNOWN  # `outs = []` is SAFE, not what is appended to it afterwards
            return base  # a slice of a tensor made under no_grad has no graph either
        if isinstance(expr, ast.Call):
            return self._call_kind(expr, scope, line, depth)
        if isinstance(expr, ast.BinOp):
            left = self.kind(expr.left, scope, line, depth + 1)
            right = self.kind(expr.right, scope, line, depth + 1)
            if TENSOR in (left, right):
                return TENSOR
            return SAFE if left == right == SAFE else UNKNOWN
        if isinstance(expr, ast.UnaryOp):
            return self.kind(expr.operand, scope, line, depth + 1)
        if isinstance(expr, ast.IfExp):
            if _number_or_itself(expr):
                return SAFE  # `x.item() if torch.is_tensor(x) else x`: x is a number where it is kept as is
            kinds = {
                self.kind(expr.body, scope, line, depth + 1),
                self.kind(expr.orelse, scope, line, depth + 1),
            }
            return TENSOR if TENSOR in kinds else (SAFE if kinds == {SAFE} else UNKNOWN)
        if isinstance(expr, (ast.List, ast.Tuple, ast.Set)):
            return self._elements(expr.elts, scope, line, depth)
        if isinstance(expr, ast.Dict):
            return self._elements(expr.values, scope, line, depth)
        if isinstance(expr, ast.NamedExpr):
            return self.kind(expr.value, scope, line, depth + 1)
        return UNKNOWN

    @staticmethod
    def _filled_later(expr: ast.AST, scope: Scope, line: int) -> bool:
        """Whether ``expr`` names a container bound from a display (``[]``, ``{}``, ``[x for ...]``); for an
        entry of an entry (``pred[0][0]``), the name it is read from. What a call returns is read at once:
        nothing fills it later (``np.argmax(p)[0]``)."""
        while isinstance(expr, ast.Subscript):
            expr = expr.value
        if isinstance(expr, ast.Call):
            return False
        key = dotted(expr) if isinstance(expr, (ast.Name, ast.Attribute)) else None
        if key is None:
            return not isinstance(expr, ast.Attribute)
        bound = [b for b in scope.bindings.get(key, ()) if b.line < line]
        value = max(bound, key=lambda b: b.line).value if bound else None
        return isinstance(value, (ast.List, ast.Dict, ast.Set, ast.Tuple, ast.ListComp, ast.DictComp))

    def _elements(self, elts: Iterable[ast.AST | None], scope: Scope, line: int, depth: int) -> int:
        kinds = {self.kind(e, scope, line, depth + 1) for e in elts if not isinstance(e, ast.Starred)}
        return TENSOR if TENSOR in kinds else (SAFE if kinds <= {SAFE} else UNKNOWN)

    def _loss_object(self, expr: ast.expr, scope: Scope, line: int) -> bool:
        """Whether ``expr`` names what a loss function of another module returned (``losses =
        component.compute_loss(batch)``): taken as the loss tensor, but a field read from it
        (``losses.intermediate_losses``) says it is an object, whose fields the data flow does not know (iris,
        round DD: a dict of ``.item()`` floats). A model's output keeps its fields (``out.logits``)."""
        key = dotted(expr) if isinstance(expr, (ast.Name, ast.Attribute)) else None
        if key is None:
            return False
        bound = [b for b in scope.bindings.get(key, ()) if b.line < line]
        if not bound:
            return False
        best = max(bound, key=lambda b: b.line)
        value = best.value
        while isinstance(value, ast.BinOp):  # `component.compute_loss(batch) / grad_acc_steps` (iris)
            value = value.left
        return (
            isinstance(value, ast.Call)
            and best.index is None
            and best.path is None
            and is_loss_callee(value.func)
            and not is_model_callee(value.func)
            and self.function_of(value, scope) is None
        )

    def _binding_kind(self, key: str, scope: Scope, line: int, depth: int) -> int:
        best: Binding | None = None
        for b in scope.bindings.get(key, ()):
            if b.line < line and (best is None or b.line >= best.line):
                best = b
        if best is None:
            return UNKNOWN
        if best.no_grad:
            return SAFE
        value = best.value
        if best.path is not None and value is not None:
            return self._iterated_kind(value, best.path, scope, best.line, depth + 1)
        if best.index is not None and isinstance(value, (ast.Tuple, ast.List)):
            if best.index < len(value.elts) and not any(isinstance(e, ast.Starred) for e in value.elts):
                value = value.elts[best.index]
            else:
                return UNKNOWN
        elif best.index is not None and not isinstance(value, ast.Call):
            return UNKNOWN
        elif best.index is not None and best.index > 0 and isinstance(value, ast.Call):
            # `loss, sample_size, logs = criterion(...)`: only the first element is known to be the tensor
            return self._element_kind(value, best.index, scope, depth)
        return self.kind(value, scope, best.line, depth + 1)

    def _iterated_kind(self, it: ast.expr, path: tuple[int, ...], scope: Scope, line: int, depth: int) -> int:
        """What a for target is, from the iterable (``enumerate``, ``zip``, ``d.items()``, ``d.values()``,
        a tensor or a tuple of tensors) and the target's place in the unpacking."""
        if depth > 12:
            return UNKNOWN
        if isinstance(it, ast.Call):
            func, args = it.func, it.args
            if isinstance(func, ast.Name) and func.id in ("enumerate", "zip") and args:
                if not path:
                    return UNKNOWN
                if func.id == "enumerate":
                    return (
                        SAFE
                        if path[0] == 0
                        else self._iterated_kind(args[0], path[1:], scope, line, depth + 1)
                    )
                if path[0] < len(args) and not any(isinstance(a, ast.Starred) for a in args):
                    return self._iterated_kind(args[path[0]], path[1:], scope, line, depth + 1)
                return UNKNOWN
            if isinstance(func, ast.Attribute) and func.attr in ("items", "values") and not args:
                if self.kind(func.value, scope, line, depth + 1) != TENSOR:
                    return UNKNOWN
                if func.attr == "values":
                    return TENSOR if not path else UNKNOWN
                if len(path) == 1:
                    return SAFE if path[0] == 0 else TENSOR  # the key, the value
                return UNKNOWN
        if not path and self.kind(it, scope, line, depth + 1) == TENSOR:
            return TENSOR  # the rows of a tensor, the tensors of a model's output tuple
        return UNKNOWN

    def _element_kind(self, call: ast.Call, index: int, scope: Scope, depth: int) -> int:
        """An element past the first of what a call returns: known only from a function of this file
        that returns tuples."""
        fn = self.function_of(call, scope)
        if fn is None or fn is scope or not fn.returns or id(fn) in self._returning:
            return UNKNOWN
        if fn.no_grad_all:
            return SAFE
        self._returning.add(id(fn))
        try:
            kinds = set()
            for value, line, no_grad in fn.returns:
                if not isinstance(value, ast.Tuple) or index >= len(value.elts):
                    return UNKNOWN
                kinds.add(SAFE if no_grad else self.kind(value.elts[index], fn, line + 1, depth + 1))
        finally:
            self._returning.discard(id(fn))
        return TENSOR if TENSOR in kinds else (SAFE if kinds == {SAFE} else UNKNOWN)

    def _call_kind(self, call: ast.Call, scope: Scope, line: int, depth: int) -> int:
        func = call.func
        name = last_name(func)
        fn = self.function_of(call, scope)
        if fn is not None and fn is not scope:
            return self.returns_kind(fn, depth)  # decided by what the function of this file returns
        if isinstance(func, ast.Name) and name[:1].isupper():
            return UNKNOWN  # a class: the call makes an object (a module, a loss, a meter), not a tensor
        if (
            self.forward_mode
            and isinstance(func, ast.Attribute)
            and dotted(func.value) == "self"
            and any(self.kind(a, scope, line, depth + 1) == TENSOR for a in call.args)
        ):
            return TENSOR  # a submodule's output inside forward
        if isinstance(func, ast.Name):
            if name in SAFE_BUILTINS:
                return SAFE
            if name == "abs" and len(call.args) == 1:
                return self.kind(call.args[0], scope, line, depth + 1)
            if is_model_callee(func):
                if self._numbers_forward(func.id, scope, line, depth):
                    return SAFE
                return SAFE if self._frozen_call(call, scope, line, depth) else TENSOR
            if is_loss_callee(func):
                return self._loss_kind(call, scope, line, depth)
            return UNKNOWN
        if not isinstance(func, ast.Attribute):
            return UNKNOWN
        root = dotted(func.value)
        if root is not None and root.split(".", 1)[0] in NUMPY_ROOTS:
            return SAFE  # `loss = np.mean([...])`: an array or a scalar, whatever it held before (round T)
        if root is not None and (root.split(".", 1)[0] in TORCH_ROOTS):
            if name in TORCH_FRESH or name.startswith(("is_", "get_", "set_", "manual_")):
                return SAFE
            if name == "grad" and root.endswith("autograd"):
                create = keyword_arg(call, "create_graph")
                return UNKNOWN if create is not None and not is_const(create.value, False) else SAFE
            if root.startswith("torch.cuda") or root.startswith("torch.distributed"):
                return UNKNOWN
            if "loss" in name or name in ("cross_entropy", "nll_loss", "kl_div", "binary_cross_entropy"):
                return TENSOR
            args = [*call.args, *(k.value for k in call.keywords)]
            return TENSOR if any(self.kind(a, scope, line, depth + 1) == TENSOR for a in args) else UNKNOWN
        if name in SAFE_METHODS:
            return SAFE
        if name in GRAPH_METHODS:
            recv = self.kind(func.value, scope, line, depth + 1)
            if recv != UNKNOWN:
                return recv
            if name == "forward" and is_model_callee(func):
                return TENSOR
            return UNKNOWN
        if is_model_callee(func):
            return SAFE if self._frozen_call(call, scope, line, depth) else TENSOR
        if is_loss_callee(func):
            return self._loss_kind(call, scope, line, depth)
        return UNKNOWN

    def _numbers_forward(self, name: str, scope: Scope, line: int, depth: int) -> bool:
        """Whether ``name`` holds an instance of a class of this file (its last binding before ``line``, here
        or at module level, is ``Cls(...)``) whose ``forward`` returns only numbers or arrays: calling it
        gives no graph-carrying output (UniVLA's ``ActionDecoder``, returning ``np.argmax(...)``; round
        CC's re-run after round FF)."""
        bound = [b for b in scope.bindings.get(name, ()) if b.line < line] or list(
            self._module_bindings.get(name, ())
        )
        if not bound:
            return False
        value = max(bound, key=lambda b: b.line).value
        if not isinstance(value, ast.Call) or not isinstance(value.func, ast.Name):
            return False
        forward = self._functions.get(f"{value.func.id}.forward")
        return forward is not None and forward is not scope and self.returns_kind(forward, depth + 1) == SAFE

    def _frozen_call(self, call: ast.Call, scope: Scope, line: int, depth: int) -> bool:
        """A model whose parameters were set not to require grad, called on values that carry no graph
        (data): nothing records one. (A frozen discriminator on a generator's output still does.)"""
        frozen = scope.frozen | self.module_frozen
        if not frozen:
            return False
        func = call.func
        if isinstance(func, ast.Attribute) and func.attr == "forward":
            func = func.value
        key = container_key(func)
        if key is None or not any(key == f or key.startswith(f + ".") for f in frozen):
            return False
        args = [*call.args, *(k.value for k in call.keywords)]
        return all(self.kind(a, scope, line, depth + 1) != TENSOR for a in args)

    def _loss_kind(self, call: ast.Call, scope: Scope, line: int, depth: int) -> int:
        """A loss computed from predictions that carry no graph (logits made under no_grad) has none: SAFE
        when the first argument is known to carry none and no argument carries one; else TENSOR."""
        args = [a for a in call.args if not isinstance(a, ast.Starred)]
        if not args or len(args) != len(call.args):
            return TENSOR
        kinds = [self.kind(a, scope, line, depth + 1) for a in args]
        kinds += [self.kind(k.value, scope, line, depth + 1) for k in call.keywords]
        return SAFE if kinds[0] == SAFE and TENSOR not in kinds else TENSOR

    def cuda_ish(self, expr: ast.AST | None, depth: int = 0) -> bool:
        """Whether an expression names a CUDA device (a literal, or a module-level name bound to one)."""
        if expr is None or depth > 4:
            return False
        if isinstance(expr, ast.Constant):
            return isinstance(expr.value, str) and expr.value.startswith("cuda")
        if isinstance(expr, ast.JoinedStr):
            return bool(expr.values) and self.cuda_ish(expr.values[0], depth + 1)
        if isinstance(expr, ast.Call) and last_name(expr.func) == "device" and expr.args:
            return self.cuda_ish(expr.args[0], depth + 1)
        if isinstance(expr, ast.IfExp):
            return self.cuda_ish(expr.body, depth + 1) or self.cuda_ish(expr.orelse, depth + 1)
        if isinstance(expr, ast.Name):
            return any(self.cuda_ish(b.value, depth + 1) for b in self._module_bindings.get(expr.id, ()))
        return False

    def is_cuda_call(self, call: ast.Call) -> bool:
        func = call.func
        if isinstance(func, ast.Attribute) and func.attr == "cuda" and dotted(func.value) != "torch":
            return True
        if (
            isinstance(func, ast.Attribute)
            and func.attr == "to"
            and call.args
            and self.cuda_ish(call.args[0])
        ):
            return True
        kw = keyword_arg(call, "device")
        if kw is not None and self.cuda_ish(kw.value):
            return True
        return (
            isinstance(func, ast.Attribute)
            and func.attr == "to"
            and self.cuda_ish(getattr(keyword_arg(call, "device"), "value", None))
        )


_TO_NUMBER_METHODS = frozenset({"item", "tolist"})
_TO_NUMBER_BUILTINS = frozenset({"float", "int"})


# What a tensor has as attributes that are tensors themselves (others are metadata: SAFE_ATTRS).
_TENSOR_ATTRS = frozenset({"T", "mT", "H", "mH", "real", "imag", "grad_fn"})


def _backwarded_since_bound(key: str, scope: Scope, line: int) -> bool:
    """Whether the value ``key`` holds at ``line`` is one that ``.backward()`` runs on: a backward of the name
    at or after its last binding before ``line``. A name rebound after its backward to what an unknown
    function returns (``[loss] = reduce_to_floats([loss])``: SimpleAICV, round DD) is not that tensor."""
    bound = [b.line for b in scope.bindings.get(key, ()) if b.line < line]
    if not bound:
        return True  # a parameter, a name bound elsewhere: the backward is the evidence
    last = max(bound)
    return any(at >= last for at in scope.backward_lines.get(key, ()))


def _number_or_itself(expr: ast.IfExp) -> bool:
    """One arm turns a name into a number (``x.item()``, ``x.tolist()``, ``float(x)``, ``int(x)``) and the
    other is that name as it is: the idiom of a value that is a tensor or already a number (round U,
    PyCIL's `flat_loss.item() if task else flat_loss`, where the other arm only runs while it is `0.0`)."""
    for conv, other in ((expr.body, expr.orelse), (expr.orelse, expr.body)):
        if not isinstance(other, ast.Name) or not isinstance(conv, ast.Call) or conv.keywords:
            continue
        func = conv.func
        if isinstance(func, ast.Attribute) and func.attr in _TO_NUMBER_METHODS and not conv.args:
            inner: ast.AST = func.value
        elif isinstance(func, ast.Name) and func.id in _TO_NUMBER_BUILTINS and len(conv.args) == 1:
            inner = conv.args[0]
        else:
            continue
        if isinstance(inner, ast.Name) and inner.id == other.id:
            return True
    return False
