"""find_batch_size under DDP on NCCL: each rank searches under its own cap (rank 0 10 GiB, rank 1 6 GiB of
allocator memory, margin 0: trials run out of memory on rank 1 only), the search agrees over the process
group: both ranks must return the same size, the one that fits the smaller rank. The trials run with DDP's
gradient all-reduce off (an OOM on rank 1 mid-step would otherwise leave rank 0 waiting in it) and step
Adam with each rank's own gradients; afterwards both ranks hold rank 0's replica again."""

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


adam = torch.optim.Adam(model.parameters(), lr=1e-4)
torch.manual_seed(rank)  # each rank's batches differ: the trials (in no_sync) step each replica differently
model(torch.randn(8, 4096, device=dev)).float().pow(2).mean().backward()  # Adam's state before the search
adam.step()
adam.zero_grad(set_to_none=True)


def step(bs: int) -> None:
    model(torch.randn(bs, 4096, device=dev)).float().pow(2).mean().backward()
    adam.step()
    adam.zero_grad(set_to_none=True)


with torchmem.limit("10GiB" if rank == 0 else "6GiB", dev):
    found = torchmem.find_batch_size(step, device=dev, margin=0.0)
# the size found runs in the real step under the same caps, on both ranks
with torchmem.limit("10GiB" if rank == 0 else "6GiB", dev):
    step(found.batch_size)
    ok = True
# every rank holds rank 0's replica again: parameters and Adam's state (its step counters on the CPU)
replica = [p.detach() for p in model.parameters()]
replica += [v for st in adam.state.values() for v in st.values() if torch.is_tensor(v)]
sums = [float(t.double().sum().item()) for t in replica]
out = {"rank": rank, "batch": found.batch_size, "ok": ok, "text": str(found), "replica": sums}
with open(f"{sys.argv[1]}.{rank}.json", "w") as f:
    json.dump(out, f)
dist.destroy_process_group()
