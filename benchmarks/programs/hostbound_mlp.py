"""Issue 12's host-bound step: 4x (Linear(64) + ReLU), SGD, a batch of 16, many short steps.

Each step is a few dozen tiny kernels (about 1 ms on an H100 host, about 150 µs on a CPU core), so whatever
a tool adds per step shows. ``torchmem run`` must cost at most 2 % here at 10,000+ steps.

    python benchmarks/programs/hostbound_mlp.py [--device cpu|cuda] [--steps N]

Default: 10,000 steps on CUDA; 150,000 on the CPU (a CPU step is several times shorter, and 10,000 of them
last about 2 s, too short to time against the interpreter's start). The environment variable
``TORCHMEM_BENCH_SCALE`` multiplies the default. Prints ``LOOP_SECONDS=<float>`` at the end.
``TORCHMEM_BENCH_STEP_TIMES=<path>``: each step's wall time (seconds, one per line) is written there too.
"""

from __future__ import annotations

import argparse
import itertools
import os
import time

import torch
from torch import nn


def main() -> None:
    default_device = "cuda" if torch.cuda.is_available() else "cpu"
    parser = argparse.ArgumentParser(description="host-bound MLP steps")
    parser.add_argument("--device", default=os.environ.get("TORCHMEM_BENCH_DEVICE", default_device))
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    scale = float(os.environ.get("TORCHMEM_BENCH_SCALE", "1"))
    steps = args.steps or max(1, round((10_000 if cuda else 150_000) * scale))

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(64, 64),
        nn.ReLU(),
        nn.Linear(64, 64),
        nn.ReLU(),
        nn.Linear(64, 64),
        nn.ReLU(),
        nn.Linear(64, 64),
        nn.ReLU(),
    ).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(args.batch_size, 64, device=device)
    target = torch.randn(args.batch_size, 64, device=device)
    loss_fn = nn.MSELoss()

    times_path = os.environ.get("TORCHMEM_BENCH_STEP_TIMES")
    marks: list[float] = []
    mark = marks.append if times_path else None
    c0 = time.process_time()  # the process's CPU time: its threads, torchmem's included
    t0 = time.perf_counter()
    for step in range(steps):
        if mark is not None:
            mark(time.perf_counter())
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), target)
        loss.backward()
        optimizer.step()
        if step % 1000 == 0:
            print(f"step {step}: loss {loss.item():.5f}")
    if cuda:
        torch.cuda.synchronize(device)
    t1 = time.perf_counter()
    if times_path:
        marks.append(t1)
        with open(times_path, "w") as f:
            f.writelines(f"{b - a:.9f}\n" for a, b in itertools.pairwise(marks))
    print(f"LOOP_CPU_SECONDS={time.process_time() - c0:.4f}")
    print(f"LOOP_SECONDS={t1 - t0:.4f}")


if __name__ == "__main__":
    main()
