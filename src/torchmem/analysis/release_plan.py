"""Release planning: which tensors do these objects hold, in which role, under which name.

Pure over the live object graph: it reads objects and returns a plan; it changes nothing.
"""

from __future__ import annotations

import dataclasses
import sys
import types
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from torchmem._gc import items_now

_ATOMIC = (type(None), bool, int, float, complex, str, bytes, bytearray, range, type, types.ModuleType)
_MAX_OBJECTS = 2_000_000

# Roles, in the order the report lists them.
PARAMETER = "parameter"
GRADIENT = "gradient"
BUFFER = "buffer"
OPTIMIZER_STATE = "optimizer state"
TENSOR = "tensor"
EXCEPTION_LOCAL = "exception frame local"


@dataclass
class PlannedTensor:
    tensor: torch.Tensor
    role: str
    name: str
    owner: Any = None  # the module (parameter, buffer), optimizer (state) or parameter (gradient)
    owner_key: Any = None  # buffer name / (param, state key)


@dataclass
class ReleasePlan:
    tensors: dict[int, PlannedTensor] = field(default_factory=dict)
    modules: list[tuple[str, torch.nn.Module]] = field(default_factory=list)
    optimizers: list[tuple[str, torch.optim.Optimizer]] = field(default_factory=list)
    graphs: list[Any] = field(default_factory=list)
    exceptions: list[BaseException] = field(default_factory=list)
    tracebacks: list[types.TracebackType] = field(default_factory=list)
    visited: set[int] = field(default_factory=set)  # ids of every object that belongs to the release set
    skipped: list[str] = field(default_factory=list)
    skipped_other_device: list[PlannedTensor] = field(default_factory=list)
    truncated: bool = False


def plan_release(
    objs: Iterable[Any], device: torch.device | None = None, names: Iterable[str] = ()
) -> ReleasePlan:
    """Walk ``objs`` and list every tensor they hold (on ``device``, or on any device when ``None``).

    Modules give parameters, gradients, buffers and tensors kept in attributes or in their hooks' closures;
    optimizers give their state and their parameters (with gradients); exceptions and tracebacks give
    the locals of their frames; containers, dataclasses, ``__dict__`` and ``__slots__`` are walked at any
    depth. ``None``, numbers and strings are listed in ``skipped``.
    """
    plan = ReleasePlan()
    name_list = list(names)
    for i, obj in enumerate(objs):
        label = name_list[i] if i < len(name_list) else f"arg{i}"
        if isinstance(obj, _ATOMIC):
            plan.skipped.append(f"{label}: {type(obj).__name__} holds no tensors")
            continue
        _Walker(plan, device).walk(obj, label)
    return plan


