"""Fine-tuning that builds a fresh AdamW and a cosine schedule at the start of every epoch (a "restart"),
keeping the old ones in a list to plot their learning rates later. AdamW makes its state lazily inside
`step()`, so each kept optimizer holds two moment buffers the size of the model.

Expected: leak at the optimizer step, born at the `opt.step()` call, held by `schedules`.
"""

import torch
from torch import nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)).to(device)
x = torch.randn(64, 512, device=device)
y = torch.randint(0, 10, (64,), device=device)

schedules = []
for epoch in range(12):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=2)
    schedules.append((opt, sched))
    for _ in range(2):
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()  # SITE
        opt.zero_grad(set_to_none=True)
        sched.step()
    print(f"epoch {epoch}: loss {loss.item():.3f}")
