"""The static checks: one walk over a module's syntax tree, then the rules over what the walk recorded.

The walk records, per scope (the module, each function, each lambda): where names are bound and to what,
the loops (which of them train: a ``.backward()`` or an optimizer ``.step()`` inside), and the calls and
stores the rules look at, each with its context (innermost loop, under ``no_grad``, under an ``if``).
The rules run after the walk, when every loop is known whole.

Precision over recall: a value counts as a graph-carrying tensor only when local data flow says so (bound
from a model or loss call, a tensor op on such a value, or a name that is ``.backward()``-ed); anything
unknown is left alone. Pure standard library: no torch import.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

# -- value kinds of the local data flow ---------------------------------------------------------------------
TENSOR = 2  # a tensor that may carry an autograd graph
SAFE = 1  # a number, a string, a detached tensor, a result computed without autograd
UNKNOWN = 0

_MODEL_NAMES = re.compile(
    r"^(?:model|net|network|module|encoder|decoder|generator|discriminator|critic|actor|classifier|backbone"
    r"|policy|student|ddp_model|netg|netd|g_?net|d_?net|\w+_model|model_\w+|\w+_net|\w+_network"
    r"|\w+_encoder|\w+_decoder)$",
    re.IGNORECASE,
)
_LOSS_NAMES = re.compile(r"loss|criterion", re.IGNORECASE)
_OPT_NAMES = re.compile(r"opt", re.IGNORECASE)
# Methods whose result holds no autograd graph.
_SAFE_METHODS = frozenset(
    {
        "item", "tolist", "detach", "detach_", "numpy", "numel", "size", "dim", "argmax", "argmin", "argsort",
        "nonzero", "eq", "ne", "lt", "gt", "le", "ge", "long", "int", "bool", "byte", "short", "isnan",
        "isinf", "isfinite", "count_nonzero", "element_size", "nelement", "stride", "data_ptr", "equal",
        "allclose", "isclose", "__len__", "get_device", "requires_grad_", "backward", "round", "floor",
        "ceil", "sign", "logical_and", "logical_or", "logical_not", "any", "all", "unique",
    }
)  # fmt: skip
# Methods whose result carries the receiver's graph (when the receiver carries one).
_GRAPH_METHODS = frozenset(
    {
        "sum", "mean", "float", "double", "half", "bfloat16", "to", "cpu", "cuda", "clone", "view", "reshape",
        "squeeze", "unsqueeze", "flatten", "contiguous", "abs", "pow", "sqrt", "exp", "log", "mul", "add",
        "div", "sub", "max", "min", "norm", "softmax", "log_softmax", "sigmoid", "tanh", "relu", "permute",
        "transpose", "expand", "expand_as", "repeat", "type", "type_as", "index_select", "gather",
        "masked_select", "masked_fill", "squeeze_", "unsqueeze_", "view_as", "reshape_as", "prod", "std",
        "var", "logsumexp", "clamp", "clip", "neg", "square", "t", "narrow", "select", "diag", "trace",
        "matmul", "mm", "bmm", "dot", "forward",
    }
)  # fmt: skip
_SAFE_ATTRS = frozenset(
    {
        "data", "shape", "device", "dtype", "grad", "requires_grad", "is_cuda", "ndim", "layout",
        "is_leaf", "names", "itemsize", "nbytes",
    }
)  # fmt: skip
_SAFE_BUILTINS = frozenset({"float", "int", "bool", "str", "len", "repr", "format", "round", "isinstance"})
# torch.* calls that make a tensor without a graph (or not a tensor at all).
_TORCH_FRESH = frozenset(
    {
        "tensor", "as_tensor", "from_numpy", "zeros", "ones", "empty", "full", "randn", "rand", "randint",
        "randperm", "arange", "linspace", "logspace", "eye", "zeros_like", "ones_like", "empty_like",
        "full_like", "rand_like", "randn_like", "randint_like", "device", "is_tensor", "numel", "argmax",
        "argmin", "argsort", "eq", "ne", "lt", "gt", "le", "ge", "equal", "allclose", "isclose", "isnan",
        "isinf", "isfinite", "no_grad", "inference_mode", "manual_seed", "load", "save", "Generator",
        "count_nonzero", "nonzero", "unique", "bucketize", "searchsorted",
    }
)  # fmt: skip
_TORCH_ROOTS = frozenset({"torch", "F", "functional", "nn", "fn"})
_NO_GRAD_CTX = frozenset({"no_grad", "inference_mode"})
_EVAL_WORDS = frozenset(
    {
        "eval", "evaluate", "evaluation", "validate", "validation", "valid", "val", "predict",
        "prediction", "predictions", "inference", "infer", "generate", "generation", "test", "testing",
    }
)  # fmt: skip
_NOT_EVAL_WORDS = frozenset({"step", "train", "training", "fit", "loss", "split", "data", "dataset", "set"})
_DATASET_METHODS = frozenset({"__getitem__", "__getitems__", "__iter__"})
_BACKWARD_BY_ARG = frozenset({"accelerator", "autograd", "engine", "model_engine", "fabric", "self"})
_TORCH_WORLD = frozenset(
    {
        "torch", "torchvision", "torchaudio", "torchtext", "lightning", "pytorch_lightning",
        "lightning_fabric", "transformers", "accelerate", "timm", "deepspeed", "diffusers", "peft", "trl",
        "torch_geometric", "dgl", "fairseq", "ignite", "detectron2", "mmengine", "composer", "torchmetrics",
        "functorch",
    }
)  # fmt: skip
_RANK_VARS = frozenset({"LOCAL_RANK", "RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK"})
_ARGS_NAMES = frozenset({"args", "opt", "opts", "cfg", "config", "hparams", "FLAGS", "flags"})
_METER_NAMES = re.compile(r"meter|avg|average", re.IGNORECASE)
_TRACKER_ROOTS = frozenset({"wandb", "run", "accelerator", "experiment", "tracker", "mlflow", "neptune"})
_SINK_METHODS = frozenset({"log", "log_metrics", "log_metric", "add_scalar", "add_scalars", "log_dict"})


def dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for a chain of names and attributes, else None."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _last_name(func: ast.AST) -> str:
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return ""


def _root_name(node: ast.AST) -> str:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else ""


def _kw(call: ast.Call, name: str) -> ast.keyword | None:
    for k in call.keywords:
        if k.arg == name:
            return k
    return None


def _has_star_kwargs(call: ast.Call) -> bool:
    return any(k.arg is None for k in call.keywords)


def _is_const(node: ast.AST | None, value: object) -> bool:
    return isinstance(node, ast.Constant) and node.value is value


def _is_const_in(node: ast.AST, values: frozenset[str]) -> bool:
    return isinstance(node, ast.Constant) and node.value in values


def _words(name: str) -> list[str]:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name)
    return [w for w in spaced.lower().split("_") if w]


def is_eval_name(name: str) -> bool:
    """Whether a function name reads as evaluation (``evaluate``, ``val_epoch``, ``test``, ``infer``)."""
    words = _words(name)
    return (
        bool(words) and any(w in _EVAL_WORDS for w in words) and not any(w in _NOT_EVAL_WORDS for w in words)
    )


def is_model_callee(func: ast.AST) -> bool:
    """Whether a call's callee names a model (``model(x)``, ``self.net(x)``, ``anything.forward(x)``)."""
    if isinstance(func, ast.Attribute) and func.attr == "forward":
        return True
    name = _last_name(func)
    if not name or name == "self" or _MODEL_NAMES.match(name) is None:
        return False
    if isinstance(func, ast.Attribute):  # self.generator(z), model.encoder(x); not writer.generator(...)
        root = _root_name(func)
        return root in ("self", "cls") or _MODEL_NAMES.match(root) is not None
    return True


