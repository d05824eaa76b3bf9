"""A torch.profiler started before the loop and left recording: every op of every step adds an event on
the host; nothing else grows."""

import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64))
prof = torch.profiler.profile()
prof.start()  # never stopped while the loop runs
losses = []
for _step in range(500):  # enough host readings under load
    loss = model(torch.randn(16, 64)).square().mean()
    loss.backward()
    with torch.no_grad():  # plain SGD (no optimizer: no torch._dynamo import)
        for p in model.parameters():
            p -= 0.01 * p.grad
            p.grad = None
    losses.append(loss.item())
prof.stop()  # after the loop (a profiler left running crashes some torch builds at exit)
print(losses[-1])
