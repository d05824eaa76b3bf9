"""release() on the CPU with real modules, optimizers and graphs; the ledger proves the bytes died."""

from __future__ import annotations

import dataclasses
import sys
import weakref

import pytest
import torch

import torchmem
from torchmem.actions.release import ReleasedError


def _nbytes(*ts: torch.Tensor) -> int:
    return sum(t.untyped_storage().nbytes() for t in ts)


def _trained(width: int = 64) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(width, width), torch.nn.BatchNorm1d(width), torch.nn.Linear(width, 4)
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(8, width)).sum().backward()
    opt.step()
    return model, opt


def test_release_model_and_optimizer_frees_every_byte_and_leaves_shells() -> None:
    with torchmem.cpu_tracking() as cpu:
        model, opt = _trained()
        params = list(model.parameters())
        expected = (
            _nbytes(*params)
            + _nbytes(*[p.grad for p in params if p.grad is not None])
            + _nbytes(*[b for b in model.buffers()])
            + _nbytes(*[v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)])
        )
        before = cpu.allocated
        report = torchmem.release(model, opt)
        assert report.freed_bytes == expected
        assert before - cpu.allocated == expected
        assert report.remaining == ()
        assert report.errors == ()
        assert all(p.numel() == 0 and p.grad is None for p in model.parameters())
        assert model[0].weight is params[0]  # identity kept: the caller's references see the shell
        assert len(opt.state) == 0
        with pytest.raises(ReleasedError, match=r"emptied by torchmem\.release"):
            model(torch.randn(2, 64))
        with pytest.raises(ReleasedError):
            opt.step()
        assert "freed" in str(report) and report.to_dict()["freed_bytes"] == expected


def test_release_again_is_a_no_op() -> None:
    with torchmem.cpu_tracking():
        model, opt = _trained()
        torchmem.release(model, opt)
        again = torchmem.release(model, opt)
        assert again.freed_bytes == 0 and again.errors == ()


def test_none_ints_strings_are_skipped_and_listed() -> None:
    report = torchmem.release(None, 3, "text")
    assert report.freed_bytes == 0 and report.released_tensors == 0
    assert len(report.skipped) == 3 and "NoneType" in report.skipped[0]


def test_arbitrary_objects_dataclasses_and_dicts_of_outputs_with_graphs() -> None:
    @dataclasses.dataclass
    class Trainer:
        model: torch.nn.Module
        optimizer: torch.optim.Optimizer
        history: list[torch.Tensor]

    with torchmem.cpu_tracking() as cpu:
        start = cpu.allocated
        model, opt = _trained()
        x = torch.randn(16, 64)
        out = model(x)
        outputs = {"logits": out, "hidden": {"h": out * 2}}
        trainer = Trainer(model, opt, [torch.ones(100)])
        del out
        torchmem.release(trainer, outputs)
        # Everything the trainer and the outputs (and their autograd graphs) held is gone; x survives.
        assert cpu.allocated - start == _nbytes(x)


def test_optimizer_alone_frees_its_state_and_keeps_the_live_models_parameters() -> None:
    with torchmem.cpu_tracking() as cpu:
        model, opt = _trained()
        params = list(model.parameters())
        state = _nbytes(*[v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)])
        start = cpu.allocated
        report = torchmem.release(opt)
        assert report.freed_bytes == state == start - cpu.allocated
        assert all(p.numel() > 0 and p.grad is not None for p in params)  # the model still works
        assert {r.name for r in report.remaining} >= {"opt.param_groups[0]['params'][0]"}
        assert all("not released" in r.reason for r in report.remaining)
        model(torch.randn(4, 64)).sum().backward()


def test_offload_on_the_same_device_changes_nothing() -> None:
    model, opt = _trained()
    w = model[0].weight.detach().clone()
    report = torchmem.release(model, opt, offload=True)
    assert report.released_tensors == 0 and report.freed_bytes == 0
    assert torch.equal(model[0].weight, w)
    model(torch.randn(4, 64)).sum().backward()
    opt.step()


def test_tied_weights_shared_with_an_unreleased_module_are_kept_and_reported() -> None:
    a = torch.nn.Linear(8, 8)
    b = torch.nn.Linear(8, 8)
    b.weight = a.weight
    report = torchmem.release(a)
    assert a.weight.numel() == 64 and b.weight is a.weight  # intact: b still needs it
    assert a.bias.numel() == 0
    assert [r.name for r in report.remaining] == ["a.weight"]
    assert "not released" in report.remaining[0].reason
    assert report.remaining[0].paths  # named holders


def test_parameters_shared_between_two_released_modules_are_freed_once() -> None:
    with torchmem.cpu_tracking() as cpu:
        a = torch.nn.Linear(32, 32)
        b = torch.nn.Linear(32, 32)
        b.weight = a.weight
        start = cpu.allocated
        report = torchmem.release(a, b)
        assert report.freed_bytes == start - cpu.allocated == start


