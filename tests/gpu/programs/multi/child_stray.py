"""A process meant for GPU 1 that touches GPU 0 first: a bare ``.cuda()`` before ``torch.cuda.set_device(1)``
(``load`` as the argument: a ``torch.load`` of a checkpoint saved from cuda:0, without map_location, instead).
Then it trains on GPU 1."""

import os
import sys
import tempfile
import time

import torch

if len(sys.argv) > 1 and sys.argv[1] == "load":
    path = os.path.join(tempfile.mkdtemp(), "ckpt.pt")
    torch.save({"w": torch.randn(1024, 1024)}, path)
    # saved from the CPU; make the checkpoint as one saved from cuda:0 would be
    torch.save({"w": torch.randn(1024, 1024, device="cuda:0")}, path)
    torch.cuda.set_device(1)
    state = torch.load(path)  # no map_location: back onto cuda:0
else:
    probe = torch.zeros(1).cuda()  # the current device is still cuda:0
    torch.cuda.set_device(1)
model = torch.nn.Linear(4096, 4096).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(30):
    model(torch.randn(2048, 4096, device="cuda")).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
keep = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
time.sleep(float(os.environ.get("CHILD_HOLD_S", "0")))
print("child done on", torch.cuda.current_device())
