"""An evaluation helper with a nested function that adds each batch loss to a `nonlocal total` — the
tensor, not `.item()`, and without torch.no_grad(): the sum's graph chains every batch's graph.

Expected: leak, one step = one top-level model call, born at the model call, held by `total`.
"""

import torch
from torch import nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 1)).to(device).eval()


def evaluate(batches: int) -> float:
    total = 0.0

    def add(batch):
        nonlocal total
        pred = model(batch)  # SITE
        total = total + pred.square().mean()

    for _ in range(batches):
        add(torch.randn(512, 256, device=device))
    return float(total) / batches


print("mean loss", evaluate(24))
