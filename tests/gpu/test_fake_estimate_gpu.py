"""The device-free estimate (fake tensors, no device) against the measured peak of a real step on the GPU."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from torchmem.capture.fake import estimate_fake

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.fixture
def dev() -> Iterator[torch.device]:
    d = torch.device("cuda", 0)
    gc.collect()
    torch.cuda.empty_cache()
    yield d
    gc.collect()
    torch.cuda.empty_cache()


def _transformer() -> torch.nn.Module:
    return torch.nn.TransformerEncoder(
        torch.nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True, dropout=0.0),
        6,
        enable_nested_tensor=False,
    )


def _cnn() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 64, 3, padding=1),
        torch.nn.BatchNorm2d(64),
        torch.nn.ReLU(),
        torch.nn.Conv2d(64, 128, 3, padding=1),
        torch.nn.BatchNorm2d(128),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(128, 10),
    )


def _measured(factory: Any, x: torch.Tensor, dev: torch.device) -> tuple[int, int]:
    torch.manual_seed(0)
    model = factory().to(dev)
    xb = x.to(dev)
    model.eval()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats(dev)
    with torch.inference_mode():
        model(xb)
    torch.cuda.synchronize()
    inf = torch.cuda.max_memory_allocated(dev)
    model.train()
    opt = torch.optim.AdamW(model.parameters())
    peak = 0
    for i in range(3):
        if i == 2:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats(dev)
        model(xb).float().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated(dev)
    del model, opt, xb
    return int(peak), int(inf)


@pytest.mark.parametrize(
    ("factory", "shape"),
    [
        pytest.param(
            _transformer,
            (32, 256, 512),
            marks=pytest.mark.xfail(
                strict=True,
                reason="issue 16 open: the fake run is a CPU run; on the H100 the transformer's peak "
                "measured is 1.54x the fake estimate (2026-11-24, docs/benchmarks.md)",
            ),
        ),
        (_cnn, (64, 3, 64, 64)),
    ],
    ids=["transformer", "cnn"],
)
def test_fake_estimate_within_10_percent_of_the_measured_peak(
    dev: torch.device, factory: Any, shape: Any
) -> None:
    x = torch.randn(*shape)
    real_train, real_inf = _measured(factory, x, dev)
    est = estimate_fake(factory, x, optimizer="adamw", target="H100-80GB")
    fake_train, fake_inf = est.peak(shape[0], "training"), est.peak(shape[0], "inference")
    assert fake_train is not None and fake_inf is not None
    assert abs(fake_train - real_train) <= 0.10 * real_train, (fake_train, real_train)
    assert abs(fake_inf - real_inf) <= 0.10 * real_inf + (est.workspace or 0), (fake_inf, real_inf)
    assert est.fits
