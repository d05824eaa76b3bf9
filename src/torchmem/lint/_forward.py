"""TM013: a module's ``forward`` that keeps its tensors on the module, call after call.

Two forms, by what the data flow shows. "grows" (shown by default): the value is computed in ``forward``
from its inputs (a submodule's output, a tensor op; not an input kept as it came or copied, which may be data
without a graph), the class derives from something (a module; not a plain object whose method is named
``forward``), it is added to the attribute in a way that grows with every call (``append``, ``+=``, ``self.t =
self.t + v``, a key made from ``len(...)`` of the container), and nothing in the file empties the attribute
(no method of the class and no code elsewhere rebinds, clears or hands it out). Every other store a forward
makes into the module (an input kept as given, a key that may repeat, a slice written in place) is the
info form ``""``, shown by ``--all``. Pure standard library: no torch import.
"""

from __future__ import annotations

import ast

from torchmem.lint._kept import KeptChecks
from torchmem.lint._syntax import TENSOR, dotted, node_line, short
from torchmem.lint._walk import Scope, names_in

# ... and a tensor's in-place resets (a metric module's `clear()`: `self.count.zero_()`, round S)
_EMPTIES = frozenset({"clear", "pop", "popleft", "popitem", "remove", "zero_", "fill_", "copy_"})
# Methods that copy or move a tensor: their result is what their receiver is (an input stays an input).
_COPIES = frozenset({"clone", "to", "cpu", "cuda", "contiguous", "float", "half", "double", "bfloat16"})


def in_forward(scope: Scope) -> bool:
    """The scope is a module's ``forward`` or a method of its class that ``forward`` runs through
    ``self.<method>(...)`` (at any depth): a loop there is part of the forward pass, whose graph the caller's
    loss uses (round O: hi-ml's MIL model chunks its frozen encoder in `get_features`, called by `forward`
    from `training_step`), not an evaluation (TM002, TM010)."""
    cls = scope.cls
    if cls is None or scope.kind != "function":
        return False
    reached: set[str] | None = getattr(cls, "_tm_forward_runs", None)
    if reached is None:
        reached = _run_by_forward(cls)
        cls._tm_forward_runs = reached  # type: ignore[attr-defined]  # (the file's own tree)
    return scope.name in reached


def _run_by_forward(cls: ast.ClassDef) -> set[str]:
    """The methods of ``cls`` that its ``forward`` runs: itself and what it calls as ``self.<name>(...)``,
    at any depth (empty without a ``forward``)."""
    methods = {f.name: f for f in cls.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
    if "forward" not in methods:
        return set()
    reached: set[str] = set()
    todo = ["forward"]
    while todo:
        name = todo.pop()
        if name in reached:
            continue
        reached.add(name)
        for node in ast.walk(methods[name]):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "self"
                and node.func.attr in methods
            ):
                todo.append(node.func.attr)
    return reached


#: Methods a training framework calls once per step with autograd on (TM013 reads them like a forward).
_STEP_METHODS = frozenset({"training_step", "compute_loss"})


