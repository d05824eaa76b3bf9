"""torch.compile'd model in an eval loop without no_grad, keeping every loss (a leak)."""

import torch

model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024)).cuda()
cmodel = torch.compile(model)
losses = []
for _i in range(30):
    x = torch.randn(512, 1024, device="cuda")
    loss = cmodel(x).square().mean()  # SITE
    losses.append(loss)
print("done", len(losses))
