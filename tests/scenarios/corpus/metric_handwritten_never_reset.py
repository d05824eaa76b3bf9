"""A hand-written retrieval metric (recall@k) that gathers every query's similarity row in a list and only
computes the figure at the end; the evaluation keeps calling `update()` across rounds and never resets it.
Plain tensor code, no nn.Module call, no optimizer: no step torchmem recognises.

Expected: leak on the timeline (per second), held by the metric's list (`recall.sims`).
"""

import time

import torch

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)


class RecallAtK:
    def __init__(self, k: int = 5) -> None:
        self.k = k
        self.sims: list[torch.Tensor] = []
        self.targets: list[torch.Tensor] = []

    def update(self, queries: torch.Tensor, keys: torch.Tensor, targets: torch.Tensor) -> None:
        self.sims.append(queries @ keys.T)  # SITE
        self.targets.append(targets)

    def compute(self) -> float:
        sims, targets = torch.cat(self.sims), torch.cat(self.targets)
        topk = sims.topk(self.k, dim=1).indices
        return (topk == targets[:, None]).any(1).float().mean().item()


keys = torch.nn.functional.normalize(torch.randn(1024, 64, device=device), dim=1)
recall = RecallAtK()
start = time.perf_counter()
while time.perf_counter() - start < 2.0:
    q = torch.nn.functional.normalize(torch.randn(256, 64, device=device), dim=1)
    recall.update(q, keys, torch.randint(0, 1024, (256,), device=device))
    time.sleep(0.02)
print("recall@5", recall.compute())
