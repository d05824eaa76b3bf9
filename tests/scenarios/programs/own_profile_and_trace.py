"""Safety: the program installs its own sys.setprofile and sys.settrace functions (a home-made call
counter) around a training loop that leaks (validation losses logged as tensors), then removes them.
Expected: the leak is still found: one step = one optimizer step, born at the validation forward, held by
`val_losses`; exit code 0."""

import sys
from collections import Counter

import torch
import torch.nn.functional as F
from torch import nn

calls: Counter = Counter()


def profiler(frame, event, arg):
    if event == "call":
        calls[frame.f_code.co_name] += 1


def tracer(frame, event, arg):
    if event == "call" and frame.f_code.co_filename == __file__:
        calls["traced " + frame.f_code.co_name] += 1
    return None  # no line events


device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
model = model.to(device)
opt = torch.optim.SGD(model.parameters(), lr=1e-2)
x, y = torch.randn(256, 512, device=device), torch.randint(0, 10, (256,), device=device)
x_val, y_val = torch.randn(512, 512, device=device), torch.randint(0, 10, (512,), device=device)

sys.setprofile(profiler)
sys.settrace(tracer)
val_losses = []
for _step in range(30):
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    val_logits = model(x_val)  # SITE
    val_losses.append(F.cross_entropy(val_logits, y_val))
sys.settrace(None)
sys.setprofile(None)
print("most called:", calls.most_common(3))
