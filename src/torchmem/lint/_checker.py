"""The static checks: one walk over a module's syntax tree (:mod:`torchmem.lint._walk`), then the rules over
what the walk recorded, judging values by the local data flow (:mod:`torchmem.lint._flow`).

The rules run after the walk, when every loop is known whole. Precision over recall: a value counts as a
graph-carrying tensor only when local data flow says so; anything unknown is left alone. Pure standard
library: no torch import.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from torchmem.lint._calls import clear_through_methods, framework_step
from torchmem.lint._flow import DataFlow
from torchmem.lint._forward import ForwardChecks, in_forward
from torchmem.lint._grad_wanted import attack_fix, feeds_grad_input, grad_inputs
from torchmem.lint._imported import (
    called_under_no_grad_elsewhere,
    forward_off,
    frozen_model,
    imported_update_keeps,
)
from torchmem.lint._rules import WARNING, severity
from torchmem.lint._syntax import (
    METER_NAMES,
    RANK_VARS,
    TENSOR,
    container_key,
    dotted,
    has_star_kwargs,
    is_const,
    is_const_in,
    is_eval_name,
    keyword_arg,
    last_name,
    node_line,
    optimizer_step,
    short,
    stepped_optimizers,
)
from torchmem.lint._walk import Binding, Ctx, Loop, Scope, Walker, names_in, same_path
from torchmem.lint._workers import WorkerChecks


def _is_eval_call(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and not node.args and last_name(node.func) == "eval"


def _made_in_eval_mode(value: ast.Call) -> bool:
    """A value bound from a model in eval() mode: ``wrap(m).eval()``, or a wrapper given ``m.eval()`` as
    its first argument (``prepare(m.eval(), qconfig)``, which returns that model, observers added)."""
    return _is_eval_call(value) or (bool(value.args) and _is_eval_call(value.args[0]))


@dataclass(frozen=True)
class RawFinding:
    line: int
    col: int
    code: str
    message: str
    form: str = ""
    fix: str = ""  # where the rule's fix does not fit this finding: its own


# -- rules over what the walk recorded ----------------------------------------------------------------------
class Rules(ForwardChecks, WorkerChecks):
    """The TM rules over one module's walk; :meth:`run` gives their findings."""

    def __init__(self, walker: Walker) -> None:
        self.w = walker
        self.facts = walker.facts
        self.out: list[RawFinding] = []
        self.flow = DataFlow(walker.module.bindings, walker.functions)
        self.flow.module_frozen = walker.module.frozen
        self._feeding: dict[int, set[str]] = {}
        self._grad_helpers: set[str] | None = None  # functions that differentiate a parameter
        self._reset_attrs: dict[int, set[str]] = {}
        self._mutated: frozenset[str] | None = None  # the module's names changed in place (when needed)
        self._tm010: list[tuple[int, str]] = []  # (line, form) of each TM010 finding
        _under_no_grad_closure(walker)
        clear_through_methods(walker.facts)

    def add(self, node: ast.AST, code: str, message: str, form: str = "", fix: str = "") -> None:
        """Record a finding; ``form`` names the rule's variant where a rule has several
        (:data:`torchmem.lint._rules.DEFAULT_FORMS` says which are shown by default); ``fix``, where the
        rule's own fix does not fit this finding."""
        line, col = getattr(node, "lineno", 1), getattr(node, "col_offset", 0)
        self.out.append(RawFinding(line, col, code, message, form, fix))

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
            self.tm013(scope)
        return self.out

    def _on_aug(self, scope: Scope, node: ast.AST, ctx: Ctx, extra: object) -> None:
        if ctx.no_grad or scope.no_grad_all:
            return  # total += loss under no_grad: the sum has no graph
        if isinstance(extra, tuple) and isinstance(extra[0], str) and own_iadd(self.w, extra[0], scope):
            return  # `meter += loss`, a class of this file with its own `__iadd__`: it decides what it keeps
        self.kept(scope, node, ctx, extra, "accumulates")

    def _on_store(self, scope: Scope, node: ast.AST, ctx: Ctx, extra: object) -> None:
        self.kept(scope, node, ctx, extra, "stores")

    def _on_retain(self, scope: Scope, node: ast.AST, ctx: Ctx, extra: object) -> None:
        loop = ctx.loop
        assert loop is not None
        pos = (getattr(node, "lineno", 0), getattr(node, "col_offset", 0))
        if any(p > pos and not retains for p, retains in loop.backwards):
            return  # a later backward in the same iteration frees the graph
        if self.facts.other_world:
            return  # a file of another framework (MXNet's `autograd.record()`): no torch graph
        feeding = self.feeding_backward(scope)
        # A name the loop calls as a model is a module (`model = DDP(model)` rebound once in the epoch loop,
        # round P's AutoTinyBERT): its parameters are leaves, it carries no graph from one step to the next.
        called = {container_key(c.func) for lp in loop.chain() for c in lp.model_calls}
        carried = sorted(
            (line, key)
            for lp in loop.chain()
            for key, line in lp.carried.items()
            if key not in lp.detached and key in feeding and key not in called
        )
        if not carried:
            # nothing links one iteration's graph to the next: wasteful at most, not a leak (a for target
            # is bound afresh by each iteration; state that never reaches the backward is not in its graph)
            return
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
        if ctx.branch and not scope.trains and not (ctx.loop is not None and ctx.loop.trains):
            return  # a rare path outside the step (zeroing NaN gradients in a hook): the step's own
            # zero_grad still frees the buffers
        self.add(
            node,
            "TM008",
            "`zero_grad(set_to_none=False)` keeps every gradient buffer allocated (and zeroed) between steps",
        )

    def _on_empty_cache(self, scope: Scope, node: ast.AST, ctx: Ctx, extra: object) -> None:
        loop = ctx.loop
        if loop is None and framework_step(scope, ctx):
            empty_cache_per_step(self, scope, node)  # MiniCPM-o (round CC): an HF Trainer's training_step
            return
        if loop is None or ctx.in_handler:
            return
        if not loop.direct_trains:
            step = training_helper(self.w, loop, scope)
            if step is None or ctx.guard is loop:
                return
            # align-anything (round BB): `info = self.train_step(batch)` steps the model every iteration
            self.add(
                node,
                "TM003",
                f"`empty_cache()` on every step of the training loop at line {node_line(loop.node)} (its "
                f"`{step}(...)` runs the backward and the optimizer step): it frees nothing the program "
                "holds, only the cache the next step must allocate again (slow)",
                "" if loop.remade(stepped_optimizers(loop.node)) else "optimizer-step",
            )
            return
        if ctx.guard is loop and not _with_optimizer_step(loop.node, node):
            return  # `if i % 100 == 0: empty_cache()`; not `if acc >= n: opt.step(); ...` (round AA)
        if self.fixed_cases(loop, scope):
            return  # between listed cases of different shapes (a test's configurations), not every step
        # "optimizer-step" (shown by default): the loop steps an optimizer and trains the same model on
        # every iteration, so each call gives back blocks the next step allocates again. A loop that
        # only runs backward, or builds its model afresh each iteration (a test over a model zoo, where
        # shapes change from one model to the next), is the info form.
        # ... or steps an optimizer it makes anew each iteration (a benchmark over configurations that
        # builds, times and deletes a model and its optimizer per iteration, round GG): each iteration is a
        # training run of its own, and the call gives back what the next run's shapes may not reuse
        callees = [container_key(c.func) or "" for c in loop.model_calls]
        rebuilt = loop.remade(callees + stepped_optimizers(loop.node))
        self.add(
            node,
            "TM003",
            f"`empty_cache()` on every step of the training loop at line {node_line(loop.node)}: "
            "it frees nothing the program holds, only the cache the next step must allocate again (slow)",
            "optimizer-step" if loop.steps and not rebuilt else "",
        )

    def _on_load(self, scope: Scope, node: ast.AST, ctx: Ctx, extra: object) -> None:
        call = node
        assert isinstance(call, ast.Call)
        if isinstance(call.func, ast.Name) and call.func.id != "load":
            return
        if isinstance(call.func, ast.Name) and not _imported_from_torch(self.w.module.node, "load"):
            return
        if not self.facts.rank_setup or len(call.args) >= 2 or has_star_kwargs(call):
            return
        kw = keyword_arg(call, "map_location")
        if kw is not None and not is_const(kw.value, None):
            return
        source = call.args[0] if call.args else getattr(keyword_arg(call, "f"), "value", None)
        if isinstance(source, ast.Call) and last_name(source.func) == "BytesIO":
            return  # bytes this process made: their devices are this process's
        if isinstance(source, ast.Name) and any(
            isinstance(b.value, ast.Call) and last_name(b.value.func) in ("BytesIO", "NamedTemporaryFile")
            for b in scope.bindings.get(source.id, ())
        ):
            return
        if self._one_process(scope, ctx, call):
            return  # `if rank == 0:` / after `if rank > 0: return`: one process loads, not every rank
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
            given = len(other.args) >= 2 or keyword_arg(other, "map_location") is not None
            if given and other.args and ast.dump(other.args[0]) == text:
                return True
        return False

    @staticmethod
    def _saved_here(scope: Scope, source: ast.AST) -> bool:
        texts = {ast.dump(source)}
        if isinstance(source, ast.Name):  # `path = f.name` after `torch.save(state, f.name)`
            texts.update(ast.dump(b.value) for b in scope.bindings.get(source.id, ()) if b.value is not None)
        for kind, other, _ctx, _extra in scope.events:
            saved = kind == "save" and isinstance(other, ast.Call) and len(other.args) >= 2
            if saved and ast.dump(other.args[1]) in texts:  # type: ignore[attr-defined]
                return True
        return False

    def _one_process(self, scope: Scope, ctx: Ctx, call: ast.Call) -> bool:
        """Whether only one process reaches the call: under an `if` that tests for rank 0 (or the main
        process), or after `if rank > 0: return` in the function's body."""
        if any(_rank_zero_test(self.w.if_tests.get(if_id)) for if_id, _arm in ctx.branch):
            return True
        for s in getattr(scope.node, "body", ()):
            if node_line(s) >= call.lineno:
                break
            if (
                isinstance(s, ast.If)
                and _rank_zero_test(s.test)
                and any(isinstance(x, ast.Return) for x in s.body)
            ):
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
        if not isinstance(func, ast.Attribute) or func.attr != "update":
            return
        # Trackers (wandb.log, accelerator.log, add_scalar, log_metrics, mlflow) convert what they are given
        # at once (`.detach().cpu()`, `make_np`, `float(...)`): they keep no graph. A meter's running sum
        # (`self.sum += val * n`) does: each step's graph is chained to the last.
        recv = dotted(func.value) or ""
        keeps = meter_keeps(self, func.value, scope, call.lineno)
        if keeps is False or (keeps is None and not METER_NAMES.search(recv.rsplit(".", 1)[-1])):
            return
        values = [*call.args[:1], *(k.value for k in call.keywords if k.arg in ("val", "value"))]
        line = call.lineno + 1
        for v in values:
            if self.flow.kind(v, scope, line) == TENSOR:
                self.add(
                    call,
                    "TM007",
                    f"`{recv}.update` is given `{short(v)}`, a tensor that carries its autograd graph: the "
                    "meter's running sum (or average) chains every step's graph to the last "
                    f"({self.growth(v, scope, line)})",
                )
                return

    def _on_dataloader(self, scope: Scope, node: ast.AST, ctx: Ctx, extra: object) -> None:
        call = node
        assert isinstance(call, ast.Call)
        workers = keyword_arg(call, "num_workers")
        if workers is None or is_const(workers.value, None):
            return
        if isinstance(workers.value, ast.Constant) and not (
            isinstance(workers.value.value, int) and workers.value.value > 0
        ):
            return
        mp_ctx = keyword_arg(call, "multiprocessing_context")
        if mp_ctx is not None:
            if not (isinstance(mp_ctx.value, ast.Constant) and mp_ctx.value.value == "fork"):
                return
        elif self.facts.start_method not in (None, "fork"):
            return
        ds_kw = keyword_arg(call, "dataset")
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
        cls_name = last_name(dataset.func)
        if not cls_name.endswith("Dataset") and cls_name not in self.facts.classes:
            return None
        for arg in (*dataset.args, *(k.value for k in dataset.keywords)):
            if self._cuda_tensor(arg, scope, line):
                return f"`{short(arg)}` is on a CUDA device"
        cls = self.facts.classes.get(cls_name)
        if cls is not None:
            for item in cls.body:
                if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                    for n in ast.walk(item):
                        if isinstance(n, ast.Call) and self.flow.is_cuda_call(n):
                            return f"`{cls_name}.__init__` moves data to CUDA at line {n.lineno}"
        return None

    def _cuda_tensor(self, expr: ast.AST, scope: Scope, line: int, depth: int = 0) -> bool:
        if depth > 6:
            return False
        if isinstance(expr, ast.Call):
            return self.flow.is_cuda_call(expr)
        if isinstance(expr, ast.Name):
            best: Binding | None = None
            for b in scope.bindings.get(expr.id, ()):
                if b.line <= line and (best is None or b.line >= best.line):
                    best = b
            if best is not None and best.value is not None and best.index is None:
                return self._cuda_tensor(best.value, scope, best.line, depth + 1)
        return False

    def _tm002(self, scope: Scope) -> None:
        if scope.kind == "lambda" or not scope.eval_loops or not self.facts.torch_imported:
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
        if in_forward(scope):
            return  # part of a module's forward pass (hi-ml's frozen encoder): its caller decides on autograd
        if scope.name.endswith("_step") or scope.name.startswith("on_"):
            return  # framework hooks (Lightning's validation_step) run under no_grad already
        if self.w.test_file and scope.kind == "function" and scope.name.startswith("test"):
            return  # a test of a pytest/unittest file checks outputs, it is not an evaluation (round Q)
        if scope.backward_roots:
            return  # `torch.autograd.grad(...)` on what the loop computes: its gradients are used
        bound_eval = self._bound_eval(scope)
        # Two forms, by what says the loop evaluates. "eval-mode": the model this function put in eval()
        # mode is the one the loop calls (A-G first look: 31 of 37 true, docs/lint.md); an
        # eval() in the other arm of an `if` is not this loop's. "by-name": only the function's name says
        # so (9 of 23: the callee is as often a compiled, frozen or foreign model): not shown by
        # default. The first loop of the eval-mode form is reported, else the first of the other.
        found: tuple[Loop, ast.Call, str] | None = None
        wanted = grad_inputs(scope)  # inputs made to require grad: forces, saliency (round Q)
        for loop in scope.eval_loops:
            if self._helper_takes_grads(loop):
                continue  # `hvp(loss, w, v)` differentiates what the loop computes: its graph is used
            calls, in_eval = self.eval_mode_calls(scope, loop, bound_eval)
            if any(feeds_grad_input(c, wanted) for c in calls):
                continue  # the model is given an input made to require grad: its gradients are wanted
            if in_eval:
                found = (loop, in_eval[0], "eval-mode")
                break
            if named and calls and found is None:
                found = (loop, calls[0], "by-name")
        if found is None:
            return  # functions of this file (`validate_network(...)`), or not the model put in eval mode
        loop, call, form = found
        if scope.kind == "function" and called_under_no_grad_elsewhere(
            scope.name, self.w, scope.cls.name if scope.cls is not None else None
        ):
            return  # its callers in other files of the project run it under no_grad
        if self.tm010_within(loop.node, severity("TM002", form) == WARNING):
            return  # the loop also keeps its outputs: one finding, TM010's (the growth), with the same fix
        if form == "eval-mode":
            why = "the model is in eval() mode"
        else:
            why = f"`{scope.name}` evaluates (by its name: no `.eval()` of the called model here)"
        model = short(call.func)
        also, fix = attack_fix(scope, loop.node, self.facts.attack_names, model)  # round R
        self.add(
            loop.node,
            "TM002",
            f"{why} and this loop calls `{model}` with autograd on: "
            "each forward records its graph and holds every activation a backward would need until its "
            "output is dropped (a training-sized peak, several times what the same forward needs under "
            f"no_grad); memory grows step after step only if outputs are kept (TM010){also}",
            form,
            fix,
        )

    @staticmethod
    def _bound_eval(scope: Scope) -> set[str]:
        """Names bound from a model in eval() mode: ``model = get_peft_model(...).eval()``, ``prepared =
        prepare(model.eval(), qconfig)``."""
        return {
            key
            for key, bound in scope.bindings.items()
            if any(isinstance(b.value, ast.Call) and _made_in_eval_mode(b.value) for b in bound)
        }

    def eval_mode_calls(
        self, scope: Scope, loop: Loop, bound_eval: set[str] | None = None
    ) -> tuple[list[ast.Call], list[ast.Call]]:
        """The loop's model calls that record a graph as far as the file shows (not a function of the
        file, a frozen or foreign model, or a model the loop put in train() mode before the call), and
        those of them on a model in eval() mode: the last `train()`/`eval()` of the called model before
        the call is an `eval()` (in an arm of an `if` the loop can run with), or it was bound from one."""
        if bound_eval is None:
            bound_eval = self._bound_eval(scope)
        frozen = scope.frozen | self.w.module.frozen
        calls = [
            c
            for c in loop.model_calls
            if (self.flow.function_of(c, scope) is None or _module_forward(c, scope))
            and not self._called_on(c, frozen)
            and not self._foreign(c, scope)
            and not self._trained_in(c, scope, loop)
            and not forward_off(c, scope, self.w)  # `model(x, mode="inference")`: its forward's no_grad
            and not (isinstance(c.func, ast.Name) and frozen_model(c.func.id, scope, self.w))
        ]  # a model whose parameters require no grad records no graph from data
        this_loops = bound_eval | {
            key
            for key, arms in scope.eval_branches.items()
            if any(same_path(arm, loop.branch) for arm in arms)
        }
        in_eval = [c for c in calls if _called_in_eval(c, this_loops) and _eval_before(c, scope, bound_eval)]
        return calls, in_eval

    def tm010_form(self, scope: Scope, loop: Loop) -> str:
        """TM010's form for a loop that keeps outputs with autograd on: "eval-mode" when it calls a model
        this function put in eval() mode (TM002's precise form), "trained-model" when it calls a model
        whose outputs a backward of this scope runs through (its parameters require grad: it trains
        here), else "" (the function's name or an `eval()` elsewhere says so: shown by `--all`)."""
        # the loop and the loops around it that do not train (`for k, v in model(x).items():` runs the
        # model in the loop around it)
        loops = []
        for lp in loop.chain():
            if lp.trains:
                break
            loops.append(lp)
        if any(self._helper_takes_grads(lp) for lp in loops) or in_forward(scope):
            return ""
        found = [self.eval_mode_calls(scope, lp) for lp in loops]
        if any(in_eval for _calls, in_eval in found):
            return "eval-mode"
        trained = self._trained_names(scope)
        if any(self._called_on(c, trained) for calls, _in_eval in found for c in calls):
            return "trained-model"
        return ""

    def _trained_names(self, scope: Scope) -> set[str]:
        """The names whose values reach what a backward of the scope runs on through bindings made with
        autograd on: a model called there has parameters that require grad. A teacher whose output is
        bound under `no_grad` (`with torch.no_grad(): t = teacher(x)`) feeds the loss no graph."""
        seen: set[str] = set()
        todo = list(scope.backward_roots | scope.backwarded)
        while todo and len(seen) < 400:
            key = todo.pop()
            if key in seen:
                continue
            seen.add(key)
            for b in scope.bindings.get(key, ()):
                if b.value is not None and not b.no_grad:
                    todo.extend(names_in(b.value) - seen)
        return {k for k in seen if k not in ("self", "cls")}

    def _helper_takes_grads(self, loop: Loop) -> bool:
        """The loop calls a function of this file that runs ``autograd.grad``/``backward`` on one of its
        own parameters (DomainBed's nested ``hvp(y, w, v)``): the loop's graph is used, not wasted."""
        if self._grad_helpers is None:
            self._grad_helpers = _grad_helpers(self.w.scopes)
        names = self._grad_helpers
        return bool(names) and any(
            isinstance(n, ast.Call) and last_name(n.func) in names for n in ast.walk(loop.node)
        )

    def _trained_in(self, call: ast.Call, scope: Scope, loop: Loop) -> bool:
        """The loop puts the called model in training mode itself before the call (the last
        `model.train()`/`model.eval()` of the loop before it is a `train()`): a training-mode forward,
        whatever `eval()` stands elsewhere in the function."""
        pos = (call.lineno, call.col_offset)
        before = [
            (at, mode)
            for key, lp, at, mode in scope.modes_in_loops
            if at < pos and loop in lp.chain() and self._called_on(call, {key})
        ]
        return bool(before) and max(before)[1] == "train"

    def _foreign(self, call: ast.Call, scope: Scope) -> bool:
        """A callee made by (or annotated as) a non-torch runtime: `compiled = ov.compile_model(m)`,
        `model: ov.CompiledModel`, `InferenceSession(path)`; its calls have no autograd."""
        names = self.facts.foreign_names
        func = call.func
        if not names or not isinstance(func, ast.Name):
            return False
        made = [b.value for b in scope.bindings.get(func.id, ()) if b.value is not None]
        source = made[-1] if made else scope.annotations.get(func.id)
        while isinstance(source, (ast.Call, ast.Attribute, ast.Subscript)):
            source = source.func if isinstance(source, ast.Call) else source.value
        return isinstance(source, ast.Name) and source.id in names

    @staticmethod
    def _called_on(call: ast.Call, receivers: set[str]) -> bool:
        callee = _callee(call)
        if callee is None:
            return False
        return any(callee == r or callee.startswith(r + ".") or r.startswith(callee + ".") for r in receivers)


