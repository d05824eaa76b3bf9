"""Benchmark: the cost per op of exact tensor accounting (``cpu_tracking`` / ``track(survivors=True)``).

Anchor: the same ops with nothing on, in the same run. Prints µs per op and the ratio.

    PYTHONPATH=src python3 benchmarks/ledger_cost.py [--device cuda]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

import torchmem


def step(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    # 10 ops: allocating outputs, a view, an in-place op, and autograd's saved tensors.
    y = (x @ w).tanh() * 1.0
    z = y.view(-1).add_(1.0).view_as(y)
    loss = (z * z).mean()
    loss.backward()
    return loss.detach()


def timed(fn: object, n: int, sync: bool) -> float:
    samples = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()  # type: ignore[operator]
        if sync:
            torch.cuda.synchronize()
        samples.append((time.perf_counter() - t0) / n)
    return statistics.median(samples)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--iters", type=int, default=300)
    args = ap.parse_args()
    dev = torch.device(args.device)
    sync = dev.type == "cuda"
    x = torch.randn(64, 64, device=dev)
    w = torch.randn(64, 64, device=dev, requires_grad=True)

    # Count the aten ops one step runs (what the ledger sees).
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            Count.n += 1
            return func(*args, **(kwargs or {}))

    with Count():
        step(x, w)
    ops = Count.n

    class Empty(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            return func(*args, **(kwargs or {}))

    for _ in range(20):
        step(x, w)
    plain = timed(lambda: step(x, w), args.iters, sync)
    with Empty():
        floor = timed(lambda: step(x, w), args.iters, sync)
    with torchmem.cpu_tracking():
        for _ in range(20):
            step(x, w)
        tracked = timed(lambda: step(x, w), args.iters, sync)
    print(f"ledger_cost — {dev}, torch {torch.__version__}, {ops} aten ops per step, median of 5")
    print(f"{'mode':<28} {'µs/step':>9} {'µs/op':>8} {'ratio':>7}")
    print(f"{'plain  [anchor]':<28} {plain * 1e6:>9.1f} {plain * 1e6 / ops:>8.2f} {1.0:>7.2f}")
    row = "empty dispatch mode (floor)"
    print(f"{row:<28} {floor * 1e6:>9.1f} {floor * 1e6 / ops:>8.2f} {floor / plain:>7.2f}")
    print(
        f"{'cpu_tracking (ledger on)':<28} {tracked * 1e6:>9.1f} {tracked * 1e6 / ops:>8.2f} "
        f"{tracked / plain:>7.2f}"
    )
    print(
        f"added per op: {(tracked - plain) * 1e6 / ops:.2f} µs in all, "
        f"{(tracked - floor) * 1e6 / ops:.2f} µs of it torchmem's bookkeeping "
        "(the rest is torch's dispatch-mode machinery)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
