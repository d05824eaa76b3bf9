"""limit() and budget() on the CPU: real tensors, the exact ledger, real torch.OutOfMemoryError."""

from __future__ import annotations

import gc
import re
import threading

import pytest
import torch

import torchmem
from torchmem.actions.limit import (
    BudgetExceededError,
    LimitError,
    _fraction_for,
    _parse,
    budget,
    limit,
)
from torchmem.devices import _ops as ops
from torchmem.devices import ledger

MiB = 1 << 20


def test_limit_raises_real_oom_and_frees_the_refused_output() -> None:
    with torchmem.cpu_tracking() as cpu:
        keep = torch.ones(MiB // 4)  # 1 MiB
        with limit(3 * MiB, "cpu") as lim:
            assert lim.bytes == 3 * MiB
            assert ops.memory_limit(torch.device("cpu")) == 3 * MiB
            with pytest.raises(torch.OutOfMemoryError) as info:
                torch.ones(MiB // 2)  # +2 MiB -> 3 MiB: fits exactly
                torch.ones(MiB)  # +4 MiB: refused
            msg = str(info.value)
            assert msg.startswith("CPU out of memory. Tried to allocate 4.00 MiB.")
            assert "limit of 3.00 MiB" in msg
            # The refused output is gone while the exception (and its traceback) are still alive.
            assert cpu.allocated == MiB
            assert cpu.peak == 3 * MiB  # the refused op never reached the peak
            small = torch.ones(10)  # the process goes on under the cap
            assert small.sum().item() == 10
        assert ops.memory_limit(torch.device("cpu")) is None
        big = torch.ones(2 * MiB)  # no cap any more
        del big, keep, small, info
        gc.collect()
    assert not ledger().active


def test_limit_without_tracking_turns_the_ledger_on_and_off() -> None:
    assert not ledger().active
    limit("1MiB", "cpu")
    try:
        assert ledger().active
        with pytest.raises(torch.OutOfMemoryError):
            torch.empty(2 * MiB, dtype=torch.uint8)
    finally:
        limit(None, "cpu")
    assert not ledger().active
    assert ops.memory_limit(torch.device("cpu")) is None


def test_limit_handle_restores_the_previous_cap_and_limit_none_lifts_all() -> None:
    outer = limit(4 * MiB, "cpu")
    inner = limit(2 * MiB, "cpu")
    assert ops.memory_limit(torch.device("cpu")) == 2 * MiB
    inner.restore()
    assert ops.memory_limit(torch.device("cpu")) == 4 * MiB
    inner.restore()  # idempotent
    assert ops.memory_limit(torch.device("cpu")) == 4 * MiB
    limit(None, "cpu")
    assert ops.memory_limit(torch.device("cpu")) is None
    assert not ledger().active
    outer.restore()  # puts back "no cap": still none
    assert ops.memory_limit(torch.device("cpu")) is None
    assert not ledger().active


def test_limit_from_another_thread_is_refused_clearly() -> None:
    limit(MiB, "cpu")
    errors: list[BaseException] = []

    def lift() -> None:
        try:
            limit(None, "cpu")
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=lift)
    t.start()
    t.join()
    try:
        assert errors and isinstance(errors[0], LimitError)
    finally:
        limit(None, "cpu")
    assert not ledger().active


def test_autograd_saved_activations_count_against_the_limit() -> None:
    w = torch.randn(256, 256, requires_grad=True)
    with limit(2 * MiB, "cpu"):
        x = torch.randn(512, 256)  # 512 KiB
        h = (x @ w).relu()  # 512 KiB saved for backward
        with pytest.raises(torch.OutOfMemoryError):
            for _ in range(10):
                h = (h @ w).relu()  # each layer keeps another 512 KiB alive for backward
        del h, x
    assert w.grad is None


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1024, (1024, None)),
        (0.5, (None, 0.5)),
        ("2GiB", (2 << 30, None)),
        ("512MB", (512 << 20, None)),  # binary, as in torch's messages (one unit table)
        ("1.5 KiB", (1536, None)),
        ("25%", (None, 0.25)),
        ("1e3", None),
    ],
)
def test_sizes(value: object, expected: tuple[int | None, float | None] | None) -> None:
    if expected is None:
        with pytest.raises(LimitError):
            _parse(value, "x")
    else:
        assert _parse(value, "x") == expected


@pytest.mark.parametrize("bad", [0, -5, 1.5, 0.0, float("nan"), True, "lots", None, [1]])
def test_bad_sizes_are_clear_errors(bad: object) -> None:
    with pytest.raises(LimitError):
        _parse(bad, "The limit")
    if bad is not None:
        with pytest.raises(LimitError):
            limit(bad, "cpu")  # type: ignore[arg-type]
    assert not ledger().active


def test_meta_and_unknown_devices() -> None:
    with pytest.raises(torchmem.UnsupportedDeviceError):
        limit(MiB, "meta")
    with pytest.raises(torchmem.UnknownDeviceError):
        limit(MiB, "gpu")


