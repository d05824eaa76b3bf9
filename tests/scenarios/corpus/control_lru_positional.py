"""Positional encodings built per sequence length through functools.lru_cache(maxsize=4); the lengths
repeat, so the cache fills up and stays."""

import functools
import math

import torch
from torch import nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 128)).to(device).eval()


@functools.lru_cache(maxsize=4)
def positions(length: int) -> torch.Tensor:
    pos = torch.arange(length, device=device)[:, None]
    freq = torch.exp(torch.arange(0, 128, 2, device=device) * (-math.log(10000.0) / 128))
    pe = torch.zeros(length, 128, device=device)
    pe[:, 0::2], pe[:, 1::2] = torch.sin(pos * freq), torch.cos(pos * freq)
    return pe


with torch.no_grad():
    for step in range(40):
        length = (256, 512, 384)[step % 3]
        out = model(torch.randn(length, 128, device=device) + positions(length))
print(positions.cache_info())
