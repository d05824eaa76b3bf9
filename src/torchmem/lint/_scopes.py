"""What the walk of a module records (:mod:`torchmem.lint._walk`): loops, scopes, bindings, the context of
each event, the module's facts. Pure standard library: no torch import."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TypeAlias

Branch: TypeAlias = tuple[tuple[int, int], ...]


# -- what the walk records ----------------------------------------------------------------------------------
@dataclass(eq=False)
class Loop:
    node: ast.AST
    parent: Loop | None
    direct_trains: bool = False  # a backward/optimizer step in this loop, not only in a nested one
    trains: bool = False
    steps: bool = False  # an optimizer step in this loop or a nested one (what it keeps outlives a step)
    rebound: set[str] = field(default_factory=set)
    cleared: set[str] = field(default_factory=set)
    model_call: ast.Call | None = None  # the first model call not under no_grad
    model_calls: list[ast.Call] = field(default_factory=list)  # every model call not under no_grad
    backwards: list[tuple[tuple[int, int], bool]] = field(default_factory=list)  # (position, retains)
    # name -> line: bound from its own previous value (never one of this loop's or an inner loop's targets)
    carried: dict[str, int] = field(default_factory=dict)
    detached: set[str] = field(default_factory=set)  # names cut from their graph in the loop
    targets: set[str] = field(default_factory=set)  # names the for statement binds each iteration
    branch: Branch = ()  # the arms of the `if` statements the loop is written in

    def remade(self, keys: list[str]) -> bool:
        """Whether the loop binds one of ``keys`` (or the object it is an attribute of) anew."""
        return any(k in self.rebound or k.split(".", 1)[0] in self.rebound for k in keys if k)

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
    trial: ast.AST | None = None  # in an `except` handler: the `try` statement it handles


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
    branch: Branch = ()  # the arms of the `if` statements the binding is written in


@dataclass(eq=False)
class Scope:
    node: ast.AST
    name: str
    cls: ast.ClassDef | None
    kind: str  # "module", "function", "lambda"
    bindings: dict[str, list[Binding]] = field(default_factory=dict)
    backwarded: set[str] = field(default_factory=set)
    backward_lines: dict[str, list[int]] = field(default_factory=dict)  # the lines each name is backwarded at
    no_grad_all: bool = False  # decorated with no_grad / set_grad_enabled(False) as a statement
    grad_handled: bool = False  # any no_grad / inference_mode / set_grad_enabled in the scope
    enable_grad: bool = False
    trains: bool = False
    # one optimizer step per call: `opt.step()` (a DeepSpeed engine's `engine.step()`) outside any loop of it
    steps: bool = False
    backwarded_engines: set[str] = field(default_factory=set)  # `engine` of `engine.backward(loss)`
    eval_called: bool = False
    eval_receivers: set[str] = field(default_factory=set)  # `model` of `model.eval()`, `model.cuda().eval()`
    eval_branches: dict[str, list[Branch]] = field(default_factory=dict)  # where each receiver's eval() is
    # `model.train()` / `model.eval()` inside a loop: (receiver, loop, (line, col), "train" or "eval")
    modes_in_loops: list[tuple[str, Loop, tuple[int, int], str]] = field(default_factory=list)
    # every `model.train()` / `model.eval()` of the scope: (receiver, (line, col), "train" or "eval")
    modes: list[tuple[str, tuple[int, int], str]] = field(default_factory=list)
    frozen: set[str] = field(default_factory=set)  # `model` of `model.requires_grad_(False)` (no graph)
    events: list[tuple[str, ast.AST, Ctx, object]] = field(default_factory=list)
    eval_loops: list[Loop] = field(default_factory=list)  # outermost loops with a model call, in order
    grad_maybe: bool = False  # set_grad_enabled(<a variable>): autograd may be off, not known
    params: list[str] = field(default_factory=list)
    declared: set[str] = field(default_factory=set)  # names declared `nonlocal` or `global`
    returns: list[tuple[ast.expr, int, bool]] = field(default_factory=list)  # (value, line, under no_grad)
    backward_roots: set[str] = field(default_factory=set)  # names inside what `.backward()` runs on
    removes_handles: bool = False  # some `handle.remove()` in the scope
    callees: set[str] = field(default_factory=set)  # functions it calls by name: `f(...)`, `self.f(...)`
    annotations: dict[str, ast.expr] = field(default_factory=dict)  # parameter -> its annotation


@dataclass
class ModuleFacts:
    """What the walk learns of a whole file."""

    rank_setup: bool = False
    torch_imported: bool = False  # the file imports torch or a framework built on it
    cuda_graphs: bool = False
    grad_inplace: bool = False
    start_method: str | None = None  # the constant given to set_start_method, "?" when not a constant
    collate_names: set[str] = field(default_factory=set)
    collate_elsewhere: set[str] = field(default_factory=set)  # given as `collate_fn=` to no loader
    worker_names: set[str] = field(default_factory=set)
    worker_lambdas: set[int] = field(default_factory=set)
    called_under_no_grad: set[str] = field(default_factory=set)
    # (loop, receiver, method) of each ``memory.clear_memory()`` called in a loop with no argument: a method
    # of the file's classes that empties attributes empties ``memory``'s (resolved before the rules run)
    loop_method_calls: list[tuple[Loop, str, str]] = field(default_factory=list)
    classes: dict[str, ast.ClassDef] = field(default_factory=dict)
    foreign_names: set[str] = field(default_factory=set)  # names imported from a non-torch runtime
    other_framework: bool = False  # the file imports another deep-learning framework (MXNet, TensorFlow, ...)
    # names bound to torch.autograd.grad (`from torch.autograd import grad [as g]`): a bare `grad(...)` is it
    grad_names: set[str] = field(default_factory=set)
    # names imported from an adversarial-attack library (`from advertorch.attacks import LinfPGDAttack`)
    attack_names: set[str] = field(default_factory=set)
    # every name an import statement binds (`from labml import tracker`: a package's API, not a container)
    imported_names: set[str] = field(default_factory=set)

    @property
    def other_world(self) -> bool:
        """The file works with another framework and imports nothing of torch's: its `autograd`, `backward()`
        and arrays are not torch's (round P: FedML's MXNet trainer, `mxnet.autograd.record()`)."""
        return self.other_framework and not self.torch_imported
