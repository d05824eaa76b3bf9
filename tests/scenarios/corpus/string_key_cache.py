"""Inference results cached under a string key per (epoch, batch), so a "repeat request" could be served
from the cache; the keys never repeat, so nothing is ever served from it and nothing is evicted.

Expected: leak, one step = one top-level model call, born at the model call, held by `response_cache`.
"""

import torch
from torch import nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512)).to(device).eval()
response_cache: dict[str, torch.Tensor] = {}

with torch.no_grad():
    for epoch in range(2):
        for batch in range(10):
            key = f"epoch{epoch}-batch{batch}"
            if key not in response_cache:
                response_cache[key] = model(torch.randn(512, 256, device=device))  # SITE
print(len(response_cache), "cached")
