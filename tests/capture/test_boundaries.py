"""Step boundaries without an optimizer: which loop a program runs, found from real torch calls."""

from __future__ import annotations

import gc
import threading
from pathlib import Path

import pytest
import torch
from torch.nn.modules import module as mm

from torchmem.capture.boundaries import StepBoundaries, backward_ran


class Recorder:
    def __init__(self) -> None:
        self.steps = 0
        self.switches: list[tuple[str, str]] = []
        self.errors: list[str] = []

    def step(self) -> None:
        self.steps += 1

    def switch(self, kind: str, label: str) -> None:
        self.switches.append((kind, label))


@pytest.fixture
def rec() -> Recorder:
    return Recorder()


def _boundaries(rec: Recorder) -> StepBoundaries:
    return StepBoundaries(rec.step, rec.switch, on_error=rec.errors.append).start()


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))


def test_optimizer_steps_win_over_everything(rec: Recorder) -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    b = _boundaries(rec)
    try:
        for _ in range(5):
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
            opt.zero_grad()
    finally:
        b.stop()
    assert b.chosen == "optimizer"
    # module calls first (2 forwards), then backward took over, then the optimizer
    assert [k for k, _ in rec.switches] == ["optimizer"]  # chosen at the first optimizer step
    # the backward before the first optimizer step is counted; after it the wrappers are out (parked)
    assert b.counts["optimizer"] == 5 and b.counts["backward"] == 1
    assert rec.errors == []


def test_backward_wrappers_are_out_once_the_optimizer_counts_except_while_sites_are_recorded(
    rec: Recorder,
) -> None:
    """Once the optimizer step is the boundary, ``torch.autograd.backward``/``grad`` are torch's own again (a
    wrapper that only counts calls costs every step); while the exact ledger records birth sites they are
    wrapped again (a backward's engine-thread births get its line), and out when the recording ends."""
    import torch.autograd as ag

    from torchmem.devices._ledger import ledger

    originals = (ag.backward, ag.grad)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    b = _boundaries(rec)
    try:
        model(torch.randn(4, 8)).sum().backward()
        assert getattr(ag.backward, "__torchmem_boundary__", False)  # must-say: wrapped before the choice
        opt.step()
        assert b.chosen == "optimizer"
        assert (ag.backward, ag.grad) == originals  # parked
        led = ledger()
        cohort = led.open_cohort("cpu", sites=True)
        try:
            assert getattr(ag.backward, "__torchmem_boundary__", False)
            assert getattr(ag.grad, "__torchmem_boundary__", False)
            plain = led.open_cohort("cpu")  # a cohort without sites changes nothing
            led.close_cohort(plain)
            assert getattr(ag.backward, "__torchmem_boundary__", False)
        finally:
            led.close_cohort(cohort)
        assert (ag.backward, ag.grad) == originals
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
    finally:
        b.stop()
    assert (ag.backward, ag.grad) == originals
    # a program that rebinds the name keeps its own: not parked over, not restored over
    b = _boundaries(rec)
    try:
        mine = lambda *a, **k: originals[0](*a, **k)  # noqa: E731
        ag.backward = mine
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        assert ag.backward is mine
        cohort = ledger().open_cohort("cpu", sites=True)
        ledger().close_cohort(cohort)
        assert ag.backward is mine
    finally:
        b.stop()
        ag.backward = originals[0]
    assert rec.errors == []


def test_backward_without_optimizer(rec: Recorder) -> None:
    model = _model()
    b = _boundaries(rec)
    try:
        for _ in range(6):
            model(torch.randn(4, 8)).sum().backward()
    finally:
        b.stop()
    assert b.chosen == "backward" and b.label == "backward() call"
    assert b.counts["backward"] == 6


def test_whether_a_backward_ran_is_known_while_counting(rec: Recorder) -> None:
    model = _model()
    assert backward_ran() is None  # nothing counts: not known
    b = _boundaries(rec)
    try:
        for _ in range(4):
            model(torch.randn(4, 8))  # an eval loop, autograd on
        assert backward_ran() is False and not b.backward_ran
        model(torch.randn(4, 8)).sum().backward()
        assert backward_ran() is True and b.backward_ran
    finally:
        b.stop()
    assert backward_ran() is None  # stopped: no longer known here
    assert b.backward_ran  # the finished count still says it


def test_a_backward_on_another_thread_is_known_and_is_not_a_boundary(rec: Recorder) -> None:
    import threading

    model = _model()
    b = _boundaries(rec)
    try:
        model(torch.randn(4, 8))
        t = threading.Thread(target=lambda: model(torch.randn(4, 8)).sum().backward())
        t.start()
        t.join()
        assert b.backward_ran and b.counts["backward"] == 0  # known, but no step of the session's thread
    finally:
        b.stop()


def test_eval_loop_counts_the_top_level_forward_once(rec: Recorder) -> None:
    model = _model()  # 4 module calls per forward: only the outermost counts
    b = _boundaries(rec)
    try:
        for _ in range(7):
            model(torch.randn(4, 8))
    finally:
        b.stop()
    assert b.chosen == "module" and b.label == "top-level Sequential() call"
    assert b.counts["module"] == 7
    assert rec.steps == 6  # from the second call on (one call is not a loop)


class Recursive(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, depth: int = 3) -> torch.Tensor:
        x = self.lin(x)
        return self(x, depth - 1) if depth else x


def test_recursion_in_forward_is_one_call(rec: Recorder) -> None:
    m = Recursive()
    b = _boundaries(rec)
    try:
        for _ in range(5):
            m(torch.randn(2, 4))
    finally:
        b.stop()
    assert b.counts["module"] == 5


