"""Benchmark: what ``torchmem.watch()`` costs per step, and whether that grows with the number of steps.

Issue 12's host-bound step: 4x ``Linear(64)`` + ``ReLU``, SGD, a batch of 16 (about 1 ms per step on an
H100 host, a few hundred µs on a CPU core). For each run length (300, 3000 and 10000 steps) the plain loop
and the same loop wrapped in ``torchmem.watch()`` (light mode; on the CPU ``source="heap"``, the figure
``torchmem run`` reads there; on CUDA the default, the allocator's counters) run in pairs, A B A B, each
after a ``gc.collect()``. Prints µs per step of each, the watcher's added µs per step and the ratio
(medians of the pairs). The cost must stay flat as the runs get longer. The last column times the watcher
alone, the same number of steps with an empty body and a reading at every step (``stride=1``), best of the
pairs: what ``watch()`` adds per step without the noise of the step itself.

    OMP_NUM_THREADS=1 PYTHONPATH=src python3 benchmarks/watch_cost.py [--device cuda] [--pairs 3]
        [--steps 300,3000,10000] [--source heap|ledger|allocator|auto] [--stride K]
"""

from __future__ import annotations

import argparse
import datetime
import gc
import platform
import statistics
import sys
import time
from collections.abc import Callable

import torch

import torchmem
from _machine import cpu_name


def make_step(device: torch.device, batch: int) -> Callable[[], None]:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(4):
        layers += [torch.nn.Linear(64, 64), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(batch, 64, device=device)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()

    return step


def run(
    step: Callable[[], None], n: int, device: torch.device, watch_kwargs: dict[str, object] | None
) -> float:
    """Seconds per step of ``n`` steps, plain (``watch_kwargs`` None) or wrapped in ``torchmem.watch()``."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    gc.collect()
    t0 = time.perf_counter()
    if watch_kwargs is None:
        for _ in range(n):
            step()
    else:
        w = torchmem.watch(range(n), device=device, warn=False, **watch_kwargs)  # type: ignore[arg-type]
        for _ in w:
            step()
    sync()
    dt = (time.perf_counter() - t0) / n
    if watch_kwargs is not None and w.report().leaking:
        print(f"  note: the watcher reported a leak: {w.report().reason}", file=sys.stderr)
    return dt


def alone(n: int, device: torch.device, watch_kwargs: dict[str, object]) -> float:
    """Seconds per step the watcher itself adds: ``n`` empty steps wrapped, minus ``n`` empty steps plain."""
    gc.collect()
    t0 = time.perf_counter()
    for _ in range(n):
        pass
    plain = time.perf_counter() - t0
    gc.collect()
    t0 = time.perf_counter()
    kwargs = {**watch_kwargs, "stride": 1}
    for _ in torchmem.watch(range(n), device=device, warn=False, **kwargs):  # type: ignore[arg-type]
        pass
    return (time.perf_counter() - t0 - plain) / n


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--steps", default="300,3000,10000")
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--source", default=None, help="watch()'s source (default: heap on the CPU, else auto)")
    ap.add_argument("--stride", type=int, default=None, help="watch()'s stride (default: chosen by it)")
    args = ap.parse_args()
    dev = torch.device(args.device)
    source = args.source or ("heap" if dev.type == "cpu" else "auto")
    kwargs: dict[str, object] = {"source": source}
    if args.stride is not None:
        kwargs["stride"] = args.stride
    step = make_step(dev, args.batch)
    for _ in range(200):  # warm up: lazy init, allocator caches
        step()
    w = torchmem.watch(range(20), device=dev, warn=False, **kwargs)  # type: ignore[arg-type]
    for _ in w:  # and the watcher's one-time work (imports)
        step()
    source_read = w.report().source
    notes = [n for n in w.report().notes if "reading every" in n]

    where = torch.cuda.get_device_name(dev) if dev.type == "cuda" else cpu_name()
    print(
        f"watch_cost — {dev} ({where}), torch {torch.__version__}, python {platform.python_version()}, "
        f"{datetime.date.today()}"
    )
    print(
        f"step: 4x Linear(64)+ReLU, SGD, batch {args.batch}; watch(source={source!r}) reads "
        f"{source_read!r}; {args.pairs} pairs A B, medians"
    )
    for n in notes:
        print(f"watcher: {n}")
    print(
        f"{'steps':>7} {'plain µs/step':>14} {'watch µs/step':>14} {'added µs':>9} {'ratio':>7} "
        f"{'watcher alone µs/step':>22}"
    )
    for n in (int(s) for s in args.steps.split(",")):
        plain, watched, ratios, own = [], [], [], []
        for _ in range(args.pairs):
            a = run(step, n, dev, None)
            b = run(step, n, dev, kwargs)
            plain.append(a)
            watched.append(b)
            ratios.append(b / a)
            own.append(alone(n, dev, kwargs))
        p, q = statistics.median(plain), statistics.median(watched)
        print(
            f"{n:>7} {p * 1e6:>14.1f} {q * 1e6:>14.1f} {(q - p) * 1e6:>9.2f} "
            f"{statistics.median(ratios):>7.3f} {min(own) * 1e6:>22.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
