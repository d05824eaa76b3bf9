"""Control: embeddings memoized with functools.lru_cache(maxsize=4) under torch.no_grad(): the cache fills
up to four entries, then stays flat. Expected: quiet."""

import functools

import torch
from torch import nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
encoder = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512)).to(device).eval()
documents = [torch.randn(512, 512, device=device) for _ in range(10)]


@functools.lru_cache(maxsize=4)
def embed(doc_id: int) -> torch.Tensor:
    return encoder(documents[doc_id])


scores = []
with torch.no_grad():
    for i in range(30):
        query = embed(i % 10)
        scores.append(query.norm().item())
print(embed.cache_info())
