"""Safety: a program with no loop at all (one forward pass). Expected: a "no repeating step found" note,
no verdict claiming a problem, exit code 0."""

import torch
from torch import nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
model = nn.Linear(512, 512).to(device)
with torch.no_grad():
    out = model(torch.randn(512, 512, device=device))
print("mean activation", out.mean().item())
