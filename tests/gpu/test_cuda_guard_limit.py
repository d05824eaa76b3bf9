"""On the GPU: oom_guard gives back the 2 GiB a failed call held; limit() in bytes; budget() working set.

Run: PYTHONPATH=src python3 -m pytest -m cuda -s tests/gpu/test_cuda_guard_limit.py
"""

from __future__ import annotations

import gc

import pytest
import torch

from torchmem.actions.guard import oom_guard
from torchmem.actions.limit import BudgetExceededError, budget, limit
from torchmem.devices import _ops as ops

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

GiB = 1 << 30
MiB = 1 << 20


def step() -> torch.Tensor:
    """Holds 2 GiB of activations, then asks for more than the device has."""
    activations = [torch.empty(256 * MiB, dtype=torch.uint8, device="cuda") for _ in range(8)]
    total = torch.cuda.mem_get_info()[1]
    huge = torch.empty(total, dtype=torch.uint8, device="cuda")  # can never fit
    return huge.sum() + activations[0].sum()


def _clean() -> int:
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return torch.cuda.memory_allocated()


def test_guard_gives_back_the_activations_a_plain_except_leaves() -> None:
    base = _clean()
    err = None
    try:
        step()
    except torch.OutOfMemoryError as e:
        err = e
    plain = torch.cuda.memory_allocated() - base
    del err
    _clean()

    base = _clean()
    with oom_guard(reraise=False, quiet=True) as guard:
        step()
    guarded = torch.cuda.memory_allocated() - base
    print(
        f"\nplain try/except leaves {plain / GiB:.2f} GiB allocated; oom_guard leaves {guarded / GiB:.2f} GiB"
    )
    print(str(guard.oom))
    assert plain >= 2 * GiB
    assert guarded == 0
    assert guard.oom is not None and guard.oom.freed_bytes >= 2 * GiB
    assert guard.oom.reserved_after is not None and guard.oom.reserved_before is not None
    assert guard.oom.reserved_after <= guard.oom.reserved_before - 2 * GiB


def test_guard_reraises_an_exception_that_pins_nothing() -> None:
    base = _clean()
    with pytest.raises(torch.OutOfMemoryError) as info, oom_guard(quiet=True):
        step()
    assert info.value is not None
    assert torch.cuda.memory_allocated() == base


def test_limit_in_bytes_fails_above_and_limit_none_restores() -> None:
    _clean()
    dev = torch.device("cuda", torch.cuda.current_device())
    reserved = torch.cuda.memory_reserved()
    cap = reserved + 512 * MiB
    lim = limit(cap, dev)
    try:
        assert ops.memory_limit(dev) == cap
        total = ops.cuda_total_memory(dev)
        assert int(lim.fraction * total) == cap  # type: ignore[operator]
        ok = torch.empty(256 * MiB, dtype=torch.uint8, device=dev)
        with pytest.raises(torch.OutOfMemoryError):
            torch.empty(GiB, dtype=torch.uint8, device=dev)
        del ok
    finally:
        limit(None, dev)
    assert ops.memory_limit(dev) is None
    big = torch.empty(GiB, dtype=torch.uint8, device=dev)  # fits again
    del big
    _clean()


def test_limit_handle_restores_the_previous_fraction() -> None:
    dev = torch.device("cuda", torch.cuda.current_device())
    with limit(0.5, dev):
        with limit(0.25, dev) as inner:
            assert ops.memory_limit(dev) == inner.bytes
        f = ops.get_cuda_memory_fraction(dev)
        assert f is None or abs(f - 0.5) < 1e-6
    limit(None, dev)
    f = ops.get_cuda_memory_fraction(dev)
    assert f is None or f == 1.0


def test_budget_raises_with_the_working_set() -> None:
    _clean()

    def work() -> torch.Tensor:
        keep = torch.empty(512 * MiB, dtype=torch.uint8, device="cuda")
        tmp = torch.empty(512 * MiB, dtype=torch.uint8, device="cuda")
        del tmp
        return keep

    with pytest.raises(BudgetExceededError) as info, budget(768 * MiB, "cuda"):
        out = work()
    err = info.value
    print("\n" + str(err))
    assert err.used is not None and err.used >= GiB
    assert err.working_set and err.working_set[0].bytes == 512 * MiB
    del out
    with budget(2 * GiB, "cuda") as b:
        out = work()
    assert b.used is not None and GiB <= b.used < 2 * GiB
    del out
    _clean()


def test_hard_budget_stops_at_the_crossing() -> None:
    _clean()
    with pytest.raises(BudgetExceededError) as info, budget(GiB, "cuda", hard=True):
        a = torch.empty(512 * MiB, dtype=torch.uint8, device="cuda")
        b = torch.empty(GiB, dtype=torch.uint8, device="cuda")
        del a, b
    assert isinstance(info.value.__cause__, torch.OutOfMemoryError)
    assert ops.memory_limit(torch.device("cuda", torch.cuda.current_device())) is None
    _clean()
