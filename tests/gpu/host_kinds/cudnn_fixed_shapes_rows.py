"""cudnn.benchmark on with one input shape (its plan is made once), while numpy rows are kept per step: the
rows are what grows; cudnn.benchmark is not named as a cause. The allocator's history recording, bounded to
1,000 entries, fills within the first steps and stops growing: not named either."""

import numpy as np
import torch
from torch import nn

torch.backends.cudnn.benchmark = True
torch.cuda.memory._record_memory_history(max_entries=1000)
torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1)).cuda()
rows = []
for _step in range(500):
    loss = model(torch.randn(2, 3, 64, 64, device="cuda")).square().mean()
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.01 * p.grad
            p.grad = None
    rows.append(np.random.rand(512, 128))  # ROWS
torch.cuda.memory._record_memory_history(enabled=None)
print(len(rows))
