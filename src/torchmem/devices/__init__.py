"""The device layer: the only code in torchmem that touches ``torch.cuda``, ``torch.mps``, ``torch.xpu``
and NVML.

:func:`resolve` turns any device specification into a ``torch.device`` with an index, choosing the kind
explicitly from what the user gave — never by trying a backend and catching its error, and never by reading a
0 from a build that does not have the kind. :func:`backend` returns the :class:`Backend` that reads it.
"""

from __future__ import annotations

from typing import Any

import torch

from torchmem._errors import (
    DeviceIndexError,
    DeviceUnavailableError,
    UnknownDeviceError,
    UnsupportedDeviceError,
)
from torchmem.devices._base import Backend, HotReading
from torchmem.devices._cpu import CpuBackend
from torchmem.devices._cuda import CudaBackend
from torchmem.devices._ledger import Ledger, ledger
from torchmem.devices._others import MpsBackend, XpuBackend

DeviceLike = str | int | torch.device | torch.Tensor | torch.nn.Module | None

_KINDS = ("cuda", "mps", "xpu", "cpu")


def cuda_available() -> bool:
    """CUDA (or ROCm) is compiled in and at least one device is visible. Does not initialise CUDA."""
    return bool(torch.cuda.is_available())


def cuda_initialized() -> bool:
    """Whether this process has initialised CUDA (reading it never initialises it)."""
    try:
        return bool(torch.cuda.is_initialized())
    except Exception:
        return False


def current_cuda_index() -> int | None:
    """The current CUDA device's index once CUDA is initialised, else ``None`` (never initialises CUDA)."""
    if not cuda_initialized():
        return None
    try:
        return int(torch.cuda.current_device())
    except Exception:
        return None


def cuda_count() -> int:
    return int(torch.cuda.device_count()) if cuda_available() else 0


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def _xpu_available() -> bool:
    xpu = getattr(torch, "xpu", None)
    return bool(xpu is not None and xpu.is_available())


def default_device() -> torch.device:
    """The device torchmem reports on when none is given: the current CUDA device, MPS, XPU, else CPU."""
    if cuda_available():
        index = torch.cuda.current_device() if torch.cuda.is_initialized() else 0
        return torch.device("cuda", index)
    if _mps_available():
        return torch.device("mps", 0)
    if _xpu_available():
        xpu: Any = torch.xpu
        return torch.device("xpu", xpu.current_device() if xpu.is_initialized() else 0)
    return torch.device("cpu")


def _from_module(module: torch.nn.Module) -> torch.device:
    devices = {t.device for t in module.parameters()} | {t.device for t in module.buffers()}
    if not devices:
        raise UnknownDeviceError(
            f"{type(module).__name__} has no parameters or buffers, so it is on no device.",
            "Pass the device explicitly, e.g. stats('cuda:0').",
        )
    if len(devices) > 1:
        names = ", ".join(sorted(str(d) for d in devices))
        raise UnknownDeviceError(
            f"{type(module).__name__} spans several devices ({names}).",
            "Pass one device explicitly.",
        )
    return devices.pop()


def resolve(spec: DeviceLike = None) -> torch.device:
    """Turn a device specification into a validated ``torch.device`` with an index where the kind has one.

    Accepts ``None`` (the default device), ``"cuda"``, ``"cuda:1"``, ``"cpu"``, ``"mps"``, an ``int``
    (a CUDA index, as torch does), a ``torch.device``, a tensor or a module.

    Raises:
        UnknownDeviceError: the string names no device, or a module has none or several.
        DeviceUnavailableError: the kind is not in this build or not on this machine.
        DeviceIndexError: the index is past the number of visible devices.
        UnsupportedDeviceError: a kind with no memory to measure (``meta``) or no backend.
    """
    if spec is None:
        return default_device()
    if isinstance(spec, torch.Tensor):
        dev = spec.device
    elif isinstance(spec, torch.nn.Module):
        dev = _from_module(spec)
    elif isinstance(spec, torch.device):
        dev = spec
    elif isinstance(spec, bool):
        raise UnknownDeviceError(f"{spec!r} is not a device.", "Use 'cuda:0', 'cpu', an index or a tensor.")
    elif isinstance(spec, int):
        if spec < 0:
            raise DeviceIndexError(f"Device index {spec} is negative.", "Use 0 or a positive index.")
        dev = torch.device("cuda", spec)
    elif isinstance(spec, str):
        text = spec.strip().lower()
        try:
            dev = torch.device(text)
        except (RuntimeError, ValueError):
            raise UnknownDeviceError(
                f"{spec!r} is not a device torch knows.",
                "Use a form like 'cuda', 'cuda:1', 'cpu', 'mps' or 'xpu:0'.",
            ) from None
    else:
        raise UnknownDeviceError(
            f"Cannot tell a device from a {type(spec).__name__}.",
            "Pass a device string, a torch.device, an index, a tensor or a module.",
        )
    return _validate(dev)


