"""The rules about what a program keeps from step to step: a graph kept by a container or a total (TM001),
outputs of an evaluation forward kept with their activations (TM010), exceptions kept with their frames
(TM011), hooks added on every step (TM012) and tensors a module's ``forward`` keeps on the module (TM013).

Each finding says what grows, from the shape the data flow shows: after ``backward()`` ran through a graph
its saved activations are freed and what a kept loss holds is the graph's autograd nodes on the host (tens
of KB per step); a kept output of a forward that no backward runs through holds all the forward's saved
activations on the device. Pure standard library: no torch import.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from torchmem.lint._in_place import rewrites_entries
from torchmem.lint._per_call import per_call_form
from torchmem.lint._rules import WARNING, severity
from torchmem.lint._syntax import (
    TENSOR,
    TORCH_FRESH,
    dotted,
    is_eval_name,
    is_model_callee,
    last_name,
    node_line,
    short,
)
from torchmem.lint._walk import Ctx, Loop, Scope, names_in

if TYPE_CHECKING:
    from torchmem.lint._flow import DataFlow
    from torchmem.lint._walk import ModuleFacts, Walker

# Classes whose ``add`` is a set's (a store), whatever file they come from.
_SET_CLASSES = frozenset({"WeakSet", "OrderedSet", "SortedSet", "SortedList"})

# What grows, by the shape found (the figures: a step's autograd nodes are tens of KB of host memory; a
# forward's saved activations are the size of its intermediate tensors, MiB to GiB per batch).
AFTER_BACKWARD = (
    "`backward()` ran through its graph, so the saved activations are freed, but the graph's autograd nodes "
    "stay on the host (tens of KB per step) for as long as the value is kept"
)
OUTPUT_AFTER_BACKWARD = (
    "`backward()` ran through its graph, so the saved activations are freed; what grows is the output "
    "tensor itself on its device (its size, every step) and the graph's autograd nodes on the host "
    "(tens of KB per step)"
)
NO_BACKWARD = (
    "no backward runs through it, so each kept value holds its forward's whole graph with every saved "
    "activation on the device (a forward's activation memory per step): out of memory within an epoch"
)
UNKNOWN_BACKWARD = (
    "every step's graph stays alive: its saved activations on the device until a backward runs through "
    "it, its autograd nodes on the host after"
)

#: TM001's forms, by what the kept value holds: "backward-ran" (the kept tensor is what backward ran on:
#: its nodes stay), "output-kept" (an output backward ran through), "no-backward" (no backward through
#: it, or none seen in the scope). Only the first is shown by default (docs/lint.md, "Default output").
TM001_FORMS = {AFTER_BACKWARD: "backward-ran", OUTPUT_AFTER_BACKWARD: "output-kept"}


def tm001_form(grows: str) -> str:
    """TM001's form for what :meth:`KeptChecks.growth` said the kept value holds."""
    return TM001_FORMS.get(grows, "no-backward")


