"""Variable-length batches padded to buckets of 64/128/256 tokens: the allocator's cache grows to the
largest bucket and stays there."""

import torch
from torch import nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(128, 512), nn.GELU(), nn.Linear(512, 128)).to(device)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
for _step in range(36):
    length = int(torch.randint(16, 256, ()).item())
    bucket = next(b for b in (64, 128, 256) if length <= b)
    x = torch.randn(32, bucket, 128, device=device)
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
print("done")
