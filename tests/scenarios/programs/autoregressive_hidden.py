"""Autoregressive inference without torch.no_grad(): the hidden state is fed back, so its graph grows with
every generated token.

Expected: leak, one step = one top-level Decoder() call, born at the GRU cell, held by `hidden`.
"""

import torch
from torch import nn


class Decoder(nn.Module):
    def __init__(self, vocab: int = 512, width: int = 512) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.cell = nn.GRUCell(width, width)
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.cell(self.embed(tokens), hidden)  # SITE
        return self.head(hidden), hidden


device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
model = Decoder().to(device).eval()

tokens = torch.randint(0, 512, (256,), device=device)  # 256 sequences decoded in parallel
hidden = torch.zeros(256, 512, device=device)
generated = []
for _ in range(30):
    logits, hidden = model(tokens, hidden)
    tokens = logits.argmax(dim=-1)
    generated.append(tokens)
print("generated", len(generated), "tokens per sequence")
