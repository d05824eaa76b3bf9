"""Benchmark: the overhead of ``torchmem.profile()`` on a training step (a debug tool: measured, not hidden).

Anchor: the same step with nothing on, in the same run, interleaved. One block per measured step
(``with profile(...): step()``), so entry/exit cost is included. Prints ms per step and the ratio.

    PYTHONPATH=src python3 benchmarks/module_profile.py            # CPU, and CUDA when present
    PYTHONPATH=src python3 benchmarks/module_profile.py --device cpu
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable

# A script's folder goes first on sys.path, and another script here once shadowed a standard-library module
# that torch imports (cProfile imports `profile`): keep this folder off the path before torch is imported.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.getcwd()) != _HERE]

import torch  # noqa: E402
from torch import nn  # noqa: E402

from torchmem.capture.profile import profile  # noqa: E402


def _mlp(width: int, depth: int) -> nn.Module:
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.GELU()]
    return nn.Sequential(*layers)


def _encoder(d: int, layers: int) -> nn.Module:
    layer = nn.TransformerEncoderLayer(d, 8, 4 * d, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)


def workloads(dev: torch.device) -> list[tuple[str, nn.Module, torch.Tensor]]:
    big = dev.type == "cuda"
    return [
        (
            "mlp 8x" + ("2048" if big else "512"),
            _mlp(2048 if big else 512, 8),
            torch.randn(512 if big else 64, 2048 if big else 512),
        ),
        (
            "encoder 4x" + ("512" if big else "128"),
            _encoder(512 if big else 128, 4),
            torch.randn(16 if big else 4, 128 if big else 32, 512 if big else 128),
        ),
    ]


def timed(fn: Callable[[], None], n: int, sync: bool) -> float:
    if sync:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    if sync:
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n


def bench(dev: torch.device, iters: int, rounds: int) -> list[tuple[str, str, float, float, int]]:
    out = []
    sync = dev.type == "cuda"
    for name, model, x in workloads(dev):
        model = model.to(dev)
        x = x.to(dev)
        opt = torch.optim.AdamW(model.parameters())
        modules = sum(1 for _ in model.modules())

        def step(model: nn.Module = model, x: torch.Tensor = x, opt: torch.optim.Optimizer = opt) -> None:
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()

        def profiled(model: nn.Module = model, opt: torch.optim.Optimizer = opt) -> None:
            with profile(model, optimizer=opt) as prof:
                step()
            prof.report()

        for _ in range(3):
            step()
            profiled()
        plain, prof_t = [], []
        for _ in range(rounds):  # interleaved: drift hits both alike
            plain.append(timed(step, iters, sync))
            prof_t.append(timed(profiled, iters, sync))
        out.append((str(dev), name, statistics.median(plain), statistics.median(prof_t), modules))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default=None, help="cpu or cuda (default: both where present)")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    devs = [torch.device(args.device)] if args.device else [torch.device("cpu")]
    if args.device is None and torch.cuda.is_available():
        devs.append(torch.device("cuda", 0))
    torch.manual_seed(0)
    rows = []
    for dev in devs:
        rows += bench(dev, args.iters, args.rounds)
    print(f"torch {torch.__version__}")
    print(f"{'device':<8} {'workload':<16} {'modules':>7} {'plain ms':>10} {'profiled ms':>12} {'ratio':>7}")
    for dev_s, name, plain, prof_t, modules in rows:
        print(
            f"{dev_s:<8} {name:<16} {modules:>7} {plain * 1e3:>10.2f} {prof_t * 1e3:>12.2f} "
            f"{prof_t / plain:>6.2f}x"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