class KeptChecks:
    """TM001, TM010-TM013; mixed into :class:`torchmem.lint._checker.Rules` (which gives ``w``, ``facts``,
    ``flow`` and ``add``)."""

    w: Walker
    facts: ModuleFacts
    flow: DataFlow
    _feeding: dict[int, set[str]]
    _reset_attrs: dict[int, set[str]]
    _mutated: frozenset[str] | None
    _tm010: list[tuple[int, str]]

    if TYPE_CHECKING:  # Rules (torchmem.lint._checker) defines it; declared here for the type checker only

        def add(self, node: ast.AST, code: str, message: str, form: str = "") -> None: ...

        def tm010_form(self, scope: Scope, loop: Loop) -> str: ...

    # -- the data flow of backward
    def tm010_within(self, loop: ast.AST, shown: bool) -> bool:
        """Whether a TM010 finding stands inside ``loop`` (found before TM002 runs: the scope's events come
        first) that the default output shows, or any where TM002's own form is not shown (``shown``)."""
        first, last = getattr(loop, "lineno", 0), getattr(loop, "end_lineno", None) or 0
        kept = [form for line, form in self._tm010 if first <= line <= last]
        return any(not shown or severity("TM010", form) == WARNING for form in kept)

    def fixed_cases(self, loop: Loop, scope: Scope) -> bool:
        """The loop runs over a fixed list of cases (:func:`listed_cases`), not the steps of a run."""
        return listed_cases(loop, scope, self.w.module, self._mutated_names)

    def _mutated_names(self) -> frozenset[str]:
        if self._mutated is None:
            self._mutated = mutated_names(self.w.module.node)
        return self._mutated

    def feeding_backward(self, scope: Scope) -> set[str]:
        """Every name whose value reaches what ``backward()`` (or ``autograd.grad``) runs on in this scope."""
        found = self._feeding.get(id(scope))
        if found is not None:
            return found
        seen: set[str] = set()
        todo = list(scope.backward_roots | scope.backwarded)
        if not todo:
            self._feeding[id(scope)] = seen
            return seen
        stored: dict[str, list[ast.AST]] = {}  # what goes into each container: `preds.append(out)`
        for kind, _node, _ctx, extra in scope.events:
            if kind in ("store", "aug") and isinstance(extra, tuple):
                stored.setdefault(extra[0], []).append(extra[1])
        while todo and len(seen) < 400:
            key = todo.pop()
            if key in seen:
                continue
            seen.add(key)
            if "." in key:
                todo.append(key.split(".", 1)[0])
            for b in scope.bindings.get(key, ()):
                if b.value is not None:
                    todo.extend(names_in(b.value) - seen)
            for value in stored.get(key, ()):  # a container backwarded (`torch.cat(losses).backward()`)
                todo.extend(names_in(value) - seen)  # reaches what was put in it
        self._feeding[id(scope)] = seen
        return seen

    def tensor_names(self, value: ast.AST, scope: Scope, line: int) -> set[str]:
        """The graph-carrying names ``value`` is made from: the tensor names inside it, and the tensor
        names their bindings are made from (``v`` of ``for k, v in loss_dict.items()`` is made from
        ``loss_dict``)."""
        out: set[str] = set()
        todo: list[tuple[ast.AST, int]] = [(value, line)]
        while todo and len(out) < 40:
            expr, at = todo.pop()
            for n in ast.walk(expr):
                if not isinstance(n, (ast.Name, ast.Attribute)):
                    continue
                key = dotted(n)
                if key is None or key in out or self.flow.kind(n, scope, at) != TENSOR:
                    continue
                out.add(key)
                for b in scope.bindings.get(key, ()):
                    if b.value is not None and b.line < at:
                        todo.append((b.value, b.line + 1))
        return out

    def growth(self, value: ast.AST, scope: Scope, line: int) -> str:
        """What a kept graph-carrying value holds, from whether a backward runs through it."""
        if not scope.backward_roots and not scope.backwarded:
            return UNKNOWN_BACKWARD
        names = self.tensor_names(value, scope, line)
        roots = scope.backward_roots | scope.backwarded
        if names & roots:
            return AFTER_BACKWARD
        if names & self.feeding_backward(scope):
            return OUTPUT_AFTER_BACKWARD
        return NO_BACKWARD

    # -- TM001 and TM010: a container or total kept across iterations
    def kept(self, scope: Scope, node: ast.AST, ctx: Ctx, extra: object, verb: str) -> None:
        if ctx.loop is None or self.facts.other_world:
            return  # (another framework's file: its graphs and tensors are not torch's)
        assert isinstance(extra, tuple)
        key: str = extra[0]
        value: ast.expr = extra[1]
        if ctx.in_handler and (
            (ctx.exc is not None and self._mentions(value, ctx.exc) and self._caught(scope, ctx.exc, node))
            or self._exc_info(value)
        ):
            self._tm011(scope, node, ctx, key, value)
            return
        if key in scope.backwarded:
            return  # the accumulated loss is what backward runs on
        lives = next((lp for lp in ctx.loop.chain() if key not in lp.rebound and key not in lp.cleared), None)
        if lives is None:
            return
        if isinstance(node, ast.Subscript) and self._fixed_key(node.slice, lives.rebound | lives.targets):
            return  # `d[name] = out` with `name` the same every iteration: one slot, overwritten
        if isinstance(node, ast.Subscript) and rewrites_entries(node, value, key, ctx.loop, self.flow, scope):
            return  # `for k in out: out[k] = out[k].float()`: each entry converted in place (round FF)
        if self._bounded(scope, key, node_line(node)):
            return  # `deque(maxlen=n)`: a ring of the last n, it does not grow with the run
        if _one_iteration(ctx, lives, self.w.if_tests):
            return  # under `if (i + 1) == n:`: stored on one iteration of the loop, not on each
        if self._own_method(scope, key, node):
            return  # `self.pool.add(x)` of a class of this file: its method decides what it keeps
        if isinstance(node, ast.Call) and key in self.facts.imported_names and key not in scope.bindings:
            return  # `tracker.add({...: loss})` of `from labml import tracker`: a package's API (round S)
        if self.fixed_cases(lives, scope):
            return  # `for model in (ref, test):` keeps one value per listed case, not one per step
        if (
            ctx.no_grad
            and isinstance(node, ast.Subscript)
            and self._made_by_torch(scope, key, node_line(node))
        ):
            return  # `losses[i] = loss` under no_grad into `torch.zeros(n)`: the value is copied, not kept
        if ctx.no_grad and not isinstance(value, (ast.Name, ast.Attribute, ast.Subscript)):
            return  # made under no_grad
        line = node_line(node) + 1
        if verb == "accumulates" and _other_field(value, scope.backward_roots | scope.backwarded):
            return  # `n += loss.num_target_elements` where `loss.value` is what backward ran on (round Z)
        if self.flow.kind(value, scope, line) != TENSOR:
            return
        grows = self.growth(value, scope, line)
        if (
            not lives.trains
            and grows in (NO_BACKWARD, UNKNOWN_BACKWARD)
            and not self._decodes(lives, key, scope)
            and self._eval_keeps(scope, ctx, key)
        ):
            form = self.tm010_form(scope, lives)
            self._tm010.append((node_line(node), form))
            self.add(
                node,
                "TM010",
                f"`{key}` {verb} `{short(value)}` on every iteration of this loop "
                f"(line {node_line(lives.node)}), which runs the model with autograd on and never calls "
                "backward: each kept output holds its forward's graph with every saved activation "
                "on the device (a forward's activation memory per batch), so memory grows through "
                "the loop until out of memory",
                form,
            )
            return
        loop = next(
            (lp for lp in ctx.loop.chain() if lp.trains and key not in lp.rebound and key not in lp.cleared),
            None,
        )
        if loop is None:
            return
        form, bound = _step_bound(tm001_form(grows), key, list(ctx.loop.chain()))
        form, bound = per_call_form(self.w, self.flow, scope, key, list(ctx.loop.chain()), form, bound)
        self.add(
            node,
            "TM001",
            f"`{key}` {verb} `{short(value)}`, a tensor that carries its autograd graph, across the "
            f"iterations of a training loop (line {node_line(loop.node)}): {grows}{bound}",
            form,
        )

    @staticmethod
    def _made_by_torch(scope: Scope, key: str, line: int) -> bool:
        """Whether the container is a tensor made by a torch factory (``torch.zeros(n, device=d)``)."""
        bound = [b for b in scope.bindings.get(key, ()) if b.line < line and b.value is not None]
        if not bound:
            return False
        value = max(bound, key=lambda b: b.line).value
        func = value.func if isinstance(value, ast.Call) else None
        root = dotted(func.value) if isinstance(func, ast.Attribute) else None
        return root == "torch" and last_name(func) in TORCH_FRESH  # type: ignore[arg-type]

    def _binding_places(self, scope: Scope, key: str) -> list[Any]:
        """Where ``key`` may be bound: this scope, the module, and for ``self.<name>`` the class's
        ``__init__`` (in that order)."""
        places: list[Any] = [scope.bindings.get(key, ()), self.w.module.bindings.get(key, ())]
        if key.startswith("self.") and scope.cls is not None:
            init = self.w.functions.get(f"{scope.cls.name}.__init__")
            if init is not None:
                places.append(init.bindings.get(key, ()))
        return places

    def _own_method(self, scope: Scope, key: str, node: ast.AST) -> bool:
        """``key.add(x)`` where ``key`` is made by a class of this file that defines ``add``: a method of
        that class (mmagic's ``ImagePool.add`` keeps ``images.data``), not a list's or a set's. A class
        of another file (``Averager()`` imported from the project's utils) whose ``add`` cannot be read
        here is not taken for a set either (EasyOCR's ``Averager.add`` keeps ``v.data.sum()``, round M)."""
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            return False
        places = self._binding_places(scope, key)
        for bound in places:
            for b in bound:
                value = b.value
                if not isinstance(value, ast.Call):
                    continue
                if (
                    isinstance(value.func, ast.Name)
                    and f"{value.func.id}.{node.func.attr}" in self.w.functions
                ):
                    return True
                made_by = last_name(value.func) or ""
                if (
                    node.func.attr == "add"
                    and made_by[:1].isupper()
                    and not made_by.isupper()  # a class name (CamelCase), not a constant
                    and made_by not in self.facts.classes
                    and made_by not in _SET_CLASSES
                ):
                    return True
        return False

    def _bounded(self, scope: Scope, key: str, line: int) -> bool:
        """Whether the container is a ``deque`` made with a ``maxlen`` (here, at module level, or in the
        class's ``__init__`` for ``self.<name>``)."""
        places = self._binding_places(scope, key)
        for bound in places:
            made = [
                b.value for b in bound if b.value is not None and (bound is not places[0] or b.line < line)
            ]
            if made:
                value = made[-1]
                if isinstance(value, ast.Call) and last_name(value.func) == "deque":
                    maxlen = next((k.value for k in value.keywords if k.arg == "maxlen"), None)
                    if maxlen is None and len(value.args) >= 2:
                        maxlen = value.args[1]
                    return maxlen is not None and not (
                        isinstance(maxlen, ast.Constant) and maxlen.value is None
                    )
                return False
        return False

    def _decodes(self, loop: Loop, key: str, scope: Scope) -> bool:
        """Whether the loop carries graph-carrying state from one iteration to the next (``out, h =
        model(x, h)``, or ``step["h"] = h; out = policy(step); h = out["h"]``: one forward spread over
        steps), other than the kept container itself (a loop's own targets are never carried: _walk)."""
        if any(k != key and k not in loop.detached for k in loop.carried):
            return True
        loads: dict[str, int] = {}
        stores: dict[str, int] = {}
        for n in ast.walk(loop.node):
            if isinstance(n, ast.Name):
                seen = stores if isinstance(n.ctx, ast.Store) else loads
                seen[n.id] = min(seen.get(n.id, n.lineno), n.lineno)
        for name, stored in stores.items():
            if name == key or name in loop.targets or name in loop.detached:
                continue
            read = loads.get(name)
            if (
                read is not None
                and read < stored
                and self.flow.kind(ast.Name(id=name), scope, stored + 1) == TENSOR
            ):
                return True  # read in the iteration before it is rebound from the step's output
        return False

    def _eval_keeps(self, scope: Scope, ctx: Ctx, key: str) -> bool:
        """Whether a loop that keeps forward outputs evaluates with autograd on (and nothing uses the
        gradients of what it keeps)."""
        if ctx.no_grad or scope.no_grad_all or scope.grad_maybe:
            return False
        if scope.kind == "function" and scope.name in self.facts.called_under_no_grad:
            return False
        if scope.name.endswith("_step") or scope.name.startswith("on_"):
            return False  # framework hooks (Lightning's validation_step) run under no_grad already
        if key in self.feeding_backward(scope):
            return False  # the kept outputs are backwarded later: their gradients are used
        if scope.name in ("forward", "__call__") or scope.name.startswith(("forward_", "_forward")):
            return False  # a model's own forward: its caller runs backward through what it returns
        named = (
            scope.kind == "function"
            and scope.cls is None
            and not self.w.test_file  # `test_*` in a pytest file is a test, not an evaluation
            and is_eval_name(scope.name)
        )
        return scope.eval_called or scope.trains or named

    @staticmethod
    def _fixed_key(key: ast.AST, changing: set[str]) -> bool:
        """A subscript that is the same on every iteration (or every call): no call in it, and none of
        its names changes (``self.index - 1``; not ``step``, ``len(d)``, ``name + str(i)``)."""
        for n in ast.walk(key):
            if isinstance(n, ast.Call):
                return False
            if isinstance(n, (ast.Name, ast.Attribute)):
                name = dotted(n)
                if name is None or name in changing or name.split(".", 1)[0] in changing:
                    return False
        return True

    # -- TM001 through a helper: `accumulate(loss)` with `nonlocal total; total = total + loss`
    def _on_call(self, scope: Scope, node: ast.AST, ctx: Ctx, extra: object) -> None:
        call = node
        assert isinstance(call, ast.Call) and ctx.loop is not None
        if ctx.no_grad or scope.no_grad_all:
            return
        fn = self.flow.function_of(call, scope)
        if fn is None or fn is scope or fn.no_grad_all:
            return
        if not fn.trains and not any(lp.trains for lp in ctx.loop.chain()):
            return  # neither the loop nor the function it calls trains
        params = fn.params[1:] if fn.cls is not None else fn.params
        for kind, store, sctx, sextra in fn.events:
            if kind not in ("store", "aug") or sctx.no_grad or sctx.exc is not None:
                continue
            assert isinstance(sextra, tuple)
            key: str = sextra[0]
            how = self._persistent(fn, key, kind)
            if how is None or key in fn.backwarded or key in fn.bindings:
                continue  # not kept beyond the call, backwarded, or reset by the function itself
            if isinstance(store, ast.Call) and key in self.facts.imported_names:
                continue  # `tracker.add(...)` of `from labml import tracker`: a package's API (round S)
            if fn.trains and self._own_graph(call, scope, ctx, fn, store, sextra[1], key, how):
                return
            for i, param in enumerate(params):
                arg = self._argument(call, i, param)
                if arg is None:
                    continue
                self.flow.assume, self.flow.assume_in = {param: TENSOR}, fn
                try:
                    carries = self.flow.kind(sextra[1], fn, node_line(store) + 1) == TENSOR
                finally:
                    self.flow.assume, self.flow.assume_in = {}, None
                if not carries or self.flow.kind(arg, scope, node_line(call) + 1) != TENSOR:
                    continue
                loop = next(
                    (lp for lp in ctx.loop.chain() if (lp.trains or fn.trains) and key not in lp.rebound),
                    None,
                )
                if loop is None:
                    return
                grows = self.growth(arg, scope, node_line(call) + 1)
                self.add(
                    call,
                    "TM001",
                    f"`{short(call)}` keeps `{short(arg)}`, a tensor that carries its autograd graph, in "
                    f"`{key}` ({how}, line {node_line(store)}) on every iteration of the training loop "
                    f"(line {node_line(loop.node)}): {grows}",
                    tm001_form(grows),
                )
                return

    def _own_graph(
        self,
        call: ast.Call,
        scope: Scope,
        ctx: Ctx,
        fn: Scope,
        store: ast.AST,
        value: ast.expr,
        key: str,
        how: str,
    ) -> bool:
        """A training step of the file (``self.training_step(batch)``: it runs backward itself) that keeps a
        graph-carrying value of its own beyond the call, called on every iteration of a loop."""
        assert ctx.loop is not None
        if _store_in_loop(fn, store) or self.flow.kind(value, fn, node_line(store) + 1) != TENSOR:
            return False
        loop = next((lp for lp in ctx.loop.chain() if key not in lp.rebound and key not in lp.cleared), None)
        if loop is None:
            return False
        grows = self.growth(value, fn, node_line(store) + 1)
        self.add(
            call,
            "TM001",
            f"`{short(call)}` runs a training step on every iteration of the loop at line "
            f"{node_line(loop.node)} and keeps `{short(value)}`, a tensor that carries its autograd graph, "
            f"in `{key}` ({how}, line {node_line(store)}): {grows}",
            tm001_form(grows),
        )
        return True

    @staticmethod
    def _persistent(fn: Scope, key: str, kind: str) -> str | None:
        root = key.split(".", 1)[0]
        if root in fn.declared:
            return f"declared nonlocal/global in `{fn.name}`"
        if root == "self" and fn.cls is not None and "." in key:
            return f"an attribute of the `{fn.cls.name}` object"
        if kind == "store" and root not in fn.bindings:
            return f"a variable of the scope around `{fn.name}`"
        return None

    @staticmethod
    def _argument(call: ast.Call, index: int, param: str) -> ast.expr | None:
        for k in call.keywords:
            if k.arg == param:
                return k.value
        if any(isinstance(a, ast.Starred) for a in call.args[: index + 1]):
            return None
        return call.args[index] if index < len(call.args) else None

    # -- TM011: exceptions kept
    @staticmethod
    def _mentions(value: ast.AST, name: str) -> bool:
        """``e``, or a tuple/list/dict that holds ``e`` itself (not ``str(e)``)."""
        if isinstance(value, ast.Name):
            return value.id == name
        if isinstance(value, (ast.Tuple, ast.List, ast.Set)):
            return any(isinstance(e, ast.Name) and e.id == name for e in value.elts)
        if isinstance(value, ast.Dict):
            return any(isinstance(v, ast.Name) and v.id == name for v in value.values)
        return False

    @staticmethod
    def _caught(scope: Scope, name: str, node: ast.AST) -> bool:
        """Whether ``name`` is still the caught exception (not rebound: ``e = TypeError(...)`` makes a new
        exception without a traceback)."""
        line = node_line(node)
        before = [b for b in scope.bindings.get(name, ()) if b.line <= line]
        return bool(before) and max(before, key=lambda b: b.line).value is None

    @staticmethod
    def _exc_info(value: ast.AST) -> bool:
        """``sys.exc_info()`` (its third element is the traceback), alone or in a tuple."""
        items = value.elts if isinstance(value, (ast.Tuple, ast.List)) else [value]
        return any(isinstance(v, ast.Call) and last_name(v.func) == "exc_info" for v in items)

    def _tm011(self, scope: Scope, node: ast.AST, ctx: Ctx, key: str, value: ast.expr) -> None:
        assert ctx.loop is not None
        if not self.facts.torch_imported:
            return
        lives = next((lp for lp in ctx.loop.chain() if key not in lp.rebound and key not in lp.cleared), None)
        if lives is None:
            return
        if self.fixed_cases(lives, scope):
            return  # a fixed handful of attempts (`for parse in (a, b, c):`): what it keeps cannot grow
        if not any(lp.trains or lp.model_call is not None for lp in ctx.loop.chain()):
            return  # a loop that runs no model (trying parsers, types): its failed frames hold no tensors
        self.add(
            node,
            "TM011",
            f"`{key}` keeps the exception `{ctx.exc or 'sys.exc_info()'}` of every failed iteration of the "
            f"loop at line {node_line(lives.node)}: its `__traceback__` holds the frames of the failed call, "
            "and their locals (the batch, activations, a half-built graph) stay alive on the device with it",
            "model-frames" if self._runs_model(ctx.trial) else "",
        )

    @staticmethod
    def _runs_model(trial: ast.AST | None) -> bool:
        """Whether the body of the ``try`` whose exception is kept runs a model forward or a backward: the
        failed frames then hold its batch and activations on the device (and the graph, with autograd on).
        A ``try`` around a comparison, a parse or a file read holds no such frames (TM011's "model-frames"
        form, shown by default, needs one that does)."""
        todo: list[ast.AST] = list(getattr(trial, "body", ()))
        while todo:
            n = todo.pop()
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                continue  # defined here, not run here
            if isinstance(n, ast.Call):
                name = last_name(n.func)
                if name in ("backward", "manual_backward"):
                    return True
                if is_model_callee(n.func) and not (isinstance(n.func, ast.Name) and n.func.id[:1].isupper()):
                    return True
            todo.extend(ast.iter_child_nodes(n))
        return False

    # -- TM012: hooks added on every step
    def _on_hook(self, scope: Scope, node: ast.AST, ctx: Ctx, extra: object) -> None:
        call = node
        assert isinstance(call, ast.Call)
        if ctx.loop is None or ctx.guard is not None or scope.removes_handles:
            return
        step = next(
            (
                lp
                for lp in ctx.loop.chain()
                if (lp.trains or lp.model_call is not None) and not fixed_handful(lp)
            ),
            None,
        )
        if step is None:
            return  # a loop over modules (`for m in model.modules()`) registers each hook once
        assert isinstance(call.func, ast.Attribute)
        what = "training" if step.trains else "model-calling"
        self.add(
            call,
            "TM012",
            f"`{short(call.func)}(...)` runs on every iteration of the {what} loop at line "
            f"{node_line(step.node)} and no handle is removed: each step adds one more hook, every forward "
            "runs all of them (slower each step), and what they capture (outputs kept by the hook) grows "
            "with them",
        )


