"""Benchmark: torchmem's hot read vs torch.cuda.memory_allocated() and memory_stats(), in one run.

Claim (issue 2): ``torchmem.counters()`` — allocated, reserved, active and both peaks — costs <= 1/5 of
one ``torch.cuda.memory_allocated()`` call. Run on a CUDA machine:

    PYTHONPATH=src python3 benchmarks/stats_read.py

On a machine without CUDA it measures the CPU path (``counters("cpu")`` under ``cpu_tracking``) only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable

import torch

import torchmem


def per_call_us(fn: Callable[[], object], calls: int, repeats: int) -> float:
    for _ in range(min(calls, 200)):
        fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(samples)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()

    rows: list[tuple[str, float]] = []
    if torch.cuda.is_available():
        dev = torch.device("cuda", 0)
        keep = [torch.empty(1 << 20, device=dev) for _ in range(8)]  # a populated allocator
        _ = torch.randn(256, 256, device=dev) @ torch.randn(256, 256, device=dev)
        torch.cuda.synchronize()
        anchor = per_call_us(lambda: torch.cuda.memory_allocated(dev), args.calls, args.repeats)
        rows.append(("torch.cuda.memory_allocated()  [anchor]", anchor))
        rows.append(
            (
                "torch.cuda.memory_stats()",
                per_call_us(lambda: torch.cuda.memory_stats(dev), args.calls, args.repeats),
            )
        )
        rows.append(
            (
                "torch.cuda.max_memory_allocated()",
                per_call_us(lambda: torch.cuda.max_memory_allocated(dev), args.calls, args.repeats),
            )
        )
        rows.append(
            (
                "torch.cuda.mem_get_info()",
                per_call_us(lambda: torch.cuda.mem_get_info(dev), args.calls, args.repeats),
            )
        )
        hot = per_call_us(lambda: torchmem.counters(dev), args.calls, args.repeats)
        rows.append(("torchmem.counters()  [hot read: 5 figures]", hot))
        rows.append(
            (
                "torchmem.counters(None)  [default device]",
                per_call_us(lambda: torchmem.counters(), args.calls, args.repeats),
            )
        )
        rows.append(
            ("torchmem.stats()  [full reading, NVML]", per_call_us(lambda: torchmem.stats(dev), 50, 3))
        )
        c = torchmem.counters(dev)
        assert c.allocated == torch.cuda.memory_allocated(dev), (c, torch.cuda.memory_allocated(dev))
        assert c.reserved == torch.cuda.memory_reserved(dev)
        assert c.peak_allocated == torch.cuda.max_memory_allocated(dev)
        del keep
        label = torch.cuda.get_device_name(dev)
    else:
        anchor = None
        with torchmem.cpu_tracking():
            hot = per_call_us(lambda: torchmem.counters("cpu"), args.calls, args.repeats)
        rows.append(("torchmem.counters('cpu') under cpu_tracking", hot))
        label = "CPU (no CUDA here: anchor not measured)"

    print(
        f"stats_read — {label}, torch {torch.__version__}, "
        f"{args.calls} calls x {args.repeats} repeats (median)"
    )
    print(f"{'read':<48} {'µs/call':>9} {'vs anchor':>10}")
    for name, us in rows:
        ratio = f"{us / anchor:.3f}" if anchor else "-"
        print(f"{name:<48} {us:>9.2f} {ratio:>10}")
    if anchor:
        verdict = "PASS" if hot <= anchor / 5 else "FAIL"
        print(f"hot read / memory_allocated() = {hot / anchor:.3f} (target <= 0.200): {verdict}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"device": label, "torch": torch.__version__, "rows": rows, "anchor_us": anchor}, f, indent=1
            )
    return 0 if anchor is None or hot <= anchor / 5 else 1


if __name__ == "__main__":
    sys.exit(main())
