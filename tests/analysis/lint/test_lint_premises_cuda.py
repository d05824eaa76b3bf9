"""CUDA: the device-scale claims of the lint messages, measured with the caching allocator's counters.

TM010 and TM011 say a kept eval output or a kept exception holds a forward's activations on the device
(device memory grows by about a forward's activation memory per step); TM001 after ``backward()`` says the
activations are freed and what grows on the device is only the kept tensor (a scalar for a loss). Each
test runs the wrong form and the right form of the rule's page on the same model.
"""

from __future__ import annotations

import gc
from typing import Any

import pytest
import torch

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

MiB = 1 << 20
STEPS = 6
BATCH, WIDTH, DEPTH = 256, 1024, 8  # one activation: 1 MiB; a forward saves about 2 per layer


def _model() -> torch.nn.Module:
    layers: list[torch.nn.Module] = []
    for _ in range(DEPTH):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers).cuda()


def _growth_per_step(run: Any) -> float:
    """Device bytes still allocated per step after ``run(steps)`` returns what it kept."""
    gc.collect()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    kept = run(STEPS)
    torch.cuda.synchronize()
    grown = torch.cuda.memory_allocated() - before
    del kept
    gc.collect()
    return grown / STEPS


def test_tm010_kept_eval_outputs_hold_a_forwards_activations_per_step() -> None:
    model = _model().eval()
    xs = [torch.randn(BATCH, WIDTH, device="cuda") for _ in range(STEPS)]

    def wrong(n: int) -> list[torch.Tensor]:
        preds = []
        for x in xs[:n]:
            preds.append(model(x))
        return preds

    def right(n: int) -> list[torch.Tensor]:
        preds = []
        with torch.no_grad():
            for x in xs[:n]:
                preds.append(model(x))
        return preds

    output = BATCH * WIDTH * 4
    kept_wrong, kept_right = _growth_per_step(wrong), _growth_per_step(right)
    assert kept_right <= 1.5 * output  # only the outputs
    assert kept_wrong >= (DEPTH - 1) * output  # every layer's saved input, per step


def test_tm001_after_backward_a_kept_loss_keeps_no_activations() -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    xs = [torch.randn(BATCH, WIDTH, device="cuda") for _ in range(STEPS)]

    def train(n: int) -> list[torch.Tensor]:
        losses = []
        for x in xs[:n]:
            loss = model(x).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss)  # TM001: the graph's nodes (host) and a scalar (device)
        return losses

    train(1)  # optimizer state and gradients allocated before the measurement
    assert _growth_per_step(train) < 0.1 * MiB  # no activations: backward freed them


def test_tm011_a_kept_exception_holds_the_failed_forwards_activations() -> None:
    model = _model().eval()
    xs = [torch.randn(BATCH, WIDTH, device="cuda") for _ in range(STEPS)]

    def step(x: torch.Tensor) -> None:
        out = model(x)  # noqa: F841 - a local of the failing frame, with its graph
        raise RuntimeError("out of memory")

    def run(keep: Any) -> Any:
        def loop(n: int) -> list[Any]:
            errors = []
            for x in xs[:n]:
                try:
                    step(x)
                except RuntimeError as e:
                    errors.append(keep(e))
            return errors

        return loop

    output = BATCH * WIDTH * 4
    assert _growth_per_step(run(lambda e: e)) >= (DEPTH - 1) * output  # the frame's output and its graph
    assert _growth_per_step(run(str)) < 0.1 * MiB