def test_a_view_held_elsewhere_keeps_the_storage_and_is_named() -> None:
    with torchmem.cpu_tracking():
        model = torch.nn.Linear(128, 128)
        keep = {"slice": model.weight[:4].detach()}
        report = torchmem.release(model)
        names = [r.name for r in report.remaining]
        assert names == ["model.weight"]
        assert report.remaining[0].bytes == 128 * 128 * 4
        assert any("keep" in p for p in report.remaining[0].paths)
        assert keep["slice"].shape == (4, 128)


def test_tensors_on_another_device_than_the_one_released_are_skipped() -> None:
    t = torch.ones(10)
    report = torchmem.release({"t": t}, device="cpu")
    assert report.released_tensors == 1
    meta = torch.empty(10, device="meta")
    report = torchmem.release(meta)
    assert report.released_tensors == 0


def test_exception_holding_activations_is_cleared() -> None:
    def step() -> None:
        activ = torch.ones(256, 256)  # noqa: F841 - kept alive by the traceback
        raise RuntimeError("boom")

    with torchmem.cpu_tracking() as cpu:
        start = cpu.allocated
        try:
            step()
        except RuntimeError as e:
            err = e
        assert cpu.allocated - start == 256 * 256 * 4
        report = torchmem.release(err)
        assert cpu.allocated == start
    # Freed *inside* release(), before the cache is emptied: the frame's f_locals snapshot (<= 3.12) must
    # not keep the activation until the next f_locals read (a GPU run left 2 GiB reserved that way).
    assert report.freed_bytes == 256 * 256 * 4
    assert report.remaining == ()


def test_sys_last_traceback_holding_tensors_is_cleared() -> None:
    def fail() -> None:
        big = torch.ones(512, 512)  # noqa: F841
        raise ValueError("x")

    with torchmem.cpu_tracking() as cpu:
        start = cpu.allocated
        try:
            fail()
        except ValueError:
            sys.last_type, sys.last_value, sys.last_traceback = sys.exc_info()
        assert cpu.allocated - start == 512 * 512 * 4
        model = torch.nn.Linear(4, 4)
        report = torchmem.release(model)
        assert sys.last_traceback is None
        assert any("last_traceback" in a for a in report.actions)
        assert cpu.allocated == start


def test_module_hooks_and_attributes_are_released() -> None:
    with torchmem.cpu_tracking() as cpu:
        start = cpu.allocated
        model = torch.nn.Linear(16, 16)
        cache: list[torch.Tensor] = []
        model.register_forward_hook(lambda m, i, o: cache.append(o.detach()))
        model.extra = torch.ones(1000)  # a plain tensor attribute
        model(torch.ones(4, 16))
        torchmem.release(model)
        assert cpu.allocated == start
        assert cache[0].numel() == 0


def test_release_does_not_keep_objects_alive() -> None:
    model, opt = _trained()
    r1, r2 = weakref.ref(model), weakref.ref(opt)
    torchmem.release(model, opt)
    del model, opt
    assert r1() is None and r2() is None


def test_ipython_output_history_is_cleared() -> None:
    pytest.importorskip("IPython")
    InteractiveShell = pytest.importorskip("IPython.core.interactiveshell").InteractiveShell

    shell = InteractiveShell.instance()
    try:
        with torchmem.cpu_tracking() as cpu:
            start = cpu.allocated
            shell.run_cell("import torch\nmodel = torch.nn.Linear(64, 64)")
            shell.run_cell("model.weight * 2", store_history=True)  # the result lands in Out[2] and _
            assert cpu.allocated - start == 2 * 64 * 64 * 4 + 64 * 4
            report = torchmem.release(shell.user_ns["model"])
            assert any("IPython" in a for a in report.actions)
            assert cpu.allocated == start
    finally:
        InteractiveShell.clear_instance()


def test_scope_reports_what_outlives_the_block() -> None:
    history: list[torch.Tensor] = []
    with torchmem.scope() as sc:
        w = torch.randn(64, 64, requires_grad=True)
        out = sc.keep((w @ w).sum())
        history.append(w.detach() * 2)
        tmp = torch.ones(1000)
        del tmp
    r = sc.report
    assert r is not None
    # history[0] only: w is saved by the kept output's graph, so it counts as kept
    assert r.survived_bytes == 64 * 64 * 4
    assert r.kept_bytes == out.untyped_storage().nbytes() + w.untyped_storage().nbytes()
    assert any("history" in p for s in r.survivors for p in s.paths)
    assert "still alive" in str(r)


