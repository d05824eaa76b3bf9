"""Training that saves a per-step snapshot of the first layer's weight "to animate it later", as a CPU
copy in a dict keyed by step. On a GPU the device is flat and the host grows by the copies; on the CPU the
copies are CPU tensors the run counts directly.

Expected: growth of CPU tensors, born at the `.cpu()` copy, held by `weight_snapshots`.
"""

import torch
from torch import nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 1)).to(device)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(64, 512, device=device)

weight_snapshots = {}
for step in range(30):
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    weight_snapshots[step] = model[0].weight.detach().cpu().clone()  # SITE
print(len(weight_snapshots), "snapshots")
