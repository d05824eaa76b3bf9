"""Validation without torch.no_grad(): `total_loss += loss` keeps every batch's graph alive.

Expected: leak, one step = one top-level model call, born at the model call, held by `total_loss`.
"""

import torch
from torch import nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)

model = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
model = model.to(device)
criterion = nn.CrossEntropyLoss()
val_set = [
    (torch.randn(512, 512, device=device), torch.randint(0, 10, (512,), device=device)) for _ in range(30)
]

model.eval()
total_loss = 0.0
for images, labels in val_set:
    logits = model(images)  # SITE
    loss = criterion(logits, labels)
    total_loss += loss  # should be loss.item(): the sum keeps each batch's graph
print(f"validation loss {total_loss / len(val_set):.4f}")
