"""Per-step records kept as Python dicts in a list (step, loss, a text summary of the batch, and the batch
ids): ordinary Python objects that grow the host heap every step while device memory stays flat.

Expected: host growth, held by `records`.
"""

import torch
from torch import nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)).to(device)
x = torch.randn(64, 32, device=device)

records = []
for step in range(150):
    loss = model(x).square().mean()
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.01 * p.grad
            p.grad = None
    value = loss.item()
    note = f"step {step} " * 200
    records.append({"step": step, "loss": value, "ids": list(range(step, step + 2000)), "note": note})  # SITE
print(len(records), "records")