class ForwardChecks(KeptChecks):
    """TM013; mixed into :class:`torchmem.lint._checker.Rules`."""

    _file_resets: set[str] | None = None

    def tm013(self, scope: Scope) -> None:
        if scope.cls is None or not self.facts.torch_imported:
            return
        # A module's forward, and the per-step methods a framework calls with autograd on: Lightning's and
        # HF Trainer's `training_step`, HF Trainer's `compute_loss` (a subclass that keeps each step's
        # logits, session 21). Their `validation_step`s run under no_grad: what they keep has no graph.
        if scope.name != "forward" and not (scope.name in _STEP_METHODS and scope.cls.bases):
            return
        stores = [
            e
            for e in scope.events
            if e[0] in ("store", "aug")
            and not e[2].no_grad
            and isinstance(e[3], tuple)
            and str(e[3][0]).startswith("self.")
        ]
        if not stores:
            return  # (only stores on the module count: the class's resets are read for those alone)
        reset = self._resets(scope.cls)
        self.flow.assume, self.flow.assume_in = {p: TENSOR for p in scope.params[1:]}, scope
        self.flow.forward_mode = True
        found: list[tuple[ast.AST, str, str, ast.expr, str]] = []
        try:
            for kind, node, _ctx, extra in stores:
                assert isinstance(extra, tuple)
                key: str = extra[0]
                if not key.startswith("self.") or key in reset or self._own_method(scope, key, node):
                    continue
                if isinstance(node, ast.Subscript) and (
                    _has_slice(node.slice) or self._fixed_key(node.slice, self._locals(scope))
                ):
                    # `self.heads[self.index - 1] = out`: the same slot on every call; `self.cache_v[:b,
                    # pos : pos + n] = v`: a copy into a preallocated tensor (llm-awq's KV cache, round X)
                    continue
                line = node_line(node) + 1
                if self.flow.kind(extra[1], scope, line) != TENSOR:
                    continue
                grows = (
                    self._module_class(scope.cls, 0)
                    and self._computed(extra[1], scope, line, 0)
                    and self._grows(kind, node, key, scope.cls)
                    and key.rsplit(".", 1)[-1] not in self._emptied_in_file(scope.cls)
                )
                found.append((node, kind, key, extra[1], "grows" if grows else ""))
        finally:
            self.flow.assume, self.flow.assume_in = {}, None
            self.flow.forward_mode = False
        if not found:
            return
        node, kind, key, value, form = next((f for f in found if f[4]), found[0])
        verb = "adds" if kind == "aug" else "stores"
        if scope.name == "forward":
            what = (
                "each forward's output and its graph (the saved activations on the device until a backward, "
                "the autograd nodes after) stay alive on the module"
            )
        else:
            what = (
                "each step's tensor stays alive with its graph (after the step's backward: its autograd "
                "nodes on the host, tens of KB a step for a transformer, and the tensor itself)"
            )
        self.add(
            node,
            "TM013",
            f"`{scope.cls.name}.{scope.name}` {verb} `{short(value)}` into `{key}` on every call and "
            f"nothing in the class resets it: {what}, growing every step",
            form,
        )

    def _computed(self, value: ast.AST, scope: Scope, line: int, depth: int) -> bool:
        """Whether ``value`` is computed in the forward (a call, an operator, or a name bound to one),
        not one of its inputs as it came (``x``, ``batch["key"]``, ``graph.batch_size``: data, perhaps
        without a graph)."""
        if depth > 8:
            return False
        if (
            isinstance(value, ast.Call)
            and isinstance(value.func, ast.Attribute)
            and value.func.attr in _COPIES
        ):
            return self._computed(value.func.value, scope, line, depth + 1)  # `x.clone()` is still `x`
        if isinstance(value, (ast.Call, ast.BinOp, ast.UnaryOp)):
            return True
        if isinstance(value, (ast.Tuple, ast.List)):
            return any(self._computed(e, scope, line, depth + 1) for e in value.elts)
        if isinstance(value, ast.Subscript):
            return self._computed(value.value, scope, line, depth + 1)
        if isinstance(value, ast.Attribute) and not isinstance(value.value, ast.Name):
            return self._computed(value.value, scope, line, depth + 1)
        key = dotted(value)
        if key is None:
            return False
        bound = [b for b in scope.bindings.get(key, ()) if b.line < line]
        if not bound:
            base = value.value if isinstance(value, ast.Attribute) else None
            return base is not None and self._computed(base, scope, line, depth + 1)
        for b in sorted(bound, key=lambda b: b.line, reverse=True):  # the bindings that may reach it
            if b.value is None:
                return False  # a parameter: the input as it came
            if b.path is not None:  # a for target: an element of what is iterated
                made = self.flow.kind(b.value, scope, b.line + 1) == TENSOR and self._computed(
                    b.value, scope, b.line + 1, depth + 1
                )
            else:
                made = self._computed(b.value, scope, b.line + 1, depth + 1)
            if not made:
                return False
            if _dominates(scope.node, b.line, line - 1):
                return True  # every earlier binding is overwritten by this one
        return False  # bound only under an `if` (or a loop) the store is not in: the input may come as is

    def _module_class(self, cls: ast.ClassDef, depth: int) -> bool:
        """Whether the class can be a torch module: it has a base other than ``object`` (``nn.Module``, a
        library's module class, or a class of this file that has one). A class without a base is a plain
        object whose ``forward`` is only a method name (lmdeploy's recording test double)."""
        bases = [b for b in cls.bases if not (isinstance(b, ast.Name) and b.id == "object")]
        if not bases or depth > 8:
            return False
        for b in bases:
            local = self.facts.classes.get(b.id) if isinstance(b, ast.Name) else None
            if local is None or (local is not cls and self._module_class(local, depth + 1)):
                return True
        return False

    def _grows(self, kind: str, node: ast.AST, key: str, cls: ast.ClassDef) -> bool:
        """Whether the store adds to the attribute on every call: an append or a sum does; a subscript
        store only under a key that is new on each call (made from ``len(...)`` or from an attribute the
        class counts up), not a slot that may be written again; a slice written in place never does."""
        if not isinstance(node, ast.Subscript) or kind == "aug":
            return not (isinstance(node, ast.Subscript) and _has_slice(node.slice))
        if _has_slice(node.slice):
            return False
        counted = self._counted(cls)
        for n in ast.walk(node.slice):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "len":
                return True
            if isinstance(n, ast.Attribute) and dotted(n) in counted:
                return True
        return False

    @staticmethod
    def _counted(cls: ast.ClassDef) -> set[str]:
        """``self.<attr>`` names the class counts up (``self.step += 1``)."""
        return {
            key
            for n in ast.walk(cls)
            if isinstance(n, ast.AugAssign) and isinstance(n.op, ast.Add)
            for key in [dotted(n.target)]
            if key is not None and key.startswith("self.")
        }

    def _emptied_in_file(self, cls: ast.ClassDef) -> set[str]:
        """Attribute names some code of the file outside an ``__init__`` empties: rebinds (not from
        itself), clears, pops, deletes (a training loop's ``model.attn.maps.clear()``)."""
        if self._file_resets is not None:
            return self._file_resets
        out: set[str] = set()
        todo: list[ast.AST] = [self.w.module.node]
        while todo:
            n = todo.pop()
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == "__init__":
                continue
            if isinstance(n, (ast.Assign, ast.AnnAssign)) and n.value is not None:
                targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                for t in targets:
                    for elt in t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t]:
                        key = dotted(elt) if isinstance(elt, ast.Attribute) else None
                        if key is not None and key not in names_in(n.value):
                            out.add(key.rsplit(".", 1)[-1])
            elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in _EMPTIES:
                if isinstance(n.func.value, ast.Attribute):
                    out.add(n.func.value.attr)
            elif isinstance(n, ast.Delete):
                for t in n.targets:
                    base = t.value if isinstance(t, ast.Subscript) else t
                    if isinstance(base, ast.Attribute):
                        out.add(base.attr)
            todo.extend(ast.iter_child_nodes(n))
        self._file_resets = out
        return out

    @staticmethod
    def _locals(scope: Scope) -> set[str]:
        """The names a call of the function binds (parameters and locals): they change from call to call."""
        return {k for k in scope.bindings if "." not in k and k != "self"}

    def _resets(self, cls: ast.ClassDef) -> set[str]:
        """``self.<attr>`` names some method other than ``__init__`` rebinds, clears or returns (the class
        manages what it keeps, or hands it out: a recorder)."""
        found = self._reset_attrs.get(id(cls))
        if found is not None:
            return found
        out: set[str] = set()
        for member in cls.body:
            if not isinstance(member, (ast.FunctionDef, ast.AsyncFunctionDef)) or member.name == "__init__":
                continue
            for n in ast.walk(member):
                if isinstance(n, (ast.Assign, ast.AnnAssign)):
                    targets = n.targets if isinstance(n, ast.Assign) else [n.target]
                    value = n.value
                    for t in targets:
                        for elt in t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t]:
                            key = dotted(elt)
                            if key is not None and (value is None or key not in names_in(value)):
                                out.add(key)  # `self.h = []` resets; `self.h = self.h + x` does not
                elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute):
                    if n.func.attr in _EMPTIES:
                        key = dotted(n.func.value)
                        if key is not None:
                            out.add(key)
                elif isinstance(n, ast.Delete):
                    for t in n.targets:
                        key = dotted(t.value if isinstance(t, ast.Subscript) else t)
                        if key is not None:
                            out.add(key)
                elif isinstance(n, ast.Return) and n.value is not None and member.name != "forward":
                    key = dotted(n.value)  # `def get_tensor_value(self): return self.tensor_val`: a
                    if key is not None and key.startswith("self."):  # recorder hands out what it keeps
                        out.add(key)
        self._reset_attrs[id(cls)] = out
        return out


