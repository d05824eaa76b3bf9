"""A dict cache of prompt embeddings capped at 8 entries, evicting the oldest: it fills, then stays."""

import torch
from torch import nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
encoder = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512)).to(device).eval()
cache: dict[int, torch.Tensor] = {}

with torch.no_grad():
    for request in range(40):
        prompt_id = request % 13
        if prompt_id not in cache:
            if len(cache) >= 8:
                cache.pop(next(iter(cache)))
            cache[prompt_id] = encoder(torch.randn(256, 256, device=device))
print(len(cache), "cached")
