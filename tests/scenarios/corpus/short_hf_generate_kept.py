"""A small evaluation harness for a GPT-2-shaped model (built from a config, nothing downloaded): each
prompt batch is answered with `generate(..., return_dict_in_generate=True)` and the whole output object is
kept for scoring later, with the KV cache it carries.

Expected: leak in a short loop (6 generate() calls), born at the generate() call, held by `results`.
"""

import torch
from transformers import GPT2Config, GPT2LMHeadModel
from transformers.utils import logging

logging.set_verbosity_error()
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
config = GPT2Config(
    n_layer=2, n_head=4, n_embd=256, vocab_size=512, n_positions=256, bos_token_id=0, eos_token_id=1
)
model = GPT2LMHeadModel(config).to(device).eval()

results = []
for _ in range(6):
    prompts = torch.randint(2, 512, (16, 96), device=device)
    out = model.generate(  # SITE
        prompts,
        max_new_tokens=8,
        do_sample=False,
        return_dict_in_generate=True,
        pad_token_id=0,
    )
    results.append(out)  # sequences AND the KV cache of every batch
print("answered", sum(r.sequences.shape[0] for r in results), "prompts")