def _other_field(value: ast.expr, roots: set[str]) -> bool:
    """Whether ``value`` is a field ``rec.f`` of a record another field of which (``rec.value``) is what
    backward ran on: ``rec`` is no tensor, and a sum of its other field (a count of target elements,
    large_concept_model's ``LossTerm``, round Z) is of unknown type, not the loss with its graph."""
    if not isinstance(value, ast.Attribute):
        return False
    base, key = dotted(value.value), dotted(value)
    if base is None or key is None or key in roots:
        return False
    return any(r.startswith(base + ".") and r.count(".") == key.count(".") for r in roots)


def _step_bound(form: str, key: str, chain: list[Loop]) -> tuple[str, str]:
    """TM001's form once what bounds the kept value is known, and the words that say so: a container or
    total no loop that steps an optimizer keeps across iterations lives within one step: "output-in-step"
    for outputs; "backward-in-step" for a loss total made afresh by the loop that steps (`loss_accum = 0`
    there, `loss_accum += loss` over its micro-batches: modulus's corrdiff trainer, round X)."""
    in_step = not any(lp.steps and key not in lp.rebound and key not in lp.cleared for lp in chain)
    if form == "output-kept" and in_step:
        return "output-in-step", ""  # reset before any optimizer step: the micro-batches of one step
    reset = next((lp for lp in chain if lp.steps and (key in lp.rebound or key in lp.cleared)), None)
    if form == "backward-ran" and in_step and reset is not None and not _handed_on(reset.node, key):
        return "backward-in-step", (
            f"; `{key}` is made afresh on every iteration of the loop at line {node_line(reset.node)}, "
            "which steps the optimizer: what it keeps is one optimizer step's micro-batches, "
            "released at the next step, so it does not grow with the run"
        )
    return form, ""


