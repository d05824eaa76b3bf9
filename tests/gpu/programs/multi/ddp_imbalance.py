"""The GPU-0 imbalance: every rank loads a checkpoint saved from cuda:0 with ``torch.load`` and no
``map_location``: the tensors go back to cuda:0, so rank 1 creates a CUDA context (and puts the weights) on
GPU 0 although it trains on GPU 1."""

import os
import sys

import torch
import torch.distributed as dist

ckpt = sys.argv[1]
local = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local)
dev = torch.device("cuda", local)
dist.init_process_group("nccl")
rank = dist.get_rank()
if rank == 0:
    torch.save(torch.nn.Linear(2048, 2048).to("cuda:0").state_dict(), ckpt)
dist.barrier()
state = torch.load(ckpt)  # no map_location: the tensors land on cuda:0 on every rank
net = torch.nn.Linear(2048, 2048)
net.load_state_dict(state)
model = torch.nn.parallel.DistributedDataParallel(net.to(dev), device_ids=[local])
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(30):
    model(torch.randn(512, 2048, device=dev)).sum().backward()
    opt.step()
    opt.zero_grad()
dist.barrier()
dist.destroy_process_group()
