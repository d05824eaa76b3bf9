"""A DDP job on NCCL whose rank 1 runs out of device memory at step 10 (a request larger than the GPU);
rank 0 goes on into its next step's collective, which rank 1 never joins."""

import os

import torch
import torch.distributed as dist

local = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
dev = torch.device("cuda", local)
dist.init_process_group("nccl")
rank = dist.get_rank()
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(1024, 1024).to(dev), device_ids=[local])
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for i in range(40):
    if rank == 1 and i == 10:
        big = torch.empty(200 << 30, dtype=torch.uint8, device=dev)  # 200 GiB: torch.OutOfMemoryError
    loss = model(torch.randn(256, 1024, device=dev)).sum()
    loss.backward()
    opt.step()
    opt.zero_grad()
    print(f"rank {rank} step {i} loss {loss.item():.3f}", flush=True)
dist.destroy_process_group()
