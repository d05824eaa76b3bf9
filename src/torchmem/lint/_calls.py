"""The calls the walk records (:class:`torchmem.lint._walk.Walker` is made of this part): training steps,
``eval()``, stores into containers, loads, hooks, DataLoaders, CUDA uses, frozen models, ``.numpy()`` of an
output. Pure standard library: no torch import."""

from __future__ import annotations

import ast

from torchmem.lint._scopes import Ctx, Loop, ModuleFacts, Scope
from torchmem.lint._syntax import (
    HOOK_METHODS,
    OPT_NAMES,
    RANK_VARS,
    SINK_METHODS,
    container_key,
    dotted,
    is_const,
    is_const_in,
    is_model_callee,
    keyword_arg,
    last_name,
    names_in,
    optimizer_step,
    short,
    turns_off_grad,
)

_CUDA_GRAPH_NAMES = frozenset({"CUDAGraph", "make_graphed_callables"})
# The callee names the walk records something about (every other call only has its children visited).
_CALLS_OF_NOTE = frozenset(
    {
        "backward", "manual_backward", "grad", "step", "zero_grad", "empty_cache", "eval", "append",
        "requires_grad_", "train",
        "appendleft", "insert", "add", "extend", "detach_", "save", "clear", "pop", "popleft", "popitem",
        "load", "init_process_group", "set_device", "get", "getenv", "set_start_method", "set_grad_enabled",
        "remove", "DataLoader", "update", "graph", *HOOK_METHODS, *SINK_METHODS,
    }
)  # fmt: skip
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


