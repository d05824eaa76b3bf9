"""A program with its own SIGTERM handler, that gets SIGTERM in its loop: its handler runs, not torchmem's."""

import os
import signal
import sys

import torch


def stop(signum, frame):  # type: ignore[no-untyped-def]
    print(f"own handler {signum}", flush=True)
    sys.exit(3)


signal.signal(signal.SIGTERM, stop)
model = torch.nn.Linear(32, 32)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
print("started", flush=True)
try:
    for i in range(10):
        model(torch.randn(8, 32)).sum().backward()
        opt.step()
        opt.zero_grad()
        if i == 5:
            os.kill(os.getpid(), signal.SIGTERM)
finally:
    print("finally", flush=True)