def test_dataloader_batches_when_no_model(rec: Recorder) -> None:
    ds = torch.utils.data.TensorDataset(torch.randn(40, 3))
    loader = torch.utils.data.DataLoader(ds, batch_size=8)
    b = _boundaries(rec)
    try:
        acc = []
        for (x,) in loader:
            acc.append(x * 2)
    finally:
        b.stop()
    # one call per batch and the last one that ends the loop: every iteration ends at a boundary
    assert b.chosen == "dataloader" and b.counts["dataloader"] == 6


class TinyLM(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(16, 8)
        self.head = torch.nn.Linear(8, 16)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(ids))

    @torch.no_grad()
    def generate(self, ids: torch.Tensor, n: int) -> torch.Tensor:
        for _ in range(n):
            nxt = self(ids)[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, nxt], dim=1)
        return ids


def test_generate_calls_not_the_forwards_inside(rec: Recorder) -> None:
    lm = TinyLM()
    b = _boundaries(rec)
    try:
        for _ in range(4):
            lm.generate(torch.zeros(1, 1, dtype=torch.long), 6)
    finally:
        b.stop()
    assert b.chosen == "generate", (b.counts, rec.switches)
    assert b.label == "TinyLM.generate() call"
    assert b.counts["module"] == 0
    # the first generate call was running when it was found: the next three are counted
    assert b.counts["generate"] == 3
    assert "generate" not in TinyLM.__dict__["generate"].__dict__.get("__torchmem_boundary__", "")
    assert not getattr(TinyLM.__dict__["generate"], "__torchmem_boundary__", False)  # patch undone


def test_other_threads_do_not_count(rec: Recorder) -> None:
    model = _model()
    b = _boundaries(rec)

    def work() -> None:
        for _ in range(5):
            model(torch.randn(2, 8)).sum().backward()

    try:
        t = threading.Thread(target=work)
        t.start()
        t.join()
    finally:
        b.stop()
    assert b.chosen is None and b.counts == dict.fromkeys(b.counts, 0)


def test_stop_removes_every_hook_and_patch(rec: Recorder) -> None:
    before_backward, before_grad = torch.autograd.backward, torch.autograd.grad
    next_before = torch.utils.data.dataloader._BaseDataLoaderIter.__next__
    n_pre, n_post = len(mm._global_forward_pre_hooks), len(mm._global_forward_hooks)
    b = _boundaries(rec)
    assert torch.autograd.backward is not before_backward
    assert len(mm._global_forward_pre_hooks) == n_pre + 1
    b.stop()
    b.stop()  # idempotent
    assert torch.autograd.backward is before_backward and torch.autograd.grad is before_grad
    assert torch.utils.data.dataloader._BaseDataLoaderIter.__next__ is next_before
    assert len(mm._global_forward_pre_hooks) == n_pre and len(mm._global_forward_hooks) == n_post


def test_global_hooks_narrow_to_the_top_level_module(rec: Recorder) -> None:
    model = _model()
    other = torch.nn.Linear(2, 2)
    n_pre = len(mm._global_forward_pre_hooks)
    b = _boundaries(rec)
    try:
        for _ in range(5):
            model(torch.randn(2, 8))
        assert len(mm._global_forward_pre_hooks) == n_pre  # inner modules pay nothing any more
        assert len(model._forward_pre_hooks) == 1 and not other._forward_pre_hooks
    finally:
        b.stop()
    assert not model._forward_pre_hooks and not model._forward_hooks


def test_a_failing_step_callback_is_reported_once(rec: Recorder) -> None:
    def boom() -> None:
        raise RuntimeError("boom")

    model = _model()
    b = StepBoundaries(boom, rec.switch, on_error=rec.errors.append).start()
    try:
        for _ in range(6):
            model(torch.randn(2, 8)).sum().backward()  # the program goes on
    finally:
        b.stop()
    assert len(rec.errors) == 1 and "boom" in rec.errors[0]


def test_model_and_loss_module_per_iteration_is_one_step(rec: Recorder) -> None:
    model, criterion = _model(), torch.nn.MSELoss()
    b = _boundaries(rec)
    try:
        for _ in range(10):
            criterion(model(torch.randn(4, 8)), torch.zeros(4, 1))
    finally:
        b.stop()
    assert b.chosen == "module" and b.label == "top-level Sequential() call"
    assert b.counts["module"] == 10  # the model's calls, not the loss module's
    assert not criterion._forward_hooks


def test_the_boundaries_never_keep_a_deleted_model_or_optimizer_alive(tmp_path: Path) -> None:
    """A program that deletes its model and optimizer (to make room for the next one) gets the memory back
    under `torchmem run`: the step detection holds neither (it held the top-level modules it compared and
    the last optimizer that stepped)."""
    import weakref

    from torchmem.run.session import Session

    s = Session(str(tmp_path / "run.jsonl"), device="cpu", status=False).start()
    try:
        model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
        loss_fn = torch.nn.MSELoss()
        opt = torch.optim.Adam(model.parameters())
        for _ in range(3):
            loss_fn(model(torch.randn(8, 64)), torch.zeros(8, 1)).backward()
            opt.step()
            opt.zero_grad()
        gone = [weakref.ref(model), weakref.ref(opt), weakref.ref(model[0].weight), weakref.ref(loss_fn)]
        del model, opt, loss_fn
        gc.collect()
        assert [r() is None for r in gone] == [True] * 4
    finally:
        s.finish(0, "exit")