def test_live_tensors_categories_and_reconciliation() -> None:
    with torchmem.cpu_tracking() as cpu:
        model, opt = _trained(32)
        x = torch.randn(8, 32)
        loss = model(x).pow(2).sum()  # a graph with saved activations
        report = torchmem.live_tensors("cpu")
        cats = report.by_category
        params = list(model.parameters())
        assert cats["parameter"] >= _nbytes(*params)
        assert cats["gradient"] >= _nbytes(*[p.grad for p in params if p.grad is not None])
        assert cats["optimizer state"] >= _nbytes(
            *[v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
        )
        assert cats["buffer"] >= _nbytes(*list(model.buffers()))
        assert cats.get("saved for backward", 0) > 0
        assert report.allocated == cpu.allocated
        # Every storage the ledger counted is found, including those only the graph of `loss` holds.
        assert report.total >= cpu.allocated
        del loss


def test_compiled_module_caches_are_reset() -> None:
    with torchmem.cpu_tracking() as cpu:
        start = cpu.allocated
        model = torch.nn.Linear(64, 64)
        compiled = torch.compile(model, backend="eager")
        compiled(torch.ones(4, 64))
        report = torchmem.release(compiled)
        assert any("torch.compile" in a for a in report.actions)
        assert model.weight.numel() == 0  # the wrapped module was released through the wrapper
        assert cpu.allocated == start


def test_only_the_requested_device_is_released() -> None:
    t = torch.ones(10)
    meta = torch.empty(10, device="meta")
    report = torchmem.release({"t": t, "m": meta}, device="cpu")
    assert report.released_tensors == 1 and t.numel() == 0


def test_release_of_an_exception_never_empties_the_live_model_or_the_callers_input() -> None:
    class Boom(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            activ = self.fc(x).relu()  # noqa: F841 - only the traceback holds it
            raise RuntimeError("boom")

    model, batch = Boom(), torch.ones(4, 8)
    with torchmem.cpu_tracking() as cpu:
        try:
            model(batch)
        except RuntimeError as e:
            err = e
        held = cpu.allocated
        assert held > 0
        torchmem.release(err)
        assert cpu.allocated == 0  # the activation died with the cleared frames
    assert model.fc.weight.shape == (8, 8) and batch.shape == (4, 8)
    model.fc(batch)


def test_sparse_tensors_are_skipped_not_a_crash_and_dataclass_extras_are_released() -> None:
    sparse = torch.sparse_coo_tensor(
        torch.tensor([[0, 1], [1, 0]]), torch.tensor([1.0, 2.0]), (2, 2), check_invariants=True
    )
    report = torchmem.release({"s": sparse})
    assert report.errors == () and any("sparse" in s for s in report.skipped)

    @dataclasses.dataclass
    class Holder:
        a: torch.Tensor

        def __post_init__(self) -> None:
            self.cache = torch.ones(1000)

    h = Holder(torch.ones(10))
    report = torchmem.release(h)
    assert report.released_tensors == 2 and h.cache.numel() == 0


def test_a_submodule_shared_with_an_unreleased_model_is_kept() -> None:
    shared = torch.nn.Linear(4, 4)
    a = torch.nn.Sequential(shared, torch.nn.ReLU(), torch.nn.Linear(4, 4))
    b = torch.nn.Sequential(shared, torch.nn.Tanh())
    report = torchmem.release(a)
    assert b[0].weight.shape == (4, 4) and a[2].weight.numel() == 0
    assert {r.name for r in report.remaining} == {"a.0.weight", "a.0.bias"}
    b(torch.ones(2, 4))  # still works, no ReleasedError


def test_modules_and_optimizers_with_nothing_released_are_not_marked() -> None:
    # Two devices on a CPU-only machine: `cpu` is released, the meta model holds nothing on it.
    torch.manual_seed(0)
    real = torch.nn.Linear(8, 8)
    real_opt = torch.optim.SGD(real.parameters(), lr=0.1, momentum=0.9)
    real(torch.ones(2, 8)).sum().backward()
    real_opt.step()
    other = torch.nn.Sequential(torch.nn.Linear(8, 8, device="meta"), torch.nn.ReLU())
    other_opt = torch.optim.SGD(other.parameters(), lr=0.1, momentum=0.9)
    other(torch.ones(2, 8, device="meta")).sum().backward()
    other_opt.step()
    assert len(other_opt.state) == 2

    report = torchmem.release(real, real_opt, other, other_opt, device="cpu")
    assert report.errors == ()
    assert real.weight.numel() == 0
    # What held nothing on the released device keeps working, state included.
    other(torch.ones(2, 8, device="meta")).sum().backward()
    assert len(other_opt.state) == 2
    other_opt.step()
    assert "cleared the state of 1 optimizer" in report.actions
    # What was emptied raises the clear error.
    with pytest.raises(ReleasedError):
        real(torch.ones(2, 8))
    with pytest.raises(ReleasedError):
        real_opt.step()


def test_a_parent_whose_tensors_live_in_children_is_marked() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    relu: torch.nn.Module = model[1]
    torchmem.release(model)
    with pytest.raises(ReleasedError):
        model(torch.ones(1, 4))
    with pytest.raises(ReleasedError):
        model[0](torch.ones(1, 4))
    assert relu(torch.ones(1, 4)).shape == (1, 4)  # it held nothing and still works
