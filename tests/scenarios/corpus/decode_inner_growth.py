"""Greedy decoding with a small GRU decoder, written without torch.no_grad(): the hidden state carried from
token to token keeps the whole graph of the call alive until it returns. Only token ids are kept, so
everything is freed when each call returns; the peak of each call grows with the number of tokens.

Expected: no leak, growth inside each call (`inner_growth`).
"""

import torch
from torch import nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)


class Decoder(nn.Module):
    def __init__(self, vocab: int = 128, width: int = 512) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.cell = nn.GRUCell(width, width)
        self.out = nn.Linear(width, vocab)

    def forward(self, token, hidden):
        hidden = self.cell(self.embed(token), hidden)
        return self.out(hidden), hidden


decoder = Decoder().to(device).eval()


def decode(batch: int, steps: int) -> list[list[int]]:
    token = torch.zeros(batch, dtype=torch.long, device=device)
    hidden = torch.zeros(batch, 512, device=device)
    ids = []
    for _ in range(steps):
        logits, hidden = decoder(token, hidden)
        token = logits.argmax(-1)
        ids.append(token.tolist())
    return ids


for request in range(3):
    decoded = decode(96, 12)
    print(f"request {request}: {len(decoded)} tokens")
