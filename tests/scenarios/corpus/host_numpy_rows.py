"""A training loop that logs, per step, a numpy copy of the batch's per-sample losses "for a histogram at
the end": a new host array every step, kept in a list. Device memory is flat.

Expected: host growth, held by `loss_rows`.
"""

import numpy as np
import torch
from torch import nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)).to(device)
x = torch.randn(64, 32, device=device)
y = torch.randn(64, 1, device=device)

loss_rows = []
for _step in range(150):
    per_sample = (model(x) - y).square().squeeze(1)
    loss = per_sample.mean()
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.01 * p.grad
            p.grad = None
    row = np.repeat(per_sample.detach().cpu().numpy()[None], 512, axis=0)  # SITE
    loss_rows.append(row)
print(len(loss_rows), "rows")
