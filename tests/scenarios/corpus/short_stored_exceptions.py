"""Inference over a handful of shards with a strict validation check that (because of a bug in the check)
rejects every shard: each failure is stored as the exception itself for a summary at the end, and every
traceback keeps the failing frame alive, with its tensors and their graph.

Expected: leak in a short loop (8 calls), born at the encoder call, held by `failures`.
"""

import torch
from torch import nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
encoder = nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256)).to(device)


class ShardError(RuntimeError):
    pass


def embed_shard(shard_id: int) -> torch.Tensor:
    x = torch.randn(1024, 256, device=device)
    feats = encoder(x)  # SITE
    if feats.norm(dim=1).max() > 0:  # meant to be a max-norm bound; always true
        raise ShardError(f"shard {shard_id}: norm check failed")
    return feats.detach().mean(0)


failures = []
embeddings = []
for shard_id in range(8):
    try:
        embeddings.append(embed_shard(shard_id))
    except ShardError as exc:
        failures.append(exc)
print(f"{len(embeddings)} shards embedded, {len(failures)} failed")
