"""explain_oom() on real exceptions, memory pinned by old tracebacks, and the observer on a CPU-only build."""

from __future__ import annotations

import sys

import pytest
import torch

from torchmem.analysis.oom import is_oom, oom_exception
from torchmem.capture.oom import (
    OOMInputError,
    attach_oom_observer,
    capture_state,
    explain_oom,
    pinned_tensors,
)

MSG = (
    "CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total capacity of 15.77 GiB of which "
    "14.00 GiB is free. Of the allocated memory 1.00 GiB is allocated by PyTorch, and 0 bytes is reserved "
    "by PyTorch but unallocated."
)


def _raise_chained() -> None:
    try:
        raise torch.OutOfMemoryError(MSG)
    except torch.OutOfMemoryError as e:
        raise ValueError("training step failed") from e


def test_oom_found_by_type_through_the_chain() -> None:
    with pytest.raises(ValueError) as info:
        _raise_chained()
    exc = info.value
    assert is_oom(exc)
    assert isinstance(oom_exception(exc), torch.OutOfMemoryError)
    assert torch.cuda.OutOfMemoryError is torch.OutOfMemoryError
    d = explain_oom(exc)
    assert d.is_oom and d.causes[0].kind == "too_large"


def test_context_chain_and_foreign_runtime_error() -> None:
    try:
        try:
            raise RuntimeError("HIP out of memory. Tried to allocate 2.00 GiB")
        except RuntimeError:
            raise KeyError("while logging") from None
    except KeyError as e:
        # ``from None`` hides the context from display but it is still recorded
        assert is_oom(e)
    assert not is_oom(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not is_oom(ValueError("CUDA out of memory"))  # text only counts for plain RuntimeErrors
    try:
        torch.empty(1 << 50, dtype=torch.uint8)
    except RuntimeError as e:  # the CPU allocator raises a plain RuntimeError
        assert is_oom(e)
        assert explain_oom(e).parsed.source == "cpu_allocator"  # type: ignore[union-attr]


def test_not_an_oom_is_a_documented_no_op() -> None:
    d = explain_oom(ValueError("nope"))
    assert not d.is_oom and not d.causes
    assert "not an out-of-memory error" in str(d) or "Not an out-of-memory error" in str(d)
    assert not explain_oom("all fine").is_oom


def test_bad_input_raises() -> None:
    with pytest.raises(OOMInputError):
        explain_oom(42)  # type: ignore[arg-type]


def test_pinned_by_an_old_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    def step() -> None:
        acts = torch.ones(1 << 20)  # 4 MiB held by the frame
        raise RuntimeError(f"failed with {acts.shape}")

    try:
        step()
    except RuntimeError as e:
        old = e
    monkeypatch.setattr(sys, "last_value", old, raising=False)
    monkeypatch.setattr(sys, "last_traceback", old.__traceback__, raising=False)
    monkeypatch.delattr(sys, "last_exc", raising=False)
    found = pinned_tensors(torch.device("cpu"))
    assert [p.bytes for p in found] == [4 << 20]
    assert "local 'acts'" in found[0].where and "step()" in found[0].where
    assert pinned_tensors(torch.device("cpu"), exclude=old) == []
    # explain_oom of a new OOM names it
    try:
        _raise_chained()
    except ValueError as e:
        new = e
    d = explain_oom(new)
    assert d.causes[0].kind == "too_large"  # CPU tensors do not count when the OOM is on a GPU
    assert "pinned_by_exception" not in d.kinds


def test_observer_and_capture_degrade_without_cuda() -> None:
    if torch.cuda.is_available():
        pytest.skip("CPU-only behaviour")
    h = attach_oom_observer(lambda s: None)
    assert h.problem is not None and not h.active
    h.detach()
    s = capture_state("cpu")
    assert s.segments is None and s.notes


def test_device_reads_go_through_the_device_layer() -> None:
    """capture.oom reads the device count and UUID through torchmem.devices._allocator (CPU build: none)."""
    from torchmem.capture.oom import _oom_device
    from torchmem.devices import _allocator as al

    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        assert al.device_count() == count
        assert _oom_device(None, count + 5) == torch.device("cuda", torch.cuda.current_device())
        assert _oom_device(None, 0) == torch.device("cuda", 0)
        uuid = al.device_uuid(0)
        assert uuid is None or uuid.startswith(("GPU-", "MIG-"))
        return
    assert al.device_count() == 0
    assert al.device_uuid(0) is None
    assert _oom_device(None, 0) is None  # no CUDA: a message's GPU index names no device of this process
    assert _oom_device("cpu", 3) == torch.device("cpu")
