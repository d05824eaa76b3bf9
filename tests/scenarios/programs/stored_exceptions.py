"""Failed batches are collected as exceptions for a later report; each exception's traceback keeps the
failing frame alive, with its tensors.

Expected: leak, one step = one top-level model call, born at the model call, held by `errors`.
"""

import torch
from torch import nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512)).to(device).eval()
batches = [torch.randn(512, 512, device=device) for _ in range(30)]


def score_batch(batch: torch.Tensor) -> float:
    scores = model(batch)  # SITE
    if (scores < 0).any():
        raise ValueError(f"negative scores in a batch of {batch.shape[0]}")
    return scores.mean().item()


results, errors = [], []
with torch.no_grad():
    for batch in batches:
        try:
            results.append(score_batch(batch))
        except ValueError as err:
            errors.append(err)  # the traceback keeps score_batch's frame, and `scores`, alive
print(f"{len(results)} batches scored, {len(errors)} failed")
