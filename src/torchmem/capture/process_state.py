"""The process's state that makes host memory grow: read by the host watcher at its scans, never per step.

:func:`read_state` reads the switches (~2 µs: a recording profiler, anomaly mode, and through the devices
layer the CUDA allocator's history recording and ``cudnn.benchmark``); :func:`running_profilers` picks the
profiler objects that are recording out of the heap's objects, so that their holder (``prof``) can be named;
:class:`ShapeWindow` watches the shapes the convolution modules run for a few steps (a global module forward
pre-hook, on only while ``cudnn.benchmark`` is on in a CUDA process and the host grows) to tell whether new
shapes keep coming.
"""

from __future__ import annotations

from typing import Any

import torch

from torchmem.analysis.host_state import ProcessState
from torchmem.capture.host_walk import Heap, as_heap
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


def running_profilers(objs: Heap | list[Any]) -> list[Any]:
    """The recording profiler objects among ``objs`` (a heap listing): the outer ``torch.profiler.profile``
    where there is one (what the program holds), else the autograd profile itself. C-speed filtering.
    """
    kinds = _profile_types()
    if not kinds:
        return []
    heap = as_heap(objs)
    types = {t for t in heap.types() if issubclass(t, kinds)}
    if not types:
        return []
    found = [p for p in heap.of_types(types) if _recording(p)]
    inner = {id(getattr(p, "profiler", None)) for p in found}
    return [p for p in found if id(p) not in inner][:4]


def _signature(module: Any, args: tuple[Any, ...], devices: tuple[str, ...]) -> tuple[Any, ...] | None:
    x = args[0] if args else None
    if not isinstance(x, torch.Tensor) or x.device.type not in devices:
        return None
    weight = getattr(module, "weight", None)
    w = tuple(weight.shape) if isinstance(weight, torch.Tensor) else ()
    return (type(module).__name__, tuple(x.shape), tuple(x.stride()), w, x.dtype)


class ShapeWindow:
    """The shapes the convolution modules run during a few steps: :meth:`open` registers a global module
    forward pre-hook (removed by :meth:`close` at any time, also from inside a torch call), :meth:`mark` ends
    a step, :meth:`result` says how many steps ran a shape not seen before in the window. Cost while open:
    torch's slower module-call path with one hook, a few microseconds per convolution.

    Args:
        devices: The device types whose convolutions count (cuDNN's: ``("cuda",)``).
    """

    def __init__(self, devices: tuple[str, ...] = ("cuda",)) -> None:
        self.devices = devices
        self.seen: set[tuple[Any, ...]] = set()
        self.steps = 0
        self.new_steps = 0
        self._new_now = False
        self._handle: Any = None
        self.error: BaseException | None = None

    def note(self, module: Any, args: tuple[Any, ...]) -> None:
        if not isinstance(module, torch.nn.modules.conv._ConvNd):
            return
        sig = _signature(module, args, self.devices)
        if sig is None or sig in self.seen:
            return
        if self.steps > 0:  # the first (partial) step only fills the set
            self._new_now = True
        self.seen.add(sig)

    def mark(self) -> None:
        """A step ended."""
        if self._handle is None:
            return
        if self._new_now:
            self.new_steps += 1
        self._new_now = False
        self.steps += 1

    def open(self) -> bool:
        def hook(module: Any, args: tuple[Any, ...]) -> None:
            if self._handle is None:
                return
            try:
                self.note(module, args)
            except Exception as exc:  # never break the user's forward
                self.error = exc
                self.close()

        try:
            from torch.nn.modules.module import register_module_forward_pre_hook
        except ImportError:  # pragma: no cover - every torch this supports has it
            return False
        self._handle = register_module_forward_pre_hook(hook)
        return True

    def close(self) -> bool:
        """Remove the hook (idempotent)."""
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.remove()
        return True

    def result(self) -> tuple[int, int, int]:
        """``(steps watched after the first, steps that ran a new shape, distinct shapes)``."""
        return max(self.steps - 1, 0), self.new_steps, len(self.seen)


__all__ = ["ShapeWindow", "read_state", "running_profilers"]
