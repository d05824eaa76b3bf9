"""Evaluation that groups the embeddings of each batch by predicted class in a defaultdict(list) for a
t-SNE plot later, without torch.no_grad(): every kept slice is a view of the batch's embedding, which keeps
the whole batch and its graph.

Expected: leak, one step = one top-level model call, born at the encoder call, held by `by_class`.
"""

from collections import defaultdict

import torch
from torch import nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
encoder = nn.Sequential(nn.Linear(128, 512), nn.ReLU(), nn.Linear(512, 256)).to(device).eval()
classifier = nn.Linear(256, 4).to(device).eval()

by_class = defaultdict(list)
for _ in range(20):
    batch = torch.randn(512, 128, device=device)
    emb = encoder(batch)  # SITE
    pred = classifier(emb).argmax(-1)
    for c in range(4):
        by_class[c].append(emb[pred == c])
print({c: len(v) for c, v in by_class.items()})