@pytest.mark.parametrize("total", [80 * (1 << 30) + 123_456_789, 85_520_809_984, 143_771_287_552, 7])
def test_bytes_to_fraction_is_exact(total: int) -> None:
    for nbytes in (1, 1 << 20, 3 * (1 << 30) + 1, total // 3, total - 1, total):
        if nbytes > total:
            continue
        f = _fraction_for(nbytes, total)
        assert 0 < f <= 1
        assert int(f * float(total)) == nbytes  # what the CUDA allocator computes its cap from


# -- budget ---------------------------------------------------------------------------------------------
def test_budget_passes_and_reports_use() -> None:
    before = torch.ones(MiB)  # 4 MiB allocated before: not counted against the block
    with budget("8MiB", "cpu") as b:
        x = torch.ones(MiB)
        tmp = torch.ones(MiB)
        del tmp
    assert b.used == 8 * MiB
    assert b.peak is not None and b.peak >= 8 * MiB
    del x, before


def test_budget_exceeded_names_the_working_set_at_the_crossing() -> None:
    def step() -> torch.Tensor:
        activations = [torch.ones(MiB) for _ in range(3)]  # 12 MiB, gone before the block ends
        return activations[0].sum()

    with pytest.raises(BudgetExceededError) as info, budget(10 * MiB, "cpu"):
        step()
    err = info.value
    assert err.budget == 10 * MiB
    assert err.used == 12 * MiB + 4  # the three activations and the 4-byte sum
    assert not err.hard
    assert err.working_set, "the working set at the crossing is recorded"
    top = err.working_set[0]
    assert top.bytes == 4 * MiB and top.shape == (MiB,) and top.dtype == "float32"
    # The list's holder is named ("local 'activations'[0]" in a script); under pytest the holders engine
    # can only say "<list held outside Python>[0]", so check that a path into the list is given.
    assert sum(1 for w in err.working_set if any("[0]" in h or "[1]" in h for h in w.holders)) == 2, str(err)
    assert "over its budget of 10.00 MiB" in str(err)
    assert err.to_dict()["working_set"][0]["bytes"] == 4 * MiB
    assert not ledger().active


def test_hard_budget_stops_at_the_crossing_and_inner_code_can_catch_it() -> None:
    caught = []
    with budget(5 * MiB, "cpu", hard=True) as b:
        for n in (4, 2, 1):  # a batch-size search: 16 MiB and 8 MiB fail, 4 MiB fits
            try:
                torch.ones(n * MiB)
            except torch.OutOfMemoryError:
                caught.append(n)
                continue
            break
    assert caught == [4, 2]
    assert b.used == 4 * MiB  # the refused allocations never counted


def test_hard_budget_oom_leaving_the_block_becomes_budget_exceeded() -> None:
    with pytest.raises(BudgetExceededError) as info, budget(MiB, "cpu", hard=True):
        a = torch.ones(MiB // 8)  # 512 KiB
        b = torch.ones(MiB // 4)  # +1 MiB: refused
        del a, b
    err = info.value
    assert isinstance(err.__cause__, torch.OutOfMemoryError)
    assert err.hard
    assert err.used == MiB // 2
    assert "hard budget of 1.00 MiB" in str(err)
    assert err.working_set and err.working_set[0].bytes == MiB // 2


def test_other_exceptions_pass_through_untouched() -> None:
    boom = ValueError("not memory")
    with pytest.raises(ValueError) as info, budget(MiB, "cpu"):
        torch.ones(MiB)  # over budget, but the block failed for another reason first
        raise boom
    assert info.value is boom


def test_nested_budgets_each_fail_on_their_own_figure() -> None:
    # Inner over, outer fine: the inner error passes through the outer unchanged.
    with pytest.raises(BudgetExceededError) as info, budget(100 * MiB, "cpu") as outer, budget(MiB, "cpu"):
        x = torch.ones(MiB)  # 4 MiB
    assert info.value.budget == MiB
    assert outer.used == 4 * MiB
    # Inner fine, outer over (what the outer block did before the inner one counts for the outer only).
    with pytest.raises(BudgetExceededError) as info, budget(5 * MiB, "cpu"):
        y = torch.ones(MiB)  # 4 MiB
        with budget(3 * MiB, "cpu") as inner:
            z = torch.ones(MiB // 2)  # 2 MiB
    assert info.value.budget == 5 * MiB and info.value.used == 6 * MiB
    assert inner.used == 2 * MiB
    del x, y, z


def test_budget_as_decorator() -> None:
    @budget(MiB, "cpu")
    def small() -> float:
        return float(torch.ones(1000).sum())

    @budget(MiB, "cpu")
    def big() -> float:
        return float(torch.ones(MiB).sum())

    assert small() == 1000.0
    with pytest.raises(BudgetExceededError):
        big()


def test_budget_bad_input() -> None:
    with pytest.raises(LimitError):
        budget(0, "cpu")
    with pytest.raises(LimitError):
        budget("big", "cpu")
    with pytest.raises(torchmem.UnsupportedDeviceError), budget(MiB, "meta"):
        pass


def test_the_size_hint_only_gives_examples_that_parse() -> None:
    with pytest.raises(LimitError) as info:
        _parse("lots", "x")
    examples = re.findall(r"'([^']+)'", info.value.hint)
    assert examples
    for example in examples:
        _parse(example, "x")  # the hint's own examples must be accepted


def test_one_unit_table_gb_means_what_torch_messages_mean() -> None:
    """limit("20GB") and an OOM message's "20.00 GB" are the same number of bytes (one binary table)."""
    from torchmem._units import parse_size
    from torchmem.actions.limit import _parse
    from torchmem.analysis.oom import parse_oom_message

    assert _parse("20GB", "The limit") == (20 << 30, None)
    assert _parse("20GB", "The limit") == _parse("20GiB", "The limit")
    assert _parse("512MB", "The limit") == (512 << 20, None)
    assert parse_size("20GB") == parse_size("20.00 GiB") == 20 << 30
    parsed = parse_oom_message(
        "MPS backend out of memory (MPS allocated: 1.20 GB, other allocations: 2.00 MB, "
        "max allowed: 18.13 GB). Tried to allocate 20.00 GB on private pool."
    )
    assert parsed is not None and parsed.requested == _parse("20GB", "The limit")[0]
