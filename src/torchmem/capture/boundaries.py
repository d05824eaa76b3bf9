"""Find the loop a program runs: the step boundaries ``torchmem run`` counts when nobody says what a step is.

Candidates, in order of preference (the first that repeats wins; a better one found later takes over):

1. ``optimizer.step()`` of any ``torch.optim`` optimizer (torch's global step post-hook);
2. the outermost ``backward()`` / ``torch.autograd.grad()`` call (``torch.autograd.backward``/``grad`` wrapped
   for the session; a backward inside a backward, as reentrant checkpointing does, is not counted);
3. the outermost ``nn.Module`` call on the thread (the top-level forward): global module hooks while the
   loop is being found, then hooks on the top-level module(s) only, so inner modules cost nothing;
4. the next batch of a ``torch.utils.data.DataLoader``;
5. a ``generate()`` call: ``transformers``' ``GenerationMixin.generate`` once the program imports it, and a
   ``generate`` method of the program's own ``nn.Module`` (found the first time it calls the model); the
   model calls a generate makes are inside it, so they do not count as top-level forwards.

Only the thread that started the session counts. Every hook returns at once while ``torch.compile`` traces
(``torch.compiler.is_compiling()``), never raises into the program, and is removed by :meth:`stop` (a patch
is undone only if it is still the one installed). Once a kind is chosen, the costly detectors of the kinds it
outranks (the global module hooks) are removed.
"""

from __future__ import annotations

import functools
import sys
import threading
import types
import weakref
from collections.abc import Callable
from typing import Any

import torch

from torchmem._warn import ReportedOnce
from torchmem.capture.loop_calls import frame_local
from torchmem.devices._ledger import ledger

KINDS = ("optimizer", "backward", "module", "dataloader", "generate")
_RANK = {k: i for i, k in enumerate(KINDS)}
# Events of a kind before it is chosen: one call is not a loop; but an optimizer step is always a step.
REPEAT = {"optimizer": 1, "backward": 2, "module": 2, "dataloader": 2, "generate": 2}
# Module calls seen by the global hooks before they are replaced by hooks on the top-level modules.
DISCOVERY_CALLS = 4096
DISCOVERY_TOPS = 8
_GENERATE_NAMES = frozenset({"generate"})


def _compiling() -> Callable[[], bool]:
    fn: Any = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    if fn is None:  # pragma: no cover - torch < 2.3
        try:
            from torch._dynamo import is_compiling as fn
        except Exception:
            return lambda: False
    return fn  # type: ignore[no-any-return]


