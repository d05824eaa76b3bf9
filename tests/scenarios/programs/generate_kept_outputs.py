"""A serving loop: `model.generate(...)` returns a dict with the sequences and the KV cache, and the caller
keeps every output (each one holds its request's cache).

Expected: leak, one step = one generate() call, born at the key/value projections, held by `outputs`.
"""

import torch
from torch import nn


class KVCache:
    def __init__(self) -> None:
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []

    def append(self, key: torch.Tensor, value: torch.Tensor) -> None:
        self.keys.append(key)
        self.values.append(value)


class TinyLM(nn.Module):
    def __init__(self, vocab: int = 512, dim: int = 512) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.q_proj = nn.Linear(dim, dim)
        self.k_proj = nn.Linear(dim, dim)
        self.v_proj = nn.Linear(dim, dim)
        self.lm_head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
        h = self.embed(tokens)  # (batch, dim): one new token per sequence
        cache.append(self.k_proj(h), self.v_proj(h))  # SITE
        keys, values = torch.stack(cache.keys, 1), torch.stack(cache.values, 1)  # (batch, t, dim)
        scores = (self.q_proj(h).unsqueeze(1) * keys).sum(-1) / h.shape[-1] ** 0.5
        context = (scores.softmax(-1).unsqueeze(-1) * values).sum(1)
        return self.lm_head(h + context)

    @torch.no_grad()
    def generate(self, input_ids: torch.Tensor, max_new_tokens: int = 8) -> dict:
        cache = KVCache()
        tokens, new_tokens = input_ids, []
        for _ in range(max_new_tokens):
            tokens = self(tokens, cache).argmax(-1)
            new_tokens.append(tokens)
        return {"sequences": torch.stack(new_tokens, 1), "past_key_values": cache}


device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
model = TinyLM().to(device).eval()

outputs = []
for _request in range(20):
    prompt = torch.randint(0, 512, (256,), device=device)
    outputs.append(model.generate(prompt, max_new_tokens=8))  # kept whole: sequences AND the cache
print("served", len(outputs), "requests")
