"""What NCCL allocates outside PyTorch's caching allocator on each rank, read through NVML at each stage
(before the process group, after it, after the first all-reduce, a large one, a DDP step, a second group),
against what ``torchmem.stats()`` attributes to NCCL at those moments. Run under ``torchmem run`` (which
notes the baseline in its ``init_process_group`` wrapper).

    torchrun --nproc_per_node 2 -m torchmem run nccl_probe.py OUT_DIR [cuda-first|init-first]

``init-first`` creates the process group before any CUDA call (the baseline is then the CUDA context).
Writes ``OUT_DIR/probe.<mode>.<rank>.json``."""

import json
import os
import sys

import pynvml
import torch
import torch.distributed as dist

import torchmem

out_dir = sys.argv[1]
mode = sys.argv[2] if len(sys.argv) > 2 else "cuda-first"
local = int(os.environ["LOCAL_RANK"])
dev = torch.device("cuda", local)
pynvml.nvmlInit()


def used() -> int:
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    idx = int(vis.split(",")[local]) if vis else local
    h = pynvml.nvmlDeviceGetHandleByIndex(idx)
    for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
        if p.pid == os.getpid():
            return int(p.usedGpuMemory)
    return 0


rows = []


def mark(stage: str, with_stats: bool = False) -> None:
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()
    reserved = torch.cuda.memory_reserved(dev) if torch.cuda.is_initialized() else 0
    row = {"stage": stage, "nvml": used(), "reserved": reserved}
    if with_stats:
        s = torchmem.stats(dev)
        row.update(
            tm_nccl=s.nccl_buffers, tm_method=s.nccl_method, tm_comms=s.nccl_communicators,
            tm_unexplained=s.unexplained, tm_context=s.context,
        )  # fmt: skip
    rows.append(row)


if mode == "init-first":
    dist.init_process_group("nccl")
    torch.cuda.set_device(local)
    x = torch.ones(1, device=dev)
    mark("context")
    a = torch.randn(1024, 1024, device=dev)
    (a @ a).sum().item()
    mark("init_pg")
else:
    torch.cuda.set_device(local)
    x = torch.ones(1, device=dev)
    mark("context")
    a = torch.randn(1024, 1024, device=dev)
    (a @ a).sum().item()
    mark("matmul")
    dist.init_process_group("nccl")
    mark("init_pg")
t = torch.ones(1024, device=dev)
dist.all_reduce(t)
mark("allreduce_small", with_stats=True)
big = torch.ones(64 << 20, device=dev)
dist.all_reduce(big)
mark("allreduce_256MiB")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(1024, 1024).to(dev), device_ids=[local])
model(torch.randn(64, 1024, device=dev)).sum().backward()
mark("ddp_step", with_stats=True)
g = dist.new_group([0, 1])
dist.all_reduce(t, group=g)
mark("second_group", with_stats=True)
out = {"rank": dist.get_rank(), "mode": mode, "nccl_version": list(torch.cuda.nccl.version()), "rows": rows}
if dist.get_rank() == 0:
    print(torchmem.stats(dev).breakdown(), flush=True)
with open(os.path.join(out_dir, f"probe.{mode}.{dist.get_rank()}.json"), "w") as f:
    json.dump(out, f)
dist.destroy_process_group()
