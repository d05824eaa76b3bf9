"""Greedy decoding under torch.inference_mode(), keeping only the token ids as lists."""

import torch
from torch import nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
embed, cell, head = nn.Embedding(128, 512), nn.GRUCell(512, 512), nn.Linear(512, 128)
decoder = nn.ModuleDict({"embed": embed, "cell": cell, "head": head}).to(device)
generated = []
with torch.inference_mode():
    for _request in range(3):
        token = torch.zeros(96, dtype=torch.long, device=device)
        hidden = torch.zeros(96, 512, device=device)
        for _ in range(12):
            hidden = decoder["cell"](decoder["embed"](token), hidden)
            token = decoder["head"](hidden).argmax(-1)
            generated.append(token.tolist())
print(len(generated), "tokens")
