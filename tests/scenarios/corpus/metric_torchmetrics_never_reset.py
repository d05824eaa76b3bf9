"""Offline scoring of a detector's cached outputs with a real torchmetrics metric: `BinaryAUROC` with
`thresholds=None` keeps every prediction and target in list states, and the loop calls `update()` over and
over, for every chunk of every evaluation round, without ever calling `reset()`. No model runs, no
optimizer steps: nothing marks a step.

Expected: leak, one step per `update()` call (found from the loop's code), held by the metric's list state
(`auroc`), with the fix `auroc.reset()` after each `compute()`.
"""

import time

import torch
from torchmetrics.classification import BinaryAUROC

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
auroc = BinaryAUROC(thresholds=None).to(device)

start = time.perf_counter()
rounds = 0
while time.perf_counter() - start < 2.0:
    for _ in range(4):
        scores = torch.rand(65536, device=device)
        labels = (torch.rand(65536, device=device) > 0.5).long()  # SITE
        auroc.update(scores, labels)
    rounds += 1
    time.sleep(0.03)
print(f"{rounds} rounds scored")
