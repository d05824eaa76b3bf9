"""Model selection: a first candidate is trained with Adam, then deleted (`del model`) to make room for a
larger candidate, but its optimizer is still alive in `optimizer` and keeps the old parameters and both
moment buffers. The larger model runs out of memory while building.

The device is made small on purpose (torchmem's cap on the CPU from the start; on CUDA the memory fraction,
set once the first candidate is trained).

Expected: an OOM caused by the optimizer of a deleted model, caught, raised at the larger model's build.
"""

import torch
from torch import nn

BUDGET = 44 << 20
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)

if device.type == "cpu":
    import torchmem

    torchmem.limit(BUDGET, "cpu")
    torchmem.limit(torchmem.stats("cpu").allocated + BUDGET, "cpu")

model = nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 512)).to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for _ in range(2):
    loss = model(torch.randn(64, 512, device=device)).square().mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
print("candidate 1 loss", loss.item())
del model, loss  # the optimizer is forgotten

if device.type == "cuda":
    # On CUDA the budget is set here, from what is reserved now: the training above (foreach Adam, the
    # allocator's rounding) needs more than the CPU's cap would allow. 20 MiB more: the first layer of the
    # larger candidate (16 MiB) fits, the second does not; with the old optimizer's 24 MiB freed it would.
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction((torch.cuda.memory_reserved(device) + (20 << 20)) / total)

try:
    bigger = nn.Sequential(
        nn.Linear(512, 8192, device=device),
        nn.ReLU(),
        nn.Linear(8192, 512, device=device),  # SITE
    )
    print("candidate 2 built")
except torch.OutOfMemoryError:
    print("candidate 2 does not fit")
