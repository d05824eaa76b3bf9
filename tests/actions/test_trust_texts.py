"""Issue 10 ("trust"): what release(), scope(), track(), limit() and budget() say must be true and readable.

Real modules, optimizers, tensors and autograd graphs on the CPU; the ledger proves the bytes.
"""

from __future__ import annotations

import math
import re
import sys

import pytest
import torch

import torchmem
from torchmem.actions.limit import LimitError, _parse, budget, limit
from torchmem.actions.release import ReleasedError
from torchmem.devices import ledger

FILE = "test_trust_texts.py"


def _state_bytes(opt: torch.optim.Optimizer) -> int:
    return sum(
        v.untyped_storage().nbytes()
        for s in opt.state.values()
        for v in s.values()
        if isinstance(v, torch.Tensor)
    )


def _trained(*models: torch.nn.Module) -> torch.optim.Optimizer:
    opt = torch.optim.AdamW([p for m in models for p in m.parameters()], lr=1e-3)
    for m in models:
        m(torch.ones(2, 8)).sum().backward()
    opt.step()
    return opt


# -- 1. an optimizer that was not passed to release() -----------------------------------------------------
def test_an_optimizer_not_passed_loses_its_state_for_the_released_parameters_and_its_step_raises() -> None:
    torch.manual_seed(0)
    with torchmem.cpu_tracking() as cpu:
        model = torch.nn.Linear(8, 4)
        opt = _trained(model)
        params = list(model.parameters())
        expected = sum(p.untyped_storage().nbytes() * 2 for p in params) + _state_bytes(opt)  # + grads
        before = cpu.allocated
        report = torchmem.release(model)  # the optimizer is not passed
        # Its state for the emptied parameters was freed too (it used to pin the moments, silently).
        assert report.freed_bytes == expected
        assert before - cpu.allocated == expected
        assert len(opt.state) == 0
        assert report.remaining == () and report.errors == ()
        # The report names it by its holder path and says what was done.
        text = str(report)
        assert f" in {FILE}, local 'opt' (AdamW)" in text, text
        assert "refers to 2 parameters emptied here (model.weight, model.bias)" in text
        assert "its step() now raises ReleasedError" in text
        # A later step fails loudly instead of silently skipping the emptied parameters.
        with pytest.raises(ReleasedError, match=r"local 'opt' \(AdamW\) trains 2 parameters .*model\.weight"):
            opt.step()
        with pytest.raises(ReleasedError, match="silently skip"):
            opt.step()


def test_an_optimizer_over_released_and_live_parameters_keeps_the_live_state_and_raises() -> None:
    torch.manual_seed(0)
    released, live = torch.nn.Linear(8, 4), torch.nn.Linear(8, 4)
    opt = _trained(released, live)
    live_state = {id(p): dict(opt.state[p]) for p in live.parameters()}
    report = torchmem.release(released)
    assert set(map(id, opt.state)) == set(live_state)  # only the released parameters' state went
    for p in live.parameters():
        assert opt.state[p]["exp_avg"] is live_state[id(p)]["exp_avg"]
        assert opt.state[p]["exp_avg"].shape == p.shape
    assert live.weight.shape == (4, 8)
    assert "refers to 2 parameters emptied here (released.weight, released.bias)" in str(report)
    with pytest.raises(ReleasedError, match=r"released\.weight, released\.bias"):
        opt.step()


def test_an_optimizer_over_kept_parameters_is_left_alone() -> None:
    # The model is alive (not released): its parameters are kept, so a second optimizer over them keeps
    # working, state included, when the first optimizer is released.
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    first = _trained(model)
    second = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    second.step()
    assert len(second.state) == 2
    report = torchmem.release(first)
    assert model.weight.shape == (4, 8)
    assert len(second.state) == 2
    assert "was not passed" not in str(report)
    model(torch.ones(2, 8)).sum().backward()
    second.step()  # no ReleasedError


def test_an_optimizer_that_never_stepped_is_marked_too() -> None:
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)  # no state yet
    report = torchmem.release(model)
    assert "(SGD) was not passed but refers to 2 parameters emptied here" in str(report)
    assert "it held no state for them; its step() now raises ReleasedError" in str(report)
    with pytest.raises(ReleasedError):
        opt.step()


