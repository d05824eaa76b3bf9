"""A torchmetrics MulticlassAccuracy updated every batch and reset after each epoch (sum states)."""

import torch
from torch import nn
from torchmetrics.classification import MulticlassAccuracy

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10)).to(device).eval()
accuracy = MulticlassAccuracy(num_classes=10).to(device)
with torch.no_grad():
    for epoch in range(3):
        for _ in range(10):
            x = torch.randn(512, 256, device=device)
            accuracy.update(model(x), torch.randint(0, 10, (512,), device=device))
        print(f"epoch {epoch}: {accuracy.compute().item():.3f}")
        accuracy.reset()