def _dominates(fn: ast.AST, bound: int, used: int) -> bool:
    """Whether the statement at line ``bound`` runs before every run of the statement at line ``used``:
    it stands in the same block as ``used`` or in a block around it (not in an arm of an `if`, a loop
    or a `try` that ``used`` is outside of)."""
    where: dict[int, tuple[int, ...]] = {}
    todo: list[tuple[list[ast.stmt], tuple[int, ...]]] = [(getattr(fn, "body", []), ())]
    while todo:
        stmts, path = todo.pop()
        for st in stmts:
            where.setdefault(st.lineno, path)
            for name in ("body", "orelse", "finalbody", "handlers", "cases"):
                block = getattr(st, name, None)
                if not isinstance(block, list) or isinstance(st, (ast.FunctionDef, ast.ClassDef)):
                    continue
                for i, sub in enumerate(block):
                    if isinstance(sub, (ast.ExceptHandler,)) or type(sub).__name__ == "match_case":
                        todo.append((sub.body, (*path, id(st), hash(name), i)))  # type: ignore[attr-defined]
                if block and isinstance(block[0], ast.stmt):
                    todo.append((block, (*path, id(st), hash(name))))
    a, b = where.get(bound), where.get(used)
    return a is not None and b is not None and b[: len(a)] == a


def _has_slice(index: ast.AST) -> bool:
    """``[:n]``, ``[a:b, c]``: a slice written in place into a tensor (a preallocated cache), not a slot."""
    return isinstance(index, ast.Slice) or (
        isinstance(index, ast.Tuple) and any(isinstance(e, ast.Slice) for e in index.elts)
    )
