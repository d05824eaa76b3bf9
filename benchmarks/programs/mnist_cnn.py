"""MNIST-shaped CNN training, as in pytorch/examples' mnist, on random 28x28 images (no download).

The "usual CPU program" of ``benchmarks/run_cost.py``: ``torchmem run`` must stay within 1.2x of plain python.

    python benchmarks/programs/mnist_cnn.py [--device cpu|cuda] [--steps BATCHES_PER_EPOCH] [--epochs N]

``--steps`` is the number of training batches per epoch (the data set holds ``steps * 64`` images); the
environment variable ``TORCHMEM_BENCH_SCALE`` multiplies the default. Prints ``LOOP_SECONDS=<float>`` (the
epochs' training and test loops) at the end.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.nn.functional as F
from torch import nn, optim
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x)
        x = F.relu(x)
        x = self.conv2(x)
        x = F.relu(x)
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = self.fc1(x)
        x = F.relu(x)
        x = self.dropout2(x)
        x = self.fc2(x)
        return F.log_softmax(x, dim=1)


def train(
    model: nn.Module,
    device: torch.device,
    loader: DataLoader[tuple[torch.Tensor, ...]],
    optimizer: optim.Optimizer,
    epoch: int,
) -> None:
    model.train()
    for batch_idx, (data, target) in enumerate(loader):
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
        if batch_idx % 10 == 0:
            print(f"Train Epoch: {epoch} [batch {batch_idx}/{len(loader)}]\tLoss: {loss.item():.6f}")


def test(model: nn.Module, device: torch.device, loader: DataLoader[tuple[torch.Tensor, ...]]) -> None:
    model.eval()
    test_loss = 0.0
    correct = 0
    n = 0
    with torch.no_grad():
        for data, target in loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction="sum").item()
            pred = output.argmax(dim=1, keepdim=True)
            correct += int(pred.eq(target.view_as(pred)).sum().item())
            n += len(target)
    print(f"Test set: Average loss: {test_loss / n:.4f}, Accuracy: {correct}/{n}")


def random_mnist(n: int, generator: torch.Generator) -> TensorDataset:
    images = torch.rand(n, 1, 28, 28, generator=generator)
    images = (images - 0.1307) / 0.3081  # the example's Normalize((0.1307,), (0.3081,))
    labels = torch.randint(0, 10, (n,), generator=generator)
    return TensorDataset(images, labels)


def main() -> None:
    default_device = "cuda" if torch.cuda.is_available() else "cpu"
    parser = argparse.ArgumentParser(description="MNIST-shaped CNN on random data")
    parser.add_argument("--device", default=os.environ.get("TORCHMEM_BENCH_DEVICE", default_device))
    parser.add_argument("--steps", type=int, default=None, help="training batches per epoch")
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1.0)
    parser.add_argument("--gamma", type=float, default=0.7)
    args = parser.parse_args()
    device = torch.device(args.device)
    scale = float(os.environ.get("TORCHMEM_BENCH_SCALE", "1"))
    cuda = device.type == "cuda"
    steps = args.steps or max(1, round((938 if cuda else 250) * scale))  # 938 batches: the real 60,000 images
    epochs = args.epochs or (3 if cuda else 2)

    torch.manual_seed(1)
    g = torch.Generator().manual_seed(1)
    train_set = random_mnist(steps * args.batch_size, g)
    test_set = random_mnist(max(1000, steps * args.batch_size // 6), g)
    workers = 1 if cuda else 0  # the example's cuda_kwargs: num_workers=1, pin_memory=True
    train_loader = DataLoader(
        train_set, batch_size=args.batch_size, shuffle=True, num_workers=workers, pin_memory=cuda
    )
    test_loader = DataLoader(test_set, batch_size=1000, num_workers=workers, pin_memory=cuda)

    model = Net().to(device)
    optimizer = optim.Adadelta(model.parameters(), lr=args.lr)
    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)

    c0 = time.process_time()  # the process's CPU time: its threads, torchmem's included
    t0 = time.perf_counter()
    for epoch in range(1, epochs + 1):
        train(model, device, train_loader, optimizer, epoch)
        test(model, device, test_loader)
        scheduler.step()
    if cuda:
        torch.cuda.synchronize(device)
    print(f"LOOP_CPU_SECONDS={time.process_time() - c0:.4f}")
    print(f"LOOP_SECONDS={time.perf_counter() - t0:.4f}")


if __name__ == "__main__":
    main()
