"""The walk over one module's syntax tree: what it records, per scope (the module, each function, each
lambda), for the rules to read once every loop is known whole.

Where names are bound and to what, the loops (which of them train: a ``.backward()`` or an optimizer
``.step()`` inside), the module's facts (a rank set up, torch imported, CUDA graphs, the start method), and
the calls and stores the rules look at (``Scope.events``), each with its context (innermost loop, under
``no_grad``, under an ``if`` or ``except``). Pure standard library: no torch import.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TypeAlias

from torchmem.lint._syntax import (
    ARGS_NAMES,
    FOREIGN_RUNTIMES,
    HOOK_METHODS,
    OPT_NAMES,
    RANK_VARS,
    SINK_METHODS,
    TORCH_WORLD,
    container_key,
    dotted,
    is_const,
    is_const_in,
    is_model_callee,
    keyword_arg,
    last_name,
    no_grad_item,
    node_line,
    short,
)

# The callee names the walk records something about (every other call only has its children visited).
_CUDA_GRAPH_NAMES = frozenset({"CUDAGraph", "make_graphed_callables"})
_CALLS_OF_NOTE = frozenset(
    {
        "backward", "manual_backward", "grad", "step", "zero_grad", "empty_cache", "eval", "append",
        "requires_grad_",
        "appendleft", "insert", "add", "extend", "detach_", "save", "clear", "pop", "popleft", "popitem",
        "load", "init_process_group", "set_device", "get", "getenv", "set_start_method", "set_grad_enabled",
        "remove", "DataLoader", "update", "graph", *HOOK_METHODS, *SINK_METHODS,
    }
)  # fmt: skip
# Fields of expression nodes that never hold an expression worth a visit (contexts, operators, names).
_NOT_CHILDREN = frozenset({"ctx", "op", "ops", "attr", "id", "arg", "conversion", "type_comment", "kind"})
_CHILD_FIELDS: dict[type[ast.AST], tuple[str, ...]] = {}
_JOINS = frozenset({"cat", "concat", "concatenate", "stack", "hstack", "vstack"})
Branch: TypeAlias = tuple[tuple[int, int], ...]
# Methods whose result requires grad when their receiver does (what `.numpy()` of it would refuse).
_KEEP_GRAD = frozenset(
    {
        "cpu",
        "float",
        "double",
        "half",
        "to",
        "contiguous",
        "squeeze",
        "unsqueeze",
        "reshape",
        "view",
        "clone",
        "flatten",
    }
)


# -- what the walk records ----------------------------------------------------------------------------------
@dataclass(eq=False)
class Loop:
    node: ast.AST
    parent: Loop | None
    direct_trains: bool = False  # a backward/optimizer step in this loop, not only in a nested one
    trains: bool = False
    rebound: set[str] = field(default_factory=set)
    cleared: set[str] = field(default_factory=set)
    model_call: ast.Call | None = None  # the first model call not under no_grad
    model_calls: list[ast.Call] = field(default_factory=list)  # every model call not under no_grad
    backwards: list[tuple[tuple[int, int], bool]] = field(default_factory=list)  # (position, retains)
    carried: dict[str, int] = field(default_factory=dict)  # name -> line: bound from its own previous value
    detached: set[str] = field(default_factory=set)  # names cut from their graph in the loop
    targets: set[str] = field(default_factory=set)  # names the for statement binds each iteration
    branch: Branch = ()  # the arms of the `if` statements the loop is written in

    def chain(self) -> Iterator[Loop]:
        loop: Loop | None = self
        while loop is not None:
            yield loop
            loop = loop.parent


@dataclass(frozen=True)
class Ctx:
    loop: Loop | None = None
    no_grad: bool = False
    guard: Loop | None = None  # under an if/except inside this loop
    in_handler: bool = False
    exc: str | None = None  # the name an enclosing `except ... as e:` binds
    branch: Branch = ()  # the arms of the enclosing `if` statements: ((id of the if, 0 body / 1 else), ...)


def same_path(a: Branch, b: Branch) -> bool:
    """Whether code written in the arms ``a`` can run on the same pass as code in the arms ``b``: no `if`
    of both is taken one way for one and the other way for the other."""
    if not a or not b:
        return True
    arms = dict(a)
    return all(arms.get(if_id, arm) == arm for if_id, arm in b)


@dataclass
class Binding:
    line: int
    col: int
    value: ast.expr | None  # None: bound by a for target, a with, a parameter
    no_grad: bool
    index: int | None = None  # the element of an unpacked tuple
    path: tuple[int, ...] | None = None  # a for target: `value` is the iterable, `path` the unpacking


@dataclass(eq=False)
class Scope:
    node: ast.AST
    name: str
    cls: ast.ClassDef | None
    kind: str  # "module", "function", "lambda"
    bindings: dict[str, list[Binding]] = field(default_factory=dict)
    backwarded: set[str] = field(default_factory=set)
    no_grad_all: bool = False  # decorated with no_grad / set_grad_enabled(False) as a statement
    grad_handled: bool = False  # any no_grad / inference_mode / set_grad_enabled in the scope
    enable_grad: bool = False
    trains: bool = False
    eval_called: bool = False
    eval_receivers: set[str] = field(default_factory=set)  # `model` of `model.eval()`, `model.cuda().eval()`
    eval_branches: dict[str, list[Branch]] = field(default_factory=dict)  # where each receiver's eval() is
    frozen: set[str] = field(default_factory=set)  # `model` of `model.requires_grad_(False)` (no graph)
    events: list[tuple[str, ast.AST, Ctx, object]] = field(default_factory=list)
    eval_loops: list[Loop] = field(default_factory=list)  # outermost loops with a model call, in order
    grad_maybe: bool = False  # set_grad_enabled(<a variable>): autograd may be off, not known
    params: list[str] = field(default_factory=list)
    declared: set[str] = field(default_factory=set)  # names declared `nonlocal` or `global`
    returns: list[tuple[ast.expr, int, bool]] = field(default_factory=list)  # (value, line, under no_grad)
    backward_roots: set[str] = field(default_factory=set)  # names inside what `.backward()` runs on
    removes_handles: bool = False  # some `handle.remove()` in the scope
    annotations: dict[str, ast.expr] = field(default_factory=dict)  # parameter -> its annotation


@dataclass
class ModuleFacts:
    rank_setup: bool = False
    torch_imported: bool = False  # the file imports torch or a framework built on it
    cuda_graphs: bool = False
    grad_inplace: bool = False
    start_method: str | None = None  # the constant given to set_start_method, "?" when not a constant
    collate_names: set[str] = field(default_factory=set)
    worker_names: set[str] = field(default_factory=set)
    worker_lambdas: set[int] = field(default_factory=set)
    called_under_no_grad: set[str] = field(default_factory=set)
    classes: dict[str, ast.ClassDef] = field(default_factory=dict)
    foreign_names: set[str] = field(default_factory=set)  # names imported from a non-torch runtime


class Walker:
    """One module's walk (:func:`torchmem.lint._checker.check_tree` runs it, then the rules)."""

    def __init__(self, tree: ast.Module, path: str) -> None:
        self.facts = ModuleFacts()
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
        if isinstance(value, ast.Call) and _freezes(value):
            scope.frozen.add(key)  # model = Net().eval().requires_grad_(False)
        bound = scope.bindings.setdefault(key, [])
        bound.append(
            Binding(node_line(target), int(getattr(target, "col_offset", 0)), value, ctx.no_grad, index)
        )
        loop = ctx.loop
        if loop is not None and value is not None:
            self._carry(key, value, node_line(target), loop, bound[:-1])
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
    def _carry(key: str, value: ast.expr, line: int, loop: Loop, earlier: list[Binding]) -> None:
        """Record ``h = f(x, h)`` (state carried into the next iteration) and ``h = h.detach()``; not when
        ``h`` was bound afresh earlier in the same iteration (``wave, = next(it); wave = wave.to(d)``)."""
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
        start = node_line(loop.node)
        if not cut and any(
            start < b.line < line and (b.value is None or key not in names_in(b.value)) for b in earlier
        ):
            return  # what the previous iteration left is replaced before this reads it
        for lp in loop.chain():
            if cut:
                lp.detached.add(key)
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
            loop.targets = _target_names(s.target)
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
                sub = Ctx(ctx.loop, ctx.no_grad, guard, ctx.in_handler, ctx.exc, (*ctx.branch, (id(s), arm)))
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
            inner = Ctx(ctx.loop, no_grad, ctx.guard, ctx.in_handler, ctx.exc, ctx.branch)
            self._body(s.body, scope, inner)
        elif isinstance(s, ast.Try) or type(s).__name__ == "TryStar":
            try_node: ast.Try = s  # type: ignore[assignment]
            self._body(try_node.body, scope, ctx)
            for h in try_node.handlers:
                if h.type is not None:
                    self._expr(h.type, scope, ctx)
                if h.name:
                    scope.bindings.setdefault(h.name, []).append(Binding(h.lineno, h.col_offset, None, False))
                handler_ctx = Ctx(ctx.loop, ctx.no_grad, ctx.loop, True, h.name or ctx.exc, ctx.branch)
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
                case_ctx = Ctx(ctx.loop, ctx.no_grad, ctx.loop, ctx.in_handler, ctx.exc, ctx.branch)
                self._body(case.body, scope, case_ctx)
        elif isinstance(s, (ast.Import, ast.ImportFrom)):
            mods = [a.name for a in s.names] if isinstance(s, ast.Import) else [s.module or ""]
            if any(m.split(".", 1)[0] in TORCH_WORLD for m in mods):
                self.facts.torch_imported = True
            for a in s.names:  # `import openvino as ov`, `from onnxruntime import InferenceSession`
                root = (a.name if isinstance(s, ast.Import) else s.module or "").split(".", 1)[0]
                if root in FOREIGN_RUNTIMES and not getattr(s, "level", 0):
                    self.facts.foreign_names.add((a.asname or a.name).split(".", 1)[0])
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
                self._carry(key, value, node_line(t), ctx.loop, scope.bindings.get(key, []))
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

    def _call(self, call: ast.Call, scope: Scope, ctx: Ctx) -> None:
        func = call.func
        name = last_name(func)
        loop = ctx.loop
        for k in call.keywords:
            if k.arg in ("collate_fn", "worker_init_fn"):
                target = k.value
                if isinstance(target, ast.Call) and last_name(target.func) == "partial" and target.args:
                    target = target.args[0]
                names = self.facts.collate_names if k.arg == "collate_fn" else self.facts.worker_names
                if isinstance(target, ast.Lambda):
                    self.facts.worker_lambdas.add(id(target))
                elif last_name(target):
                    names.add(last_name(target))
        if name in _CALLS_OF_NOTE:  # one set lookup for the common call (none of these names)
            if name in ("backward", "manual_backward"):
                retains = any(
                    k.arg in ("retain_graph", "create_graph") and is_const(k.value, True)
                    for k in call.keywords
                )
                scope.trains = True
                self._mark_training(loop, call, retains)
                if isinstance(func, ast.Attribute):
                    recv = func.value
                    if isinstance(recv, ast.Call) and recv.args:  # scaler.scale(loss).backward()
                        recv = recv.args[0]
                    for part in (recv, *call.args[:1]):
                        scope.backward_roots.update(names_in(part))
                    key = dotted(recv)
                    if key is not None and call.args == [] and name == "backward":
                        scope.backwarded.add(key)
                if (call.args and dotted(call.args[0]) is not None and name == "manual_backward") or (
                    name == "backward" and call.args and isinstance(func, ast.Attribute)
                    and last_name(func.value) in ("accelerator", "autograd", "engine", "model_engine")
                ):  # fmt: skip
                    key = dotted(call.args[0])
                    if key is not None:
                        scope.backwarded.add(key)
                if retains and loop is not None:
                    create = any(k.arg == "create_graph" and is_const(k.value, True) for k in call.keywords)
                    if not create:
                        scope.events.append(("retain", call, ctx, None))
            elif name == "grad" and isinstance(func, ast.Attribute) and last_name(func.value) == "autograd":
                for part in (*call.args[:1], *(k.value for k in call.keywords if k.arg == "outputs")):
                    scope.backward_roots.update(names_in(part))
                retains = any(
                    k.arg in ("retain_graph", "create_graph") and is_const(k.value, True)
                    for k in call.keywords
                )
                if loop is not None:
                    loop.backwards.append(((call.lineno, call.col_offset), retains))
            elif name == "step" and isinstance(func, ast.Attribute):
                opt_name = last_name(func.value)
                if OPT_NAMES.search(opt_name) or (call.args and OPT_NAMES.search(last_name(call.args[0]))):
                    scope.trains = True
                    self._mark_training(loop, None, False)
            elif name == "zero_grad":
                kw = keyword_arg(call, "set_to_none")
                if kw is not None and is_const(kw.value, False):
                    scope.events.append(("zero_grad", call, ctx, None))
            elif name == "empty_cache":
                base = dotted(func.value) if isinstance(func, ast.Attribute) else ""
                if base is None or base.startswith("torch") or base in ("cuda", "mps", "xpu") or base == "":
                    scope.events.append(("empty_cache", call, ctx, None))
            elif name == "requires_grad_" and isinstance(func, ast.Attribute) and _turns_off(call):
                self._freeze(func.value, scope, ctx)
            elif name == "eval" and isinstance(func, ast.Attribute) and not call.args and not call.keywords:
                scope.eval_called = True
                recv = func.value
                while isinstance(recv, ast.Call) and isinstance(recv.func, ast.Attribute):
                    recv = recv.func.value  # model.cuda().eval(), model.to(device).eval()
                key = container_key(recv)
                if key is not None:
                    scope.eval_receivers.add(key)
                    scope.eval_branches.setdefault(key, []).append(ctx.branch)
            elif (
                name in ("append", "appendleft", "insert", "add")
                and isinstance(func, ast.Attribute)
                and len(call.args)
                == (2 if name == "insert" else 1)  # list.append(v), set.add(v): not add(a, b)
                and not call.keywords
            ):
                container = container_key(func.value)
                if container is not None:
                    scope.events.append(("store", call, ctx, (container, call.args[-1])))
            elif name == "extend" and isinstance(func, ast.Attribute) and call.args:
                container = container_key(func.value)
                if container is not None and isinstance(call.args[0], (ast.List, ast.Tuple)):
                    for elt in call.args[0].elts:
                        scope.events.append(("store", call, ctx, (container, elt)))
                elif container is not None and not isinstance(call.args[0], ast.Starred):
                    scope.events.append(("store", call, ctx, (container, call.args[0])))  # its elements
            elif name == "detach_" and isinstance(func, ast.Attribute):
                key = dotted(func.value)
                for lp in loop.chain() if key is not None and loop is not None else ():
                    lp.detached.add(key)  # type: ignore[arg-type]
            elif name == "save" and dotted(func) == "torch.save":
                scope.events.append(("save", call, ctx, None))
            elif name in ("clear", "pop", "popleft", "popitem") and isinstance(func, ast.Attribute):
                key = dotted(func.value)
                while key is not None and loop is not None:
                    loop.cleared.add(key)
                    loop = loop.parent
            elif name == "load" and (dotted(func) == "torch.load" or isinstance(func, ast.Name)):
                scope.events.append(("load", call, ctx, None))
            elif name in ("init_process_group", "set_device", "get", "getenv"):
                if name == "init_process_group" or (
                    call.args
                    and (
                        "rank" in short(call.args[0], 200).lower()
                        if name == "set_device"
                        else is_const_in(call.args[0], RANK_VARS)
                    )
                ):
                    self.facts.rank_setup = True
            elif name == "set_start_method":
                arg = call.args[0] if call.args else getattr(keyword_arg(call, "method"), "value", None)
                self.facts.start_method = arg.value if isinstance(arg, ast.Constant) else "?"  # type: ignore[assignment]
            elif name == "set_grad_enabled" and call.args and not is_const(call.args[0], True):
                scope.grad_handled = True
                scope.grad_maybe = scope.grad_maybe or not is_const(call.args[0], False)
            elif name in HOOK_METHODS and isinstance(func, ast.Attribute):
                scope.events.append(("hook", call, ctx, None))
            elif name == "remove" and not call.args and isinstance(func, ast.Attribute):
                scope.removes_handles = True
            elif name == "DataLoader":
                scope.events.append(("dataloader", call, ctx, None))
            elif name in SINK_METHODS or name == "update":
                scope.events.append(("sink", call, ctx, None))
            elif name == "graph" and isinstance(func, ast.Attribute) and last_name(func.value) == "cuda":
                self.facts.cuda_graphs = True
        if name == "numpy" and isinstance(func, ast.Attribute) and not call.args:
            self._numpy_of(func.value)
        if name in ("add_", "copy_", "zero_") and last_name(getattr(func, "value", func)) == "grad":
            self.facts.grad_inplace = True
        if is_cuda_use(call):
            scope.events.append(("cuda", call, ctx, None))
        if ctx.no_grad and name:
            self.facts.called_under_no_grad.add(name)
        if (
            loop is not None
            and call.args
            and (
                isinstance(func, ast.Name)
                or (isinstance(func, ast.Attribute) and dotted(func.value) == "self")
            )
        ):
            scope.events.append(("call", call, ctx, None))
        if (
            not ctx.no_grad
            and loop is not None
            and (call.args or call.keywords)
            and id(call) not in self._gradless
            and is_model_callee(func)
            and not (isinstance(func, ast.Name) and func.id[:1].isupper())  # a class: makes a model
        ):
            for lp in loop.chain():
                lp.model_calls.append(call)
                if lp.model_call is None:
                    lp.model_call = call
            outer = list(loop.chain())[-1]
            if outer not in scope.eval_loops:
                scope.eval_loops.append(outer)
        # the children: the caller's walk visits them (no recursion per call)

    @staticmethod
    def _freeze(recv: ast.expr, scope: Scope, ctx: Ctx) -> None:
        """Record the model whose parameters stop requiring grad: ``model.requires_grad_(False)``,
        ``model.eval().requires_grad_(False)``, or a parameter of ``for p in model.parameters():``."""
        while isinstance(recv, ast.Call) and isinstance(recv.func, ast.Attribute):
            recv = recv.func.value  # model.eval().requires_grad_(False), model.to(d).requires_grad_(False)
        loop = ctx.loop
        if (
            isinstance(recv, ast.Name)
            and loop is not None
            and recv.id in loop.targets
            and isinstance(loop.node, (ast.For, ast.AsyncFor))
            and isinstance(loop.node.iter, ast.Call)
            and last_name(loop.node.iter.func) in ("parameters", "named_parameters")
            and isinstance(loop.node.iter.func, ast.Attribute)
        ):
            recv = loop.node.iter.func.value  # for p in model.parameters(): p.requires_grad_(False)
        key = container_key(recv)
        if key is not None:
            scope.frozen.add(key)

    def _numpy_of(self, recv: ast.expr) -> None:
        """``model(x)[0].cpu().numpy()``: ``.numpy()`` raises on a tensor that requires grad, so a model call
        whose output reaches it with nothing cutting the graph (``.detach()``, ``.data``) records none
        (its module has no trainable parameters, or grad is off where it runs)."""
        node: ast.AST = recv
        while True:
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in _KEEP_GRAD
            ):
                node = node.func.value
            elif isinstance(node, ast.Subscript) or (
                isinstance(node, ast.Attribute) and node.attr not in ("data", "grad")
            ):
                node = node.value
            else:
                break
        if isinstance(node, ast.Call) and is_model_callee(node.func):
            self._gradless.add(id(node))

    @staticmethod
    def _mark_training(loop: Loop | None, call: ast.Call | None, retains: bool) -> None:
        if loop is None:
            return
        loop.direct_trains = True
        if call is not None:
            loop.backwards.append(((call.lineno, call.col_offset), retains))
        for lp in loop.chain():
            lp.trains = True


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


