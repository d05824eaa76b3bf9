"""An AverageMeter (as in pytorch/examples' ImageNet script) updated with the loss tensor, not loss.item().

`self.sum += val * n` chains every batch's graph. Expected: leak, one step = one top-level model call, born
at the model call, held by `loss_meter`.
"""

import torch
import torch.nn.functional as F
from torch import nn


class AverageMeter:
    """Computes and stores the average and current value."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.reset()

    def reset(self) -> None:
        self.val = 0
        self.avg = 0
        self.sum = 0
        self.count = 0

    def update(self, val, n=1):
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count


device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(512, 512), nn.GELU(), nn.Linear(512, 512), nn.GELU(), nn.Linear(512, 100))
model = model.to(device)
val_loader = [
    (torch.randn(512, 512, device=device), torch.randint(0, 100, (512,), device=device)) for _ in range(30)
]

loss_meter = AverageMeter("Loss")
model.eval()
for images, target in val_loader:
    output = model(images)  # SITE
    loss = F.cross_entropy(output, target)
    loss_meter.update(loss, images.size(0))
print(f" * Loss {loss_meter.avg:.3f}")
