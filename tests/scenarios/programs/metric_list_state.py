"""A torchmetrics-style metric with list states ("cat" reduction), updated every batch and never reset.

Expected: leak, one step = one top-level model call, born at the softmax, held by `val_accuracy`.
"""

import torch
from torch import nn


class Metric:
    """States are lists of tensors, concatenated by compute()."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.preds: list[torch.Tensor] = []
        self.target: list[torch.Tensor] = []

    def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:
        self.preds.append(preds)
        self.target.append(target)


class Accuracy(Metric):
    def compute(self) -> torch.Tensor:
        preds, target = torch.cat(self.preds), torch.cat(self.target)
        return (preds.argmax(-1) == target).float().mean()


device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512)).to(device).eval()
val_batches = [
    (torch.randn(512, 512, device=device), torch.randint(0, 512, (512,), device=device)) for _ in range(10)
]

val_accuracy = Accuracy()
with torch.no_grad():
    for epoch in range(3):
        for x, y in val_batches:
            probs = model(x).softmax(dim=-1)  # SITE
            val_accuracy.update(probs, y)
        print(f"epoch {epoch}: accuracy {val_accuracy.compute():.4f}")  # never val_accuracy.reset()
