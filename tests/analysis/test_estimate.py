"""estimate(): predicted peaks of real models against their measured peaks on the CPU (exact ledger)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch

import torchmem
from torchmem.analysis.estimate import FitArgumentError, StepMeasurement, build_estimate
from torchmem.capture.measure import estimate


def _mlp() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(128, 512),
        torch.nn.GELU(),
        torch.nn.Linear(512, 512),
        torch.nn.GELU(),
        torch.nn.Linear(512, 10),
    )


def _cnn() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1),
        torch.nn.BatchNorm2d(16),
        torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(32, 10),
    )


def _transformer() -> torch.nn.Module:
    layer = torch.nn.TransformerEncoderLayer(64, 4, 256, batch_first=True, dropout=0.1)
    return torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)


CASES: dict[str, tuple[Callable[[], torch.nn.Module], Callable[[int], torch.Tensor]]] = {
    "mlp": (_mlp, lambda b: torch.randn(b, 128)),
    "cnn": (_cnn, lambda b: torch.randn(b, 3, 16, 16)),
    "transformer": (_transformer, lambda b: torch.randn(b, 32, 64)),
}


def _measured_peak(model: torch.nn.Module, x: torch.Tensor, training: bool) -> int:
    """The real peak of a steady step (third step, after optimizer state exists), exact on the CPU.

    The batch is counted too (it lives on the device during a real step, and the estimate includes it).
    """
    with torchmem.cpu_tracking() as cpu:
        x = x.clone()
        m = copy.deepcopy(model)
        opt = torch.optim.AdamW(m.parameters())
        for i in range(3):
            if i == 2:
                torchmem.reset_peak("cpu")
            if training:
                m.train()
                loss = m(x).float().mean()
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                del loss
            else:
                m.eval()
                with torch.inference_mode():
                    m(x)
        peak = cpu.peak
        del m, opt
    return peak


@pytest.mark.parametrize("name", list(CASES))
def test_estimate_is_within_10_percent_of_the_measured_peak(name: str) -> None:
    make, data = CASES[name]
    torch.manual_seed(0)
    model = make()
    est = estimate(model, data(2), optimizer="adamw", batch_sizes=[16, 48], device="cpu")
    for bs in (16, 48):
        for mode, training in (("training", True), ("inference", False)):
            predicted = est.peak(bs, mode)
            real = _measured_peak(model, data(bs), training)
            assert predicted is not None
            assert abs(predicted - real) <= 0.10 * real, (name, bs, mode, predicted, real)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    assert est.parameters == params
    assert est.gradients == params
    assert est.optimizer_state >= 2 * params  # AdamW: exp_avg + exp_avg_sq (+ step)
    assert est.weights_only >= params
    assert est.weights_only < est.peak(16)  # type: ignore[operator]
    for row in est.rows:
        parts = row.parameters + row.gradients + row.optimizer_state + row.temporaries
        if row.activations_in_peak:  # an optimizer-step peak comes after backward freed the activations
            parts += row.activations
        assert parts == row.peak
    acts = [r.activations for r in est.rows if r.mode == "training"]
    assert 0 < acts[0] < acts[1]  # saved for backward, whichever phase holds the peak


def test_the_users_model_and_optimizer_are_left_as_they_were() -> None:
    torch.manual_seed(0)
    model = _transformer()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(2, 32, 64)).mean().backward()
    opt.step()
    model(torch.randn(2, 32, 64)).mean().backward()  # grads present now
    model.eval()
    params = [p.detach().clone() for p in model.parameters()]
    grads = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
    state = {
        k: {n: v.clone() if isinstance(v, torch.Tensor) else v for n, v in s.items()}
        for k, s in opt.state.items()
    }
    x = torch.randn(2, 32, 64)
    rng = torch.get_rng_state()

    est = estimate(model, x, optimizer=opt, batch_sizes=[8], device="cpu")

    assert est.optimizer_state > 0
    assert not model.training and all(not m.training for m in model.modules())
    assert torch.equal(torch.get_rng_state(), rng)
    for p, before, g in zip(model.parameters(), params, grads):
        assert torch.equal(p, before)
        assert g is not None and p.grad is not None and torch.equal(p.grad, g)
    assert set(opt.state) == set(state)
    for k, s in opt.state.items():
        for n, v in s.items():
            ref = state[k][n]
            assert torch.equal(v, ref) if isinstance(v, torch.Tensor) else v == ref
    assert opt.param_groups[0]["lr"] == 1e-2


def test_inference_only_and_optimizer_forms() -> None:
    model = _mlp()
    x = torch.randn(4, 128)
    inf = estimate(model, x, training=False, batch_sizes=[8])
    assert [r.mode for r in inf.rows] == ["inference"]
    assert inf.gradients == 0 and inf.optimizer_state == 0
    sgd = estimate(model, x, optimizer=torch.optim.SGD, batch_sizes=[8])
    assert sgd.optimizer_state == 0  # plain SGD keeps no state
    adam = estimate(model, x, optimizer=lambda ps: torch.optim.Adam(ps, lr=1e-3), batch_sizes=[8])
    assert adam.optimizer_state >= 2 * adam.parameters
    none = estimate(model, x, batch_sizes=[8])
    assert none.optimizer_state == 0 and any("no optimizer" in n for n in none.notes)
    text = str(adam)
    assert "training" in text and "inference" in text and "optimizer state" in text
    d: dict[str, Any] = adam.to_dict()
    assert d["rows"][0]["batch_size"] == 8


def test_dict_inputs_and_bf16() -> None:
    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = torch.nn.Embedding(100, 32)
            self.out = torch.nn.Linear(32, 100)

        def forward(self, ids: torch.Tensor, scale: float = 1.0) -> dict[str, torch.Tensor]:
            logits = self.out(self.emb(ids)) * scale
            return {"loss": torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids.flatten())}

    est = estimate(Net(), {"ids": torch.randint(0, 100, (2, 16)), "scale": 2.0}, batch_sizes=[4, 64])
    half = estimate(Net(), {"ids": torch.randint(0, 100, (2, 16))}, batch_sizes=[4], dtype=torch.bfloat16)
    assert half.parameters * 2 == est.parameters
    assert est.peak(64) > est.peak(4)  # type: ignore[operator]


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((torch.tensor(3.0),), {}),
        ((torch.randn(2, 128),), {"batch_sizes": [0]}),
        ((torch.randn(2, 128),), {"optimizer": "nope"}),
        ((torch.randn(2, 128),), {"probe_sizes": [4]}),
    ],
)
def test_bad_input(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    with pytest.raises(FitArgumentError):
        estimate(_mlp(), *args, **kwargs)


def test_not_a_module() -> None:
    with pytest.raises(FitArgumentError):
        estimate(lambda x: x, torch.randn(2, 2))  # type: ignore[arg-type]


def test_build_estimate_fits_each_phase_and_splits_the_peak() -> None:
    ms = [StepMeasurement(b, 100 + 10 * b, 90 + 8 * b, 90, 95 + 12 * b, 120, 60 + 3 * b, 50) for b in (2, 4)]
    e = build_estimate(
        ms,
        batch_sizes=[1, 100],
        parameters=40,
        gradients=40,
        optimizer_state=30,
        weights_only=40,
        training=True,
        model="M",
        device="cpu",
        measured_on="cpu",
    )
    small, big = e.rows[0], e.rows[1]
    assert small.phase == "optimizer" and small.peak == 120  # batch-independent phase wins at bs 1
    assert big.phase == "backward" and big.peak == 95 + 1200
    assert big.activations == 800 and big.gradients == 40 and big.temporaries == big.peak - 40 - 30 - 800 - 40
    assert e.activations_per_sample == 8.0
    assert e.peak(100, "inference") == 360
    assert e.peak(7) is None


def test_activations_are_reported_when_the_optimizer_step_holds_the_peak() -> None:
    ms = [
        StepMeasurement(
            b, 100 + 10 * b, 90 + 8 * b, 90, 95 + 12 * b, 1000, 60 + 3 * b, 50, saved_for_backward=7 * b
        )
        for b in (2, 4)
    ]
    e = build_estimate(
        ms,
        batch_sizes=[2, 4, 10],
        parameters=200,
        gradients=200,
        optimizer_state=400,
        weights_only=200,
        training=True,
        model="M",
        device="cpu",
        measured_on="cpu",
    )
    rows = [r for r in e.rows if r.mode == "training"]
    assert [r.phase for r in rows] == ["optimizer"] * 3
    assert [r.activations for r in rows] == [14, 28, 70]  # the saved bytes, not the growth over forward
    assert e.activations_per_sample == 7.0
    for r in rows:
        assert not r.activations_in_peak and r.to_dict()["activations_in_peak"] is False
        assert r.parameters + r.gradients + r.optimizer_state + r.temporaries == r.peak == 1000
    text = str(e)
    assert "14 B*" in text and "freed before the optimizer step" in text and "optimizer" in text


K = 4096  # bytes per unit below (a bend under 1 KiB per sample is not reported)


def _step(b: int, fwd: int, bwd: int) -> StepMeasurement:
    return StepMeasurement(b, fwd * K, fwd * K, 0, bwd * K, 0, fwd * K // 2, 0, fwd * K // 2)


def test_a_bent_peak_is_extrapolated_from_the_largest_probes_and_said() -> None:
    # backward: flat at small sizes (the gradients hold its peak), 100 per sample from 4 on (activations)
    m = [_step(2, 1000 + 50 * 2, 2000), _step(4, 1000 + 50 * 4, 2000), _step(8, 1000 + 50 * 8, 2400)]
    e = build_estimate(
        m,
        batch_sizes=[4, 6, 32],
        parameters=100,
        gradients=100,
        optimizer_state=0,
        weights_only=100,
        training=True,
        model="M",
        device="cpu",
        measured_on="cpu",
    )
    assert e.peak(4) == 2000 * K  # measured sizes are exact
    assert e.peak(6) == 2200 * K  # between two, on the segment joining them
    assert (
        e.peak(32) == (2400 + 100 * 24) * K
    )  # beyond, on the largest probes' line (a line through all: 4736)
    assert any("not linear" in n and "batch size 4" in n for n in e.notes)
    straight = [_step(b, 1000 + 50 * b, 1500 + 60 * b) for b in (2, 4, 8)]
    e2 = build_estimate(
        straight,
        batch_sizes=[32],
        parameters=100,
        gradients=100,
        optimizer_state=0,
        weights_only=100,
        training=True,
        model="M",
        device="cpu",
        measured_on="cpu",
    )
    assert e2.peak(32) == (1500 + 60 * 32) * K and not any("not linear" in n for n in e2.notes)


def test_probes_grow_toward_the_asked_size_and_predict_it() -> None:
    """The example's batch (2) is far below the asked size (32): estimate() probes 2, 4, 8 and 16 and the
    prediction at 32 is the measured peak (exact ledger); explicit probe_sizes are kept as given."""
    make, data = CASES["transformer"]
    torch.manual_seed(0)
    model = make()
    est = estimate(model, data(2), optimizer="adamw", batch_sizes=[32], device="cpu")
    assert est.measured_at == (2, 4, 8, 16)
    for training in (True, False):
        measured = _measured_peak(model, data(32), training)
        predicted = est.peak(32, "training" if training else "inference")
        assert predicted is not None and abs(predicted - measured) <= 0.03 * measured, (training, predicted)
    given = estimate(model, data(2), optimizer="adamw", batch_sizes=[32], device="cpu", probe_sizes=(2, 4))
    assert given.measured_at == (2, 4)