def _is_loss_callee(func: ast.AST) -> bool:
    name = _last_name(func)
    return bool(name) and _LOSS_NAMES.search(name) is not None and not name.startswith(("get_", "set_"))


def _no_grad_item(expr: ast.AST) -> int:
    """1 when a ``with`` item (or decorator) turns autograd off, -1 when it may (a variable), else 0."""
    call = expr if isinstance(expr, ast.Call) else None
    func = call.func if call is not None else expr
    name = _last_name(func)
    if name in _NO_GRAD_CTX:
        if name == "inference_mode" and call is not None and call.args and _is_const(call.args[0], False):
            return 0
        return 1
    if name == "set_grad_enabled" and call is not None and call.args:
        if _is_const(call.args[0], False):
            return 1
        return 0 if _is_const(call.args[0], True) else -1
    return 0


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
    backwards: list[tuple[tuple[int, int], bool]] = field(default_factory=list)  # (position, retains)
    carried: dict[str, int] = field(default_factory=dict)  # name -> line: bound from its own previous value
    detached: set[str] = field(default_factory=set)  # names cut from their graph in the loop

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


@dataclass
class Binding:
    line: int
    col: int
    value: ast.expr | None  # None: bound by a for target, a with, a parameter
    no_grad: bool
    index: int | None = None  # the element of an unpacked tuple


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
    events: list[tuple[str, ast.AST, Ctx, object]] = field(default_factory=list)
    first_eval_loop: Loop | None = None


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


@dataclass(frozen=True)
class RawFinding:
    line: int
    col: int
    code: str
    message: str