class CallEvents:
    """The part of the walk that reads one call (its children are visited by the caller's walk)."""

    facts: ModuleFacts
    _gradless: set[int]

    def _call(self, call: ast.Call, scope: Scope, ctx: Ctx) -> None:
        func = call.func
        name = last_name(func)
        grad_names = self.facts.grad_names
        if grad_names and isinstance(func, ast.Name) and func.id in grad_names:
            name = "grad"  # `from torch.autograd import grad [as g]`: torch.autograd.grad
        loop = ctx.loop
        # a collate_fn/worker_init_fn given to a loader (`DataLoader(...)`, `build_dataloader(...)`) runs in
        # its workers; the same keyword of another API (a quantizer's calibration, round U's ppq) may not
        loader = "loader" in name.lower()
        for k in call.keywords:
            if not loader and k.arg == "collate_fn" and isinstance(k.value, ast.Name):
                self.facts.collate_elsewhere.add(k.value.id)
            if loader and k.arg in ("collate_fn", "worker_init_fn"):
                target = k.value
                if isinstance(target, ast.Call) and last_name(target.func) == "partial" and target.args:
                    target = target.args[0]
                names = self.facts.collate_names if k.arg == "collate_fn" else self.facts.worker_names
                if isinstance(target, ast.Lambda):
                    self.facts.worker_lambdas.add(id(target))
                elif last_name(target):
                    names.add(last_name(target))
        if len(call.args) >= 2 and _scaler_step(call, name):
            # timm's `loss_scaler(loss, optimizer, parameters=...)`: backward and the optimizer step inside
            # (xcit, round Y)
            scope.trains = True
            self._mark_training(loop, call, False)
            scope.backward_roots.update(names_in(call.args[0]))
            for lp in loop.chain() if loop is not None else ():
                lp.steps = True
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
                        scope.backward_lines.setdefault(key, []).append(call.lineno)
                if name == "backward" and call.args and isinstance(func, ast.Attribute):
                    engine = dotted(func.value)
                    if engine is not None:
                        scope.backwarded_engines.add(engine)  # `engine.backward(loss)`
                if (call.args and dotted(call.args[0]) is not None and name == "manual_backward") or (
                    name == "backward" and call.args and isinstance(func, ast.Attribute)
                    and last_name(func.value) in ("accelerator", "autograd", "engine", "model_engine")
                ):  # fmt: skip
                    key = dotted(call.args[0])
                    if key is not None:
                        scope.backwarded.add(key)
                        scope.backward_lines.setdefault(key, []).append(call.lineno)
                if retains and loop is not None:
                    create = any(k.arg == "create_graph" and is_const(k.value, True) for k in call.keywords)
                    if not create:
                        scope.events.append(("retain", call, ctx, None))
            elif name == "grad" and (
                (isinstance(func, ast.Name) and func.id in grad_names)
                or (isinstance(func, ast.Attribute) and last_name(func.value) == "autograd")
            ):
                for part in (*call.args[:1], *(k.value for k in call.keywords if k.arg == "outputs")):
                    scope.backward_roots.update(names_in(part))
                retains = any(
                    k.arg in ("retain_graph", "create_graph") and is_const(k.value, True)
                    for k in call.keywords
                )
                if loop is not None:
                    loop.backwards.append(((call.lineno, call.col_offset), retains))
            elif name == "step" and isinstance(func, ast.Attribute):
                if optimizer_step(call):
                    scope.trains = True
                    scope.steps = scope.steps or loop is None
                    self._mark_training(loop, None, False)
                    for lp in loop.chain() if loop is not None else ():
                        lp.steps = True
                elif not call.args and dotted(func.value) in scope.backwarded_engines and loop is None:
                    scope.steps = True  # `self.model.backward(loss); self.model.step()`: a DeepSpeed engine
            elif name == "zero_grad":
                kw = keyword_arg(call, "set_to_none")
                if kw is not None and is_const(kw.value, False):
                    scope.events.append(("zero_grad", call, ctx, None))
            elif name == "empty_cache":
                base = dotted(func.value) if isinstance(func, ast.Attribute) else ""
                if base is None or base.startswith("torch") or base in ("cuda", "mps", "xpu") or base == "":
                    scope.events.append(("empty_cache", call, ctx, None))
            elif name == "requires_grad_" and isinstance(func, ast.Attribute) and turns_off_grad(call):
                self._freeze(func.value, scope, ctx)
            elif name == "train" and isinstance(func, ast.Attribute):
                if not call.args or not is_const(call.args[0], False):  # model.train(), model.train(True)
                    self._mode(func.value, scope, ctx, call, "train")
            elif name == "eval" and isinstance(func, ast.Attribute) and not call.args and not call.keywords:
                scope.eval_called = True
                recv = func.value
                while isinstance(recv, ast.Call) and isinstance(recv.func, ast.Attribute):
                    recv = recv.func.value  # model.cuda().eval(), model.to(device).eval()
                key = container_key(recv)
                if key is not None:
                    scope.eval_receivers.add(key)
                    scope.eval_branches.setdefault(key, []).append(ctx.branch)
                    self._mode(recv, scope, ctx, call, "eval")
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
        if loop is not None and isinstance(func, ast.Attribute) and not call.args and not call.keywords:
            recv_key = dotted(func.value)
            if recv_key is not None and name not in ("clear", "pop", "popleft", "popitem"):
                self.facts.loop_method_calls.append((loop, recv_key, name))
        if isinstance(func, ast.Name) or (
            isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self"
        ):
            scope.callees.add(name)
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
            and (is_model_callee(func) or self._eval_receiver(func, scope))
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
    def _eval_receiver(func: ast.expr, scope: Scope) -> bool:
        """A callee this scope put in eval mode before (``roberta.eval()``, then ``roberta(source)``): a
        module whatever its name (muzic's MusicBERT evaluation, round V). Only a call of the object itself:
        its methods (``roberta.predict``) may turn autograd off inside."""
        return isinstance(func, (ast.Name, ast.Attribute)) and container_key(func) in scope.eval_receivers

    @staticmethod
    def _mode(recv: ast.expr, scope: Scope, ctx: Ctx, call: ast.Call, mode: str) -> None:
        """Record ``model.train()`` / ``model.eval()``: where it is, and in which loop."""
        key = container_key(recv)
        if key is None:
            return
        scope.modes.append((key, (call.lineno, call.col_offset), mode))
        if ctx.loop is not None:
            scope.modes_in_loops.append((key, ctx.loop, (call.lineno, call.col_offset), mode))

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


