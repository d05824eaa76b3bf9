"""Batched scoring without torch.no_grad(), with batches that grow (sorted by length): `scores` and
`probs` of the previous batch, with their graph, are still alive while the next batch's forward runs, and
the largest batch runs out of memory. The program catches it and reports the batch size.

The device is made small on purpose (memory fraction on CUDA, torchmem's cap on the CPU).

Expected: an OOM caused by the previous batch's outputs, caught, raised at the forward, holder `scores`.
"""

import torch
from torch import nn

BUDGET = 64 << 20
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
model = nn.Sequential(*[nn.Sequential(nn.Linear(512, 512), nn.Tanh()) for _ in range(4)]).to(device)

if device.type == "cuda":
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction((torch.cuda.memory_reserved(device) + BUDGET) / total)
else:
    import torchmem

    torchmem.limit(BUDGET, "cpu")
    torchmem.limit(torchmem.stats("cpu").allocated + BUDGET, "cpu")

total = 0.0
try:
    for batch_size in (512, 1024, 2048, 3072, 4096):
        x = torch.randn(batch_size, 512, device=device)
        scores = model(x)  # SITE
        probs = scores.softmax(-1)
        total += probs.max(-1).values.sum().item()
    print("scored", total)
except torch.OutOfMemoryError:
    print("out of memory at batch size", batch_size)
