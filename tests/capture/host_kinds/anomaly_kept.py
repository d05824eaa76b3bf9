"""Anomaly mode left on while the losses are kept with their graphs: every autograd node keeps the stack
that created it, and `losses` keeps the nodes alive."""

import torch

torch.autograd.set_detect_anomaly(True)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
losses = []
for _step in range(400):  # enough readings under load (a host reading every ~100 steps)
    loss = model(torch.randn(16, 64)).square().mean()
    loss.backward()
    with torch.no_grad():  # plain SGD (no optimizer: no torch._dynamo import)
        for p in model.parameters():
            p -= 0.01 * p.grad
            p.grad = None
    losses.append(loss)  # KEEP
print(len(losses))
