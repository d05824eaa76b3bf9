"""Anomaly detection turned on while chasing a NaN and never turned off, and the losses kept as tensors
for a plot: every autograd node keeps the Python stack that created it, and the kept losses keep their
nodes alive.

Expected: host growth from anomaly mode, held by `loss_history`.
"""

import torch
from torch import nn

torch.autograd.set_detect_anomaly(True)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1)).to(device)
x = torch.randn(8, 16, device=device)

loss_history = []
for _step in range(300):
    loss = model(x).square().mean()  # SITE
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.01 * p.grad
            p.grad = None
    loss_history.append(loss)
print("final", loss_history[-1].item())