class Walker:
    """One module's walk; :func:`check_tree` is the entry point."""

    def __init__(self, tree: ast.Module, path: str) -> None:
        self.facts = ModuleFacts()
        self.scopes: list[Scope] = []
        name = path.replace("\\", "/").rsplit("/", 1)[-1]
        self.test_file = name.startswith("test_") or name.endswith("_test.py") or name == "conftest.py"
        self.module = self._new_scope(tree, "<module>", None, "module")
        self._body(tree.body, self.module, Ctx())

    # -- scopes
    def _new_scope(self, node: ast.AST, name: str, cls: ast.ClassDef | None, kind: str) -> Scope:
        scope = Scope(node, name, cls, kind)
        self.scopes.append(scope)
        return scope

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef, cls: ast.ClassDef | None) -> None:
        scope = self._new_scope(node, node.name, cls, "function")
        for dec in node.decorator_list:
            self._expr(dec, self.module, Ctx())
            state = _no_grad_item(dec)
            if state:
                scope.grad_handled = True
                scope.no_grad_all = state == 1
        args = node.args
        for a in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg):
            if a is not None:
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
        scope.bindings.setdefault(key, []).append(
            Binding(_line(target), int(getattr(target, "col_offset", 0)), value, ctx.no_grad, index)
        )
        loop = ctx.loop
        if loop is not None and value is not None:
            self._carry(key, value, _line(target), loop)
        while loop is not None:
            loop.rebound.add(key)
            loop = loop.parent

    @staticmethod
    def _carry(key: str, value: ast.expr, line: int, loop: Loop) -> None:
        """Record ``h = f(x, h)`` (state carried into the next iteration) and ``h = h.detach()``."""
        uses = False
        cut = False
        for n in ast.walk(value):
            if isinstance(n, (ast.Name, ast.Attribute)) and dotted(n) == key:
                uses = True
            elif isinstance(n, ast.Call):
                fname = _last_name(n.func).lower()
                if "detach" in fname or "repackage" in fname or fname in ("item", "tolist", "numpy"):
                    cut = True
        if not uses:
            return
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
            loop = Loop(s, ctx.loop)
            inner = Ctx(loop, ctx.no_grad, None, False)
            self._bind(s.target, None, scope, inner)
            self._body(s.body, scope, inner)
            self._body(s.orelse, scope, ctx)
        elif isinstance(s, ast.While):
            loop = Loop(s, ctx.loop)
            inner = Ctx(loop, ctx.no_grad, None, False)
            self._expr(s.test, scope, inner)
            self._body(s.body, scope, inner)
            self._body(s.orelse, scope, ctx)
        elif isinstance(s, ast.If):
            self._expr(s.test, scope, ctx)
            sub = ctx
            if ctx.loop is not None and not self._availability_test(s.test):
                sub = Ctx(ctx.loop, ctx.no_grad, ctx.loop, ctx.in_handler)
            self._body(s.body, scope, sub)
            self._body(s.orelse, scope, sub)
        elif isinstance(s, (ast.With, ast.AsyncWith)):
            no_grad = ctx.no_grad
            for item in s.items:
                self._expr(item.context_expr, scope, ctx)
                state = _no_grad_item(item.context_expr)
                if state:
                    scope.grad_handled = True
                    no_grad = no_grad or state == 1
                if _last_name(getattr(item.context_expr, "func", item.context_expr)) == "enable_grad":
                    scope.enable_grad = True
                    no_grad = False
                if item.optional_vars is not None:
                    self._bind(item.optional_vars, None, scope, ctx)
            inner = Ctx(ctx.loop, no_grad, ctx.guard, ctx.in_handler)
            self._body(s.body, scope, inner)
        elif isinstance(s, ast.Try) or type(s).__name__ == "TryStar":
            try_node: ast.Try = s  # type: ignore[assignment]
            self._body(try_node.body, scope, ctx)
            handler_ctx = Ctx(ctx.loop, ctx.no_grad, ctx.loop, True)
            for h in try_node.handlers:
                if h.type is not None:
                    self._expr(h.type, scope, ctx)
                if h.name:
                    scope.bindings.setdefault(h.name, []).append(Binding(h.lineno, h.col_offset, None, False))
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
                self._body(case.body, scope, Ctx(ctx.loop, ctx.no_grad, ctx.loop, ctx.in_handler))
        elif isinstance(s, (ast.Import, ast.ImportFrom)):
            mods = [a.name for a in s.names] if isinstance(s, ast.Import) else [s.module or ""]
            if any(m.split(".", 1)[0] in _TORCH_WORLD for m in mods):
                self.facts.torch_imported = True
        # Global, Nonlocal, Pass, Break, Continue: nothing to record

    @staticmethod
    def _availability_test(test: ast.expr) -> bool:
        """``if torch.cuda.is_available():`` guards nothing per step."""
        return isinstance(test, ast.Call) and _last_name(test.func) == "is_available"

    def _assign_target(self, t: ast.expr, value: ast.expr, scope: Scope, ctx: Ctx) -> None:
        if isinstance(t, ast.Subscript):
            container = dotted(t.value)
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
            container = dotted(t.value)
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
            if isinstance(n, ast.Call):
                self._call(n, scope, ctx)
                continue
            if isinstance(n, ast.Lambda):
                role = id(n) in self.facts.worker_lambdas
                lam = self._new_scope(n, "<lambda-worker>" if role else "<lambda>", None, "lambda")
                self._expr(n.body, lam, Ctx())
                continue
            elif isinstance(n, ast.NamedExpr):
                self._bind(n.target, n.value, scope, ctx)
            elif isinstance(n, ast.Constant):
                continue
            elif isinstance(n, ast.Subscript):
                if (
                    isinstance(n.ctx, ast.Load)
                    and isinstance(n.slice, ast.Constant)
                    and n.slice.value in _RANK_VARS
                ):
                    self.facts.rank_setup = True  # os.environ["LOCAL_RANK"] read
            elif isinstance(n, ast.Attribute):
                if n.attr == "local_rank" and isinstance(n.value, ast.Name) and n.value.id in _ARGS_NAMES:
                    self.facts.rank_setup = True  # args.local_rank (torch.distributed.launch)
                elif n.attr in ("CUDAGraph", "make_graphed_callables"):
                    self.facts.cuda_graphs = True
            elif isinstance(n, ast.Name):
                if n.id in ("CUDAGraph", "make_graphed_callables"):
                    self.facts.cuda_graphs = True
                continue
            stack.extend(ast.iter_child_nodes(n))

    def _call(self, call: ast.Call, scope: Scope, ctx: Ctx) -> None:
        func = call.func
        name = _last_name(func)
        loop = ctx.loop
        for k in call.keywords:
            if k.arg in ("collate_fn", "worker_init_fn"):
                target = k.value
                if isinstance(target, ast.Call) and _last_name(target.func) == "partial" and target.args:
                    target = target.args[0]
                names = self.facts.collate_names if k.arg == "collate_fn" else self.facts.worker_names
                if isinstance(target, ast.Lambda):
                    self.facts.worker_lambdas.add(id(target))
                elif _last_name(target):
                    names.add(_last_name(target))
        if name in ("backward", "manual_backward"):
            retains = any(
                k.arg in ("retain_graph", "create_graph") and _is_const(k.value, True) for k in call.keywords
            )
            scope.trains = True
            self._mark_training(loop, call, retains)
            if isinstance(func, ast.Attribute):
                recv = func.value
                if isinstance(recv, ast.Call) and recv.args:  # scaler.scale(loss).backward()
                    recv = recv.args[0]
                key = dotted(recv)
                if key is not None and call.args == [] and name == "backward":
                    scope.backwarded.add(key)
            if (call.args and dotted(call.args[0]) is not None and name == "manual_backward") or (
                name == "backward" and call.args and isinstance(func, ast.Attribute)
                and _last_name(func.value) in ("accelerator", "autograd", "engine", "model_engine")
            ):  # fmt: skip
                key = dotted(call.args[0])
                if key is not None:
                    scope.backwarded.add(key)
            if retains and loop is not None:
                create = any(k.arg == "create_graph" and _is_const(k.value, True) for k in call.keywords)
                if not create:
                    scope.events.append(("retain", call, ctx, None))
        elif name == "grad" and isinstance(func, ast.Attribute) and _last_name(func.value) == "autograd":
            retains = any(
                k.arg in ("retain_graph", "create_graph") and _is_const(k.value, True) for k in call.keywords
            )
            if loop is not None:
                loop.backwards.append(((call.lineno, call.col_offset), retains))
        elif name == "step" and isinstance(func, ast.Attribute):
            opt_name = _last_name(func.value)
            if _OPT_NAMES.search(opt_name) or (call.args and _OPT_NAMES.search(_last_name(call.args[0]))):
                scope.trains = True
                self._mark_training(loop, None, False)
        elif name == "zero_grad":
            kw = _kw(call, "set_to_none")
            if kw is not None and _is_const(kw.value, False):
                scope.events.append(("zero_grad", call, ctx, None))
        elif name == "empty_cache":
            base = dotted(func.value) if isinstance(func, ast.Attribute) else ""
            if base is None or base.startswith("torch") or base in ("cuda", "mps", "xpu") or base == "":
                scope.events.append(("empty_cache", call, ctx, None))
        elif name == "eval" and isinstance(func, ast.Attribute) and not call.args and not call.keywords:
            scope.eval_called = True
        elif (
            name in ("append", "appendleft", "insert", "add")
            and isinstance(func, ast.Attribute)
            and call.args
        ):
            container = dotted(func.value)
            if container is not None:
                scope.events.append(("store", call, ctx, (container, call.args[-1])))
        elif name == "extend" and isinstance(func, ast.Attribute) and call.args:
            container = dotted(func.value)
            if container is not None and isinstance(call.args[0], (ast.List, ast.Tuple)):
                for elt in call.args[0].elts:
                    scope.events.append(("store", call, ctx, (container, elt)))
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
                    "rank" in _short(call.args[0], 200).lower()
                    if name == "set_device"
                    else _is_const_in(call.args[0], _RANK_VARS)
                )
            ):
                self.facts.rank_setup = True
        elif name == "set_start_method":
            arg = call.args[0] if call.args else getattr(_kw(call, "method"), "value", None)
            self.facts.start_method = arg.value if isinstance(arg, ast.Constant) else "?"  # type: ignore[assignment]
        elif name == "set_grad_enabled" and call.args and _is_const(call.args[0], False):
            scope.grad_handled = True
        elif name == "DataLoader":
            scope.events.append(("dataloader", call, ctx, None))
        elif name in _SINK_METHODS or name == "update":
            scope.events.append(("sink", call, ctx, None))
        elif name == "graph" and isinstance(func, ast.Attribute) and _last_name(func.value) == "cuda":
            self.facts.cuda_graphs = True
        if name in ("add_", "copy_", "zero_") and _last_name(getattr(func, "value", func)) == "grad":
            self.facts.grad_inplace = True
        if _is_cuda_use(call):
            scope.events.append(("cuda", call, ctx, None))
        if ctx.no_grad and name:
            self.facts.called_under_no_grad.add(name)
        if not ctx.no_grad and loop is not None and (call.args or call.keywords) and is_model_callee(func):
            for lp in loop.chain():
                if lp.model_call is None:
                    lp.model_call = call
            if scope.first_eval_loop is None:
                scope.first_eval_loop = list(loop.chain())[-1]
        # children
        stack_nodes: list[ast.AST] = [func, *call.args, *(k.value for k in call.keywords)]
        for child in stack_nodes:
            self._expr(child, scope, ctx)

    @staticmethod
    def _mark_training(loop: Loop | None, call: ast.Call | None, retains: bool) -> None:
        if loop is None:
            return
        loop.direct_trains = True
        if call is not None:
            loop.backwards.append(((call.lineno, call.col_offset), retains))
        for lp in loop.chain():
            lp.trains = True


