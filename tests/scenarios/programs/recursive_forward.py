"""Safety: a module that calls itself recursively in forward() (a recursive refinement network), run in
an evaluation loop without torch.no_grad() that keeps every output with its graph. Only the outermost
call is a step. Expected: leak, one step = one top-level model call, born in forward(), held by `outputs`."""

import torch
from torch import nn


class Refiner(nn.Module):
    def __init__(self, width: int = 512) -> None:
        super().__init__()
        self.lin = nn.Linear(width, width)

    def forward(self, x: torch.Tensor, depth: int = 6) -> torch.Tensor:
        if depth == 0:
            return x
        return self(torch.tanh(self.lin(x)), depth - 1)  # SITE


device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
model = Refiner().to(device).eval()
batches = [torch.randn(256, 512, device=device) for _ in range(30)]

outputs = []
for x in batches:
    outputs.append(model(x))
print(len(outputs), "refined batches")
