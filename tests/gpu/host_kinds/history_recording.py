"""The CUDA allocator's memory history turned on (unbounded, as `_record_memory_history()` is by default)
and left on during training: every allocation and free keeps a trace entry with its stack on the host."""

import torch
from torch import nn

torch.cuda.memory._record_memory_history()  # never turned off while the loop runs
torch.manual_seed(0)
model = nn.Sequential(
    nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 1)
).cuda()
losses = []
for _step in range(900):
    loss = model(torch.randn(64, 512, device="cuda")).square().mean()
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.01 * p.grad
            p.grad = None
    losses.append(loss.item())
torch.cuda.memory._record_memory_history(enabled=None)
print(losses[-1])
