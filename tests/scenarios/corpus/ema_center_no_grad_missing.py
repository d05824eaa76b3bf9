"""A DINO-style centre of the teacher outputs, updated as an exponential moving average without
torch.no_grad() and without detaching: each update chains the new batch's graph onto the old centre.

Expected: leak at the optimizer step, born at the teacher forward, held by `center`.
"""

import torch
from torch import nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
student = nn.Sequential(nn.Linear(128, 512), nn.GELU(), nn.Linear(512, 256)).to(device)
teacher = nn.Sequential(nn.Linear(128, 512), nn.GELU(), nn.Linear(512, 256)).to(device)
opt = torch.optim.SGD(student.parameters(), lr=1e-2)
center = torch.zeros(256, device=device)

for _step in range(20):
    x = torch.randn(512, 128, device=device)
    t_out = teacher(x)  # SITE
    s_out = student(x)
    loss = -(((t_out - center) / 0.04).softmax(-1).detach() * s_out.log_softmax(-1)).sum(-1).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    center = 0.9 * center + 0.1 * t_out.mean(0)
print("center norm", center.norm().item())
