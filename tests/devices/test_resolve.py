"""Device resolution on a CPU-only torch build: what resolves, and which error everything else raises."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import torchmem
from torchmem.devices import CpuBackend, backend, default_device, resolve, visible_devices

pytestmark = pytest.mark.skipif(
    torch.backends.cuda.is_built(), reason="these expectations are for a CPU-only torch build"
)

CPU = torch.device("cpu")


class _WithBuffer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("b", torch.zeros(2))


CPU_SPECS: list[tuple[str, Any]] = [
    ("None", None),
    ("str", "cpu"),
    ("str-index", "cpu:0"),
    ("padded-upper", "CPU "),
    ("padded-mixed", "  Cpu\t"),
    ("device", torch.device("cpu")),
    ("device-index", torch.device("cpu", 0)),
    ("tensor", torch.ones(3)),
    ("module", torch.nn.Linear(2, 2)),
    ("module-buffer-only", _WithBuffer()),
]


@pytest.mark.parametrize("spec", [s for _, s in CPU_SPECS], ids=[i for i, _ in CPU_SPECS])
def test_cpu_specs_resolve_to_cpu(spec: Any) -> None:
    dev = resolve(spec)
    assert isinstance(dev, torch.device)
    assert dev == CPU
    assert dev.type == "cpu" and dev.index is None


@pytest.mark.parametrize("spec", [s for _, s in CPU_SPECS], ids=[i for i, _ in CPU_SPECS])
def test_cpu_specs_get_the_cpu_backend(spec: Any) -> None:
    be = backend(spec)
    assert isinstance(be, CpuBackend)
    assert be.kind == "cpu"
    assert be.label == "cpu"
    assert be.platform == "cpu"
    assert be.device == CPU
    assert be.is_initialized() is True


def test_default_and_visible_devices_on_a_cpu_only_build() -> None:
    assert default_device() == CPU
    assert visible_devices() == [CPU]


def test_resolve_does_not_initialise_cuda() -> None:
    resolve(None)
    resolve("cpu")
    with pytest.raises(torchmem.DeviceUnavailableError):
        resolve("cuda")
    assert torch.cuda.is_initialized() is False


def _check_error(exc: torchmem.TorchmemError) -> None:
    assert isinstance(exc, torchmem.TorchmemError)
    assert isinstance(exc, torchmem.DeviceError)
    assert exc.message.strip()
    assert exc.hint.strip(), f"{type(exc).__name__} has an empty hint"
    assert exc.exit_code == 2


ERROR_CASES: list[tuple[str, Any, type[torchmem.TorchmemError]]] = [
    ("gpu", "gpu", torchmem.UnknownDeviceError),
    ("cuda:x", "cuda:x", torchmem.UnknownDeviceError),
    ("empty", "", torchmem.UnknownDeviceError),
    ("blank", "   ", torchmem.UnknownDeviceError),
    ("object", object(), torchmem.UnknownDeviceError),
    ("float", 1.5, torchmem.UnknownDeviceError),
    ("True", True, torchmem.UnknownDeviceError),
    ("False", False, torchmem.UnknownDeviceError),
    ("no-param-module", torch.nn.ReLU(), torchmem.UnknownDeviceError),
    ("cuda", "cuda", torchmem.DeviceUnavailableError),
    ("cuda:0", "cuda:0", torchmem.DeviceUnavailableError),
    ("CUDA:1 padded", " CUDA:1 ", torchmem.DeviceUnavailableError),
    ("int-0", 0, torchmem.DeviceUnavailableError),
    ("int-3", 3, torchmem.DeviceUnavailableError),
    ("device-cuda", torch.device("cuda", 0), torchmem.DeviceUnavailableError),
    ("mps", "mps", torchmem.DeviceUnavailableError),
    ("int--1", -1, torchmem.DeviceIndexError),
    ("meta", "meta", torchmem.UnsupportedDeviceError),
    ("meta-tensor", torch.empty(2, device="meta"), torchmem.UnsupportedDeviceError),
    ("meta-device", torch.device("meta"), torchmem.UnsupportedDeviceError),
]


@pytest.mark.parametrize(
    ("spec", "error"), [(s, e) for _, s, e in ERROR_CASES], ids=[i for i, _, _ in ERROR_CASES]
)
def test_errors(spec: Any, error: type[torchmem.TorchmemError]) -> None:
    with pytest.raises(error) as info:
        resolve(spec)
    assert type(info.value) is error
    _check_error(info.value)
    # backend() resolves the same way.
    with pytest.raises(error):
        backend(spec)


@pytest.mark.parametrize("spec", ["cuda", "cuda:0", 0, torch.device("cuda")], ids=str)
def test_cuda_on_cpu_only_build_says_so(spec: Any) -> None:
    with pytest.raises(torchmem.DeviceUnavailableError) as info:
        resolve(spec)
    assert "CPU-only build" in info.value.message
    assert "cpu" in info.value.hint


def test_negative_index_message_names_the_index() -> None:
    with pytest.raises(torchmem.DeviceIndexError) as info:
        resolve(-1)
    assert "-1" in info.value.message


def test_module_on_no_device_is_named() -> None:
    with pytest.raises(torchmem.UnknownDeviceError) as info:
        resolve(torch.nn.Sequential(torch.nn.ReLU(), torch.nn.Tanh()))
    assert "Sequential" in info.value.message


def test_module_on_several_devices() -> None:
    m = torch.nn.Linear(2, 2)
    m.register_buffer("on_meta", torch.empty(1, device="meta"))
    with pytest.raises(torchmem.UnknownDeviceError) as info:
        resolve(m)
    assert "cpu" in info.value.message and "meta" in info.value.message
    _check_error(info.value)


def test_unknown_string_is_quoted_in_message() -> None:
    with pytest.raises(torchmem.UnknownDeviceError) as info:
        resolve("gpu")
    assert "'gpu'" in info.value.message
    assert str(info.value) == f"{info.value.message} Hint: {info.value.hint}"


def test_errors_through_public_entry_points() -> None:
    with pytest.raises(torchmem.DeviceUnavailableError):
        torchmem.stats("cuda")
    with pytest.raises(torchmem.UnknownDeviceError):
        torchmem.counters("gpu")
    with pytest.raises(torchmem.DeviceIndexError):
        torchmem.reset_peak(-1)
    tracker = torchmem.track("meta")  # resolved when the block starts
    with pytest.raises(torchmem.UnsupportedDeviceError), tracker:
        pass
    assert tracker.result is None