class StepBoundaries:
    """Counts candidate step boundaries on one thread and reports the chosen kind's to ``on_step``.

    ``on_step()`` is called at each boundary of the chosen kind; ``on_switch(kind, label)`` when a kind is
    chosen or a better one takes over (the caller restarts its per-step state); ``on_first(kind)`` at the
    first event of a kind while none is chosen (it ends the first step if the kind is chosen later).
    """

    def __init__(
        self,
        on_step: Callable[[], None],
        on_switch: Callable[[str, str], None],
        *,
        thread: int | None = None,
        on_error: Callable[[str], None] | None = None,
        on_first: Callable[[str], None] | None = None,
    ) -> None:
        self._on_step = on_step
        self._on_first = on_first
        self._on_switch = on_switch
        self._on_error = on_error
        self.thread = thread if thread is not None else threading.get_ident()
        self.counts: dict[str, int] = dict.fromkeys(KINDS, 0)
        self.other_thread: dict[str, int] = dict.fromkeys(KINDS, 0)
        self.chosen: str | None = None
        self.label = ""
        self._labels: dict[str, str] = {}
        self._undo: list[Callable[[], None]] = []
        self._module_handles: list[Any] = []
        self._narrowed = False
        self._module_calls = 0
        # Weakly: torchmem never keeps the program's model (or optimizer) alive — a deleted model is freed.
        self._tops: weakref.WeakValueDictionary[int, torch.nn.Module] = weakref.WeakValueDictionary()
        self._depth = 0  # module-call depth on the session's thread
        self._in_backward = 0
        self._in_generate = 0
        self._nested_top = False
        self._generate_code: dict[Any, bool] = {}  # caller code -> "a generate() frame is above it"
        self._patched_generate: set[Any] = set()
        self._error = ReportedOnce(
            self._say,
            "step detection: {where} failed ({error}); the program goes on",
        )
        self._stopped = False
        self._lean_backward = False  # see _choose
        self._backward_wrappers: list[tuple[Any, str, Any]] = []  # (owner, name, wrapper): _park_backward
        self.quiet = 0
        """The next events of the chosen kind that need no ``on_step()`` call (the caller's watchers read at
        none of them): only counted, in :attr:`quiet_counted` (the *quiet lane*; see :meth:`take_quiet`)."""
        self.quiet_counted = 0
        self._compiling = _compiling()

    @property
    def backward_ran(self) -> bool:
        """Whether a ``backward()``/``autograd.grad()`` call or an optimizer step was seen on any thread."""
        return any(self.counts[k] or self.other_thread[k] for k in ("backward", "optimizer"))

    # -- install / remove -------------------------------------------------------------------------
    def start(self) -> StepBoundaries:
        global _active
        _active = weakref.ref(self)
        for install in (
            self._install_optimizer,
            self._install_backward,
            self._install_modules,
            self._install_dataloader,
            self.check_imports,
        ):
            try:
                install()
            except Exception as exc:
                self._error(f"installing {install.__name__.lstrip('_')}", exc)
        return self

    def stop(self) -> None:
        """Remove every hook and undo every patch (idempotent)."""
        global _active
        self._stopped = True
        if _active is not None and _active() is self:
            _active = None
        self._remove_module_hooks()
        self._tops.clear()
        self._last_optimizer = None
        self._generate_code.clear()
        undo, self._undo = self._undo, []
        for fn in reversed(undo):
            try:
                fn()
            except Exception as exc:
                self._error("removing a hook", exc)

    def take_quiet(self) -> int:
        """The events counted in the quiet lane since the last call (they are steps the caller counts now)."""
        n, self.quiet_counted = self.quiet_counted, 0
        return n

    def end_quiet(self) -> None:
        """No more quiet events: the next one calls ``on_step()`` (an OOM is pending, the device changed)."""
        self.quiet = 0

    def _say(self, text: str) -> None:
        if self._on_error is not None:
            self._on_error(text)

    def _patch(self, owner: Any, name: str, make: Callable[[Any], Any]) -> Any:
        """``owner.<name>`` wrapped by ``make(original)`` (undone by :meth:`stop`); returns the wrapper."""
        from torchmem._patch import wrap_attribute

        made: list[Any] = []

        def flagged(original: Any) -> Any:
            wrapper = make(original)
            wrapper.__torchmem_boundary__ = True
            made.append(wrapper)
            return wrapper

        self._undo.append(wrap_attribute(owner, name, flagged))
        return made[0]

    # -- events ------------------------------------------------------------------------------------
    def _event(self, kind: str) -> None:
        if self._stopped:
            return
        try:
            self.counts[kind] += 1
            chosen = self.chosen
            if chosen == kind:
                q = self.quiet
                if q > 0:
                    self.quiet = q - 1
                    self.quiet_counted += 1
                    return
                self._on_step()
                return
            if self.counts[kind] >= REPEAT[kind] and (chosen is None or _RANK[kind] < _RANK[chosen]):
                self._choose(kind)
                self._on_step()  # this boundary ends a step of the new kind
            elif chosen is None and self.counts[kind] == 1 and self._on_first is not None:
                # Not a loop yet; if the kind is chosen at its next event, this one ended its first step
                # (3 generate() calls are 3 steps, not 2).
                self._on_first(kind)
        except Exception as exc:
            self._error("counting a step", exc)

    def _choose(self, kind: str) -> None:
        self.quiet = 0  # the lane ends: the next event of the new kind calls on_step()
        self.chosen = kind
        self.label = self._labels.get(kind) or _default_label(kind)
        # A kind better than backward counts the steps: a backward only needs counting (backward_ran) where
        # no exact ledger records sites (its engine-thread births get the call's line then).
        self._lean_backward = _RANK[kind] < _RANK["backward"]
        if self._lean_backward and not ledger().wants_sites:
            self._park_backward(True)
        if _RANK[kind] < _RANK["module"]:
            self._remove_module_hooks()  # a better boundary: the per-call module hooks only cost
            self._tops.clear()
        self._on_switch(kind, self.label)

    # -- 1. optimizer steps ------------------------------------------------------------------------
    def _install_optimizer(self) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        handle = register_optimizer_step_post_hook(self._after_optimizer_step)
        self._undo.append(handle.remove)

    def _after_optimizer_step(self, opt: Any = None, *_a: Any, **_k: Any) -> None:
        if threading.get_ident() != self.thread:
            self.other_thread["optimizer"] += 1
            return
        ref = self._last_optimizer
        if ref is None or ref() is not opt:
            try:
                self._last_optimizer = weakref.ref(opt) if opt is not None else None
            except TypeError:  # not weak-referenceable: not kept
                self._last_optimizer = None
        if self.chosen == "optimizer" and not self._stopped:
            # the chosen kind's event, every step of a training loop: the step straight away (or, in the
            # quiet lane, only counted: the per-step hot path of a long run)
            self.counts["optimizer"] += 1
            q = self.quiet
            if q > 0:
                self.quiet = q - 1
                self.quiet_counted += 1
                return
            try:
                self._on_step()
            except Exception as exc:
                self._error("counting a step", exc)
            return
        self._event("optimizer")

    _last_optimizer: weakref.ref[Any] | None = None

    @property
    def last_optimizer(self) -> Any:
        """The optimizer that stepped last, while the program keeps it (``None`` once it is gone)."""
        ref = self._last_optimizer
        return ref() if ref is not None else None

    # -- 2. backward -------------------------------------------------------------------------------
    def _install_backward(self) -> None:
        import torch.autograd as ag

        def make(original: Any) -> Any:
            return self._outermost_call(
                original, "backward", "_in_backward", skip_compiling=True, engine_call=True
            )

        self._backward_wrappers = [(ag, name, self._patch(ag, name, make)) for name in ("backward", "grad")]
        self._undo.append(ledger().on_sites(self._sites_wanted))

    def _park_backward(self, park: bool) -> None:
        """Take the ``backward``/``grad`` wrappers out (``park``: the originals back in place) or put them
        back. Once a better boundary counts the steps they only count calls (``_lean_backward``), a cost at
        every step for nothing, so they are out, except while the exact ledger records birth sites (engine
        threads' births get the call's line from them: :meth:`_sites_wanted`). Where the program rebound
        the name meanwhile, it stays the program's."""
        for owner, name, wrapper in self._backward_wrappers:
            now = owner.__dict__.get(name)
            if park and now is wrapper:
                setattr(owner, name, wrapper.__wrapped__)
            elif not park and now is wrapper.__wrapped__ and not self._stopped:
                setattr(owner, name, wrapper)

    def _sites_wanted(self, on: bool) -> None:
        """The ledger started (``on``) or stopped recording birth sites: the wrappers in or out."""
        if self._lean_backward:
            self._park_backward(not on)

    # -- 3. top-level module calls -----------------------------------------------------------------
    def _install_modules(self) -> None:
        from torch.nn.modules import module as mm

        pre = mm.register_module_forward_pre_hook(self._module_pre)
        try:
            post = mm.register_module_forward_hook(self._module_post, always_call=True)
        except TypeError:  # pragma: no cover - torch without always_call
            post = mm.register_module_forward_hook(self._module_post)
        self._module_handles = [pre, post]

    def _remove_module_hooks(self) -> None:
        handles, self._module_handles = self._module_handles, []
        for h in handles:
            try:
                h.remove()
            except Exception:
                pass

    def _module_pre(self, module: Any, _args: Any) -> None:
        if threading.get_ident() != self.thread or self._compiling():
            return
        try:
            depth = self._depth
            self._depth = depth + 1
            if depth or self._in_generate or self._in_backward:
                return
            if not self._narrowed:
                self._module_calls += 1
                self.check_imports()
                self._nested_top = self._check_generate(module)
        except Exception as exc:
            self._error("a module pre-hook", exc)

    def _module_post(self, module: Any, _args: Any, _out: Any) -> None:
        if threading.get_ident() != self.thread or self._compiling():
            return
        try:
            self._depth = depth = max(self._depth - 1, 0)
            if depth or self._in_generate or self._in_backward:
                return
            if self._nested_top:  # a model call made by a generate() that was running before its patch
                self._nested_top = False
                return
            if sys.exc_info()[0] is not None:  # the forward raised (always_call): not the end of a step
                return
            if not self._narrowed:
                # One step per iteration even when an iteration makes several top-level calls (the model,
                # then the loss module): the boundary is the call of the top-level module with the most
                # parameters, fixed once a top-level module is called a second time (one iteration seen).
                key = id(module)
                repeat = key in self._tops
                self._tops.setdefault(key, module)
                best = self._best_top()
                if repeat or len(self._tops) > DISCOVERY_TOPS or self._module_calls >= DISCOVERY_CALLS:
                    self._narrow(best)
                if best is not module:
                    return
                self._labels["module"] = f"top-level {type(module).__name__}() call"
            self._event("module")
        except Exception as exc:
            self._error("a module hook", exc)

    def _best_top(self) -> Any:
        best, best_n = None, -1
        for m in self._tops.values():
            try:
                n = sum(p.numel() for p in m.parameters())
            except Exception:
                n = 0
            if n > best_n:  # the first seen wins a tie
                best, best_n = m, n
        return best

    def _narrow(self, main: Any) -> None:
        """Replace the global hooks (every module call pays) by hooks on the main top-level module."""
        if self._narrowed or self._stopped:
            return
        self._narrowed = True
        self._remove_module_hooks()
        self._tops.clear()
        if main is None or (self.chosen is not None and _RANK[self.chosen] < _RANK["module"]):
            return
        handles = [main.register_forward_pre_hook(self._module_pre)]
        try:
            handles.append(main.register_forward_hook(self._module_post, always_call=True))
        except TypeError:  # pragma: no cover
            handles.append(main.register_forward_hook(self._module_post))
        self._module_handles = handles

    def _check_generate(self, module: Any) -> bool:
        """Whether a top-level model call is made by a ``generate()`` method (then that method is patched
        to count as the boundary, and the model calls inside it are not top-level forwards)."""
        f: types.FrameType | None = sys._getframe(2)
        # The caller of the module: the first frame outside torch.nn.
        while f is not None and f.f_code.co_filename.startswith(_NN_DIR):
            f = f.f_back
        if f is None:
            return False
        code = f.f_code
        known = self._generate_code.get(code)
        if known is not None:
            return known
        g: types.FrameType | None = f
        for _ in range(8):
            if g is None:
                break
            if g.f_code.co_name in _GENERATE_NAMES:
                owner = frame_local(g, "self")
                if isinstance(owner, torch.nn.Module):
                    self._generate_code[code] = True
                    self._patch_generate(type(owner), g.f_code)
                    return True
            g = g.f_back
        self._generate_code[code] = False
        return False

    def _patch_generate(self, cls: type, code: Any) -> None:
        for klass in cls.__mro__:
            fn = klass.__dict__.get("generate")
            inner: Any = fn
            for _ in range(4):  # decorated (torch.no_grad() and the like): compare the innermost code
                if getattr(inner, "__code__", None) is code or not hasattr(inner, "__wrapped__"):
                    break
                inner = inner.__wrapped__
            if getattr(inner, "__code__", None) is code and klass not in self._patched_generate:
                self._patched_generate.add(klass)
                self._labels["generate"] = f"{klass.__name__}.generate() call"
                self._patch(klass, "generate", self._generate_wrapper)
                return

    def _generate_wrapper(self, original: Any) -> Any:
        return self._outermost_call(original, "generate", "_in_generate")

    def _outermost_call(
        self, original: Any, kind: str, depth: str, skip_compiling: bool = False, engine_call: bool = False
    ) -> Any:
        """``original`` wrapped to count a ``kind`` boundary when its outermost call on the session's thread
        returns (a call that raises is not a boundary); ``depth`` names the nesting counter it keeps.
        ``engine_call``: the call allocates on engine threads (CUDA's backward), so while the exact ledger
        records sites, births there are given this call's line."""
        boundaries = self
        led = ledger()

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if boundaries._lean_backward and engine_call and not led.active:
                # the steps are counted at a better boundary (the optimizer step): no event, no nesting
                boundaries.counts[kind] += 1
                return original(*args, **kwargs)
            if threading.get_ident() != boundaries.thread:
                if kind == "backward":
                    boundaries.other_thread[kind] += (
                        1  # a backward ran (``backward_ran``), not a boundary here
                    )
                return original(*args, **kwargs)
            if skip_compiling and boundaries._compiling():
                return original(*args, **kwargs)
            setattr(boundaries, depth, getattr(boundaries, depth) + 1)
            entered = engine_call and led.active and led.wants_sites
            caller = led.enter_engine_call() if entered else None
            try:
                result = original(*args, **kwargs)
            finally:
                if entered:
                    led.leave_engine_call(caller)
                setattr(boundaries, depth, getattr(boundaries, depth) - 1)
            if getattr(boundaries, depth) == 0:
                boundaries._event(kind)
            return result

        return wrapper

    # -- 4. DataLoader batches ---------------------------------------------------------------------
    def _install_dataloader(self) -> None:
        from torch.utils.data import dataloader as dl

        boundaries = self

        def make(original: Any) -> Any:
            def __next__(it: Any) -> Any:
                if threading.get_ident() == boundaries.thread and not boundaries._in_generate:
                    boundaries._event("dataloader")
                return original(it)

            return __next__

        self._patch(dl._BaseDataLoaderIter, "__next__", make)

    # -- 5. transformers' generate ------------------------------------------------------------------
    def check_imports(self) -> None:
        """Patch ``transformers``' ``GenerationMixin.generate`` once the program has imported it (called
        at start and by the session's sampler)."""
        if self._stopped:
            return
        mod = sys.modules.get("transformers.generation.utils")
        cls = getattr(mod, "GenerationMixin", None) if mod is not None else None
        if cls is None or cls in self._patched_generate or "generate" not in cls.__dict__:
            return
        self._patched_generate.add(cls)
        self._labels.setdefault("generate", "generate() call")
        self._patch(cls, "generate", self._generate_wrapper)

    # -- reporting ---------------------------------------------------------------------------------
    def describe(self) -> str:
        """What was counted, for the notes: ``"optimizer step: 40, backward() call: 40, ..."``."""
        seen = [f"{_default_label(k)}: {n}" for k, n in self.counts.items() if n]
        return ", ".join(seen) if seen else "none"


_active: weakref.ref[StepBoundaries] | None = None  # the boundaries counting now (torchmem run)


def backward_ran() -> bool | None:
    """Whether the program under ``torchmem run`` ran a backward (or an optimizer step) so far; ``None``
    where no boundaries are counting (``torchmem.watch`` in the user's code: not known).

    Example:
        >>> backward_ran() is None  # nothing is counting
        True
    """
    b = _active() if _active is not None else None
    return None if b is None or b._stopped else b.backward_ran


_NN_DIR = __import__("os").path.join(__import__("os").path.dirname(torch.nn.__file__), "")


def _default_label(kind: str) -> str:
    return {
        "optimizer": "optimizer step",
        "backward": "backward() call",
        "module": "top-level module call",
        "dataloader": "DataLoader batch",
        "generate": "generate() call",
    }[kind]


__all__ = ["KINDS", "StepBoundaries", "backward_ran"]
