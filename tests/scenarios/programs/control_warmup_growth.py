"""Control: a padding buffer that grows while the sequence-length curriculum ramps up (three steps), then
stays; AdamW's state appears at the first step. Growth at the start only. Expected: quiet."""

import torch
import torch.nn.functional as F
from torch import nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512)).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

padded = torch.empty(0, 512, device=device)
for step in range(30):
    seq_len = min(512 * (step + 1), 1536)  # curriculum: longer sequences for the first 3 steps
    if padded.shape[0] < seq_len:
        padded = torch.zeros(seq_len, 512, device=device)  # grown to the longest length seen
    padded[:seq_len].normal_()
    loss = F.mse_loss(model(padded[:seq_len]), padded[:seq_len])
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
print("loss", loss.item())