def _one_iteration(ctx: Ctx, loop: Loop, tests: dict[int, ast.expr]) -> bool:
    """Whether the store runs on one iteration of ``loop`` only: it is in the body of an ``if`` that tests
    the loop's counter for equality (``if (i + 1) == batch_size:``, ``if i == 0:``; mttl keeps the last
    example's loss for its caller's backward, round Y), not a period (``if i % 10 == 0:``) nor the
    ``else`` of such a test."""
    if not loop.targets:
        return False
    for if_id, arm in ctx.branch:
        test = tests.get(if_id)
        if arm != 0 or not isinstance(test, ast.Compare) or len(test.ops) != 1:
            continue
        if not isinstance(test.ops[0], ast.Eq):
            continue
        sides = (test.left, test.comparators[0])
        counted = any(isinstance(n, ast.Name) and n.id in loop.targets for x in sides for n in ast.walk(x))
        period = any(
            isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mod) for x in sides for n in ast.walk(x)
        )
        if counted and not period:
            return True
    return False


# Calls that read what they are given and keep nothing of its graph (or only iterate over it).
_READS = frozenset({"float", "int", "str", "repr", "print", "len", "enumerate", "zip", "iter", "isinstance"})


def _handed_on(loop: ast.AST, key: str) -> bool:
    """Whether the loop gives ``key`` to a call that may keep it: ``losses.update(list_mean(kept))`` hands
    one step's graphs to a running meter (once-for-all, round W: the list is made afresh each step, the
    meter it feeds is not); ``float(...)``, ``print(...)``, ``torch.tensor([total])`` (a copy, no graph),
    ``enumerate(...)`` only read it."""
    for node in ast.walk(loop):
        if not isinstance(node, ast.Call):
            continue
        args = [*node.args, *(k.value for k in node.keywords)]
        given = any(
            dotted(e) == key
            for a in args
            for e in ((*a.elts, a) if isinstance(a, (ast.List, ast.Tuple)) else (a,))
        )
        if not given:
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id in _READS:
            continue
        if isinstance(func, ast.Attribute) and func.attr == "tensor" and dotted(func.value) == "torch":
            continue
        return True
    return False


