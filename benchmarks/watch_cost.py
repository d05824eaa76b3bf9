"""Benchmark: what public ``torchmem.watch()`` costs per step, and whether that grows with the run (issue 29).

For each run length (``--steps``, default 1,000, 10,000 and 100,000 steps of the ``tiny`` step) the plain
loop and the same loop wrapped in ``torchmem.watch()`` (light mode, the default source: on CUDA the
allocator's counters, on the CPU what ``watch()`` picks there) run as interleaved pairs (``A B``, ``B A``;
``benchmarks/_pairs.py``: pinned CPU and threads, ``gc.collect()`` before each run). Each pair gives the
watcher's added µs per step and the ratio; the table has their medians with 95 % intervals (order
statistics of the pairs). The cost is flat in the run's length when the added µs per step do not rise from
1k to 100k steps. The last columns are counted, not timed: the readings the watcher took per step and the
readings it keeps (the report's series, bounded), from the last watched run of each length.

    PYTHONPATH=src python3 benchmarks/watch_cost.py [--device cpu|cuda] [--model tiny|mlp|resnet18|gpt2]
        [--steps 1000,10000,100000] [--pairs 10] [--source auto|heap|ledger|allocator] [--stride K]
        [--cpus 1] [--threads 1]

On an H100 (each under ~4 minutes):

    PYTHONPATH=src python3 benchmarks/watch_cost.py --device cuda --model tiny --steps 1000,10000,20000
    PYTHONPATH=src python3 benchmarks/watch_cost.py --device cuda --model mlp --steps 8000
    PYTHONPATH=src python3 benchmarks/watch_cost.py --device cuda --model resnet18 --steps 1500
    PYTHONPATH=src python3 benchmarks/watch_cost.py --device cuda --model gpt2 --steps 200
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

import torchmem
from _machine import cpu_name
from _models import MODELS, make_step
from _pairs import fmt_interval, measure_pairs, pin, table


def run_loop(
    step: Callable[[], None], n: int, device: torch.device, watch_kwargs: dict[str, Any] | None
) -> tuple[float, Any]:
    """µs per step of ``n`` steps, plain (``watch_kwargs`` None) or wrapped in ``torchmem.watch()``; with the
    watcher's counts ``(readings, kept, source, verdict)`` when watched."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    if watch_kwargs is None:
        for _ in range(n):
            step()
        sync()
        return (time.perf_counter() - t0) / n * 1e6, None
    w = torchmem.watch(range(n), device=device, warn=False, **watch_kwargs)
    for _ in w:
        step()
    sync()
    dt = (time.perf_counter() - t0) / n * 1e6
    rep = w.report()
    if rep.leaking:
        print(f"  note: the watcher reported a leak: {rep.reason}", file=sys.stderr)
    readings = w._schedule.readings + min(w.warmup, w.steps)
    return dt, (readings, len(rep.series), rep.source, rep.verdict, w._stride)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--model", default="tiny", choices=MODELS)
    ap.add_argument("--steps", default="1000,10000,100000")
    ap.add_argument("--pairs", type=int, default=10)
    ap.add_argument("--source", default="auto", help="watch()'s source (default: auto)")
    ap.add_argument("--stride", type=int, default=None, help="watch()'s stride (default: chosen by it)")
    ap.add_argument("--cpus", default=None, help="CPUs to pin to (default: the last one)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    dev = torch.device(args.device)
    pinned = pin(args.cpus, args.threads, count=4 if dev.type == "cuda" else 1)
    kwargs: dict[str, Any] = {"source": args.source}
    if args.stride is not None:
        kwargs["stride"] = args.stride
    step, what = make_step(args.model, dev)
    for _ in range(50):  # warm up: lazy init, allocator caches
        step()
    for _ in torchmem.watch(range(20), device=dev, warn=False, **kwargs):  # the watcher's one-time work
        step()

    where = torch.cuda.get_device_name(dev) if dev.type == "cuda" else cpu_name()
    print(
        f"watch_cost — {datetime.date.today()}, {dev} ({where}), CPU {cpu_name()}, "
        f"torch {torch.__version__}, python {platform.python_version()}, {pinned}"
    )
    print(
        f"step: {what}; watch(source={args.source!r}); {args.pairs} interleaved pairs per length; "
        "medians with 95 % intervals"
    )
    rows = []
    for n in (int(s) for s in args.steps.split(",")):

        def plain(n: int = n) -> tuple[float, Any]:
            return run_loop(step, n, dev, None)

        def watched(n: int = n) -> tuple[float, Any]:
            return run_loop(step, n, dev, kwargs)

        p = measure_pairs(plain, watched, args.pairs)
        counts = p.extra[-1][1]
        readings, kept, source, verdict, stride = counts
        rows.append(
            (
                n,
                f"{sorted(p.a)[len(p.a) // 2]:.2f}",
                f"{sorted(p.b)[len(p.b) // 2]:.2f}",
                f"{p.diff_median():+.2f}",
                fmt_interval(p.diff_interval(), "+.2f"),
                f"{p.median():.3f}",
                fmt_interval(p.interval()),
                f"{readings / n:.3f}",
                kept,
                f"{source}/{stride}",
                verdict,
            )
        )
        print(f"  {n} steps done: ratio {p.summary()}", file=sys.stderr)
    print(
        table(
            (
                "steps",
                "plain µs",
                "watch µs",
                "added µs",
                "95% interval",
                "ratio",
                "95% interval",
                "reads/step",
                "kept",
                "source/stride",
                "verdict",
            ),
            rows,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
