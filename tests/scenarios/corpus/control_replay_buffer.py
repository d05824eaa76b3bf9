"""A DQN-style replay buffer that appends transitions until it holds 10 of them, then overwrites the
oldest slot: memory grows for the first steps, then stays flat."""

import torch
from torch import nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
q_net = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 4)).to(device)
opt = torch.optim.SGD(q_net.parameters(), lr=1e-3)
CAPACITY = 10
buffer: list[torch.Tensor] = []
for step in range(36):
    obs = torch.randn(256, 256, device=device)
    if len(buffer) < CAPACITY:
        buffer.append(obs)
    else:
        buffer[step % CAPACITY] = obs
    batch = buffer[int(torch.randint(0, len(buffer), ()).item())]
    loss = q_net(batch).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
print(len(buffer), "in the buffer")