def _freezes(value: ast.expr) -> bool:
    """A call chain with ``.requires_grad_(False)`` in it."""
    while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute):
        if value.func.attr == "requires_grad_" and _turns_off(value):
            return True
        value = value.func.value
    return False


def _turns_off(call: ast.Call) -> bool:
    """``requires_grad_(False)`` / ``requires_grad_(requires_grad=False)`` (no argument means True)."""
    arg = call.args[0] if call.args else getattr(keyword_arg(call, "requires_grad"), "value", None)
    return is_const(arg, False)


def _target_names(target: ast.AST) -> set[str]:
    """The names a for target binds (``i``, ``(k, (a, b))``, ``*rest``), without a full ``ast.walk``."""
    if target.__class__ is ast.Name:
        return {target.id}  # type: ignore[attr-defined]
    out: set[str] = set()
    todo = [target]
    while todo:
        n = todo.pop()
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, (ast.Tuple, ast.List)):
            todo.extend(n.elts)
        elif isinstance(n, ast.Starred):
            todo.append(n.value)
    return out


def names_in(expr: ast.AST) -> set[str]:
    """Every ``a`` and ``a.b.c`` named inside an expression."""
    out: set[str] = set()
    for n in ast.walk(expr):
        if isinstance(n, (ast.Name, ast.Attribute)):
            key = dotted(n)
            if key is not None:
                out.add(key)
    return out


def is_cuda_use(call: ast.Call) -> bool:
    """A call that puts something on a CUDA device by its syntax alone (``.cuda()``, ``.to('cuda')``,
    ``device='cuda:0'``); ``.to(device)`` with a variable is decided later, against module-level names."""
    func = call.func
    if isinstance(func, ast.Attribute) and func.attr == "cuda" and dotted(func.value) != "torch":
        return True
    if isinstance(func, ast.Attribute) and func.attr == "to" and call.args:
        return True  # decided by cuda_ish on the argument
    kw = keyword_arg(call, "device")
    return kw is not None
