"""A callback factory: `make_collector()` returns a function that appends to a list living only in its
closure. The evaluation loop calls it with each batch's logits (computed without torch.no_grad()).

Expected: leak, one step = one top-level model call, born at the model call, held by the closure's `seen`.
"""

import torch
from torch import nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 256)).to(device).eval()


def make_collector():
    seen = []

    def collect(logits):
        seen.append(logits)
        return len(seen)

    return collect


collect = make_collector()
for _ in range(20):
    logits = model(torch.randn(512, 256, device=device))  # SITE
    n = collect(logits)
print("collected", n)
