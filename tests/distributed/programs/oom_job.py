"""A DDP job on gloo whose rank 1 runs out of memory (torchmem's CPU cap) at step 10."""

import torch
import torch.distributed as dist

import torchmem

torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 64))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
cap = torchmem.limit("16MiB", "cpu") if rank == 1 else None
for i in range(40):
    if rank == 1 and i == 10:
        big = torch.empty(64 << 20, dtype=torch.uint8)  # over the cap: torch.OutOfMemoryError
    model(torch.randn(16, 64)).sum().backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
