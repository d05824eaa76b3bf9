"""A device-bound step: a few wide Linear layers on a large batch, where the matmuls dominate the step.

On CUDA: 3x Linear(8192) with ReLU, a batch of 8192, TF32 matmuls, SGD with momentum, 300 steps (tens of
milliseconds a step, almost all of it on the GPU). ``torchmem run`` must cost at most 1 % here. On the CPU
the same shape scaled down (Linear(1024), a batch of 1024) so the run lasts about half a minute.

    python benchmarks/programs/gpubound_matmul.py [--device cpu|cuda] [--steps N] [--width W] [--batch-size B]

The environment variable ``TORCHMEM_BENCH_SCALE`` multiplies the default number of steps. Prints
``LOOP_SECONDS=<float>`` at the end.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from torch import nn


def main() -> None:
    default_device = "cuda" if torch.cuda.is_available() else "cpu"
    parser = argparse.ArgumentParser(description="device-bound wide MLP")
    parser.add_argument("--device", default=os.environ.get("TORCHMEM_BENCH_DEVICE", default_device))
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--width", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=None)
    args = parser.parse_args()
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    scale = float(os.environ.get("TORCHMEM_BENCH_SCALE", "1"))
    width = args.width or (8192 if cuda else 1024)
    batch = args.batch_size or (8192 if cuda else 1024)
    steps = args.steps or max(1, round((300 if cuda else 200) * scale))

    torch.manual_seed(0)
    torch.set_float32_matmul_precision("high")
    model = nn.Sequential(
        nn.Linear(width, width),
        nn.ReLU(),
        nn.Linear(width, width),
        nn.ReLU(),
        nn.Linear(width, width),
    ).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
    x = torch.randn(batch, width, device=device)
    target = torch.randn(batch, width, device=device)

    c0 = time.process_time()  # the process's CPU time: its threads, torchmem's included
    t0 = time.perf_counter()
    for step in range(steps):
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(model(x), target)
        loss.backward()
        optimizer.step()
        if step % 50 == 0:
            print(f"step {step}: loss {loss.item():.5f}")
    if cuda:
        torch.cuda.synchronize(device)
    print(f"LOOP_CPU_SECONDS={time.process_time() - c0:.4f}")
    print(f"LOOP_SECONDS={time.perf_counter() - t0:.4f}")


if __name__ == "__main__":
    main()
