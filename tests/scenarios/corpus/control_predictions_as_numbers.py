"""Batch inference keeping each batch's predictions as Python numbers (`.tolist()`)."""

import torch
from torch import nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10)).to(device).eval()
predictions: list[int] = []
with torch.no_grad():
    for _ in range(30):
        predictions += model(torch.randn(256, 256, device=device)).argmax(-1).tolist()
print(len(predictions), "predictions")
