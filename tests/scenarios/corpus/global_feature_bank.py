"""A module-level registry `FEATURE_BANK` that an evaluation loop fills with each sample id's features
(keys are ids, never evicted), computed without torch.no_grad().

Expected: leak, one step = one top-level model call, born at the backbone call, held by `FEATURE_BANK`.
"""

import torch
from torch import nn

FEATURE_BANK: dict[int, torch.Tensor] = {}

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
backbone = nn.Sequential(nn.Linear(128, 512), nn.ReLU(), nn.Linear(512, 512)).to(device).eval()


def register(batch_ids: range, feats: torch.Tensor) -> None:
    for i, f in zip(batch_ids, feats):
        FEATURE_BANK[i] = f


for b in range(20):
    feats = backbone(torch.randn(256, 128, device=device))  # SITE
    register(range(b * 256, (b + 1) * 256), feats)
print(len(FEATURE_BANK), "features")
