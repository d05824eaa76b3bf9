"""Safety (cost): thousands of tiny nested module calls per second — a 3-level tree of small modules run
on a 4x16 input in a tight loop under torch.no_grad(). Expected: quiet, and `torchmem run` not much slower
than plain python."""

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


device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
model = Tree().to(device).eval()
x = torch.randn(4, 16, device=device)
ITERATIONS = 10000

start = time.perf_counter()
with torch.no_grad():
    for _ in range(ITERATIONS):
        x = model(x)
elapsed = time.perf_counter() - start
print(f"loop_seconds={elapsed:.3f} module_calls_per_second={ITERATIONS * 22 / elapsed:.0f}")
