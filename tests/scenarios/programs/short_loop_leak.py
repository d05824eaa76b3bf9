"""Test-time adaptation for six steps only, keeping each step's output (a tensor of the graph): too few steps
for a growth trend, but what the loop allocated is still alive at the end, one more every step.

Expected: survivors (an accumulating group), born at the model call, held by `snapshots`.
"""

import torch
from torch import nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512)).to(device)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(512, 512, device=device)

snapshots = []
for _ in range(6):
    out = model(x)  # SITE
    loss = out.square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    snapshots.append(out)
print("adapted; kept", len(snapshots), "outputs")
