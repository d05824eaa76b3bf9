"""Gradients accumulated by hand into `w.grad` from `torch.autograd.grad(..., create_graph=True)` (kept
differentiable for a gradient-norm penalty later): `w.grad = w.grad + g` chains every step's
double-backward graph onto the last one, and the graph refers back to `w` (a cycle through autograd:
w -> w.grad -> graph -> w). Nothing ever resets `w.grad`.

Expected: leak, born at the autograd.grad call, held by `.grad`.
"""

import torch

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
w = torch.randn(512, 512, device=device, requires_grad=True)
head = torch.nn.Linear(512, 1).to(device)

for _step in range(40):
    data = torch.randn(256, 512, device=device)
    loss = head((data @ w).tanh()).square().mean()
    (g,) = torch.autograd.grad(loss, w, create_graph=True)  # SITE
    w.grad = g if w.grad is None else w.grad + g
print("grad norm", w.grad.norm().item())
