"""Gradient analysis without an optimizer: one backward() per batch, each batch's flattened gradient kept
on the device "for later" (an influence / gradient-similarity study).

Expected: leak, one step = one backward() call, born at the concatenation, held by `batch_grads`.
"""

import torch
import torch.nn.functional as F
from torch import nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512)).to(device)
batches = [
    (torch.randn(256, 512, device=device), torch.randint(0, 512, (256,), device=device)) for _ in range(30)
]

batch_grads = []
for x, y in batches:
    model.zero_grad()
    F.cross_entropy(model(x), y).backward()
    batch_grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))  # SITE
similarity = torch.stack(batch_grads) @ batch_grads[0]
print("gradient similarity to the first batch:", similarity[:4].tolist())
