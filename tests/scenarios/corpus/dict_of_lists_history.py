"""A training loop with a Keras-style `history` dict of lists; the validation logits are appended as
tensors computed without torch.no_grad(), so each one keeps its graph.

Expected: leak at the optimizer step, born at the validation forward, held by `history`.
"""

import torch
from torch import nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10)).to(device)
opt = torch.optim.SGD(model.parameters(), lr=1e-2)
x, y = torch.randn(64, 256, device=device), torch.randint(0, 10, (64,), device=device)
val_x = torch.randn(512, 256, device=device)

history = {"loss": [], "val_logits": []}
for _step in range(20):
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    history["loss"].append(loss.item())
    history["val_logits"].append(model(val_x))  # SITE
print(len(history["loss"]), "steps")
