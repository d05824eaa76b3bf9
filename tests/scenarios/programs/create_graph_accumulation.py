"""`loss.backward(create_graph=True)` (kept "for a curvature term later") with hand-written SGD and no
zero_grad(): autograd adds each step's gradient to `.grad` out of place, with its graph, so every `.grad`
holds the graphs of all earlier steps (and the parameter and its gradient form a cycle through the graph).

Expected: leak, one step = one backward() call, born at the backward(create_graph=True) line (the gradients'
graphs, the larger part; the forward's saved tensors come second), held by the parameters' `.grad`.
"""

import torch
import torch.nn.functional as F
from torch import nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(512, 512), nn.Tanh(), nn.Linear(512, 512), nn.Tanh(), nn.Linear(512, 1))
model = model.to(device)
data = [(torch.randn(512, 512, device=device), torch.randn(512, 1, device=device)) for _ in range(30)]
lr = 1e-3

for x, y in data:
    pred = model(x)
    loss = F.mse_loss(pred, y)
    loss.backward(create_graph=True)  # SITE
    with torch.no_grad():
        for p in model.parameters():
            p -= lr * p.grad
print("final loss", loss.item())
