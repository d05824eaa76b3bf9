"""Claim: torchmem.estimate predicts the peak of a training step within 10 % (MLP, CNN, small transformer).

One run per model: the measured peak of a steady training step (AdamW, third step; CUDA: the caching
allocator's peak allocated above the figure before the model existed; CPU: the exact ledger) against
torchmem.estimate (two small measured steps, extrapolated) and against the weights-only figure that
peers' estimators report (accelerate estimate-memory's idea: the size of the weights).

Run: PYTHONPATH=src python3 benchmarks/estimate.py  [--cpu]
"""

from __future__ import annotations

import argparse
import copy
import gc
import time
from collections.abc import Callable

import torch

import torchmem
from torchmem.capture.measure import estimate


def models(cpu: bool) -> dict[str, tuple[Callable[[], torch.nn.Module], Callable[[int], torch.Tensor], int]]:
    w = 1 if cpu else 4
    return {
        "MLP": (
            lambda: torch.nn.Sequential(
                torch.nn.Linear(1024, 1024 * w),
                torch.nn.GELU(),
                torch.nn.Linear(1024 * w, 1024 * w),
                torch.nn.GELU(),
                torch.nn.Linear(1024 * w, 10),
            ),
            lambda b: torch.randn(b, 1024),
            64 if cpu else 1024,
        ),
        "CNN": (
            lambda: torch.nn.Sequential(
                torch.nn.Conv2d(3, 32 * w, 3, padding=1),
                torch.nn.BatchNorm2d(32 * w),
                torch.nn.ReLU(),
                torch.nn.Conv2d(32 * w, 64 * w, 3, padding=1),
                torch.nn.BatchNorm2d(64 * w),
                torch.nn.ReLU(),
                torch.nn.MaxPool2d(2),
                torch.nn.Conv2d(64 * w, 64 * w, 3, padding=1),
                torch.nn.ReLU(),
                torch.nn.AdaptiveAvgPool2d(1),
                torch.nn.Flatten(),
                torch.nn.Linear(64 * w, 10),
            ),
            lambda b: torch.randn(b, 3, 32, 32),
            32 if cpu else 256,
        ),
        "Transformer": (
            lambda: torch.nn.TransformerEncoder(
                torch.nn.TransformerEncoderLayer(128 * w, 8, 512 * w, batch_first=True, dropout=0.1),
                2 if cpu else 6,
                enable_nested_tensor=False,
            ),
            lambda b: torch.randn(b, 64 if cpu else 256, 128 * w),
            16 if cpu else 64,
        ),
    }


def measured_peak(model: torch.nn.Module, x: torch.Tensor, dev: torch.device) -> int:
    """Peak of the third AdamW step above the figure before the model (and batch) existed."""
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated(dev)
    with torchmem.cpu_tracking() if dev.type == "cpu" else torch.enable_grad() as cpu:
        m = copy.deepcopy(model).to(dev)
        xb = x.to(dev)
        opt = torch.optim.AdamW(m.parameters())
        for i in range(3):
            if i == 2:
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats(dev)
                else:
                    torchmem.reset_peak("cpu")
            m(xb).float().mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        if dev.type == "cuda":
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated(dev) - base
        else:
            peak = cpu.peak
        del m, opt, xb
    return int(peak)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpu", action="store_true")
    args = ap.parse_args()
    cpu = args.cpu or not torch.cuda.is_available()
    dev = torch.device("cpu") if cpu else torch.device("cuda", 0)
    if dev.type == "cuda":
        (torch.ones(64, 64, device=dev) @ torch.ones(64, 64, device=dev)).sum().item()  # cuBLAS workspace
    print(f"device {dev}; AdamW training step; estimate from two small measured steps")
    print(
        "| model | batch | measured peak MiB | torchmem estimate MiB | error % "
        "| weights-only MiB | error % | estimate s |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, (make, data, bs) in models(cpu).items():
        torch.manual_seed(0)
        model = make()
        t = time.perf_counter()
        est = estimate(model, data(2), optimizer="adamw", batch_sizes=[bs], device=dev)
        secs = time.perf_counter() - t
        real = measured_peak(model, data(bs), dev)
        pred = est.peak(bs)
        assert pred is not None
        mib = 1 << 20
        print(
            f"| {name} | {bs} | {real / mib:.1f} | {pred / mib:.1f} | {100 * (pred - real) / real:+.1f} | "
            f"{est.weights_only / mib:.1f} | {100 * (est.weights_only - real) / real:+.1f} | {secs:.2f} |"
        )


if __name__ == "__main__":
    main()
