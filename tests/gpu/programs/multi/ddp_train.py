"""A DDP training job on NCCL, GPU-bound (4x Linear(4096), batch 4096, bf16 autocast, AdamW): one GPU per
rank. Each rank writes the seconds of its own loop to ``<out>.loop.<rank>`` (the overhead comparison reads
it). ``--leak`` makes rank 1 keep 2 MiB per step (a leak on one rank only)."""

import argparse
import os
import time

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--steps", type=int, default=600)
parser.add_argument("--leak", action="store_true")
args = parser.parse_args()

local = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
dev = torch.device("cuda", local)
dist.init_process_group("nccl")
rank = dist.get_rank()
torch.manual_seed(0)
net = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(4)]).to(dev)
model = torch.nn.parallel.DistributedDataParallel(net, device_ids=[local])
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
x = torch.randn(4096, 4096, device=dev)
kept = []
for step in range(args.steps + 20):
    if step == 20:  # warm-up done
        torch.cuda.synchronize()
        t0 = time.perf_counter()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(x).float().pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if args.leak and rank == 1:
        kept.append(torch.empty(512 * 1024, device=dev))  # 2 MiB per step, rank 1 only
torch.cuda.synchronize()
seconds = time.perf_counter() - t0
with open(f"{args.out}.loop.{rank}", "w") as f:
    f.write(f"{seconds:.6f}")
print(f"rank {rank} LOOP_SECONDS={seconds:.4f}", flush=True)
dist.destroy_process_group()
