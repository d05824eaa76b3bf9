"""The walk over one module's syntax tree: what it records, per scope (the module, each function, each
lambda), for the rules to read once every loop is known whole.

Where names are bound and to what, the loops (which of them train: a ``.backward()`` or an optimizer
``.step()`` inside), the module's facts (a rank set up, torch imported, CUDA graphs, the start method), and
the calls and stores the rules look at (``Scope.events``), each with its context (innermost loop, under
``no_grad``, under an ``if`` or ``except``). Pure standard library: no torch import.
"""

from __future__ import annotations

import ast
from dataclasses import replace

from torchmem.lint._calls import CallEvents, is_cuda_use
from torchmem.lint._scopes import Binding, Branch, Ctx, Loop, ModuleFacts, Scope, same_path
from torchmem.lint._syntax import (
    ARGS_NAMES,
    ATTACK_LIBRARIES,
    FOREIGN_RUNTIMES,
    NUMPY_ROOTS,
    OTHER_FRAMEWORKS,
    RANK_VARS,
    TORCH_WORLD,
    container_key,
    dotted,
    freezes,
    is_const,
    last_name,
    names_in,
    no_grad_item,
    node_line,
    target_names,
)


def _grad_switch(stmt: ast.stmt) -> bool | None:
    """``False`` for the statement ``torch.set_grad_enabled(False)``, ``True`` for ``(True)``, else None."""
    if not (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)):
        return None
    call = stmt.value
    if last_name(call.func) != "set_grad_enabled" or len(call.args) != 1:
        return None
    if is_const(call.args[0], False):
        return False
    return True if is_const(call.args[0], True) else None


def _module_grad_off(tree: ast.AST) -> bool:
    """A module whose top-level statements turn autograd off, and that never turns it on again (no
    ``set_grad_enabled`` with another argument, no ``enable_grad``)."""
    if not isinstance(tree, ast.Module) or not any(_grad_switch(s) is False for s in tree.body):
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = last_name(node.func)
            if name == "enable_grad" or (
                name == "set_grad_enabled" and not (node.args and is_const(node.args[0], False))
            ):
                return False
    return True


__all__ = [  # what the rules read of the walk (defined in _scopes, _calls, _syntax; imported from here)
    "Binding", "Branch", "Ctx", "Loop", "ModuleFacts", "Scope", "Walker", "is_cuda_use", "names_in",
    "same_path",
]  # fmt: skip

_CUDA_GRAPH_NAMES = frozenset({"CUDAGraph", "make_graphed_callables"})
# Fields of expression nodes that never hold an expression worth a visit (contexts, operators, names).
_NOT_CHILDREN = frozenset({"ctx", "op", "ops", "attr", "id", "arg", "conversion", "type_comment", "kind"})
_CHILD_FIELDS: dict[type[ast.AST], tuple[str, ...]] = {}
_JOINS = frozenset({"cat", "concat", "concatenate", "stack", "hstack", "vstack"})


# NumPy's module names: a value made by one of its functions is an array, which carries no autograd graph.