def _scaler_step(call: ast.Call, name: str) -> bool:
    """A call given a loss and then an optimizer by name, ``loss_scaler(loss, optimizer, ...)`` or
    ``scaler_step(loss, opt)``: a loss scaler that runs backward and steps (not a class made from an
    optimizer, ``LambdaLR(optimizer, ...)``, nor a call given a number)."""
    first, second = call.args[0], call.args[1]
    return (
        isinstance(first, ast.Name)
        and "loss" in first.id.lower()
        and isinstance(second, (ast.Name, ast.Attribute))
        and OPT_NAMES.search(last_name(second)) is not None
        and not name[:1].isupper()
    )


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


_EMPTY_CALLS = frozenset({"list", "dict", "set", "deque", "OrderedDict", "defaultdict"})


def attributes_emptied(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """The ``self`` attributes a method empties: ``del self.x[:]``, ``del self.x``, ``self.x.clear()``,
    ``self.x = []`` (or ``{}``, ``list()``, ``deque(...)``...)."""
    out: set[str] = set()

    def own(node: ast.AST) -> str | None:
        if isinstance(node, ast.Subscript):
            node = node.value
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            return node.attr
        return None

    for n in ast.walk(fn):
        if isinstance(n, ast.Delete):
            out.update(a for a in map(own, n.targets) if a is not None)
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "clear":
            a = own(n.func.value)
            if a is not None and not n.args:
                out.add(a)
        elif isinstance(n, ast.Assign):
            v = n.value
            empty = isinstance(v, (ast.List, ast.Dict, ast.Set)) and not getattr(
                v, "elts", getattr(v, "keys", [])
            )
            empty = empty or (
                isinstance(v, ast.Call)
                and (v.func.id if isinstance(v.func, ast.Name) else getattr(v.func, "attr", ""))
                in _EMPTY_CALLS
                and not (v.args and isinstance(v.args[0], (ast.Name, ast.Attribute, ast.Call)))
            )
            if empty:
                out.update(a for a in (own(t) for t in n.targets if not isinstance(t, ast.Subscript)) if a)
    return out


def clear_through_methods(facts: ModuleFacts) -> None:
    """``memory.clear_memory()`` in a loop, where a class of the file defines ``clear_memory`` to empty
    ``self.actions``: ``memory.actions`` is cleared in that loop and the loops around it, as a direct
    ``memory.actions.clear()`` would be (rl4co's PPO rollout buffer, round CC: TM001 said it kept each step's
    tensors). Where several classes define the method, what any of them empties counts."""
    if not facts.loop_method_calls:
        return
    emptied: dict[str, set[str]] = {}
    called = {method for _, _, method in facts.loop_method_calls}
    for cls in facts.classes.values():
        for m in cls.body:
            if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef)) and m.name in called:
                attrs = attributes_emptied(m)
                if attrs:
                    emptied.setdefault(m.name, set()).update(attrs)
    for loop, recv, method in facts.loop_method_calls:
        for attr in emptied.get(method, ()):
            key = f"{recv}.{attr}"
            for lp in loop.chain():
                lp.cleared.add(key)


def framework_step(scope: Scope, ctx: Ctx) -> bool:
    """Whether code at ``ctx`` runs on every training step of a framework: unconditionally (no ``if``, no
    ``except`` around it) in the ``training_step`` of a class derived from another (Lightning's, HF
    Trainer's), outside any loop of the method."""
    return (
        scope.kind == "function"
        and scope.name == "training_step"
        and scope.cls is not None
        and bool(scope.cls.bases)
        and ctx.loop is None
        and not ctx.branch
        and not ctx.in_handler
        and ctx.trial is None
    )