class _Walker:
    def __init__(self, plan: ReleasePlan, device: torch.device | None) -> None:
        self.plan = plan
        self.device = device

    def _seen(self, obj: Any) -> bool:
        i = id(obj)
        if i in self.plan.visited:
            return True
        if len(self.plan.visited) >= _MAX_OBJECTS:
            self.plan.truncated = True
            return True
        self.plan.visited.add(i)
        return False

    def add_tensor(self, t: torch.Tensor, role: str, name: str, owner: Any = None, key: Any = None) -> None:
        if id(t) in self.plan.tensors:
            return
        self.plan.visited.add(id(t))
        pt = PlannedTensor(t, role, name, owner, key)
        if t.device.type == "meta":
            return
        if t.layout != torch.strided:
            self.plan.skipped.append(f"{name}: {t.layout} tensors are not released")
            return
        if self.device is not None and t.device != self.device:
            self.plan.skipped_other_device.append(pt)
            return
        self.plan.tensors[id(t)] = pt
        if role in (PARAMETER, TENSOR) and t.is_leaf and t.grad is not None:
            self.add_tensor(t.grad, GRADIENT, f"{name}.grad", owner=t)

    def walk(self, obj: Any, name: str) -> None:
        # Iterative depth-first walk; the stack holds (object, readable name).
        stack: list[tuple[Any, str]] = [(obj, name)]
        while stack:
            o, n = stack.pop()
            if type(o) in _PROXIES:
                # A weak proxy (Lightning's trainer holds some) is not ownership, and it passes isinstance
                # checks for what it points to: what it points to is released where it is held.
                continue
            if isinstance(o, torch.Tensor):
                self.add_tensor(o, PARAMETER if isinstance(o, torch.nn.Parameter) else TENSOR, n)
                continue
            if isinstance(o, _ATOMIC) or self._seen(o):
                continue
            if isinstance(o, torch.nn.Module):
                self._module(o, n, stack)
            elif isinstance(o, torch.optim.Optimizer):
                self._optimizer(o, n, stack)
            elif isinstance(o, BaseException):
                self.plan.exceptions.append(o)
                if o.__traceback__ is not None:
                    stack.append((o.__traceback__, f"{n}.__traceback__"))
                for link in ("__cause__", "__context__"):
                    nxt = getattr(o, link, None)
                    if nxt is not None:
                        stack.append((nxt, f"{n}.{link}"))
            elif isinstance(o, types.TracebackType):
                self._traceback(o, n, stack)
            elif isinstance(o, dict):
                for k, v in list(o.items()):
                    if isinstance(k, torch.Tensor):
                        stack.append((k, f"{n}<key>"))
                    stack.append((v, f"{n}[{k!r}]" if isinstance(k, (str, int)) else f"{n}[...]"))
            elif isinstance(o, (list, tuple)):
                for i, v in enumerate(o):
                    stack.append((v, f"{n}[{i}]"))
            elif isinstance(o, (set, frozenset)):
                for v in list(o):
                    stack.append((v, f"{n}{{...}}"))
            elif isinstance(o, types.FunctionType):
                self._function(o, n, stack)
            elif isinstance(o, types.MethodType):
                stack.append((o.__self__, f"{n}.__self__"))
            elif _is_cuda_graph(o):
                self.plan.graphs.append(o)
            else:
                self._object(o, n, stack)

    def _mark(self, *objs: Any) -> None:
        """Internal containers of a released object belong to the release set too."""
        for o in objs:
            self.plan.visited.add(id(o))

    def _module(self, m: torch.nn.Module, n: str, stack: list[tuple[Any, str]]) -> None:
        self.plan.modules.append((n, m))
        for pname, p in m.named_parameters(remove_duplicate=True):
            self.add_tensor(p, PARAMETER, f"{n}.{pname}")
        for sub_name, sub in m.named_modules(remove_duplicate=True):
            if sub is not m and not self._seen(sub):
                self.plan.modules.append((f"{n}.{sub_name}", sub))
            self._mark(vars(sub), sub._parameters, sub._buffers, sub._modules)
            for bname, b in list(sub._buffers.items()):
                if b is not None:
                    self.add_tensor(
                        b, BUFFER, f"{n}.{sub_name}.{bname}" if sub_name else f"{n}.{bname}", sub, bname
                    )
            # Tensors kept as plain attributes and in hooks' closures.
            for attr, v in items_now(vars(sub)):
                if attr in ("_parameters", "_buffers", "_modules"):
                    continue
                prefix = f"{n}.{sub_name}" if sub_name else n
                stack.append((v, f"{prefix}.{attr}"))

    def _optimizer(self, opt: torch.optim.Optimizer, n: str, stack: list[tuple[Any, str]]) -> None:
        self.plan.optimizers.append((n, opt))
        self._mark(vars(opt), opt.state, opt.param_groups, *opt.param_groups)
        self._mark(*(g["params"] for g in opt.param_groups), *opt.state.values())
        for gi, group in enumerate(opt.param_groups):
            for pi, p in enumerate(group["params"]):
                self.add_tensor(p, PARAMETER, f"{n}.param_groups[{gi}]['params'][{pi}]")
        for p, state in list(opt.state.items()):
            pname = self.plan.tensors[id(p)].name if id(p) in self.plan.tensors else "param"
            if isinstance(state, dict):
                for k, v in list(state.items()):
                    if isinstance(v, torch.Tensor):
                        self.add_tensor(v, OPTIMIZER_STATE, f"{n}.state[{pname}][{k!r}]", opt, (p, k))
        for attr, v in items_now(vars(opt)):
            if attr not in ("state", "param_groups"):
                stack.append((v, f"{n}.{attr}"))

    def _traceback(self, tb: types.TracebackType, n: str, stack: list[tuple[Any, str]]) -> None:
        self.plan.tracebacks.append(tb)
        # Only frames that have finished: a running frame (the caller's own, a notebook cell's module
        # level) holds the program's live variables, not the exception's leftovers.
        running: set[int] = set()
        f: types.FrameType | None = sys._getframe()
        while f is not None:
            running.add(id(f))
            f = f.f_back
        cur: types.TracebackType | None = tb
        while cur is not None:
            frame = cur.tb_frame
            if id(frame) in running or frame.f_code.co_name == "<module>":
                cur = cur.tb_next
                continue
            where = (
                f"{frame.f_code.co_filename.rsplit('/', 1)[-1]}:{cur.tb_lineno} in {frame.f_code.co_name}()"
            )
            # Only tensors the frame holds directly or in a plain container: `self` and the caller's
            # objects are live program state, not the exception's leftovers. These tensors are not emptied;
            # clearing the frames drops the exception's references and frees what nothing else holds.
            for k, v in list(frame.f_locals.items()):
                items = [v] if isinstance(v, torch.Tensor) else []
                if isinstance(v, (list, tuple)):
                    items = [x for x in list(v) if isinstance(x, torch.Tensor)]
                elif isinstance(v, dict):
                    items = [x for x in list(v.values()) if isinstance(x, torch.Tensor)]
                for x in items:
                    self.add_tensor(x, EXCEPTION_LOCAL, f"frame {where} local {k!r}")
            cur = cur.tb_next

    def _function(self, f: types.FunctionType, n: str, stack: list[tuple[Any, str]]) -> None:
        if f.__closure__:
            for var, cell in zip(f.__code__.co_freevars, f.__closure__):
                try:
                    stack.append((cell.cell_contents, f"{n}.<closure {var!r}>"))
                except ValueError:  # empty cell
                    pass
        if f.__defaults__:
            stack.append((f.__defaults__, f"{n}.__defaults__"))

    def _object(self, o: Any, n: str, stack: list[tuple[Any, str]]) -> None:
        if dataclasses.is_dataclass(o) and not isinstance(o, type):
            for fld in dataclasses.fields(o):
                stack.append((getattr(o, fld.name, None), f"{n}.{fld.name}"))
        d = getattr(o, "__dict__", None)
        if isinstance(d, dict):
            for k, v in items_now(d):
                stack.append((v, f"{n}.{k}"))
        for cls in type(o).__mro__:
            for slot in getattr(cls, "__slots__", ()) or ():
                if isinstance(slot, str) and slot not in ("__dict__", "__weakref__") and hasattr(o, slot):
                    stack.append((getattr(o, slot), f"{n}.{slot}"))


_PROXIES = (weakref.ProxyType, weakref.CallableProxyType)


def _is_cuda_graph(o: Any) -> bool:
    graph_cls = getattr(getattr(torch, "cuda", None), "CUDAGraph", None)
    return graph_cls is not None and isinstance(o, graph_cls)


def storage_bytes(t: torch.Tensor) -> int:
    try:
        return int(t.untyped_storage().nbytes())
    except (RuntimeError, NotImplementedError):
        return 0


__all__ = ["PlannedTensor", "ReleasePlan", "plan_release", "storage_bytes"]
