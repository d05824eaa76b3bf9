"""Feature inspection on a few batches: forward hooks on every linear layer save the layer's output in a
dict of lists keyed by layer name. The batches are run without torch.no_grad(), so each saved output keeps
its autograd graph too.

Expected: leak in a short loop (7 batches), born at the model call, held by `activations`.
"""

from collections import defaultdict

import torch
from torch import nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)).to(
    device
)

activations = defaultdict(list)


def save_output(name):
    def hook(module, inputs, output):
        activations[name].append(output)

    return hook


for name, module in model.named_modules():
    if isinstance(module, nn.Linear):
        module.register_forward_hook(save_output(name))

for _ in range(7):
    batch = torch.randn(1024, 256, device=device)
    logits = model(batch)  # SITE
    print("mean logit", logits.mean().item())
print({k: len(v) for k, v in activations.items()})