def _callee(call: ast.Call) -> str | None:
    """The model a call runs: ``model`` of ``model(x)`` and of ``model.forward(x)``."""
    func = call.func
    if isinstance(func, ast.Attribute) and func.attr == "forward":
        func = func.value
    return container_key(func)


def _called_in_eval(call: ast.Call, receivers: set[str]) -> bool:
    """Whether ``call`` runs a model one of ``receivers`` put in eval() mode: the model itself or a part of
    it (``model.encoder(x)`` after ``model.eval()``), or the model a wrapper holds (``model.module.eval()``,
    then ``model(x)``) — not a model of which only a part is in eval() mode (``model.module.patch_embed
    .eval()`` in a training loop that freezes its stem's BatchNorm: xcit, round Y)."""
    callee = _callee(call)
    if callee is None:
        return False
    return any(r in (callee, callee + ".module") or callee.startswith(r + ".") for r in receivers)


def _rank_zero_test(test: ast.expr | None) -> bool:
    """``rank == 0``, ``args.local_rank > 0``, ``args.local_rank in [-1, 0]``,
    ``os.environ.get("RANK", "0") == "0"``, ``accelerator.is_main_process``, ``is_rank_zero()``: a test
    that singles out one process."""
    if test is None:
        return False
    if isinstance(test, ast.UnaryOp):
        return _rank_zero_test(test.operand)
    if isinstance(test, ast.BoolOp):
        return any(_rank_zero_test(v) for v in test.values)
    if isinstance(test, ast.Call):
        test = test.func
    if isinstance(test, (ast.Name, ast.Attribute)):
        name = last_name(test).lower()
        return name.endswith(("main_process", "rank_zero", "global_zero", "is_master", "is_main"))
    if isinstance(test, ast.Compare) and len(test.comparators) == 1:
        sides = (test.left, test.comparators[0])
        zero = any(isinstance(x, ast.Constant) and x.value in (0, "0") for x in sides) or (
            isinstance(test.ops[0], ast.In)  # `args.local_rank in [-1, 0]` (CodeXGLUE, rounds W and X)
            and isinstance(sides[1], (ast.List, ast.Tuple, ast.Set))
            and any(isinstance(e, ast.Constant) and e.value in (0, "0") for e in sides[1].elts)
        )
        ranked = any(
            (
                "rank" in last_name(n).lower()
                if isinstance(n, (ast.Name, ast.Attribute))
                else is_const_in(n, RANK_VARS)
            )
            for x in sides
            for n in ast.walk(x)
            if isinstance(n, (ast.Name, ast.Attribute, ast.Constant))
        )
        return zero and ranked
    return False


