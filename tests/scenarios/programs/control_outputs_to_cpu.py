"""Control (CUDA only: on the CPU the outputs already live where they are kept): inference under
torch.no_grad() with every output moved to host memory and kept. Device memory stays flat.
Expected: quiet."""

import torch
from torch import nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512)).to(device).eval()
batches = [torch.randn(512, 512, device=device) for _ in range(30)]

predictions = []
with torch.no_grad():
    for x in batches:
        predictions.append(model(x).cpu())
print(torch.cat(predictions).shape)
