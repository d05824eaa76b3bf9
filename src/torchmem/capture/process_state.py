"""The process's state that makes host memory grow: read by the host watcher at its scans, never per step.

:func:`read_state` reads the switches (~2 µs: a recording profiler, anomaly mode, and through the devices
layer the CUDA allocator's history recording and ``cudnn.benchmark``); :func:`running_profilers` picks the
profiler objects that are recording out of the heap's objects, so that their holder (``prof``) can be named;
:class:`ShapeWindow` watches the shapes of convolutions for a few steps (a function mode, on only while
``cudnn.benchmark`` is on in a CUDA process and the host grows) to tell whether new shapes keep coming.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import torch

from torchmem.analysis.host_state import ProcessState
from torchmem.devices._state import cudnn_benchmark_on, memory_history_recording


def _profiler_on() -> bool:
    try:
        return bool(torch._C._autograd._profiler_enabled())
    except Exception:
        return False


def _anomaly_on() -> bool:
    try:
        return bool(torch.is_anomaly_enabled())
    except Exception:
        return False


def read_state() -> ProcessState:
    """The switches now. Never raises, never initialises CUDA.

    Example:
        >>> read_state().on()
        ()
    """
    return ProcessState(
        profiler=_profiler_on(),
        anomaly=_anomaly_on(),
        memory_history=memory_history_recording(),
        cudnn_benchmark=cudnn_benchmark_on(),
    )


def _profile_types() -> tuple[type, ...]:
    out: list[type] = []
    try:
        from torch.autograd.profiler import profile as autograd_profile

        out.append(autograd_profile)
    except Exception:  # pragma: no cover - every torch this supports has it
        pass
    try:
        from torch.profiler.profiler import _KinetoProfile

        out.append(_KinetoProfile)
    except Exception:  # pragma: no cover
        pass
    return tuple(out)


def _recording(p: Any) -> bool:
    """An autograd profiler that was entered and not exited yet (its results are set when it stops)."""
    inner = getattr(p, "profiler", p)  # torch.profiler.profile wraps an autograd profile
    if inner is None:
        return False
    return bool(getattr(inner, "entered", False)) and getattr(inner, "kineto_results", None) is None


def running_profilers(objs: Sequence[Any]) -> list[Any]:
    """The recording profiler objects among ``objs`` (a heap listing): the outer ``torch.profiler.profile``
    where there is one (what the program holds), else the autograd profile itself. C-speed filtering.
    """
    kinds = _profile_types()
    if not kinds:
        return []
    types = {t for t in set(map(type, objs)) if issubclass(t, kinds)}
    if not types:
        return []
    found = [p for p in itertools.compress(objs, map(types.__contains__, map(type, objs))) if _recording(p)]
    inner = {id(getattr(p, "profiler", None)) for p in found}
    return [p for p in found if id(p) not in inner][:4]


_CONV = ("conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d")
_CONV_ALL = (*_CONV, "convolution", "_convolution")


def _signature(args: tuple[Any, ...]) -> tuple[Any, ...] | None:
    if len(args) < 2:
        return None
    x, w = args[0], args[1]
    if not isinstance(x, torch.Tensor) or not isinstance(w, torch.Tensor) or not x.is_cuda:
        return None
    return (tuple(x.shape), tuple(w.shape), x.dtype, tuple(x.stride()))


class ShapeWindow:
    """The convolution shapes run during a few steps: :meth:`open` pushes a function mode, :meth:`mark`
    ends a step, :meth:`close` pops it, :meth:`result` says how many steps ran a shape not seen before in the
    window. Cost while open: one Python call per torch op."""

    def __init__(self) -> None:
        self.seen: set[tuple[Any, ...]] = set()
        self.steps = 0
        self.new_steps = 0
        self._new_now = False
        self.mode: Any = None
        self.error: BaseException | None = None

    def note(self, func: Any, args: tuple[Any, ...]) -> None:
        name = getattr(func, "__name__", "")
        if name not in _CONV_ALL:
            return
        sig = _signature(args)
        if sig is None or sig in self.seen:
            return
        if self.steps > 0:  # the first (partial) step only fills the set
            self._new_now = True
        self.seen.add(sig)

    def mark(self) -> None:
        """A step ended."""
        if self.mode is None:
            return
        if self._new_now:
            self.new_steps += 1
        self._new_now = False
        self.steps += 1

    def open(self) -> bool:
        mode_cls = _mode_class()
        if mode_cls is None:
            return False
        self.mode = mode_cls(self)
        self.mode.__enter__()
        return True

    def close(self) -> bool:
        """Pop the mode when it is on top of the stack (``False``: the program's mode was above it: it stays,
        inactive)."""
        mode: Any = self.mode
        self.mode = None
        if mode is None:
            return True
        mode.active = False
        ours = True
        try:
            n = torch._C._len_torch_function_stack()
            ours = n > 0 and torch._C._get_function_stack_at(n - 1) is mode
        except Exception:  # private reads: if they fail, trust the order
            pass
        if ours:
            mode.__exit__(None, None, None)
        return ours

    def result(self) -> tuple[int, int, int]:
        """``(steps watched after the first, steps that ran a new shape, distinct shapes)``."""
        return max(self.steps - 1, 0), self.new_steps, len(self.seen)


_MODE: list[Any] = []


def _mode_class() -> Any:
    if _MODE:
        return _MODE[0]
    try:
        from torch.overrides import TorchFunctionMode
    except ImportError:  # pragma: no cover
        return None

    class _ShapeMode(TorchFunctionMode):
        def __init__(self, window: ShapeWindow) -> None:
            super().__init__()
            self.window = window
            self.active = True

        def __torch_function__(
            self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
        ) -> Any:
            if self.active:
                try:
                    self.window.note(func, args)
                except Exception as exc:  # never break the user's op
                    self.window.error = exc
                    self.active = False
            return func(*args, **(kwargs or {}))

    _MODE.append(_ShapeMode)
    return _ShapeMode


__all__ = ["ShapeWindow", "read_state", "running_profilers"]
