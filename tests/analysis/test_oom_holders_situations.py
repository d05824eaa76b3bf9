"""OOM diagnoses name the holders of the memory, on the CPU under torchmem's cap (a real
``torch.OutOfMemoryError`` from real tensors and graphs): the largest holders with their bytes, summing with
what has no holder and what no live tensor explains to what was allocated, and the named situations with
their own fixes — each where it must be said, and where it must not."""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator

import pytest
import torch

import torchmem
from torchmem.analysis.oom.holders import oom_holders
from torchmem.capture import oom as oom_capture
from torchmem.capture.oom import explain_oom, watch_ooms
from torchmem.results.oom import OOMDiagnosis, OOMEvent, OOMHolders

MiB = 1 << 20
NO_GRAD_TEXT = "run it without autograd"


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    """A clean heap, and a full holder-search budget (other tests' OOMs may have spent the process's)."""
    gc.collect()
    saved = list(oom_capture._registry["budget"])
    oom_capture._registry["budget"] = [None, 0.0]
    yield
    oom_capture._registry["budget"] = saved
    sys.last_traceback = sys.last_value = None
    gc.collect()


def _mlp(width: int = 512, depth: int = 4) -> torch.nn.Module:
    layers = [torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU()) for _ in range(depth)]
    return torch.nn.Sequential(*layers)


def _kinds(d: OOMDiagnosis) -> list[str]:
    return [c.kind for c in d.causes]


def _settings(d: OOMDiagnosis) -> list[str | None]:
    return [f.setting for f in d.fixes]


def _sums(h: OOMHolders) -> None:
    """The holders, what has none and what no live tensor explains add up to what was allocated."""
    assert h.allocated is not None
    assert h.named() + h.unnamed + (h.unaccounted or 0) >= h.allocated
    assert h.named() + h.unnamed <= h.total


# -- a training graph kept alive during evaluation -------------------------------------------------------


def _train_then_evaluate(drop: bool) -> tuple[OOMDiagnosis, list[OOMEvent]]:
    events: list[OOMEvent] = []
    with watch_ooms(events.append), torchmem.limit(36 * MiB, "cpu"):
        model = _mlp()
        out = model(torch.randn(1024, 512))  # the last training step: its graph saved ~10 MiB
        loss = out.pow(2).mean()
        if drop:
            del out, loss
        model.eval()
        try:
            with torch.no_grad():
                for _ in range(3):
                    model(torch.randn(4096, 512))  # 8 MiB per activation
        except torch.OutOfMemoryError as e:
            d = explain_oom(e)
        else:  # pragma: no cover - the cap is set so that it fails
            raise AssertionError("no OOM")
    return d, events


def test_a_training_graph_alive_during_evaluation_is_named_with_del_out_loss() -> None:
    d, events = _train_then_evaluate(drop=False)
    assert d.causes[0].kind == "training_graph", str(d)
    cause = d.causes[0]
    assert "`out` and `loss`" in cause.summary and cause.confidence == "high"
    assert any("autograd was off at the OOM" in e for e in cause.evidence)
    assert d.fixes[0].setting == "del out, loss", str(d)
    # evaluation already ran under no_grad: the generic "run it without autograd" fix is not given
    assert "with torch.inference_mode(): ..." not in _settings(d)
    assert "with torch.no_grad(): ..." not in _settings(d)
    h = d.holders
    assert h is not None and h.grad_enabled is False and h.training is False
    out = next(x for x in h.holders if x.label.endswith("local 'out'"))
    assert out.kind == "graph" and out.graph >= 8 * MiB, h
    _sums(h)
    text = str(d)
    assert "Who holds the memory on cpu" in text and "its autograd graph" in text
    # the event of the same OOM, delivered where the program caught it, says the same
    (event,) = events
    assert event.kind == "training_graph" and event.diagnosis is not None
    assert event.diagnosis.holders is not None and event.diagnosis.holders.when == "at the OOM"


def test_no_training_graph_once_out_and_loss_are_deleted() -> None:
    d, _ = _train_then_evaluate(drop=True)
    assert "training_graph" not in _kinds(d), str(d)
    assert d.holders is not None and not d.holders.situations
    assert not any(x.graph for x in d.holders.holders)