def _validate(dev: torch.device) -> torch.device:
    kind = dev.type
    if kind == "cpu":
        return torch.device("cpu")
    if kind == "cuda":
        if not torch.backends.cuda.is_built():
            raise DeviceUnavailableError(
                "This torch build has no CUDA support (a CPU-only build).",
                "Install a CUDA build of torch, or ask for 'cpu'.",
            )
        count = cuda_count()
        if count == 0:
            raise DeviceUnavailableError(
                "No CUDA device is visible to this process.",
                "Check nvidia-smi and CUDA_VISIBLE_DEVICES, or ask for 'cpu'.",
            )
        if dev.index is None:
            index = torch.cuda.current_device() if torch.cuda.is_initialized() else 0
        else:
            index = dev.index
        if index >= count:
            raise DeviceIndexError(
                f"cuda:{index} does not exist: {count} CUDA device(s) visible (cuda:0..cuda:{count - 1}).",
                "Use an index below the device count, or check CUDA_VISIBLE_DEVICES.",
            )
        return torch.device("cuda", index)
    if kind == "mps":
        if not _mps_available():
            raise DeviceUnavailableError(
                "MPS is not available on this machine (it needs Apple silicon and an MPS-enabled torch).",
                "Use 'cuda' or 'cpu'.",
            )
        return torch.device("mps", 0)
    if kind == "xpu":
        if not _xpu_available():
            raise DeviceUnavailableError("No Intel XPU is available to this torch.", "Use 'cuda' or 'cpu'.")
        xpu: Any = torch.xpu
        count = int(xpu.device_count())
        index = 0 if dev.index is None else dev.index
        if index >= count:
            raise DeviceIndexError(
                f"xpu:{index} does not exist: {count} XPU device(s) visible.",
                "Use an index below the device count, or check ZE_AFFINITY_MASK.",
            )
        return torch.device("xpu", index)
    if kind == "meta":
        raise UnsupportedDeviceError(
            "The meta device holds no memory.", "Measure the device the real tensors live on."
        )
    raise UnsupportedDeviceError(
        f"torchmem has no backend for {kind!r} devices yet.", "Supported: " + ", ".join(_KINDS) + "."
    )


def backend(spec: DeviceLike = None) -> Backend:
    """The backend that reads ``spec`` (see :func:`resolve` for what is accepted)."""
    dev = resolve(spec)
    if dev.type == "cuda":
        return CudaBackend(dev)
    if dev.type == "mps":
        return MpsBackend(dev)
    if dev.type == "xpu":
        return XpuBackend(dev)
    return CpuBackend(dev)


def visible_devices() -> list[torch.device]:
    """Every device torchmem can report on, accelerators first, then the CPU."""
    out = [torch.device("cuda", i) for i in range(cuda_count())]
    if _mps_available():
        out.append(torch.device("mps", 0))
    if _xpu_available():
        xpu: Any = torch.xpu
        out.extend(torch.device("xpu", i) for i in range(int(xpu.device_count())))
    out.append(torch.device("cpu"))
    return out


__all__ = [
    "Backend",
    "CpuBackend",
    "CudaBackend",
    "DeviceLike",
    "HotReading",
    "Ledger",
    "backend",
    "cuda_available",
    "cuda_initialized",
    "current_cuda_index",
    "default_device",
    "ledger",
    "resolve",
    "visible_devices",
]
