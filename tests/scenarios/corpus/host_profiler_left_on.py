"""A torch.profiler started "to look at the first steps" and never stopped: it records every op of every
step on the host while device memory is flat.

Expected: host growth from a recording profiler, held by `profiler`.
"""

import torch
from torch import nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 1)).to(device)
x = torch.randn(16, 32, device=device)

profiler = torch.profiler.profile(record_shapes=True)
profiler.start()  # SITE
total = 0.0
for _step in range(300):
    loss = model(x).square().mean()
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.01 * p.grad
            p.grad = None
    total += loss.item()
print("mean loss", total / 300)
profiler.stop()  # only after the loop (a profiler left running crashes some torch builds at exit)