def test_an_optimizer_held_only_by_a_scheduler_is_named_by_its_path() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    sched = torch.optim.lr_scheduler.StepLR(_trained(model), step_size=1)
    report = torchmem.release(model)
    assert "local 'sched'.optimizer (AdamW)" in str(report), str(report)
    with pytest.raises(ReleasedError):
        sched.optimizer.step()


def test_releasing_the_model_and_its_optimizer_together_mentions_no_bystander() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    opt = _trained(model)
    report = torchmem.release(model, opt)
    assert "was not passed" not in str(report)
    assert "cleared the state of 1 optimizer" in report.actions


# -- 4. singular and plural ------------------------------------------------------------------------------
def test_release_of_one_tensor_reads_in_the_singular() -> None:
    t = torch.ones(16)
    report = torchmem.release(t)
    text = str(report)
    assert text.startswith("released 1 tensor: freed 64 B of tensor storage")
    assert "emptied 1 tensor" in report.actions
    assert "(s)" not in text and "tensor tensor" not in text


def test_release_counts_read_in_the_plural_and_name_each_role_once() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 4))
    opt = _trained(model)
    extra = {"a": torch.ones(3), "b": torch.ones(3)}
    report = torchmem.release(model, opt, extra)
    assert report.actions[:5] == (
        "emptied 6 parameters",
        "emptied 6 gradients",
        "emptied 3 buffers",
        "emptied 18 optimizer state tensors",
        "emptied 2 tensors",
    )
    text = str(report)
    assert text.startswith("released 35 tensors: freed ")
    assert "(s)" not in text


def test_what_survives_a_release_is_counted_in_words() -> None:
    w = torch.ones(8, 8)
    keep = w[:2]
    report = torchmem.release(w)
    assert "still alive: 256 B in 1 storage\n" in str(report) + "\n"
    del keep


def test_track_and_scope_texts_agree_in_number() -> None:
    with torchmem.track("cpu") as t:
        one = torch.ones(1024)
    assert "survived 4.00 KiB in 1 tensor," in str(t)
    with torchmem.track("cpu") as t2:
        two = [torch.ones(1024), torch.ones(1024)]
    assert "in 2 tensors," in str(t2)
    with torchmem.scope() as sc:
        kept = sc.keep(torch.ones(4))
        left = [torch.ones(4), torch.ones(4)]
    assert "(s)" not in str(sc) and "(s)" not in repr(sc)
    assert "in 2 storages" in repr(sc)
    del one, two, kept, left


def test_count_helper() -> None:
    from torchmem._format import count

    assert [count(n, "tensor") for n in (0, 1, 2)] == ["0 tensors", "1 tensor", "2 tensors"]
    assert (
        count(1, "process", "processes") == "1 process" and count(3, "process", "processes") == "3 processes"
    )


# -- 5. limit() and budget() inputs ----------------------------------------------------------------------
def _quoted_examples_parse(hint: str) -> None:
    examples = re.findall(r"'([^']+)'", hint)
    assert examples, hint
    for example in examples:
        _parse(example, "x")  # every quoted example in a hint must be accepted


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        (1.5, ["the float 1.5", "fraction of the device's memory", "(0, 1]", "150% of the device"]),
        ("150%", ["'150%'", "percentage", "(0, 100]"]),
        (50.0, ["the float 50.0", "pass 0.5 or '50%'"]),
        (8e9, ["(0, 1]", "pass the int 8000000000"]),
        (0.0, ["the float 0.0", "(0, 1]"]),
        ("0%", ["'0%'", "(0, 100]"]),
        (-1, ["positive number of bytes", "got -1"]),
        (0, ["positive number of bytes", "got 0"]),
        ("0B", ["positive number of bytes", "got 0 ('0B')"]),
        ("-5", ["cannot be negative", "'-5'"]),
        (math.nan, ["got nan (not a number)"]),
        (math.inf, ["finite size", "got inf"]),
        (-math.inf, ["finite size", "got -inf"]),
        ("abc", ["Cannot read 'abc' as a size", "Units: B, KiB/KB"]),
        ("10 XB", ["unknown unit 'XB'", "KiB/KB, MiB/MB, GiB/GB, TiB/TB"]),
        ("1e3", ["scientific notation"]),
        (True, ["got True (a bool)"]),
        ([1], ["got [1] (a list)"]),
        (10**30, ["1000000000000000000000000000000 bytes", "more memory than any device has"]),
        ("1000000000TB", ["('1000000000TB')", "more memory than any device has"]),
    ],
)
def test_bad_sizes_say_what_was_passed_and_why(bad: object, says: list[str]) -> None:
    for fn, who in ((limit, "limit"), (budget, "budget")):
        with pytest.raises(LimitError) as info:
            fn(bad, "cpu")  # type: ignore[operator]
        err = info.value
        for part in says:
            assert part in err.message, (who, err.message)
        assert "A float The" not in str(err)
        _quoted_examples_parse(err.hint)
        if who == "budget":
            assert "limit(None)" not in str(err)  # the wrong hint for a budget
        else:
            assert "torchmem.limit(None) lifts the limit" in err.hint
    assert not ledger().active


