"""find_batch_size under DDP on NCCL: each rank searches under its own cap (rank 0 6 GiB, rank 1 3 GiB of
allocator memory, margin 0: trials run out of memory on rank 1 only), the search agrees over the process
group: both ranks must return the same size, the one that fits the smaller rank. The trials run with DDP's
gradient all-reduce off: an OOM on rank 1 mid-step would otherwise leave rank 0 waiting in it."""

import json
import os
import sys

import torch
import torch.distributed as dist

import torchmem

local = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
dev = torch.device("cuda", local)
dist.init_process_group("nccl")
rank = dist.get_rank()
torch.manual_seed(0)
net = torch.nn.Sequential(
    torch.nn.Linear(4096, 8192),
    torch.nn.GELU(),
    torch.nn.Linear(8192, 8192),
    torch.nn.GELU(),
    torch.nn.Linear(8192, 4096),
).to(dev)
model = torch.nn.parallel.DistributedDataParallel(net, device_ids=[local])


def step(bs: int) -> None:
    model(torch.randn(bs, 4096, device=dev)).float().pow(2).mean().backward()
    model.zero_grad(set_to_none=True)


with torchmem.limit("6GiB" if rank == 0 else "3GiB", dev):
    found = torchmem.find_batch_size(step, device=dev, margin=0.0)
# the size found runs in the real step under the same caps, on both ranks
with torchmem.limit("6GiB" if rank == 0 else "3GiB", dev):
    step(found.batch_size)
    ok = True
out = {"rank": rank, "batch": found.batch_size, "ok": ok, "text": str(found)}
with open(f"{sys.argv[1]}.{rank}.json", "w") as f:
    json.dump(out, f)
dist.destroy_process_group()
