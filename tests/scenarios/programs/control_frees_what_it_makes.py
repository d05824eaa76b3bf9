"""Control: an evaluation loop that makes temporaries (an augmented copy, a scratch buffer, outputs) and
frees them every step, accumulating floats only. Expected: quiet."""

import torch
import torch.nn.functional as F
from torch import nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)).to(device).eval()
val_set = [
    (torch.randn(512, 512, device=device), torch.randint(0, 10, (512,), device=device)) for _ in range(30)
]

total, correct = 0.0, 0
with torch.no_grad():
    for x, y in val_set:
        flipped = torch.flip(x, dims=[1])  # test-time augmentation
        scratch = torch.empty(2, *x.shape, device=device)
        scratch[0], scratch[1] = x, flipped
        logits = model(scratch).mean(0)
        total += F.cross_entropy(logits, y).item()
        correct += (logits.argmax(-1) == y).sum().item()
        del flipped, scratch, logits
print(f"loss {total / len(val_set):.4f}, accuracy {correct / (512 * len(val_set)):.4f}")
