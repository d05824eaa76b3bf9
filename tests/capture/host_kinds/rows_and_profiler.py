"""256 KiB of numpy rows kept per step (`rows.append(...)`), a dict of lists of floats and a dict of
strings (a dict the garbage collector does not track: int keys, str values) kept per step, while a
torch.profiler records: the rows, the lists and the strings are what grows (named with their holder and
line); the profiler's events are a small part of the growth, so the profiler is not named as a cause."""

import numpy as np
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64))
rows = []
log = {}
names = {}
prof = torch.profiler.profile()
prof.start()
for step in range(200):
    loss = model(torch.randn(16, 64)).square().mean()
    loss.backward()
    with torch.no_grad():  # plain SGD (no optimizer: no torch._dynamo import)
        for p in model.parameters():
            p -= 0.01 * p.grad
            p.grad = None
    rows.append(np.random.rand(256, 128))  # ROWS
    log[f"step{step}"] = [float(i) for i in range(2000)]  # LOG
    names[step] = f"{step:08d}" * 4096  # NAMES
prof.stop()  # after the loop (a profiler left running crashes some torch builds at exit)
print(len(rows), len(log))
