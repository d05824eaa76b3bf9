"""An inference helper that halves the batch and recurses from inside its own `except` block: the frame
of the failed attempt (with its input copy and partial activations) is still alive during the retry, so
the retry runs out too.

The device is made small on purpose: on CUDA with the allocator's memory fraction, on the CPU with
torchmem's own cap (a real torch.OutOfMemoryError).

Expected: an OOM pinned by the exception, caught, raised at the retry's forward.
"""

import torch
from torch import nn

BUDGET = 72 << 20
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 2048), nn.ReLU(), nn.Linear(2048, 256)).to(device).eval()

if device.type == "cuda":
    model(torch.randn(8, 256, device=device))
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction((torch.cuda.memory_reserved(device) + BUDGET) / total)
else:
    import torchmem

    torchmem.limit(BUDGET, "cpu")
    torchmem.limit(torchmem.stats("cpu").allocated + BUDGET, "cpu")


def predict(batch: torch.Tensor, attempt: int = 0) -> torch.Tensor:
    staged = batch.clone()
    try:
        hidden = model[1](model[0](staged))  # SITE
        return model[2](hidden)
    except torch.OutOfMemoryError:
        if attempt >= 2:
            raise
        half = staged.shape[0] // 2
        return torch.cat([predict(staged[:half], attempt + 1), predict(staged[half:], attempt + 1)])


try:
    with torch.no_grad():
        preds = predict(torch.randn(16384, 256, device=device))
    print("predicted", preds.shape[0])
except torch.OutOfMemoryError:
    print("gave up: out of memory even at a quarter of the batch")