def test_no_training_graph_for_an_oom_while_training() -> None:
    with torchmem.limit(24 * MiB, "cpu"):
        model = _mlp()
        try:
            model(torch.randn(4096, 512)).sum().backward()  # the step's own graph: its working set
        except torch.OutOfMemoryError as e:
            d = explain_oom(e)
    assert d.holders is not None and d.holders.grad_enabled is True
    assert "training_graph" not in _kinds(d) and "previous_outputs" not in _kinds(d), str(d)


# -- the previous batch's outputs kept ---------------------------------------------------------------


def _evaluate(model: torch.nn.Module, n: int, drop: bool) -> None:
    with torch.no_grad():
        for _ in range(n):
            out = model(torch.randn(1024, 256))  # 16 MiB of logits
            _ = out.argmax(-1)
            if drop:
                del out


def _previous(n: int, drop: bool, cap: int = 34) -> OOMDiagnosis:
    with torchmem.limit(cap * MiB, "cpu"):
        model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 4096))
        try:
            _evaluate(model, n, drop)
        except torch.OutOfMemoryError as e:
            return explain_oom(e)
    raise AssertionError("no OOM")


def test_the_previous_batchs_outputs_are_named_with_the_line_that_reassigns_them() -> None:
    d = _previous(3, drop=False)
    assert d.causes[0].kind == "previous_outputs", str(d)
    cause = d.causes[0]
    assert "`out` still holds the previous batch's outputs" in cause.summary
    assert "_evaluate()" in cause.summary and cause.bytes == 16 * MiB
    assert d.fixes[0].setting == "del out"


def test_no_previous_outputs_when_they_are_deleted_or_on_the_first_batch() -> None:
    d = _previous(3, drop=True, cap=22)  # the next batch alone is too much: nothing previous is alive
    assert "previous_outputs" not in _kinds(d), str(d)
    first = _previous(1, drop=False, cap=18)
    assert "previous_outputs" not in _kinds(first), str(first)


# -- an optimizer of a model you deleted ---------------------------------------------------------------


def _with_optimizer(delete_model: bool) -> OOMDiagnosis:
    with torchmem.limit(56 * MiB, "cpu"):
        model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.Linear(1024, 1024))
        opt = torch.optim.Adam(model.parameters())
        model(torch.randn(8, 1024)).sum().backward()
        opt.step()  # params 8 MiB + grads 8 MiB + Adam state 16 MiB
        if delete_model:
            del model
        try:
            torch.ones(7 * MiB)  # 28 MiB more: fits only without the optimizer's 32 MiB
        except torch.OutOfMemoryError as e:
            d = explain_oom(e)
    assert opt.param_groups  # alive to the end
    return d


def test_an_optimizer_of_a_deleted_model_is_named_with_del_opt() -> None:
    d = _with_optimizer(delete_model=True)
    assert d.causes[0].kind == "orphaned_optimizer", str(d)
    cause = d.causes[0]
    assert "`opt` (Adam)" in cause.summary and cause.bytes >= 32 * MiB
    assert d.fixes[0].setting == "del opt"
    h = d.holders
    assert h is not None
    top = h.holders[0]
    assert top.kind == "optimizer" and top.label.endswith("local 'opt'")
    assert {"parameter", "gradient", "optimizer state"} <= set(top.categories)


def test_no_orphaned_optimizer_while_its_model_lives() -> None:
    d = _with_optimizer(delete_model=False)
    assert "orphaned_optimizer" not in _kinds(d), str(d)
    assert d.holders is not None and any(x.kind == "module" for x in d.holders.holders)


# -- the failed attempt's frames in a retry inside except ---------------------------------------------------


def _attempt(n: int) -> torch.Tensor:
    w = torch.randn(256, 256, requires_grad=True)
    h = (torch.randn(n, 256) @ w).relu() @ w  # its graph saved the activations
    h = h.relu() @ w
    big = torch.ones(n, 1024)
    return h + big.sum()


