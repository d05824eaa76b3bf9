"""A model that builds a lookup table on its first forward (lazily), trained with AdamW (state made at the
first step): memory rises once, then stays flat."""

import torch
from torch import nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)


class WithTable(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(256, 256)
        self.table: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.table is None:
            self.table = torch.randn(1024, 256, device=x.device)
        return self.proj(x) @ self.table.T


model = WithTable().to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for _step in range(24):
    loss = model(torch.randn(128, 256, device=device)).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
print("done")
