"""A batch that does not fit is retried at half size inside the `except` block, while the failed attempt's
frames (and its activations) are still alive through the exception: the retry runs out of memory too, and
the outer handler skips the batch. Both errors are caught; the program ends normally.

The device is made small on purpose: on CUDA with the allocator's memory fraction, on the CPU (which has no
allocator) with torchmem's own cap, which raises a real torch.OutOfMemoryError.

Expected: an OOM pinned by the exception, caught, raised at the retry.
"""

import gc

import torch
import torch.nn.functional as F
from torch import nn

ACTIVATION_BUDGET = 336 << 20  # what the small device leaves for activations and gradients
BATCH = 65536  # a (65536, 128) float32 activation is 32 MiB: a batch is too large, half a batch fits

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
layers = []
for _ in range(10):
    layers += [nn.Linear(128, 128), nn.ReLU()]
model = nn.Sequential(*layers, nn.Linear(128, 10)).to(device)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)

# a small sanity-check batch first, so the budget below is what is left once the model and its workspaces
# are in place
F.cross_entropy(
    model(torch.randn(8, 128, device=device)), torch.zeros(8, dtype=torch.long, device=device)
).backward()
opt.zero_grad(set_to_none=True)

if device.type == "cuda":
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(device).total_memory
    used = torch.cuda.memory_reserved(device)
    torch.cuda.set_per_process_memory_fraction((used + ACTIVATION_BUDGET) / total)
else:
    import torchmem

    torchmem.limit(ACTIVATION_BUDGET, "cpu")  # from here on torchmem counts the CPU tensors
    torchmem.limit(torchmem.stats("cpu").allocated + ACTIVATION_BUDGET, "cpu")

skipped = 0
for i in range(3):
    x = torch.randn(BATCH, 128, device=device)
    y = torch.randint(0, 10, (BATCH,), device=device)
    try:
        try:
            loss = F.cross_entropy(model(x), y)
            loss.backward()
        except torch.OutOfMemoryError:
            if device.type == "cuda":
                torch.cuda.empty_cache()
            half = x.shape[0] // 2  # retry with half the batch, still inside the except block
            loss = F.cross_entropy(model(x[:half]), y[:half])  # SITE
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    except torch.OutOfMemoryError:
        skipped += 1
        print(f"batch {i}: out of memory even at half size, skipped")
        gc.collect()  # free what the failed attempts left behind
        if device.type == "cuda":
            torch.cuda.empty_cache()
print(f"{skipped} of 3 batches skipped")
