"""A particle simulation paced to real time that records every frame on the device: no nn.Module, no
backward, no optimizer, no DataLoader — no repeating step torchmem can find, so growth must be judged on
the timeline (bytes per second).

Expected: leak, per second of the timeline, born at the position update, held by `trajectory`.
"""

import time

import torch

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
pos = torch.randn(256, 512, device=device)
vel = torch.zeros_like(pos)
dt = 0.01

trajectory = []
start = time.perf_counter()
while time.perf_counter() - start < 3.0:
    vel += -pos * dt
    pos = pos + vel * dt  # SITE
    trajectory.append(pos)  # every frame kept on the device
    time.sleep(0.02)  # 50 frames per second
print(len(trajectory), "frames")
