"""A contrastive memory bank grown with `torch.cat` every step and never truncated to its intended size
(the slicing line was lost): one tensor re-allocated larger each step.

Expected: leak at the optimizer step, born at the `torch.cat`, held by `bank`.
"""

import torch
from torch import nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
encoder = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 512)).to(device)
opt = torch.optim.SGD(encoder.parameters(), lr=1e-2)
bank = torch.empty(0, 512, device=device)

for _step in range(20):
    z = nn.functional.normalize(encoder(torch.randn(512, 128, device=device)), dim=1)
    loss = (z @ bank.T).logsumexp(1).mean() if len(bank) else z.sum() * 0
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    bank = torch.cat([bank, z.detach()])  # SITE
print("bank", tuple(bank.shape))
