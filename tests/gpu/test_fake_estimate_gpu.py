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


def _transformer(dropout: float = 0.0) -> torch.nn.Module:
    return torch.nn.TransformerEncoder(
        torch.nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True, dropout=dropout),
        6,
        enable_nested_tensor=False,
    )


def _transformer_dropout() -> torch.nn.Module:
    return _transformer(0.1)


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


def _clear_workspaces() -> None:
    """Free the cuBLAS workspaces earlier tests left (the autograd thread's among them), so that the
    measured step holds its own: one in inference, two in training (forward and backward threads)."""
    torch.cuda.synchronize()
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()
    torch.cuda.empty_cache()


def _measured(factory: Any, x: torch.Tensor, dev: torch.device) -> tuple[int, int]:
    """(training peak, inference peak): steady state, the third step and the second forward."""
    _clear_workspaces()
    torch.manual_seed(0)
    model = factory().to(dev)
    xb = x.to(dev)
    model.eval()
    with torch.inference_mode():
        model(xb)  # warm-up: the main thread's cuBLAS workspace
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
    [(_transformer, (32, 256, 512)), (_transformer_dropout, (32, 256, 512)), (_cnn, (64, 3, 64, 64))],
    ids=["transformer", "transformer-dropout", "cnn"],
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
    assert abs(fake_inf - real_inf) <= 0.10 * real_inf, (fake_inf, real_inf)
    assert est.fits