class Walker(CallEvents):
    """One module's walk (:func:`torchmem.lint._checker.check_tree` runs it, then the rules)."""

    def __init__(self, tree: ast.Module, path: str) -> None:
        self.facts = ModuleFacts()
        self.path = path  # the checked file (`_imported` reads a model class's file from beside it)
        self.scopes: list[Scope] = []
        self.functions: dict[str, Scope] = {}  # functions by name; methods as "Class.name"
        self.if_tests: dict[int, ast.expr] = {}  # the test of each `if`, by the id a Ctx.branch names
        self._gradless: set[int] = set()  # model calls whose output is `.numpy()`-ed as it is
        name = path.replace("\\", "/").rsplit("/", 1)[-1]
        stem = name[:-3] if name.endswith(".py") else name
        self.test_file = (  # pytest's own patterns, and a collection of tests (`torch_stub_tests.py`)
            stem.startswith("test_")
            or stem.endswith("_test")
            or stem == "conftest"
            or "tests" in stem.split("_")
        )
        self.module = self._new_scope(tree, "<module>", None, "module")
        # A script that turns autograd off at its top (`torch.set_grad_enabled(False)` after the imports)
        # and never on again runs every function of it with autograd off (round Z)
        self.grad_off = _module_grad_off(tree)
        self._body(tree.body, self.module, Ctx())

    # -- scopes
    def _new_scope(self, node: ast.AST, name: str, cls: ast.ClassDef | None, kind: str) -> Scope:
        scope = Scope(node, name, cls, kind)
        self.scopes.append(scope)
        return scope

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef, cls: ast.ClassDef | None) -> None:
        scope = self._new_scope(node, node.name, cls, "function")
        self.functions[f"{cls.name}.{node.name}" if cls is not None else node.name] = scope
        for dec in node.decorator_list:
            self._expr(dec, self.module, Ctx())
            state = no_grad_item(dec)
            if state:
                scope.grad_handled = True
                scope.no_grad_all = state == 1
                scope.grad_maybe = state == -1
        if self.grad_off:
            scope.grad_handled = scope.no_grad_all = True
        args = node.args
        for a in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg):
            if a is not None:
                scope.params.append(a.arg)
                if a.annotation is not None:
                    scope.annotations[a.arg] = a.annotation
                scope.bindings.setdefault(a.arg, []).append(Binding(a.lineno, a.col_offset, None, False))
        for d in (*args.defaults, *args.kw_defaults):
            if d is not None:
                self._expr(d, self.module, Ctx())
        self._body(node.body, scope, Ctx(no_grad=scope.no_grad_all))

    # -- statements
    def _body(self, stmts: list[ast.stmt], scope: Scope, ctx: Ctx) -> None:
        for s in stmts:
            self._stmt(s, scope, ctx)
            switch = _grad_switch(s)
            if switch is not None and switch != (not ctx.no_grad):
                # `torch.set_grad_enabled(False)` as a statement: autograd is off for what follows it in
                # this block (TRELLIS's feature extraction, round Z), on again after `(True)`
                ctx = replace(ctx, no_grad=not switch)

    def _bind(
        self, target: ast.AST, value: ast.expr | None, scope: Scope, ctx: Ctx, index: int | None = None
    ) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for i, elt in enumerate(target.elts):
                self._bind(elt, value, scope, ctx, i)
            return
        if isinstance(target, ast.Starred):
            self._bind(target.value, None, scope, ctx)
            return
        if isinstance(target, ast.Subscript):
            self._expr(target, scope, ctx)
            return
        key = dotted(target)
        if key is None:
            self._expr(target, scope, ctx)
            return
        if isinstance(target, ast.Attribute):
            self._expr(target.value, scope, ctx)
        if isinstance(value, ast.Call) and freezes(value):
            scope.frozen.add(key)  # model = Net().eval().requires_grad_(False)
        bound = scope.bindings.setdefault(key, [])
        col = int(getattr(target, "col_offset", 0))
        bound.append(Binding(node_line(target), col, value, ctx.no_grad, index, None, ctx.branch))
        loop = ctx.loop
        if loop is not None and value is not None:
            self._carry(key, value, node_line(target), loop, bound[:-1], ctx.branch)
        while loop is not None:
            loop.rebound.add(key)
            loop = loop.parent

    @staticmethod
    def _elements_of(target: ast.AST, iterable: ast.expr, scope: Scope, path: tuple[int, ...]) -> None:
        """Record what a for target is bound from: an element of ``iterable`` (``for k, v in d.items()``)."""
        if isinstance(target, (ast.Tuple, ast.List)):
            for i, elt in enumerate(target.elts):
                Walker._elements_of(elt, iterable, scope, (*path, i))
            return
        key = dotted(target) if isinstance(target, (ast.Name, ast.Attribute)) else None
        if key is not None and scope.bindings.get(key):
            bound = scope.bindings[key][-1]
            bound.value, bound.index, bound.path = iterable, None, path

    @staticmethod
    def _carry(
        key: str, value: ast.expr, line: int, loop: Loop, earlier: list[Binding], branch: Branch
    ) -> None:
        """Record ``h = f(x, h)`` (state carried into the next iteration) and ``h = h.detach()``; not when
        ``h`` was bound afresh earlier in the same iteration (``wave, = next(it); wave = wave.to(d)``), nor
        for a self-assignment ``h = h``, which carries nothing new (PyContinual's ``buf_inputs = buf_inputs``
        after a buffer read, round FF)."""
        if value.__class__ in (ast.Name, ast.Attribute) and dotted(value) == key:
            return
        uses = False
        cut = False
        stack: list[ast.AST] = [value]
        while stack:  # ast.walk without its generator and the ctx/operator leaves (a hot path)
            n = stack.pop()
            cls = n.__class__
            if cls is ast.Name:
                uses = uses or n.id == key  # type: ignore[attr-defined]
                continue
            if cls is ast.Constant:
                continue
            if cls is ast.Attribute:
                if not uses and dotted(n) == key:
                    uses = True
                    continue
            elif cls is ast.Call:
                fname = last_name(n.func).lower()  # type: ignore[attr-defined]
                if "detach" in fname or "repackage" in fname or fname in ("item", "tolist", "numpy"):
                    cut = True
            _push_children(n, cls, stack)
        if not uses:
            return
        made_by = dotted(value.func) if isinstance(value, ast.Call) else None
        if made_by is not None and made_by.split(".", 1)[0] in NUMPY_ROOTS:
            cut = True  # `r = np.float32(r + dr)`: the value is a NumPy array, it carries no graph (round S)
        # where the name was bound afresh (not from itself) before this statement
        fresh = [b for b in earlier if b.line < line and (b.value is None or key not in names_in(b.value))]
        for lp in loop.chain():
            if cut:
                lp.detached.add(key)
            elif key in lp.targets:
                # the loop binds it afresh at each iteration, before its body reads it: nothing goes into
                # this loop's next iteration, nor out to the loops around it (StyleTTS2's `batch = [...
                # for b in batch[1:]]` and `_s2s_pred = _s2s_pred[:n]` inside their own loops, round N)
                break
            elif any(node_line(lp.node) < b.line and branch[: len(b.branch)] == b.branch for b in fresh):
                # what the previous iteration of this loop left is replaced before this reads it, in this
                # loop's body: nothing goes into its next iteration, nor out to the loops around it
                # (`hidden = features`, then `for w in weights: hidden = f(hidden, w)`: the inner loop
                # carries it, the loop around it does not; DeepRobust's mettack, round S), or earlier in
                # the arm this statement is written in (`if not buffer.is_empty(): labels = buffer.get();
                # labels = labels.long()`: PyContinual, round FF). Not a binding under an `if` this
                # statement is not in (`if t == 0: hidden = zeros(...)`: the other iterations read what
                # the one before left; home-robot's keypoint rollout, round V)
                break
            else:
                lp.carried.setdefault(key, line)

    def _stmt(self, s: ast.stmt, scope: Scope, ctx: Ctx) -> None:
        if isinstance(s, ast.Expr):
            self._expr(s.value, scope, ctx)
        elif isinstance(s, ast.Assign):
            self._expr(s.value, scope, ctx)
            for t in s.targets:
                self._assign_target(t, s.value, scope, ctx)
        elif isinstance(s, ast.AugAssign):
            self._expr(s.value, scope, ctx)
            self._augassign(s, scope, ctx)
        elif isinstance(s, ast.AnnAssign):
            if s.value is not None:
                self._expr(s.value, scope, ctx)
                self._assign_target(s.target, s.value, scope, ctx)
        elif isinstance(s, (ast.For, ast.AsyncFor)):
            self._expr(s.iter, scope, ctx)
            loop = Loop(s, ctx.loop, branch=ctx.branch)
            inner = Ctx(loop, ctx.no_grad, None, False, branch=ctx.branch)
            self._bind(s.target, None, scope, inner)
            self._elements_of(s.target, s.iter, scope, ())
            loop.targets = target_names(s.target)
            self._body(s.body, scope, inner)
            self._body(s.orelse, scope, ctx)
        elif isinstance(s, ast.While):
            loop = Loop(s, ctx.loop, branch=ctx.branch)
            inner = Ctx(loop, ctx.no_grad, None, False, branch=ctx.branch)
            self._expr(s.test, scope, inner)
            self._body(s.body, scope, inner)
            self._body(s.orelse, scope, ctx)
        elif isinstance(s, ast.If):
            self._expr(s.test, scope, ctx)
            self.if_tests[id(s)] = s.test
            guard = ctx.guard
            if ctx.loop is not None and not self._availability_test(s.test):
                guard = ctx.loop
            for arm, stmts in ((0, s.body), (1, s.orelse)):
                arms = (*ctx.branch, (id(s), arm))
                sub = Ctx(ctx.loop, ctx.no_grad, guard, ctx.in_handler, ctx.exc, arms, ctx.trial)
                self._body(stmts, scope, sub)
        elif isinstance(s, (ast.With, ast.AsyncWith)):
            no_grad = ctx.no_grad
            for item in s.items:
                self._expr(item.context_expr, scope, ctx)
                cm = item.context_expr
                if isinstance(cm, ast.Name) and scope.bindings.get(cm.id):
                    cm = scope.bindings[cm.id][-1].value or cm  # `ctx = torch.no_grad(); with ctx:`
                state = no_grad_item(cm)
                if state:
                    scope.grad_handled = True
                    no_grad = no_grad or state == 1
                    scope.grad_maybe = scope.grad_maybe or state == -1
                if last_name(getattr(item.context_expr, "func", item.context_expr)) == "enable_grad":
                    scope.enable_grad = True
                    no_grad = False
                if item.optional_vars is not None:
                    self._bind(item.optional_vars, None, scope, ctx)
            inner = Ctx(ctx.loop, no_grad, ctx.guard, ctx.in_handler, ctx.exc, ctx.branch, ctx.trial)
            self._body(s.body, scope, inner)
        elif isinstance(s, ast.Try) or type(s).__name__ == "TryStar":
            try_node: ast.Try = s  # type: ignore[assignment]
            self._body(try_node.body, scope, ctx)
            for h in try_node.handlers:
                if h.type is not None:
                    self._expr(h.type, scope, ctx)
                if h.name:
                    scope.bindings.setdefault(h.name, []).append(Binding(h.lineno, h.col_offset, None, False))
                exc = h.name or ctx.exc
                handler_ctx = Ctx(ctx.loop, ctx.no_grad, ctx.loop, True, exc, ctx.branch, try_node)
                self._body(h.body, scope, handler_ctx)
            self._body(try_node.orelse, scope, ctx)
            self._body(try_node.finalbody, scope, ctx)
        elif isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)):
            self._bind(ast.Name(id=s.name, lineno=s.lineno, col_offset=s.col_offset), None, scope, ctx)
            self._function(s, None)
        elif isinstance(s, ast.ClassDef):
            self.facts.classes.setdefault(s.name, s)
            for b in (*s.bases, *s.decorator_list):
                self._expr(b, scope, ctx)
            for member in s.body:
                if isinstance(member, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    self._function(member, s)
                else:
                    self._stmt(member, scope, Ctx())
        elif isinstance(s, ast.Return):
            if s.value is not None:
                self._expr(s.value, scope, ctx)
                scope.returns.append((s.value, s.lineno, ctx.no_grad))
        elif isinstance(s, (ast.Global, ast.Nonlocal)):
            scope.declared.update(s.names)
        elif isinstance(s, ast.Delete):
            for t in s.targets:
                deleted = dotted(t.value if isinstance(t, ast.Subscript) else t)
                for lp in ctx.loop.chain() if ctx.loop is not None and deleted is not None else ():
                    lp.cleared.add(deleted)  # type: ignore[arg-type]
        elif isinstance(s, (ast.Raise, ast.Assert)):
            for child in ast.iter_child_nodes(s):
                self._expr(child, scope, ctx)
        elif type(s).__name__ == "Match":
            self._expr(s.subject, scope, ctx)  # type: ignore[attr-defined]
            for case in s.cases:  # type: ignore[attr-defined]
                case_ctx = replace(ctx, guard=ctx.loop)
                self._body(case.body, scope, case_ctx)
        elif isinstance(s, (ast.Import, ast.ImportFrom)):
            mods = [a.name for a in s.names] if isinstance(s, ast.Import) else [s.module or ""]
            if any(m.split(".", 1)[0] in TORCH_WORLD for m in mods):
                self.facts.torch_imported = True
            if any(m.split(".", 1)[0] in OTHER_FRAMEWORKS for m in mods) and not getattr(s, "level", 0):
                self.facts.other_framework = True
            if isinstance(s, ast.ImportFrom) and s.module == "torch.autograd" and not s.level:
                self.facts.grad_names.update(a.asname or a.name for a in s.names if a.name == "grad")
            for a in s.names:  # `import openvino as ov`, `from onnxruntime import InferenceSession`
                self.facts.imported_names.add((a.asname or a.name).split(".", 1)[0])
                root = (a.name if isinstance(s, ast.Import) else s.module or "").split(".", 1)[0]
                if root in FOREIGN_RUNTIMES and not getattr(s, "level", 0):
                    self.facts.foreign_names.add((a.asname or a.name).split(".", 1)[0])
                if root in ATTACK_LIBRARIES and not getattr(s, "level", 0):
                    self.facts.attack_names.add((a.asname or a.name).split(".", 1)[0])
        # Pass, Break, Continue: nothing to record

    @staticmethod
    def _availability_test(test: ast.expr) -> bool:
        """``if torch.cuda.is_available():`` guards nothing per step."""
        return isinstance(test, ast.Call) and last_name(test.func) == "is_available"

    def _assign_target(self, t: ast.expr, value: ast.expr, scope: Scope, ctx: Ctx) -> None:
        if isinstance(t, ast.Attribute) and t.attr == "grad" and not is_const(value, None):
            self.facts.grad_inplace = True  # `p.grad = torch.empty_like(p)`: buffers the program allocates
        if isinstance(t, ast.Attribute) and t.attr == "requires_grad" and is_const(value, False):
            self._freeze(t.value, scope, ctx)  # `for p in model.parameters(): p.requires_grad = False`
        if isinstance(t, ast.Subscript):
            container = container_key(t.value)
            self._expr(t, scope, ctx)
            if container is not None and not isinstance(t.slice, (ast.Constant, ast.Slice)):
                scope.events.append(("store", t, ctx, (container, value)))
            return
        key = dotted(t)
        if key is not None and isinstance(value, ast.BinOp) and isinstance(value.op, (ast.Add, ast.Sub)):
            # total = total + loss: an accumulation, not a fresh binding
            if dotted(value.left) == key:
                scope.events.append(("aug", t, ctx, (key, value.right)))
                return
            if dotted(value.right) == key:
                scope.events.append(("aug", t, ctx, (key, value.left)))
                return
        if (
            key is not None
            and isinstance(value, ast.Call)
            and last_name(value.func) in _JOINS
            and value.args
            and isinstance(value.args[0], (ast.List, ast.Tuple))
            and any(dotted(e) == key for e in value.args[0].elts)
        ):  # h = torch.cat([h, loss[None]]): an accumulation too
            for e in value.args[0].elts:
                if dotted(e) != key:
                    scope.events.append(("aug", t, ctx, (key, e)))
            if ctx.loop is not None:
                self._carry(key, value, node_line(t), ctx.loop, scope.bindings.get(key, []), ctx.branch)
            return
        self._bind(t, value, scope, ctx)

    def _augassign(self, s: ast.AugAssign, scope: Scope, ctx: Ctx) -> None:
        t = s.target
        if (isinstance(t, ast.Attribute) and t.attr == "grad") or (
            isinstance(t, ast.Subscript) and isinstance(t.value, ast.Attribute) and t.value.attr == "grad"
        ):
            self.facts.grad_inplace = True
        if not isinstance(s.op, (ast.Add, ast.Sub)):
            return
        if isinstance(t, ast.Subscript):
            container = container_key(t.value)
            self._expr(t, scope, ctx)
            if container is not None:
                scope.events.append(("aug", t, ctx, (container, s.value)))
            return
        key = dotted(t)
        if key is None:
            return
        if isinstance(s.value, (ast.List, ast.Tuple)):
            for elt in s.value.elts:
                scope.events.append(("store", t, ctx, (key, elt)))
        else:
            scope.events.append(("aug", t, ctx, (key, s.value)))

    # -- expressions
    def _expr(self, node: ast.AST, scope: Scope, ctx: Ctx) -> None:
        stack: list[ast.AST] = [node]
        while stack:
            n = stack.pop()
            cls = n.__class__
            if cls is ast.Call:
                self._call(n, scope, ctx)  # type: ignore[arg-type]
                stack.extend([k.value for k in reversed(n.keywords)])  # type: ignore[attr-defined]
                stack.extend(reversed(n.args))  # type: ignore[attr-defined]
                stack.append(n.func)  # type: ignore[attr-defined]
                continue
            if cls is ast.Name:
                if n.id in _CUDA_GRAPH_NAMES:  # type: ignore[attr-defined]
                    self.facts.cuda_graphs = True
                continue
            if cls is ast.Constant:
                continue
            if cls is ast.Attribute:
                assert isinstance(n, ast.Attribute)
                if n.attr == "local_rank" and isinstance(n.value, ast.Name) and n.value.id in ARGS_NAMES:
                    self.facts.rank_setup = True  # args.local_rank (torch.distributed.launch)
                elif n.attr in _CUDA_GRAPH_NAMES:
                    self.facts.cuda_graphs = True
            elif cls is ast.Subscript:
                assert isinstance(n, ast.Subscript)
                if (
                    isinstance(n.ctx, ast.Load)
                    and isinstance(n.slice, ast.Constant)
                    and n.slice.value in RANK_VARS
                ):
                    self.facts.rank_setup = True  # os.environ["LOCAL_RANK"] read
            elif cls is ast.Lambda:
                assert isinstance(n, ast.Lambda)
                role = id(n) in self.facts.worker_lambdas
                lam = self._new_scope(n, "<lambda-worker>" if role else "<lambda>", None, "lambda")
                self._expr(n.body, lam, Ctx())
                continue
            elif cls is ast.NamedExpr:
                assert isinstance(n, ast.NamedExpr)
                self._bind(n.target, n.value, scope, ctx)
            _push_children(n, cls, stack)


def _push_children(n: ast.AST, cls: type[ast.AST], stack: list[ast.AST]) -> None:
    """``stack.extend(ast.iter_child_nodes(n))`` without the generator and the ctx/operator leaves."""
    fields = _CHILD_FIELDS.get(cls)
    if fields is None:
        fields = _CHILD_FIELDS[cls] = tuple(f for f in cls._fields if f not in _NOT_CHILDREN)
    for name in fields:
        v = getattr(n, name, None)
        if v.__class__ is list:
            stack.extend([x for x in v if x is not None])
        elif isinstance(v, ast.AST):
            stack.append(v)
