"""A post-processing step computed on the CPU with autograd on: the model's outputs are copied to the
host and a calibration layer (which requires grad) is applied there; the calibrated outputs, with their
CPU autograd graph, are kept per batch. On a GPU the device is flat and the host grows; on the CPU it is
the CPU tensors that grow.

Expected: a leak of CPU tensors with their graph, born at the calibration, held by `calibrated`.
"""

import torch
from torch import nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256)).to(device).eval()
calibration = nn.Linear(256, 256)  # stays on the CPU, requires grad

calibrated = []
with torch.no_grad():
    batches = [torch.randn(512, 64, device=device) for _ in range(4)]
for step in range(30):
    with torch.no_grad():
        logits = model(batches[step % 4]).cpu()
    calibrated.append(calibration(logits).softmax(-1))  # SITE
print(len(calibrated), "batches calibrated")
