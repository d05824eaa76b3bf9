"""An op-heavy program shaped like pytorch/examples' time_sequence_prediction: sine waves, two LSTMCells.

Two ``LSTMCell`` layers unrolled step by step over a long sequence (thousands of tiny ops per forward),
trained in double precision with ``LBFGS`` and a closure (up to 20 evaluations per outer step); after each
outer step, a prediction of the future under ``torch.no_grad()``. On the CPU ``torchmem run`` must stay
within 2x of plain python here (issue 12 measured 7.5x before).

    python benchmarks/programs/lbfgs_ops.py [--device cpu|cuda] [--steps OUTER_STEPS] [--length L]

The environment variable ``TORCHMEM_BENCH_SCALE`` multiplies the default number of outer steps. Prints
``LOOP_SECONDS=<float>`` (the outer steps with their predictions) at the end.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from torch import nn


class Sequence(nn.Module):
    def __init__(self, hidden: int = 51) -> None:
        super().__init__()
        self.hidden = hidden
        self.lstm1 = nn.LSTMCell(1, hidden)
        self.lstm2 = nn.LSTMCell(hidden, hidden)
        self.linear = nn.Linear(hidden, 1)

    def forward(self, inputs: torch.Tensor, future: int = 0) -> torch.Tensor:
        outputs = []
        n = inputs.size(0)
        h1 = torch.zeros(n, self.hidden, dtype=inputs.dtype, device=inputs.device)
        c1 = torch.zeros_like(h1)
        h2 = torch.zeros_like(h1)
        c2 = torch.zeros_like(h1)
        output = torch.zeros(n, 1, dtype=inputs.dtype, device=inputs.device)
        for x_t in inputs.split(1, dim=1):
            h1, c1 = self.lstm1(x_t, (h1, c1))
            h2, c2 = self.lstm2(h1, (h2, c2))
            output = self.linear(h2)
            outputs.append(output)
        for _ in range(future):  # feed the prediction back in
            h1, c1 = self.lstm1(output, (h1, c1))
            h2, c2 = self.lstm2(h1, (h2, c2))
            output = self.linear(h2)
            outputs.append(output)
        return torch.cat(outputs, dim=1)


def sine_waves(n: int, length: int, period: float = 20.0) -> torch.Tensor:
    shifts = torch.randint(int(-4 * period), int(4 * period), (n, 1))
    x = torch.arange(length).unsqueeze(0) + shifts
    return torch.sin(x.double() / period)


def main() -> None:
    default_device = "cuda" if torch.cuda.is_available() else "cpu"
    parser = argparse.ArgumentParser(description="LSTMCell sine prediction with LBFGS")
    parser.add_argument("--device", default=os.environ.get("TORCHMEM_BENCH_DEVICE", default_device))
    parser.add_argument("--steps", type=int, default=None, help="outer LBFGS steps")
    parser.add_argument("--length", type=int, default=400, help="sequence length")
    parser.add_argument("--future", type=int, default=None, help="steps predicted after each outer step")
    args = parser.parse_args()
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    scale = float(os.environ.get("TORCHMEM_BENCH_SCALE", "1"))
    steps = args.steps or max(1, round(4 * scale))
    future = args.length if args.future is None else args.future

    torch.manual_seed(0)
    data = sine_waves(100, args.length).to(device)
    train_input, train_target = data[3:, :-1], data[3:, 1:]
    test_input, test_target = data[:3, :-1], data[:3, 1:]

    seq = Sequence().double().to(device)
    criterion = nn.MSELoss()
    optimizer = torch.optim.LBFGS(seq.parameters(), lr=0.8)

    c0 = time.process_time()  # the process's CPU time: its threads, torchmem's included
    t0 = time.perf_counter()
    for i in range(steps):
        print(f"STEP: {i}")

        def closure() -> torch.Tensor:
            optimizer.zero_grad()
            out = seq(train_input)
            loss: torch.Tensor = criterion(out, train_target)
            print(f"loss: {loss.item():.6f}")
            loss.backward()
            return loss

        optimizer.step(closure)
        with torch.no_grad():
            pred = seq(test_input, future=future)
            loss = criterion(pred[:, : pred.size(1) - future], test_target)
            print(f"test loss: {loss.item():.6f}")
            y = pred.detach().cpu()  # the example plots these
        print(f"predicted {tuple(y.shape)} values")
    if cuda:
        torch.cuda.synchronize(device)
    print(f"LOOP_CPU_SECONDS={time.process_time() - c0:.4f}")
    print(f"LOOP_SECONDS={time.perf_counter() - t0:.4f}")


if __name__ == "__main__":
    main()