def _is_cuda_use(call: ast.Call) -> bool:
    """A call that puts something on a CUDA device by its syntax alone (``.cuda()``, ``.to('cuda')``,
    ``device='cuda:0'``); ``.to(device)`` with a variable is decided later, against module-level names."""
    func = call.func
    if isinstance(func, ast.Attribute) and func.attr == "cuda" and dotted(func.value) != "torch":
        return True
    if isinstance(func, ast.Attribute) and func.attr == "to" and call.args:
        return True  # decided by cuda_ish on the argument
    kw = _kw(call, "device")
    return kw is not None


# -- rules over what the walk recorded ----------------------------------------------------------------------
class Rules:
    def __init__(self, walker: Walker) -> None:
        self.w = walker
        self.facts = walker.facts
        self.out: list[RawFinding] = []
        self._module_bindings = walker.module.bindings

    def add(self, node: ast.AST, code: str, message: str) -> None:
        self.out.append(RawFinding(getattr(node, "lineno", 1), getattr(node, "col_offset", 0), code, message))

    # data flow
    def kind(self, expr: ast.AST | None, scope: Scope, line: int, depth: int = 0) -> int:
        if expr is None or depth > 12:
            return UNKNOWN
        if isinstance(expr, (ast.Constant, ast.JoinedStr, ast.Compare)):
            return SAFE
        if isinstance(expr, (ast.Name, ast.Attribute)):
            if isinstance(expr, ast.Attribute) and expr.attr in _SAFE_ATTRS:
                return SAFE
            key = dotted(expr)
            if key is not None:
                found = self._binding_kind(key, scope, line, depth)
                if found != UNKNOWN:
                    return found
                if key in scope.backwarded:
                    return TENSOR
            if isinstance(expr, ast.Attribute):
                return TENSOR if self.kind(expr.value, scope, line, depth + 1) == TENSOR else UNKNOWN
            return UNKNOWN
        if isinstance(expr, ast.Subscript):
            base = self.kind(expr.value, scope, line, depth + 1)
            return base if base == TENSOR else UNKNOWN
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

    def _elements(self, elts: Iterable[ast.AST | None], scope: Scope, line: int, depth: int) -> int:
        kinds = {self.kind(e, scope, line, depth + 1) for e in elts if not isinstance(e, ast.Starred)}
        return TENSOR if TENSOR in kinds else (SAFE if kinds <= {SAFE} else UNKNOWN)

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
        if best.index is not None and isinstance(value, (ast.Tuple, ast.List)):
            if best.index < len(value.elts) and not any(isinstance(e, ast.Starred) for e in value.elts):
                value = value.elts[best.index]
            else:
                return UNKNOWN
        elif best.index is not None and not isinstance(value, ast.Call):
            return UNKNOWN
        return self.kind(value, scope, best.line, depth + 1)

    def _call_kind(self, call: ast.Call, scope: Scope, line: int, depth: int) -> int:
        func = call.func
        name = _last_name(func)
        if isinstance(func, ast.Name):
            if name in _SAFE_BUILTINS:
                return SAFE
            if name == "abs" and len(call.args) == 1:
                return self.kind(call.args[0], scope, line, depth + 1)
            if is_model_callee(func) or _is_loss_callee(func):
                return TENSOR
            return UNKNOWN
        if not isinstance(func, ast.Attribute):
            return UNKNOWN
        root = dotted(func.value)
        if root is not None and (root.split(".", 1)[0] in _TORCH_ROOTS):
            if name in _TORCH_FRESH or name.startswith(("is_", "get_", "set_", "manual_")):
                return SAFE
            if name == "grad" and root.endswith("autograd"):
                create = _kw(call, "create_graph")
                return UNKNOWN if create is not None and not _is_const(create.value, False) else SAFE
            if root.startswith("torch.cuda") or root.startswith("torch.distributed"):
                return UNKNOWN
            if "loss" in name or name in ("cross_entropy", "nll_loss", "kl_div", "binary_cross_entropy"):
                return TENSOR
            args = [*call.args, *(k.value for k in call.keywords)]
            return TENSOR if any(self.kind(a, scope, line, depth + 1) == TENSOR for a in args) else UNKNOWN
        if name in _SAFE_METHODS:
            return SAFE
        if name in _GRAPH_METHODS:
            recv = self.kind(func.value, scope, line, depth + 1)
            if recv != UNKNOWN:
                return recv
            if name == "forward" and is_model_callee(func):
                return TENSOR
            return UNKNOWN
        if is_model_callee(func) or _is_loss_callee(func):
            return TENSOR
        return UNKNOWN

    def cuda_ish(self, expr: ast.AST | None, depth: int = 0) -> bool:
        """Whether an expression names a CUDA device (a literal, or a module-level name bound to one)."""
        if expr is None or depth > 4:
            return False
        if isinstance(expr, ast.Constant):
            return isinstance(expr.value, str) and expr.value.startswith("cuda")
        if isinstance(expr, ast.JoinedStr):
            return bool(expr.values) and self.cuda_ish(expr.values[0], depth + 1)
        if isinstance(expr, ast.Call) and _last_name(expr.func) == "device" and expr.args:
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
        kw = _kw(call, "device")
        if kw is not None and self.cuda_ish(kw.value):
            return True
        return (
            isinstance(func, ast.Attribute)
            and func.attr == "to"
            and self.cuda_ish(getattr(_kw(call, "device"), "value", None))
        )

    # the rules
    def run(self) -> list[RawFinding]:
        for scope in self.w.scopes:
            for kind, node, ctx, extra in scope.events:
                # "cuda" and "save" events have no rule of their own: TM005 and TM006 read them from the
                # scope's events
                handler = getattr(self, f"_on_{kind}", None)
                if handler is not None:
                    handler(scope, node, ctx, extra)
            self._tm002(scope)
            self._tm005(scope)
        return self.out

    def _on_aug(self, scope: Scope, node: ast.AST, ctx: Ctx, extra: object) -> None:
        if ctx.no_grad or scope.no_grad_all:
            return  # total += loss under no_grad: the sum has no graph
        self._tm001(scope, node, ctx, extra, "accumulates")

    def _on_store(self, scope: Scope, node: ast.AST, ctx: Ctx, extra: object) -> None:
        self._tm001(scope, node, ctx, extra, "stores")

    def _tm001(self, scope: Scope, node: ast.AST, ctx: Ctx, extra: object, verb: str) -> None:
        if ctx.loop is None:
            return
        assert isinstance(extra, tuple)
        key: str = extra[0]
        value: ast.expr = extra[1]
        if key in scope.backwarded:
            return  # the accumulated loss is what backward runs on
        loop = next(
            (lp for lp in ctx.loop.chain() if lp.trains and key not in lp.rebound and key not in lp.cleared),
            None,
        )
        if loop is None:
            return
        if ctx.no_grad and not isinstance(value, (ast.Name, ast.Attribute, ast.Subscript)):
            return  # made under no_grad
        if self.kind(value, scope, getattr(node, "lineno", 0) + 1) != TENSOR:
            return
        what = _short(value)
        self.add(
            node,
            "TM001",
            f"`{key}` {verb} `{what}`, a tensor that carries its autograd graph, across the iterations of "
            f"a training loop (line {_line(loop.node)}): every step's graph stays alive",
        )

    def _on_retain(self, scope: Scope, node: ast.AST, ctx: Ctx, extra: object) -> None:
        loop = ctx.loop
        assert loop is not None
        pos = (getattr(node, "lineno", 0), getattr(node, "col_offset", 0))
        if any(p > pos and not retains for p, retains in loop.backwards):
            return  # a later backward in the same iteration frees the graph
        carried = sorted(
            (line, key) for lp in loop.chain() for key, line in lp.carried.items() if key not in lp.detached
        )
        if not carried:
            return  # nothing links one iteration's graph to the next: wasteful at most, not a leak
        line, key = carried[0]
        self.add(
            node,
            "TM004",
            f"`retain_graph=True` on the last backward of the iteration while `{key}` carries the graph into "
            f"the next one (line {line}): every iteration's graph stays alive and memory grows each step",
        )

    def _on_zero_grad(self, scope: Scope, node: ast.AST, ctx: Ctx, extra: object) -> None:
        if self.facts.cuda_graphs or self.facts.grad_inplace:
            return  # CUDA graphs and in-place gradient sums need the buffers
        self.add(
            node,
            "TM008",
            "`zero_grad(set_to_none=False)` keeps every gradient buffer allocated (and zeroed) between steps",
        )

    def _on_empty_cache(self, scope: Scope, node: ast.AST, ctx: Ctx, extra: object) -> None:
        loop = ctx.loop
        if loop is None or not loop.direct_trains or ctx.guard is loop or ctx.in_handler:
            return
        self.add(
            node,
            "TM003",
            f"`empty_cache()` on every step of the training loop at line {_line(loop.node)}: "
            "it frees nothing the program holds, only the cache the next step must allocate again (slow)",
        )

    def _on_load(self, scope: Scope, node: ast.AST, ctx: Ctx, extra: object) -> None:
        call = node
        assert isinstance(call, ast.Call)
        if isinstance(call.func, ast.Name) and call.func.id != "load":
            return
        if isinstance(call.func, ast.Name) and not self._imported_from_torch("load"):
            return
        if not self.facts.rank_setup or len(call.args) >= 2 or _has_star_kwargs(call):
            return
        kw = _kw(call, "map_location")
        if kw is not None and not _is_const(kw.value, None):
            return
        source = call.args[0] if call.args else getattr(_kw(call, "f"), "value", None)
        if isinstance(source, ast.Call) and _last_name(source.func) == "BytesIO":
            return  # bytes this process made: their devices are this process's
        if isinstance(source, ast.Name) and any(
            isinstance(b.value, ast.Call) and _last_name(b.value.func) in ("BytesIO", "NamedTemporaryFile")
            for b in scope.bindings.get(source.id, ())
        ):
            return
        if source is not None and self._saved_here(scope, source):
            return  # saved by this process a moment before: its devices are this process's
        if source is not None and self._loaded_elsewhere_with_map_location(scope, source):
            return  # `if gpu is None: load(p) else: load(p, map_location=...)`: decided on purpose
        self.add(
            call,
            "TM006",
            "`torch.load()` without `map_location` in code that sets a device per rank: every rank loads the "
            "saved tensors onto the device they were saved from (usually cuda:0)",
        )

    @staticmethod
    def _loaded_elsewhere_with_map_location(scope: Scope, source: ast.AST) -> bool:
        text = ast.dump(source)
        for kind, other, _ctx, _extra in scope.events:
            if kind != "load" or not isinstance(other, ast.Call):
                continue
            given = len(other.args) >= 2 or _kw(other, "map_location") is not None
            if given and other.args and ast.dump(other.args[0]) == text:
                return True
        return False

    @staticmethod
    def _saved_here(scope: Scope, source: ast.AST) -> bool:
        text = ast.dump(source)
        for kind, other, _ctx, _extra in scope.events:
            saved = kind == "save" and isinstance(other, ast.Call) and len(other.args) >= 2
            if saved and ast.dump(other.args[1]) == text:  # type: ignore[attr-defined]
                return True
        return False

    def _imported_from_torch(self, name: str) -> bool:
        tree = self.w.module.node
        assert isinstance(tree, ast.Module)
        for s in tree.body:
            if isinstance(s, ast.ImportFrom) and s.module == "torch" and any(a.name == name for a in s.names):
                return True
        return False

    def _on_sink(self, scope: Scope, node: ast.AST, ctx: Ctx, extra: object) -> None:
        call = node
        assert isinstance(call, ast.Call)
        if (
            ctx.loop is None
            or ctx.no_grad
            or scope.no_grad_all
            or not any(lp.trains for lp in ctx.loop.chain())
        ):
            return
        func = call.func
        if not isinstance(func, ast.Attribute):
            return
        recv = dotted(func.value) or ""
        last = recv.rsplit(".", 1)[-1]
        name = func.attr
        if name == "update":
            if not _METER_NAMES.search(last):
                return
            values: list[ast.expr | None] = list(call.args[:1])
        elif name in ("add_scalar",):
            values = list(call.args[1:2])
        elif name in ("log", "log_metrics", "log_dict", "add_scalars", "log_metric"):
            if recv == "self":
                return  # Lightning's self.log detaches and reduces tensors itself
            if name != "add_scalars" and last not in _TRACKER_ROOTS and not last.endswith("logger"):
                return
            if name == "log_metric":
                values = list(call.args[1:2])
            else:
                values = list(call.args[:2])
                if values and isinstance(values[-1], ast.Dict):
                    values = list(values[-1].values)
        else:
            return
        values += [k.value for k in call.keywords if k.arg in ("value", "scalar_value", "val")]
        line = call.lineno + 1
        for v in values:
            if v is not None and self.kind(v, scope, line) == TENSOR:
                self.add(
                    call,
                    "TM007",
                    f"`{recv}.{name}` is given `{_short(v)}`, a tensor that carries its autograd graph: each "
                    "call syncs the device, and a sink that keeps values (a meter's running sum) keeps "
                    "the graph",
                )
                return

    def _on_dataloader(self, scope: Scope, node: ast.AST, ctx: Ctx, extra: object) -> None:
        call = node
        assert isinstance(call, ast.Call)
        workers = _kw(call, "num_workers")
        if workers is None or _is_const(workers.value, None):
            return
        if isinstance(workers.value, ast.Constant) and not (
            isinstance(workers.value.value, int) and workers.value.value > 0
        ):
            return
        mp_ctx = _kw(call, "multiprocessing_context")
        if mp_ctx is not None:
            if not (isinstance(mp_ctx.value, ast.Constant) and mp_ctx.value.value == "fork"):
                return
        elif self.facts.start_method not in (None, "fork"):
            return
        ds_kw = _kw(call, "dataset")
        dataset = ds_kw.value if ds_kw is not None else (call.args[0] if call.args else None)
        reason = self._dataset_on_cuda(dataset, scope, call.lineno)
        if reason is None:
            return
        how = "fork" if mp_ctx is not None or self.facts.start_method else "fork, the default on Linux"
        self.add(
            call,
            "TM009",
            f"DataLoader workers (start method: {how}) index a dataset that holds CUDA tensors ({reason}): "
            "a forked worker cannot use CUDA and fails with 'Cannot re-initialize CUDA in forked subprocess'",
        )

    def _dataset_on_cuda(self, dataset: ast.AST | None, scope: Scope, line: int) -> str | None:
        if isinstance(dataset, ast.Name):
            best: Binding | None = None
            for b in scope.bindings.get(dataset.id, ()):
                if b.line <= line and (best is None or b.line >= best.line):
                    best = b
            if best is None or best.value is None:
                return None
            dataset = best.value
        if not isinstance(dataset, ast.Call):
            return None
        cls_name = _last_name(dataset.func)
        if not cls_name.endswith("Dataset") and cls_name not in self.facts.classes:
            return None
        for arg in (*dataset.args, *(k.value for k in dataset.keywords)):
            if self._cuda_tensor(arg, scope, line):
                return f"`{_short(arg)}` is on a CUDA device"
        cls = self.facts.classes.get(cls_name)
        if cls is not None:
            for item in cls.body:
                if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                    for n in ast.walk(item):
                        if isinstance(n, ast.Call) and self.is_cuda_call(n):
                            return f"`{cls_name}.__init__` moves data to CUDA at line {n.lineno}"
        return None

    def _cuda_tensor(self, expr: ast.AST, scope: Scope, line: int, depth: int = 0) -> bool:
        if depth > 6:
            return False
        if isinstance(expr, ast.Call):
            return self.is_cuda_call(expr)
        if isinstance(expr, ast.Name):
            best: Binding | None = None
            for b in scope.bindings.get(expr.id, ()):
                if b.line <= line and (best is None or b.line >= best.line):
                    best = b
            if best is not None and best.value is not None and best.index is None:
                return self._cuda_tensor(best.value, scope, best.line, depth + 1)
        return False

    def _tm002(self, scope: Scope) -> None:
        if scope.kind == "lambda" or scope.first_eval_loop is None or not self.facts.torch_imported:
            return  # a file that imports nothing of torch's world: `generator(...)` is not a model
        # A method named like evaluation is often called by a framework that sets no_grad itself (a
        # pipeline's _forward): for methods only an explicit `.eval()` call counts.
        named = (
            scope.kind == "function"
            and scope.cls is None
            and not self.w.test_file
            and is_eval_name(scope.name)
        )
        if not (named or scope.eval_called):
            return
        if scope.grad_handled or scope.enable_grad or scope.trains or scope.no_grad_all:
            return
        if scope.kind == "function" and scope.name in self.facts.called_under_no_grad:
            return
        if scope.name.endswith("_step") or scope.name.startswith("on_"):
            return  # framework hooks (Lightning's validation_step) run under no_grad already
        loop = scope.first_eval_loop
        call = loop.model_call
        why = f"`{scope.name}` evaluates" if named else "the model is in eval() mode"
        self.add(
            loop.node,
            "TM002",
            f"{why} and this loop calls `{_short(call.func) if call else 'the model'}` with autograd on: "
            "every forward keeps its activations for a backward that never comes",
        )

    def _tm005(self, scope: Scope) -> None:
        role = self._worker_role(scope)
        if role is None:
            return
        for kind, node, _ctx, _extra in scope.events:
            if kind == "cuda" and isinstance(node, ast.Call) and self.is_cuda_call(node):
                self.add(
                    node,
                    "TM005",
                    f"{role} moves data to CUDA; it runs in DataLoader worker processes, where CUDA cannot "
                    "be initialised after a fork (and each worker would create its own CUDA context)",
                )
                return

    def _worker_role(self, scope: Scope) -> str | None:
        if scope.kind == "lambda":
            return "this collate_fn/worker_init_fn lambda" if scope.name == "<lambda-worker>" else None
        if scope.kind != "function":
            return None
        name = scope.name
        cls = scope.cls
        if cls is not None and name in _DATASET_METHODS and _is_dataset_class(cls):
            return f"`{cls.name}.{name}`"
        if cls is not None and name == "__call__" and "collat" in cls.name.lower():
            return f"`{cls.name}.__call__` (a collate function)"
        low = name.lower()
        if name in self.facts.collate_names or "collate" in low:
            return f"`{name}` (a collate_fn)"
        if name in self.facts.worker_names or "worker_init" in low:
            return f"`{name}` (a worker_init_fn)"
        return None


def _line(node: ast.AST) -> int:
    return int(getattr(node, "lineno", 0))


def _is_dataset_class(cls: ast.ClassDef) -> bool:
    return any(_last_name(b).endswith("Dataset") for b in cls.bases)


def _short(node: ast.AST | None, limit: int = 40) -> str:
    if node is None:
        return "?"
    try:
        text = ast.unparse(node)
    except Exception:  # pragma: no cover - unparse handles every node the parser makes
        return "?"
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_tree(tree: ast.Module, path: str) -> list[RawFinding]:
    """Every finding in one parsed module, unfiltered (suppression and selection come after)."""
    walker = Walker(tree, path)
    return Rules(walker).run()
