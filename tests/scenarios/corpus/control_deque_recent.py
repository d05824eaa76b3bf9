"""Training that keeps the last 5 detached predictions in a deque(maxlen=5) for a smoothing check."""

from collections import deque

import torch
from torch import nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 256)).to(device)
opt = torch.optim.SGD(model.parameters(), lr=1e-2)
recent = deque(maxlen=5)
for _step in range(30):
    out = model(torch.randn(512, 256, device=device))
    loss = out.square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    recent.append(out.detach())
print(len(recent), "recent outputs")