def fixed_handful(loop: Loop) -> bool:
    """A ``for`` over a literal display (``for cfg in ((768, 2048), (2048, 768)):``), or over ``range(1)``
    (one iteration: ModelCenter's test, round W): a fixed number of listed cases, not the steps of a run."""
    node = loop.node
    if not isinstance(node, (ast.For, ast.AsyncFor)):
        return False
    it = node.iter
    if isinstance(it, (ast.List, ast.Tuple, ast.Set)):
        return True
    return (
        isinstance(it, ast.Call)
        and isinstance(it.func, ast.Name)
        and it.func.id == "range"
        and len(it.args) == 1
        and isinstance(it.args[0], ast.Constant)
        and isinstance(it.args[0].value, int)
        and it.args[0].value <= 1
    )


_DICT_VIEWS = frozenset({"items", "keys", "values"})
_MUTATORS = frozenset(
    {"append", "extend", "insert", "add", "update", "setdefault", "pop", "popitem", "remove", "clear"}
    | {"discard"}
)


def _constant(node: ast.AST) -> bool:
    """A constant expression: literals, their arithmetic (``60 * 60``), displays of them."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.UnaryOp):
        return _constant(node.operand)
    if isinstance(node, ast.BinOp):
        return _constant(node.left) and _constant(node.right)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return all(_constant(e) for e in node.elts)
    if isinstance(node, ast.Dict):
        keys = all(k is not None and _constant(k) for k in node.keys)
        return keys and all(_constant(v) for v in node.values)
    return False


def mutated_names(tree: ast.AST) -> frozenset[str]:
    """The names of a module changed in place anywhere (``times.append(t)``, ``times[i] = t``,
    ``times += [t]``, ``del times[0]``)."""
    out: set[str] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in _MUTATORS:
            if isinstance(n.func.value, ast.Name):
                out.add(n.func.value.id)
        elif isinstance(n, ast.Subscript) and isinstance(n.ctx, (ast.Store, ast.Del)):
            if isinstance(n.value, ast.Name):
                out.add(n.value.id)
        elif isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name):
            out.add(n.target.id)
    return frozenset(out)


def listed_cases(loop: Loop, scope: Scope, module: Scope, mutated: Callable[[], frozenset[str]]) -> bool:
    """A ``for`` over a fixed list of cases: a literal display (:func:`fixed_handful`), or a name bound once
    (in this scope, else at module level) to a display of constants and never changed in place, or a dict
    view of one (``for t in TIMES:``, ``for name, t in TIMES.items():`` with ``TIMES = [1, 60, 60 * 60]``):
    what the loop keeps is one value per listed case, not one per step of a run (round T). ``mutated``
    gives the module's names changed in place (computed only when a name is looked up)."""
    if fixed_handful(loop):
        return True
    node = loop.node
    if not isinstance(node, (ast.For, ast.AsyncFor)):
        return False
    it = node.iter
    view = False
    if (
        isinstance(it, ast.Call)
        and not it.args
        and isinstance(it.func, ast.Attribute)
        and it.func.attr in _DICT_VIEWS
    ):
        it, view = it.func.value, True
    if not isinstance(it, ast.Name) or it.id in loop.rebound:
        return False
    name = it.id
    bound = scope.bindings.get(name)
    if bound is None and name not in scope.declared:
        bound = module.bindings.get(name)
    if not bound or len(bound) != 1 or bound[0].value is None or bound[0].index is not None:
        return False
    value = bound[0].value
    display = (ast.Dict,) if view else (ast.Tuple, ast.List, ast.Set, ast.Dict)
    if not isinstance(value, display) or not _constant(value):
        return False
    return name not in mutated()


def _store_in_loop(fn: Scope, store: ast.AST) -> bool:
    """Whether the store is inside a loop of the function itself (TM001 judges it there, in place)."""
    return any(node is store and c.loop is not None for _k, node, c, _e in fn.events)
