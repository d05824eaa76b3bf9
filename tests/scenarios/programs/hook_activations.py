"""A forward hook that appends the layer's output to a list, without detach(): every batch's activation is
kept with its graph.

Expected: leak, one step = one top-level model call, born at the model call, held by `activations`.
"""

import torch
from torch import nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))
model = model.to(device)
images = [torch.randn(512, 512, device=device) for _ in range(30)]

activations = []


def save_activation(module, inputs, output):
    activations.append(output)  # should be output.detach().cpu()


model[2].register_forward_hook(save_activation)

predictions = []
for x in images:
    logits = model(x)  # SITE
    predictions.append(logits.argmax(-1).tolist())
print(len(activations), "activations captured")
