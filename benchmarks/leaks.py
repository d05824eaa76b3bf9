"""watch(): detection latency and attribution accuracy per scenario, and the per-step overhead of light and
deep mode against torch's allocator history recording, on a GPU-bound and a host-bound training step.

Run: PYTHONPATH=src python benchmarks/leaks.py   (CUDA when present; the scenario table also runs on CPU)
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import time
from collections.abc import Iterator

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import torchmem
from scenarios.catalog import ALL, site_of

STEPS, WARMUP = 20, 3


def scenario_table(device: str) -> None:
    print(f"scenarios on {device}: detection step (after a {WARMUP}-step warm-up) and attribution")
    print(f"{'scenario':<28} {'expected':<20} {'detected':>8} {'kind':<20} {'site':>5} {'holder':>6}")
    ok = 0
    for s in ALL:
        w = torchmem.watch(range(STEPS), device=device, warmup=WARMUP, warn=False)
        s.run(w, torch.device(device))
        r = w.report()
        top = r.culprits[0] if r.culprits else None
        det = "-" if r.detected_at is None else str(r.detected_at - WARMUP)
        if s.leaks:
            site_ok = top is not None and site_of(s) in [top.site] + [x for x, _ in top.sites]
            holder_ok = top is not None and s.holder is not None and s.holder in (top.holder or "")
            kind = top.kind if top else "-"
            good = r.detected_at is not None and kind == s.kind and site_ok and holder_ok
            print(
                f"{s.name:<28} {s.kind!s:<20} {det:>8} {kind:<20} {'yes' if site_ok else 'NO':>5} "
                f"{'yes' if holder_ok else 'NO':>6}"
            )
        else:
            good = r.detected_at is None and not r.culprits
            print(
                f"{s.name:<28} {'no leak':<20} {det:>8} {'-' if good else 'FALSE ALARM':<20} {'':>5} {'':>6}"
            )
        ok += good
    print(f"correct: {ok}/{len(ALL)}")


def _gpu_step(dev: torch.device) -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(8)]).to(dev)
    return model, torch.optim.AdamW(model.parameters()), torch.randn(256, 2048, device=dev)


def _host_step(dev: torch.device) -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(3)]).to(dev)
    return model, torch.optim.SGD(model.parameters(), lr=1e-3), torch.randn(16, 64, device=dev)


def _tiny_step(dev: torch.device) -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64).to(dev)
    return model, torch.optim.SGD(model.parameters(), lr=1e-3), torch.randn(16, 64, device=dev)


def _loop(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, steps: object) -> None:
    for _ in steps:  # type: ignore[attr-defined]
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def _reading(steps: range, dev: torch.device) -> Iterator[int]:
    for i in steps:
        yield i
        torchmem.counters(dev)  # the anchor: a plain per-step stats read


def _time(
    config: str, work: tuple[torch.nn.Module, torch.optim.Optimizer, torch.Tensor], dev: torch.device, n: int
) -> float:
    model, opt, x = work
    torch.cuda.synchronize()
    if config == "history":
        torch.cuda.memory._record_memory_history(max_entries=100_000)
    t0 = time.perf_counter()
    if config in ("plain", "history"):
        _loop(model, opt, x, range(n))
    elif config == "counters()":
        _loop(model, opt, x, _reading(range(n), dev))
    elif config == "light/uncapped":
        _loop(model, opt, x, torchmem.watch(range(n), device=dev, max_stride=None, warn=False))
    elif config.startswith("light/"):
        stride = int(config.split("/")[1])
        _loop(model, opt, x, torchmem.watch(range(n), device=dev, stride=stride, warn=False))
    else:
        _loop(model, opt, x, torchmem.watch(range(n), device=dev, mode=config, warn=False))
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / n
    if config == "history":
        torch.cuda.memory._record_memory_history(enabled=None)
    return dt


def call_costs(dev: torch.device) -> None:
    """What one reading and one ``step()`` cost on this host, without any training around them."""
    torch.empty(1, device=dev)
    n = 20000

    def per_call(fn: object) -> float:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()  # type: ignore[operator]
        return (time.perf_counter() - t0) / n * 1e6

    rows = [
        ("torch.cuda.memory_allocated()", per_call(lambda: torch.cuda.memory_allocated(dev))),
        ("torchmem.counters()", per_call(lambda: torchmem.counters(dev))),
    ]
    for stride in (1, 2):
        with torchmem.watch(device=dev, warn=False, stride=stride) as w:
            rows.append((f"Watcher.step(), stride {stride}", per_call(w.step)))
    print("\ncost per call on this host (µs)")
    for label, us in rows:
        print(f"  {label:<34} {us:8.2f}")


def overhead_table(dev: torch.device) -> None:
    configs = ["plain", "counters()", "light", "light/uncapped", "deep", "history"]
    if "--configs" in sys.argv:
        configs = sys.argv[sys.argv.index("--configs") + 1].split(",")
    print(
        f"\noverhead per step on {torch.cuda.get_device_name(dev)}, torch {torch.__version__} "
        "(median of 15 rounds of short interleaved blocks)"
    )
    print(f"{'step':<34} " + " ".join(f"{c:>17}" for c in configs))
    for label, build, n in (
        ("GPU-bound: 8xLinear(2048) AdamW", _gpu_step, 150),
        ("host-bound: 3xLinear(64) SGD", _host_step, 300),
        ("host-bound: 1xLinear(64) SGD", _tiny_step, 300),
    ):
        work = build(dev)
        _loop(*work, range(50))
        times: dict[str, list[float]] = {c: [] for c in configs}
        for _ in range(15):  # short blocks, a new order each round, one model: drift hits every config alike
            for c in random.sample(configs, len(configs)):
                times[c].append(_time(c, work, dev, n))
        med = {c: statistics.median(v) for c, v in times.items()}
        base = med["plain"]
        cells = [
            f"{med[c] * 1e3:7.3f} ms" + (f" {100 * (med[c] / base - 1):+5.1f}%" if c != "plain" else "")
            for c in configs
        ]
        print(f"{label:<34} " + " ".join(f"{x:>17}" for x in cells))


def main() -> int:
    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    if "--overhead-only" not in sys.argv:
        scenario_table(device)
    if torch.cuda.is_available():
        call_costs(torch.device(device))
        overhead_table(torch.device(device))
    return 0


if __name__ == "__main__":
    sys.exit(main())
