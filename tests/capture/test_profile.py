"""``torchmem.profile()`` on the CPU: per-module figures checked against real tensors and the exact ledger."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import torchmem
from torchmem._errors import TrackingError
from torchmem.analysis.profile import ROW_KEYS, ModuleProfile, display_order, reconcile
from torchmem.capture.profile import ProfileError, Profiler, profile

NB = Callable[..., int]


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 8))


def _bytes(*ts: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in ts)


_HOOK_ATTRS = (
    "_forward_hooks",
    "_forward_pre_hooks",
    "_backward_hooks",
    "_backward_pre_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_forward_pre_hooks_with_kwargs",
    "_state_dict_hooks",
    "_load_state_dict_pre_hooks",
)


def _hook_state(model: nn.Module, opt: torch.optim.Optimizer | None = None) -> list[Any]:
    """Every hook registry of the model, its parameters and the optimizer, copied."""
    out: list[Any] = []
    for name, m in model.named_modules():
        out.append((name, [(a, dict(getattr(m, a, {}) or {})) for a in _HOOK_ATTRS]))
    for name, p in model.named_parameters():
        out.append((name, p._backward_hooks, p._post_accumulate_grad_hooks, p.grad_fn))
    if opt is not None:
        out.append(dict(opt._optimizer_step_pre_hooks))
        out.append(dict(opt._optimizer_step_post_hooks))
    out.append(torch._C._autograd._top_saved_tensors_default_hooks(False))
    return out


def _train_step(model: nn.Module, x: torch.Tensor, opt: torch.optim.Optimizer | None = None) -> None:
    model(x).square().mean().backward()
    if opt is not None:
        opt.step()


# -- exact figures ---------------------------------------------------------------------------------------


def test_docstring_example() -> None:
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 1))
    opt = torch.optim.Adam(model.parameters())
    x = torch.randn(16, 64)
    with profile(model, optimizer=opt) as prof:
        model(x).sum().backward()
        opt.step()
    r = prof.report()
    assert r.row("0").activations == x.numel() * 4
    assert r.totals.params == sum(p.numel() * 4 for p in model.parameters())


def test_mlp_figures_are_exact(nbytes: NB) -> None:
    model = _mlp()
    opt = torch.optim.Adam(model.parameters())
    x = torch.randn(16, 64)
    with profile(model, optimizer=opt) as prof:
        _train_step(model, x, opt)
    r = prof.report()
    lin0, lin2 = model[0], model[2]
    h = torch.relu(lin0(x))  # the shapes the forward made
    # parameters and gradients: numel * element_size of each
    assert r.row("0").params == _bytes(lin0.weight, lin0.bias)
    assert r.row("2").params == _bytes(lin2.weight, lin2.bias)
    assert r.totals.params == sum(_bytes(p) for p in model.parameters())
    assert r.totals.grads == sum(_bytes(p.grad) for p in model.parameters() if p.grad is not None)
    # Adam state: exp_avg + exp_avg_sq + step per parameter, storage bytes
    state = sum(nbytes(*[v for v in s.values() if isinstance(v, torch.Tensor)]) for s in opt.state.values())
    assert r.totals.optimizer_state == state
    assert r.row("0").optimizer_state == sum(
        nbytes(*[v for v in opt.state[p].values() if isinstance(v, torch.Tensor)]) for p in lin0.parameters()
    )
    # saved for backward: a Linear saves its input, a ReLU its output (the next Linear saves the same one)
    assert r.row("0").activations == _bytes(x)
    assert r.row("1").activations == _bytes(h)
    assert r.row("2").activations == _bytes(h)
    assert r.totals.activations == _bytes(x) + _bytes(h)  # one storage counted once at the root
    # a Linear's forward makes exactly its output: addmm, no temporaries
    assert r.row("0").forward_peak == _bytes(h)
    assert r.row("2").forward_peak == 16 * 8 * 4
    assert r.row("1").forward_peak == _bytes(h)
    assert r.steps == 1 and all(row.calls == 1 for row in r.rows)
    for row in r.rows:
        assert row.backward_peak is not None and row.backward_peak >= 0
    assert not r.notes or all("hook failed" not in n for n in r.notes)


def test_activations_per_pass_not_summed_over_steps() -> None:
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(16, 64)
    with profile(model, optimizer=opt) as prof:
        for _ in range(3):
            _train_step(model, x, opt)
            opt.zero_grad()
    r = prof.report()
    assert r.steps == 3 and r.row("0").calls == 3
    assert r.row("0").activations == _bytes(x)
    assert r.totals.grads == sum(_bytes(p) for p in model.parameters())  # seen at the step, then zeroed
    assert r.totals.optimizer_state == 0  # plain SGD keeps no state


def test_reconciliation_matches_the_ledger_peak() -> None:
    with torchmem.cpu_tracking():  # everything born under the ledger: its figure is the whole CPU truth
        model = _mlp()
        opt = torch.optim.Adam(model.parameters())
        x = torch.randn(32, 64)
        with torchmem.track("cpu", survivors=False) as t, profile(model, optimizer=opt) as prof:
            _train_step(model, x, opt)
            opt.zero_grad()
            _train_step(model, x, opt)
        rec = prof.report().reconciliation
        assert rec.measured_peak == t.peak
        assert rec.sum_of_parts is not None and rec.unexplained is not None
        assert rec.sum_of_parts + rec.unexplained == rec.measured_peak
        assert rec.parameters == sum(_bytes(p) for p in model.parameters())
        assert rec.transient is not None and rec.transient >= 0
        assert rec.unexplained >= 0
        assert rec.where


def test_reconciliation_of_a_forward_peak_is_exact() -> None:
    """No backward: the peak is in the ReLU, where the Linear's output and the ReLU's output coexist."""
    model = _mlp()
    x = torch.randn(8, 64)  # made before the block and never saved: invisible to the CPU ledger
    with profile(model) as prof, torch.no_grad():
        out = model(x)
    r = prof.report()
    rec = r.reconciliation
    h = 8 * 32 * 4
    assert rec.where == "forward of '1'"
    assert rec.measured_peak == rec.parameters + 2 * h
    assert rec.transient == h  # the ReLU's output, made inside the interval
    assert rec.unexplained == h  # the Linear's output: alive across the boundary, in no category
    assert rec.activations == 0  # under no_grad nothing is saved
    assert r.totals.activations == 0 and r.totals.backward_peak is None
    assert r.row("2").forward_peak == _bytes(out)


def test_small_cnn_with_batchnorm_and_inplace_relu() -> None:
    torch.manual_seed(0)
    cnn = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(8 * 8 * 8, 10),
    )
    opt = torch.optim.SGD(cnn.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(4, 3, 16, 16)
    y = torch.tensor([1, 2, 3, 4])
    with profile(cnn, optimizer=opt) as prof:
        nn.functional.cross_entropy(cnn(x), y).backward()
        opt.step()
    r = prof.report()
    conv_out = 4 * 8 * 16 * 16 * 4
    assert r.row("0").activations == _bytes(x)  # a conv saves its input
    assert r.row("1").activations is not None and r.row("1").activations >= conv_out  # BN saves its input
    assert r.row("3").activations == conv_out + 4 * 8 * 8 * 8 * 8  # max-pool: input + int64 indices
    assert r.row("5").activations == 4 * 8 * 8 * 8 * 4  # the Linear's (flattened) input
    assert r.row("1").params == _bytes(*cnn[1].parameters())
    assert r.totals.optimizer_state == sum(_bytes(p) for p in cnn.parameters())  # one momentum buffer each
    assert r.reconciliation.buffers == sum(
        b.untyped_storage().nbytes() for b in cnn.buffers()
    )  # running stats and the batch counter
    assert r.saved_outside is not None and r.saved_outside > 0  # cross_entropy saved its log-softmax


def test_transformer_encoder_layer() -> None:
    torch.manual_seed(0)
    enc = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    opt = torch.optim.AdamW(enc.parameters())
    x = torch.randn(2, 10, 32)
    with profile(enc, optimizer=opt) as prof:
        enc(x).sum().backward()
        opt.step()
    r = prof.report()
    assert r.row("linear1").activations == 2 * 10 * 32 * 4  # its input
    assert r.row("linear2").activations == 2 * 10 * 64 * 4  # its input (the ReLU's output)
    assert r.totals.params == sum(_bytes(p) for p in enc.parameters())
    assert r.row("self_attn").forward_peak is not None and r.row("self_attn").forward_peak > 0
    assert r.row("self_attn.out_proj").calls == 0  # MultiheadAttention uses its weights directly
    assert r.row("self_attn.out_proj").forward_peak is None
    rows = [row.to_row() for row in r.rows]  # the capture file's "modules" columns
    assert [list(row) for row in rows] == [list(ROW_KEYS)] * len(rows)
    full = r.to_dict()["rows"]
    assert all(set(ROW_KEYS) <= set(row) for row in full)
    assert type(r).from_dict(r.to_dict()) == r


# -- hooks are removed -------------------------------------------------------------------------------


def test_hooks_removed_after_a_normal_block() -> None:
    model = _mlp()
    opt = torch.optim.Adam(model.parameters())
    before = _hook_state(model, opt)
    with profile(model, optimizer=opt):
        _train_step(model, torch.randn(4, 64), opt)
    assert _hook_state(model, opt) == before
    # the model still trains normally and nothing fires any more
    _train_step(model, torch.randn(4, 64), opt)


def test_hooks_removed_after_an_exception_inside_a_forward() -> None:
    class Boom(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = _mlp()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.inner(x)
            raise ValueError("boom")

    model = Boom()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = _hook_state(model, opt)
    prof = profile(model, optimizer=opt)
    with pytest.raises(ValueError, match="boom"), prof:
        model(torch.randn(4, 64))
    assert _hook_state(model, opt) == before
    r = prof.report()
    assert any("raised ValueError" in n for n in r.notes)
    assert r.row("inner.0").calls == 1 and r.row("inner.0").activations == 4 * 64 * 4
    assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None


def test_an_exception_caught_inside_the_block_keeps_the_module_stack_straight() -> None:
    class Flaky(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(8, 8)
            self.fail = True

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if self.fail:
                self.fail = False
                raise RuntimeError("once")
            return self.lin(x)

    model = nn.Sequential(Flaky(), nn.Linear(8, 8))
    x = torch.randn(4, 8)
    with profile(model) as prof:
        with pytest.raises(RuntimeError):
            model(x)
        model(x).sum().backward()
    r = prof.report()
    assert r.row("0.lin").calls == 1 and r.row("1").calls == 1
    assert r.row("0.lin").activations == _bytes(x)


def test_an_error_inside_a_hook_is_reported_once_and_the_step_goes_on() -> None:
    armed = [False]

    class Broken(Profiler):
        def _observe_grads(self) -> None:
            if armed[0]:
                raise KeyError("grads")
            super()._observe_grads()

    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    w0 = model[0].weight.detach().clone()
    prof = Broken(model, optimizer=opt)
    with pytest.warns(RuntimeWarning, match="hook failed"), prof:
        armed[0] = True
        for _ in range(3):
            _train_step(model, torch.randn(4, 64), opt)
        armed[0] = False
    assert not torch.equal(model[0].weight, w0)  # the optimizer stepped every time
    failed = [n for n in prof.report().notes if "hook failed" in n]
    # once per place (the end of backward, the step pre-hook), not once per call
    assert len(failed) == 2, failed
    assert prof.report().row("0").calls == 3


# -- checkpointing, compile, shared modules ---------------------------------------------------------------


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(32, 128)
        self.b = nn.Linear(128, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


class _Ck(nn.Module):
    def __init__(self, mode: str) -> None:
        super().__init__()
        self.blk = _Block()
        self.head = nn.Linear(32, 1)
        self.mode = mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mode == "none":
            h = self.blk(x)
        else:
            h = checkpoint(self.blk, x, use_reentrant=self.mode == "reentrant")
        return self.head(h)


@pytest.mark.parametrize("mode", ["non_reentrant", "reentrant"])
def test_activation_checkpointing(mode: str) -> None:
    x = torch.randn(64, 32, requires_grad=mode == "reentrant")
    plain = _Ck("none")
    with profile(plain) as p0:
        plain(x).sum().backward()
    model = _Ck(mode)
    model.load_state_dict(plain.state_dict())
    with profile(model) as p1:
        model(x).sum().backward()
    r0, r1 = p0.report(), p1.report()
    # the checkpointed block keeps nothing for backward; its recomputation is not counted as a call
    assert r0.row("blk").activations == _bytes(x) + 64 * 128 * 4  # a's input, relu's output (b's input)
    assert r1.row("blk").activations == 0
    assert r1.row("blk").calls == 1 and r1.row("blk.a").calls == 1
    assert any("recomputed in backward" in n for n in r1.row("blk").notes)
    assert r1.totals.activations is not None and r0.totals.activations is not None
    assert r1.totals.activations < r0.totals.activations
    assert r1.totals.backward_peak is not None and r1.totals.backward_peak > 0
    assert r1.totals.grads == r0.totals.grads  # the same gradients come out
    for a, b in zip(plain.parameters(), model.parameters(), strict=True):
        assert a.grad is not None and b.grad is not None
        torch.testing.assert_close(a.grad, b.grad)


def test_shared_module_called_twice_and_reachable_twice() -> None:
    class Shared(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(16, 16)
            self.alias = self.lin

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin(self.alias(x))

    model = Shared()
    x = torch.randn(8, 16)
    with profile(model) as prof:
        model(x).sum().backward()
    r = prof.report()
    assert [row.module for row in r.rows] == ["", "lin"]
    lin = r.row("lin")
    assert lin.calls == 2
    assert lin.params == r.totals.params == _bytes(*model.lin.parameters())
    assert lin.activations == 2 * _bytes(x)  # x, then the first call's output
    assert any("also reachable as 'alias'" in n for n in lin.notes)


def test_tied_weights_counted_once_at_the_root() -> None:
    emb = nn.Embedding(50, 16)
    head = nn.Linear(16, 50, bias=False)
    head.weight = emb.weight
    model = nn.Sequential(emb, head)
    with profile(model) as prof:
        model(torch.randint(0, 50, (4, 6))).sum().backward()
    r = prof.report()
    assert r.row("0").params == r.row("1").params == 50 * 16 * 4
    assert r.totals.params == 50 * 16 * 4


def test_torch_compile_wrapper_is_measured_as_one_block() -> None:
    inner = _Block()
    compiled = torch.compile(inner, backend="aot_eager")
    x = torch.randn(16, 32)
    compiled(x).sum().backward()  # compile outside the block
    before = _hook_state(inner)
    with profile(compiled) as prof:
        compiled(x).sum().backward()
    assert _hook_state(inner) == before
    r = prof.report()
    assert r.model == "_Block (torch.compile)"
    assert [row.module for row in r.rows] == ["", "a", "b"]  # the user's names, no _orig_mod
    assert r.totals.params == sum(_bytes(p) for p in inner.parameters())
    assert r.totals.activations is not None and r.totals.activations >= _bytes(x)
    assert r.totals.forward_peak is not None and r.totals.forward_peak > 0
    assert r.row("a").activations is None and r.row("a").forward_peak is None
    assert r.row("a").params == _bytes(*inner.a.parameters())
    assert any("compile" in n for n in r.totals.notes)


def test_module_compiled_in_place_is_not_hooked() -> None:
    model = nn.Sequential(_Block(), nn.Linear(32, 1))
    model[0].compile(backend="aot_eager")
    x = torch.randn(8, 32)
    model(x).sum().backward()
    before = _hook_state(model)
    with profile(model) as prof:
        model(x).sum().backward()
    assert _hook_state(model) == before
    r = prof.report()
    assert r.row("0").forward_peak is None and r.row("0.a").activations is None
    assert r.row("1").activations == 8 * 32 * 4
    assert r.totals.forward_peak is not None


# -- the report object ---------------------------------------------------------------------------------


def test_report_str_and_to_dict() -> None:
    model = _mlp()
    opt = torch.optim.Adam(model.parameters())
    with profile(model, optimizer=opt) as prof:
        _train_step(model, torch.randn(16, 64), opt)
    r = prof.report()
    text = str(r)
    assert text == str(prof)
    lines = text.splitlines()
    assert "Sequential (model)" in lines[2]
    assert lines[3].startswith("    0 (Linear)")  # the largest child first, indented one level
    assert "reconciliation of the peak" in text and "unexplained" in text
    d = r.to_dict()
    json.dumps(d)
    assert d["rows"][0]["module"] == "" and d["totals"] == d["rows"][0]
    assert set(d["reconciliation"]) >= {"measured_peak", "sum_of_parts", "unexplained", "where"}
    with pytest.raises(KeyError):
        r.row("nope")


def test_no_optimizer_and_no_forward() -> None:
    model = _mlp()
    with profile(model) as prof:
        pass
    r = prof.report()
    assert r.steps == 0 and r.totals.optimizer_state is None and r.totals.forward_peak is None
    assert r.totals.params == sum(_bytes(p) for p in model.parameters())
    assert any("no forward pass" in n for n in r.notes)
    assert "n/a" in str(r)


def test_display_order_and_reconcile_are_pure() -> None:
    def row(name: str, params: int) -> ModuleProfile:
        return ModuleProfile(name, "M", name.count(".") + 1 if name else 0, 1, params, 0, None, 0, None, None)

    rows = [row("", 10), row("a", 1), row("b", 5), row("a.x", 1), row("b.y", 2), row("b.z", 3)]
    assert [r.module for r in display_order(rows)] == ["", "b", "b.z", "b.y", "a", "a.x"]
    rec = reconcile(100, 70, {"parameters": 40, "gradients": 10, "activations": 5}, "forward of 'a'")
    assert rec.transient == 30 and rec.sum_of_parts == 85 and rec.unexplained == 15
    assert reconcile(None, None, {}, "x").unexplained is None


# -- bad input -----------------------------------------------------------------------------------------


def test_bad_input() -> None:
    with pytest.raises(ProfileError, match=r"torch\.nn\.Module"):
        profile("model")  # type: ignore[arg-type]
    with pytest.raises(ProfileError, match="optimizer"):
        profile(_mlp(), optimizer="adam")  # type: ignore[arg-type]
    model = _mlp()
    prof = profile(model)
    with pytest.raises(TrackingError, match="not finished"):
        prof.report()
    with prof, pytest.raises(TrackingError, match="do not nest"), profile(model):
        pass
    with pytest.raises(TrackingError, match="already used"), prof:
        pass
    with pytest.raises(torchmem.DeviceError):
        profile(model, device="nope").__enter__()
    with profile(model):  # a failed entry left nothing open
        pass