def check_tree(tree: ast.Module, path: str) -> list[RawFinding]:
    """Every finding in one parsed module, unfiltered (suppression and selection come after)."""
    walker = Walker(tree, path)
    return Rules(walker).run()


def _with_optimizer_step(loop: ast.AST, call: ast.AST) -> bool:
    """Whether the innermost ``if`` arm of ``loop`` that holds ``call`` also steps an optimizer
    (``opt.step()``, ``scaler.step(optimizer)``): the call then runs on every optimizer step of a loop that
    accumulates gradients (Marigold's trainers, round AA)."""
    line = node_line(call)
    best: list[ast.stmt] | None = None
    for n in ast.walk(loop):
        if not isinstance(n, ast.If) or n is loop:
            continue
        for arm in (n.body, n.orelse):
            inside = arm and arm[0].lineno <= line <= (arm[-1].end_lineno or arm[-1].lineno)
            if inside and (best is None or arm[0].lineno >= best[0].lineno):
                best = arm
    if best is None:
        return False
    return any(isinstance(n, ast.Call) and optimizer_step(n) for stmt in best for n in ast.walk(stmt))


def _under_no_grad_closure(w: Walker) -> None:
    """Functions of the file called by one that runs under no_grad, however deep (fairseq-style
    ``generate`` -> ``_generate`` -> ``_encode`` with only the first call under ``no_grad``, round Z), join
    the file's ``called_under_no_grad``."""
    under = w.facts.called_under_no_grad
    by_name: dict[str, list[Scope]] = {}
    for sc in w.scopes:
        if sc.kind == "function":
            by_name.setdefault(sc.name, []).append(sc)
    todo = [n for n in under if n in by_name]
    todo += [sc.name for sc in w.scopes if sc.kind == "function" and sc.no_grad_all]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for sc in by_name.get(name, ()):
            for callee in sc.callees:
                if callee in by_name and callee not in seen:
                    under.add(callee)
                    todo.append(callee)


