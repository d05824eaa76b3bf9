"""Thousands of tiny nested module calls per second: a 3-level tree of 22 small modules run on a 4x16 input
in a tight loop under ``torch.no_grad()`` — what per-module-call work costs (the step detection's hooks on the
top-level module, the unit finder). Moved here from the scenario tests, which timed one pair against a 3x
bound (a timed assertion that a loaded CI machine broke: 3.16x for a loop measured at 1.84x, 1.0x unloaded).

    python benchmarks/programs/tiny_nested_calls.py [--device cpu|cuda] [--steps N]

Default: 10,000 calls of the tree on CUDA, 40,000 on the CPU. ``TORCHMEM_BENCH_SCALE`` multiplies the default.
Prints ``LOOP_CPU_SECONDS=`` and ``LOOP_SECONDS=`` at the end.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from torch import nn


class Leaf(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x))


class Branch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.leaves = nn.ModuleList(Leaf() for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for leaf in self.leaves:
            x = leaf(x)
        return x


class Tree(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.branches = nn.ModuleList(Branch() for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for branch in self.branches:
            x = branch(x)
        return x


def main() -> None:
    default_device = "cuda" if torch.cuda.is_available() else "cpu"
    parser = argparse.ArgumentParser(description="tiny nested module calls")
    parser.add_argument("--device", default=os.environ.get("TORCHMEM_BENCH_DEVICE", default_device))
    parser.add_argument("--steps", type=int, default=None)
    args = parser.parse_args()
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    scale = float(os.environ.get("TORCHMEM_BENCH_SCALE", "1"))
    steps = args.steps or max(1, round((10_000 if cuda else 40_000) * scale))

    torch.manual_seed(0)
    model = Tree().to(device).eval()
    x = torch.randn(4, 16, device=device)
    c0 = time.process_time()
    t0 = time.perf_counter()
    with torch.no_grad():
        for _ in range(steps):
            x = model(x)
    if cuda:
        torch.cuda.synchronize(device)
    print(f"LOOP_CPU_SECONDS={time.process_time() - c0:.4f}")
    print(f"LOOP_SECONDS={time.perf_counter() - t0:.4f}")


if __name__ == "__main__":
    main()
