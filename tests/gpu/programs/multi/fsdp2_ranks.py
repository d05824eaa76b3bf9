"""FSDP2 on NCCL, one GPU per rank: 8 blocks of Linear(2048, 8192) / GELU / Linear(8192, 2048), fp32, AdamW,
batch 64 x 512 tokens, ``fully_shard`` per block and the root. Writes each rank's allocated peak over its
third step, then the allocated peak of a full state-dict gather (``get_model_state_dict`` with
``full_state_dict=True``), with and without ``cpu_offload``, to ``<out>.<rank>.json``."""

import json
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import fully_shard

BLOCKS, D, H, BATCH, SEQ = 8, 2048, 8192, 64, 512


def build() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        *[
            torch.nn.Sequential(torch.nn.Linear(D, H), torch.nn.GELU(), torch.nn.Linear(H, D))
            for _ in range(BLOCKS)
        ]
    )


def main() -> None:
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    with torch.device(dev):
        m = build()
    for b in m:
        fully_shard(b)
    fully_shard(m)
    opt = torch.optim.AdamW(m.parameters())
    x = torch.randn(BATCH, SEQ, D, device=dev)
    peaks = []
    for _ in range(3):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(dev)
        m(x).float().pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        peaks.append(torch.cuda.max_memory_allocated(dev))
    gathers = {}
    for offload in (True, False):
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        sd = get_model_state_dict(m, options=StateDictOptions(full_state_dict=True, cpu_offload=offload))
        torch.cuda.synchronize()
        gathers["cpu_offload" if offload else "on_gpu"] = {
            "before": before,
            "peak": torch.cuda.max_memory_allocated(dev),
            "after_held": torch.cuda.memory_allocated(dev),
            "entries": len(sd),
        }
        del sd
    out = {
        "rank": rank,
        "step_peaks": peaks,
        "reserved_peak": torch.cuda.max_memory_reserved(dev),
        "gathers": gathers,
        "full_param_bytes": sum(p.numel() * p.element_size() for p in build().parameters()),
    }
    with open(f"{sys.argv[1]}.{rank}.json", "w") as f:
        json.dump(out, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
