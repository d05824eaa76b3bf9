"""Control: a normal training loop that logs loss.item(). Expected: quiet."""

import torch
import torch.nn.functional as F
from torch import nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
model = model.to(device)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
train = [
    (torch.randn(512, 512, device=device), torch.randint(0, 10, (512,), device=device)) for _ in range(10)
]

history = []
for epoch in range(3):
    for x, y in train:
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        history.append(loss.item())
    print(f"epoch {epoch}: loss {sum(history[-10:]) / 10:.4f}")
