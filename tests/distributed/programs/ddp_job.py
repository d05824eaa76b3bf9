"""A DDP job on gloo: rank 1 keeps a tensor per step (a leak on one rank only); then every rank gathers its
stats to rank 0 and searches its batch size under its own CPU cap (the ranks must agree)."""

import json
import sys

import torch
import torch.distributed as dist

import torchmem
from torchmem.integrations.distributed import gather_stats, local_stats

out = sys.argv[1]
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 64))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
keep = []
for _ in range(96):  # ~36 MiB kept on rank 1: well above the C heap's own spread between ranks
    model(torch.randn(16, 64)).sum().backward()
    opt.step()
    opt.zero_grad()
    if rank == 1:
        keep.append(torch.randn(96 * 1024))  # 384 KiB per step, on rank 1 only

everyone = gather_stats("cpu")
mine = local_stats("cpu")

# A DDP model: the search runs each trial in no_sync() (rank 1 runs out of memory at sizes rank 0 still
# runs: with DDP's all-reduce in the trial, rank 0 would wait in it for ever).
net = torch.nn.parallel.DistributedDataParallel(
    torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))
)


adam = torch.optim.Adam(net.parameters(), lr=0.01)
torch.manual_seed(rank)  # each rank's batches differ: in no_sync() each replica steps with its own gradients
net(torch.randn(8, 256)).sum().backward()  # Adam's state exists before the search (outside the caps)
adam.step()
adam.zero_grad(set_to_none=True)


def step(bs: int) -> None:
    net(torch.randn(bs, 256)).sum().backward()
    adam.step()
    adam.zero_grad(set_to_none=True)


with torchmem.limit((8 << 20) if rank == 0 else (4 << 20), "cpu"):
    found = torchmem.find_batch_size(step, device="cpu", margin=0.0)
# after the search every rank holds rank 0's replica: parameters and Adam's state, to the bit
replica = [p.detach().clone() for p in net.parameters()]
replica += [v.clone() for st in adam.state.values() for v in st.values() if torch.is_tensor(v)]
result = {
    "rank": rank,
    "replica": [t.double().sum().item() for t in replica] + [float(len(replica))],
    "note": found.note,
    "local": mine.to_dict(),
    "batch": found.batch_size,
    "gathered": everyone.to_dict() if everyone is not None else None,
    "text": str(everyone) if everyone is not None else None,
}
with open(f"{out}.{rank}.json", "w") as f:
    json.dump(result, f)
dist.destroy_process_group()