def _imported_from_torch(tree: ast.AST, name: str) -> bool:
    assert isinstance(tree, ast.Module)
    for s in tree.body:
        if isinstance(s, ast.ImportFrom) and s.module == "torch" and any(a.name == name for a in s.names):
            return True
    return False


def _module_forward(call: ast.Call, scope: Scope) -> bool:
    """``self.forward(x)`` in a method of a ``nn.Module`` subclass of this file: the module's own forward is
    the model, not a helper function of the file (home-robot's ``show_validation``, round V)."""
    func, cls = call.func, scope.cls
    return (
        cls is not None
        and isinstance(func, ast.Attribute)
        and func.attr == "forward"
        and isinstance(func.value, ast.Name)
        and func.value.id == "self"
        and any(last_name(b) == "Module" for b in cls.bases)
    )


def _eval_before(call: ast.Call, scope: Scope, bound_eval: set[str]) -> bool:
    """The called model's last `train()`/`eval()` before the call (in the function's order) is an `eval()`,
    or it was bound from an `.eval()` (`model = wrap(m).eval()`): a loop before the function's
    `model.eval()` (a training-mode test run first) is not an evaluation (TM002's eval-mode form)."""
    pos = (call.lineno, call.col_offset)
    before = [(at, mode) for key, at, mode in scope.modes if at < pos and Rules._called_on(call, {key})]
    if before:
        return max(before)[1] == "eval"
    return Rules._called_on(call, bound_eval)


