"""A serving loop: HF generate(return_dict_in_generate=True), every output kept (each holds its KV cache)."""

import torch
from transformers import GPT2Config, GPT2LMHeadModel

torch.manual_seed(0)
cfg = GPT2Config(n_layer=2, n_head=4, n_embd=256, vocab_size=1000, n_positions=512)
model = GPT2LMHeadModel(cfg).cuda().eval()
kw = dict(max_new_tokens=16, do_sample=False, return_dict_in_generate=True, pad_token_id=0, use_cache=True)
results = []
for _i in range(40):
    ids = torch.randint(0, 1000, (8, 64), device="cuda")
    out = model.generate(ids, **kw)  # SITE
    results.append(out)
print("generated", len(results))
