"""ResNet-18 training on small (32x32) random images: launch-bound on a GPU (issue 29).

The model is torchvision's ResNet-18 layout written out in ``benchmarks/_models.py`` (no torchvision needed);
batch 32 on CUDA (8 on the CPU), SGD with momentum, ``loss.item()`` every 50 steps.

    python benchmarks/programs/resnet18.py [--device cpu|cuda] [--steps N]

Default: 2,000 steps on CUDA, 30 on the CPU; ``TORCHMEM_BENCH_SCALE`` multiplies it. Prints
``LOOP_SECONDS=<float>`` at the end.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/, for _models
from _models import ResNet18


def main() -> None:
    default_device = "cuda" if torch.cuda.is_available() else "cpu"
    parser = argparse.ArgumentParser(description="ResNet-18 on 32x32 images")
    parser.add_argument("--device", default=os.environ.get("TORCHMEM_BENCH_DEVICE", default_device))
    parser.add_argument("--steps", type=int, default=None)
    args = parser.parse_args()
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    scale = float(os.environ.get("TORCHMEM_BENCH_SCALE", "1"))
    steps = args.steps or max(1, round((2000 if cuda else 30) * scale))

    torch.manual_seed(0)
    model = ResNet18().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    batch = 32 if cuda else 8
    x = torch.randn(batch, 3, 32, 32, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    loss_fn = nn.CrossEntropyLoss()

    c0 = time.process_time()  # the process's CPU time: its threads, torchmem's included
    t0 = time.perf_counter()
    for step in range(steps):
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        if step % 50 == 0:
            print(f"step {step}: loss {loss.item():.4f}")
    if cuda:
        torch.cuda.synchronize(device)
    print(f"LOOP_CPU_SECONDS={time.process_time() - c0:.4f}")
    print(f"LOOP_SECONDS={time.perf_counter() - t0:.4f}")


if __name__ == "__main__":
    main()
