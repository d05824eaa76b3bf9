"""Safety: a training loop over a DataLoader with two worker processes (the platform's default start
method: fork on Linux). Expected: quiet, exit code 0."""

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Noise(Dataset):
    def __len__(self) -> int:
        return 20 * 256

    def __getitem__(self, i: int):
        g = torch.Generator().manual_seed(i)
        return torch.randn(512, generator=g), i % 10


def main() -> None:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    loader = DataLoader(Noise(), batch_size=256, num_workers=2)
    losses = []
    for x, y in loader:
        loss = F.cross_entropy(model(x.to(device)), y.to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    print(f"{len(losses)} batches, last loss {losses[-1]:.4f}")


if __name__ == "__main__":
    main()
