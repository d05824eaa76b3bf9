"""cudnn.benchmark on while every batch comes in a new size: each new convolution shape is benchmarked and
its plan cached on the host for the rest of the process."""

import torch
from torch import nn

torch.backends.cudnn.benchmark = True
torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1)).cuda()
losses = []
for step in range(240):
    x = torch.randn(2, 3, 16 + step, 24 + step, device="cuda")  # a new shape every step
    loss = model(x).square().mean()
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.01 * p.grad
            p.grad = None
    losses.append(loss.item())
print(losses[-1])