def _grad_helpers(scopes: list[Scope]) -> set[str]:
    """The functions of a module that differentiate one of their own parameters (``autograd.grad(y, ...)``
    or ``y.backward()`` with ``y`` a parameter)."""
    return {
        s.name for s in scopes if s.kind == "function" and set(s.params) & (s.backward_roots | s.backwarded)
    }


def training_helper(w: Walker, loop: Loop, scope: Scope) -> str | None:
    """The function or method of this file that the loop's own body calls (``self.train_step(batch)``,
    not in a nested loop or function) and that runs a backward and an optimizer step: its name."""
    todo: list[ast.AST] = list(getattr(loop.node, "body", ()))
    while todo:
        n = todo.pop()
        if isinstance(
            n, (ast.For, ast.AsyncFor, ast.While, ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
        ):
            continue
        if isinstance(n, ast.Call):
            f = n.func
            key = None
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "self":
                key = f"{scope.cls.name}.{f.attr}" if scope.cls is not None else None
            elif isinstance(f, ast.Name):
                key = f.id
            callee = w.functions.get(key) if key is not None else None
            if callee is not None and callee is not scope and callee.trains and callee.steps:
                return ast.unparse(f)
        todo.extend(ast.iter_child_nodes(n))
    return None


def own_iadd(w: Walker, key: str, scope: Scope) -> bool:
    """Whether ``key`` (a plain name) was made by a class defined in this file that has its own
    ``__iadd__`` (ATISS's ``AverageMeter``, round BB: ``meter += loss`` stores ``loss.sum().item()``)."""
    if "." in key:
        return False
    bound = [*scope.bindings.get(key, ()), *w.module.bindings.get(key, ())]
    made = [b.value for b in bound if isinstance(b.value, ast.Call) and isinstance(b.value.func, ast.Name)]
    return any(
        w.functions.get(f"{c.func.id}.__iadd__") is not None
        for c in made
        if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)
    )


