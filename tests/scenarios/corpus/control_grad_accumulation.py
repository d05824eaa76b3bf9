"""Gradient accumulation over 4 micro-batches per optimizer step, logging `loss.item()`."""

import torch
from torch import nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10)).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
losses = []
for _step in range(16):
    for _micro in range(4):
        x = torch.randn(128, 256, device=device)
        y = torch.randint(0, 10, (128,), device=device)
        loss = nn.functional.cross_entropy(model(x), y) / 4
        loss.backward()
        losses.append(loss.item())
    opt.step()
    opt.zero_grad(set_to_none=True)
print(len(losses), "micro-batches")