def test_budget_none_and_zero_give_a_budget_hint() -> None:
    with pytest.raises(LimitError, match="The budget cannot be None") as info:
        budget(None, "cpu")  # type: ignore[arg-type]
    assert "not wrapped in torchmem.budget()" in info.value.hint and "limit(" not in info.value.hint
    with pytest.raises(LimitError) as info:
        budget("0B", "cpu")
    assert info.value.message == "The budget must be a positive number of bytes; got 0 ('0B')."
    assert "limit(" not in str(info.value)
    _quoted_examples_parse(info.value.hint)
    with pytest.raises(LimitError, match=r"top .* must be 0 or more; got -1") as info:
        budget("1MiB", "cpu", top=-1)
    assert info.value.hint


def test_a_cpu_limit_over_the_machines_memory_is_refused() -> None:
    from torchmem.devices import _ops as ops

    total = ops.cpu_total_memory()
    if total is None:
        pytest.skip("the machine's memory size is unknown")
    with pytest.raises(LimitError, match="more than this machine's memory") as info:
        limit(total + 1, "cpu")
    assert "limit(None, 'cpu')" in info.value.hint
    assert not ledger().active


def test_the_hint_examples_themselves_are_accepted() -> None:
    for value in ("8GiB", "512MB", "50%", "25%", "2GB", "512MiB", 8 << 30, 0.5, 0.25, 1 << 30, " 1.5 KiB "):
        nbytes, fraction = _parse(value, "x")
        assert (nbytes is None) != (fraction is None)


# -- 6. print(scope) -------------------------------------------------------------------------------------
def test_scope_repr_and_str_say_state_devices_what_was_kept_and_the_result() -> None:
    sc = torchmem.scope()
    assert repr(sc) == "<torchmem.scope not entered: kept nothing>"
    assert sc.state == "not entered"
    history: list[torch.Tensor] = []
    with sc:
        out = sc.keep(torch.ones(8, 4))
        history.append(torch.zeros(100))
        inside = repr(sc)
        assert sc.state == "active"
    assert inside.startswith("<torchmem.scope active (cpu): ")
    assert "allocated inside so far" in inside and "kept 1 object (tensor float32[8, 4])" in inside
    assert sc.state == "finished"
    assert repr(sc) == (
        "<torchmem.scope finished (cpu): kept 1 object (tensor float32[8, 4]); 528 B allocated inside, "
        "128 B kept, 400 B still alive without being kept in 1 storage>"
    )
    lines = str(sc).splitlines()
    assert lines[0] == repr(sc)[1:-1]
    assert lines[1] == "  storage of 400 bytes (400 B on cpu)"
    assert lines[2].startswith("    held by ") and "local 'history'[0]" in lines[2]
    assert "object at 0x" not in str(sc) + repr(sc)
    del out


def test_scope_repr_lists_several_kept_objects_without_holding_them() -> None:
    model = torch.nn.Linear(2, 2)
    with torchmem.scope() as sc:
        a, b = sc.keep(torch.ones(2), {"x": 1, "y": 2})
        sc.keep(model, [1], (2, 3))
    text = repr(sc)
    assert "kept 5 objects (tensor float32[2], dict of 2 items, Linear, ...)" in text
    assert sys.getrefcount(model) == 2  # the local and getrefcount's argument: the scope keeps no reference
    del a, b
