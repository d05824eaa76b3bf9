"""mp.spawn, FSDP2 over 2 GPUs, then a full state dict on every rank (get_model_state_dict with
full_state_dict=True): without cpu_offload every rank gathers the whole model (1 GiB) on its GPU.
``offload`` as the second argument passes cpu_offload=True (the fix: nothing gathered on the GPU)."""

import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import fully_shard


def work(rank: int, world: int, port: str, offload: bool) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = port
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    with torch.device("cuda"):
        model = torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(16)])  # 256 M params: 1 GiB
    for block in model:
        fully_shard(block)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(5):
        model(torch.randn(64, 4096, device="cuda")).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=offload))
    if rank == 0:
        print("state dict tensors:", len(sd), "on", next(iter(sd.values())).device)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    offload = len(sys.argv) > 2 and sys.argv[2] == "offload"
    mp.spawn(work, args=(2, sys.argv[1] if len(sys.argv) > 1 else "29532", offload), nprocs=2)
