"""An exponential moving average of the weights updated without torch.no_grad(): `p` requires grad, so
`shadow.mul_(d).add_(p, alpha=1 - d)` gives each shadow tensor a grad_fn, and its autograd chain grows by two
nodes per parameter per step. No tensor is saved: device memory stays flat, host memory grows.

Expected: host_leak (an autograd chain), one step = one optimizer step, held by `ema.shadow`.
"""

import torch
import torch.nn.functional as F
from torch import nn


class EMA:
    def __init__(self, model: nn.Module, decay: float = 0.999) -> None:
        self.decay = decay
        self.shadow = {name: p.detach().clone() for name, p in model.named_parameters()}

    def update(self, model: nn.Module) -> None:  # should be decorated with @torch.no_grad()
        d = self.decay
        for name, p in model.named_parameters():
            self.shadow[name].mul_(d).add_(p, alpha=1 - d)  # SITE


device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
blocks = []
for _ in range(32):
    blocks += [nn.Linear(32, 32), nn.LayerNorm(32), nn.GELU()]
model = nn.Sequential(*blocks).to(device)  # 96 parameter tensors
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
ema = EMA(model)
x = torch.randn(16, 32, device=device)

for _step in range(300):
    loss = F.mse_loss(model(x), x)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    ema.update(model)
print("loss", loss.item())
