"""A DDP job on gloo whose rank 1 is killed (SIGKILL) at step 8, while rank 0 evaluates its model: torchrun's
agent then stops rank 0 with SIGTERM."""

import json
import os
import signal
import time

import torch
import torch.distributed as dist


def wrote_step_8() -> bool:
    with open("k.rank1.jsonl", encoding="utf-8") as f:  # -o k.jsonl: this rank's capture
        for line in f:
            try:
                rec = json.loads(line)
            except ValueError:  # a line being written
                continue
            if rec.get("type") == "step" and rec.get("step") == 8:
                return True
    return False


torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 64))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
try:
    for i in range(24):
        if i == 8:
            if rank == 1:
                for _ in range(
                    500
                ):  # until torchmem's sampler wrote the 8 steps in its capture (at most 5 s)
                    if wrote_step_8():
                        break
                    time.sleep(0.01)
                os.kill(os.getpid(), signal.SIGKILL)
            print(f"rank {rank} evaluates", flush=True)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:  # no collective: torchrun's SIGTERM stops it here
                with torch.no_grad():
                    model.module(torch.randn(16, 64))
                time.sleep(0.01)
        model(torch.randn(16, 64)).sum().backward()
        opt.step()
        opt.zero_grad()
finally:
    print(f"rank {rank}: finally", flush=True)  # never runs: SIGTERM raises nothing into the program
dist.destroy_process_group()
