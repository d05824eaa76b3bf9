"""Evaluation without torch.no_grad() but with running sums kept as numbers (`.item()`) and a smoothed
loss kept detached: nothing outlives its step."""

import torch
from torch import nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 1)).to(device).eval()
total, count = 0.0, 0
smoothed = torch.zeros((), device=device)
for _ in range(30):
    loss = model(torch.randn(512, 256, device=device)).square().mean()
    total += loss.item()
    count += 1
    smoothed = 0.9 * smoothed + 0.1 * loss.detach()
print(total / count, smoothed.item())