def meter_keeps(c: Rules, recv: ast.expr, scope: Scope, line: int) -> bool | None:
    """Whether the receiver's class (defined in this file) adds what ``update`` is given into an
    attribute; None when its class is not known."""
    if not isinstance(recv, ast.Name):
        return None
    bound = [b for b in (*scope.bindings.get(recv.id, ()), *c.w.module.bindings.get(recv.id, ()))]
    made = [b.value for b in bound if isinstance(b.value, ast.Call) and isinstance(b.value.func, ast.Name)]
    if not made:
        return None
    assert isinstance(made[-1], ast.Call) and isinstance(made[-1].func, ast.Name)
    update = c.w.functions.get(f"{made[-1].func.id}.update")
    if update is None:
        cls = made[-1].func.id  # an imported meter class (`AverageMeter()`, round W) keeps a running sum
        if cls in c.facts.classes:
            return False
        found = imported_update_keeps(recv.id, scope, c.w)  # its `update`, read in the project's file
        if found is not None:
            return found
        return True if METER_NAMES.search(cls) else None
    if len(update.params) < 2:
        return False
    c.flow.assume, c.flow.assume_in = {update.params[1]: TENSOR}, update
    try:
        return any(
            kind == "aug"
            and isinstance(extra, tuple)
            and str(extra[0]).startswith("self.")
            and c.flow.kind(extra[1], update, node_line(node) + 1) == TENSOR
            for kind, node, _ctx, extra in update.events
        )
    finally:
        c.flow.assume, c.flow.assume_in = {}, None


def empty_cache_per_step(c: Rules, scope: Scope, node: ast.AST) -> None:
    """TM003 for ``empty_cache()`` in a framework's ``training_step`` (see :func:`framework_step`): an HF
    Trainer subclass that empties the cache between the forward and the backward, on every step."""
    c.add(
        node,
        "TM003",
        f"`empty_cache()` in `{scope.name}`, which the training framework calls on every step: it "
        "frees nothing the program holds, only the cache the next step must allocate again (slow)",
        "optimizer-step",
        "remove it (the allocator reuses its cache), or call it where the framework runs once per "
        "epoch (`on_train_epoch_end`, a callback's `on_epoch_end`)",
    )
