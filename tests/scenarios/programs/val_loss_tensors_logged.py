"""A training loop that logs the validation loss as a tensor, not a float: each logged loss keeps the
validation forward's graph (it is never backpropagated, so nothing frees it).

Expected: leak, one step = one optimizer step, born at the validation forward, held by `val_losses`.
"""

import torch
import torch.nn.functional as F
from torch import nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
model = model.to(device)
opt = torch.optim.SGD(model.parameters(), lr=1e-2)
train = [
    (torch.randn(256, 512, device=device), torch.randint(0, 10, (256,), device=device)) for _ in range(8)
]
x_val, y_val = torch.randn(512, 512, device=device), torch.randint(0, 10, (512,), device=device)

train_losses, val_losses = [], []
for step in range(30):
    x, y = train[step % len(train)]
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    train_losses.append(loss.item())
    val_logits = model(x_val)  # SITE
    val_losses.append(F.cross_entropy(val_logits, y_val))  # a tensor with its graph, not .item()
print(f"train {train_losses[-1]:.3f} val {val_losses[-1]:.3f}")
