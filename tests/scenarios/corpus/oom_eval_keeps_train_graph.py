"""Train for a few steps, log the loss over the whole training set, then evaluate on a large validation
batch. The "full training loss for the log" is computed without torch.no_grad(): `train_out` and
`train_loss` are still alive when evaluation starts and keep that forward's whole graph (every saved
activation) alive. Evaluation, under no_grad, runs out of memory; the program catches it.

The device is made small on purpose: on CUDA with the allocator's memory fraction, on the CPU with
torchmem's own cap (a real torch.OutOfMemoryError).

Expected: an OOM caused by the training graph kept alive during evaluation, caught, raised at the
evaluation forward, holder `train_loss`.
"""

import torch
from torch import nn

BUDGET = 64 << 20
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
model = nn.Sequential(*[nn.Sequential(nn.Linear(512, 512), nn.GELU()) for _ in range(6)]).to(device)
opt = torch.optim.SGD(model.parameters(), lr=1e-2)
train_x = torch.randn(1024, 512, device=device)

if device.type == "cuda":
    # cuBLAS's workspace is taken from the allocator at the first matmul (and kept): take it before the
    # budget is set, so that the budget is the program's own
    w = torch.randn(64, 64, device=device, requires_grad=True)
    (w @ w).sum().backward()
    del w
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction((torch.cuda.memory_reserved(device) + BUDGET) / total)
else:
    import torchmem

    torchmem.limit(BUDGET, "cpu")
    torchmem.limit(torchmem.stats("cpu").allocated + BUDGET, "cpu")

for _step in range(3):
    idx = torch.randint(0, 1024, (256,), device=device)
    loss = model(train_x[idx]).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)

train_out = model(train_x)  # the whole training set, with autograd on
train_loss = train_out.square().mean()
print(f"training loss {train_loss.item():.4f}")

model.eval()
try:
    with torch.no_grad():
        val_loss = model(torch.randn(8192, 512, device=device)).square().mean()  # SITE
    print(f"validation loss {val_loss.item():.4f}")
except torch.OutOfMemoryError:
    print("validation ran out of memory")
