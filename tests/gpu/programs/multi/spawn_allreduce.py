"""mp.spawn, one GPU per process with torch.cuda.set_device(rank), NCCL all-reduce of gradients by hand: a
newcomer's multi-GPU job outside torchrun. Nothing is wrong with it: each process works on its own GPU."""

import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def work(rank: int, world: int, port: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = port
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    model = torch.nn.Sequential(
        torch.nn.Linear(2048, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 2048)
    ).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(40):
        model(torch.randn(256, 2048, device="cuda")).pow(2).mean().backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        opt.step()
        opt.zero_grad()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(work, args=(2, sys.argv[1] if len(sys.argv) > 1 else "29531"), nprocs=2)