def test_a_retry_inside_except_ranks_the_failed_attempts_frames_first_graphs_included() -> None:
    with torchmem.limit(24 * MiB, "cpu"):
        try:
            _attempt(4096)
        except torch.OutOfMemoryError:
            try:
                _attempt(2048)
            except torch.OutOfMemoryError as e2:
                d = explain_oom(e2)
    assert d.causes[0].kind == "pinned_by_exception", str(d)
    cause = d.causes[0]
    # the first attempt's `h` and what its graph saved: 16 MiB, most of what was allocated
    assert cause.bytes is not None and cause.bytes >= 14 * MiB and cause.confidence == "high"
    assert any("_attempt() local 'h'" in e for e in cause.evidence), cause.evidence
    assert any("% of the" in e for e in cause.evidence)
    working = next(c for c in d.causes if c.kind == "working_set")
    assert working.score < cause.score


def test_a_retry_after_the_except_block_is_not_pinned() -> None:
    with torchmem.limit(24 * MiB, "cpu"):
        failed = False
        try:
            _attempt(4096)
        except torch.OutOfMemoryError:
            failed = True
        assert failed
        try:
            _attempt(6144)  # too big even alone
        except torch.OutOfMemoryError as e:
            d = explain_oom(e)
    assert "pinned_by_exception" not in _kinds(d), str(d)
    assert d.holders is not None and not any(s.kind == "retry_in_except" for s in d.holders.situations)


# -- a cycle through autograd ----------------------------------------------------------------------------


def _leak_cycle() -> None:
    x = torch.randn(1024, 1024, requires_grad=True)
    (g,) = torch.autograd.grad((x * x).sin().sum(), x, create_graph=True)
    x.grad = g


def test_a_leaked_autograd_cycle_is_a_cause_with_its_fix() -> None:
    try:
        with torchmem.limit(48 * MiB, "cpu"):
            _leak_cycle()
            try:
                torch.ones(8 * MiB)
            except torch.OutOfMemoryError as e:
                d = explain_oom(e)
        assert "autograd_cycle" in _kinds(d), str(d)
        cause = next(c for c in d.causes if c.kind == "autograd_cycle")
        assert "-> the same tensor" in cause.summary and cause.bytes is not None and cause.bytes >= 12 * MiB
        assert any("create_graph=False" in f.text for f in cause.fixes)
    finally:
        for o in gc.get_objects():
            if type(o) is torch.Tensor and o.is_leaf and o.grad is not None and o.grad.grad_fn is not None:
                o.grad = None


# -- the search itself ---------------------------------------------------------------------------------


@pytest.mark.usefixtures("unhurried_oom_holders")
def test_the_search_says_what_it_did_not_search() -> None:
    keep = [torch.ones(64 * 1024) for _ in range(8)]
    cut = oom_holders(torch.device("cpu"), grad_enabled=True, time_limit=0.05, max_objects=10)
    assert not cut.complete and cut.not_searched is not None
    assert "stopped at its" in cut.not_searched and "not searched:" in str(cut)
    full = oom_holders(torch.device("cpu"), grad_enabled=True)
    assert full.complete and full.not_searched is None and "not searched" not in str(full)
    # its time is measured and said; its speed is benchmarks/holders.py's
    assert full.seconds > 0 and full.visited > cut.visited
    assert any(x.label.endswith("local 'keep'") for x in full.holders)
    del keep


def test_holders_round_trip_and_can_be_turned_off() -> None:
    with torchmem.limit(6 * MiB, "cpu"):
        keep = torch.ones(MiB)
        try:
            torch.ones(MiB)
        except torch.OutOfMemoryError as e:
            with_holders = explain_oom(e)
            without = explain_oom(e, holders=False)
    assert with_holders.holders is not None and without.holders is None
    assert "Who holds the memory" not in str(without)
    back = OOMDiagnosis.from_dict(with_holders.to_dict())
    assert back.holders == with_holders.holders
    assert keep.numel() == MiB


def test_a_pasted_message_has_no_holders() -> None:
    d = explain_oom("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB")
    assert d.is_oom and d.holders is None
