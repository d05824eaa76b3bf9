"""A module that records its own attention maps in `self.history` inside forward() "for visualisation";
training never clears it, so every step's attention map and its graph stay alive.

Expected: leak at the optimizer step, born at the attention softmax, held by `history`.
"""

import torch
from torch import nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)


class TinyAttention(nn.Module):
    def __init__(self, dim: int = 64) -> None:
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)
        self.history: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        attn = (q @ k.transpose(-2, -1) / 8).softmax(-1)  # SITE
        self.history.append(attn)
        return attn @ v


model = TinyAttention().to(device)
opt = torch.optim.SGD(model.parameters(), lr=1e-2)
x = torch.randn(8, 128, 64, device=device)
for _step in range(20):
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
print(len(model.history), "maps")
