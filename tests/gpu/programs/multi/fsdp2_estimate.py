"""The device-free per-rank estimate of fsdp2_ranks.py's step (FSDP2 on torch's fake process group, 2 ranks,
the H100 target), written as JSON to argv[1]. Runs in its own process: no process group of the user's."""

import json
import sys
import time

import torch
from fsdp2_ranks import BATCH, BLOCKS, SEQ, D, H, build

import torchmem

t0 = time.perf_counter()
est = torchmem.estimate(
    build,
    lambda bs: torch.randn(bs, SEQ, D),
    optimizer="adamw",
    batch_sizes=[BATCH],
    target="H100-80GB",
    sharding="fsdp",
    world_size=2,
    loss_fn=lambda o: o.float().pow(2).mean(),
)
seconds = time.perf_counter() - t0
facts = {
    "allocated_peak": est.peak(BATCH),
    "device_peak": est.device_peak,
    "parameters": est.parameters,
    "notes": list(est.notes),
    "seconds": seconds,
    "text": str(est),
    "blocks": BLOCKS,
    "hidden": H,
    "full_parameters": sum(p.numel() * p.element_size() for p in build().parameters()),
    "largest_parameter": max(p.numel() * p.element_size() for p in build().parameters()),
}
with open(sys.argv[1], "w") as f:
    json.dump(facts, f)
print(est)
