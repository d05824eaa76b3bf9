"""nn.DataParallel over 2 GPUs with a large output (logits over a 32k vocabulary): the outputs of both
replicas are gathered on cuda:0 and the loss is computed there. ``inside`` as the argument computes the loss
inside the wrapped module (only the per-replica losses are gathered): the fix."""

import sys

import torch
import torch.nn.functional as F

VOCAB, D, BATCH = 32768, 1024, 4096
inside = len(sys.argv) > 1 and sys.argv[1] == "inside"


class LM(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(D, D), torch.nn.GELU())
        self.head = torch.nn.Linear(D, VOCAB)

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        logits = self.head(self.body(x))
        if y is None:
            return logits
        return F.cross_entropy(logits, y).unsqueeze(0)


model = torch.nn.DataParallel(LM().cuda())
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _step in range(12):
    x = torch.randn(BATCH, D, device="cuda")
    y = torch.randint(0, VOCAB, (BATCH,), device="cuda")
    loss = model(x, y).mean() if inside else F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
for i in range(torch.cuda.device_count()):
    print(f"cuda:{i} peak allocated {torch.cuda.max_memory_allocated(i) / 2**20:.0f} MiB")
