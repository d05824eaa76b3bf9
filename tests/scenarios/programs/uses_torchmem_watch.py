"""Safety: the program uses torchmem itself, watching its own training loop with torchmem.watch(), and
leaks (validation losses logged as tensors). Expected: the same leak as without the watch: one step = one
optimizer step, born at the validation forward, held by `val_losses`; exit code 0."""

import torch
import torch.nn.functional as F
from torch import nn

import torchmem

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
model = model.to(device)
opt = torch.optim.SGD(model.parameters(), lr=1e-2)
x, y = torch.randn(256, 512, device=device), torch.randint(0, 10, (256,), device=device)
x_val, y_val = torch.randn(512, 512, device=device), torch.randint(0, 10, (512,), device=device)

val_losses = []
for _step in torchmem.watch(range(30), device=device, warn=False):
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    val_logits = model(x_val)  # SITE
    val_losses.append(F.cross_entropy(val_logits, y_val))
print("done", len(val_losses))
