"""Benchmark: what ``torchmem run``'s background sampler takes from a Python-heavy loop (issue 29).

The sampler thread (``run/sampler.Sampler``) wakes up every ``interval`` and, on the CPU, reads the C heap
in use (``run/sampler.Figure``) and keeps it in the timeline (``run/timeline.Timeline``), as a session's tick
does; each wake-up needs the GIL, which the loop holds. The loop here is Python-heavy on purpose (dict and
list work around a tiny tensor op: the GIL is almost never free), the worst case for a thread that wants
the GIL. The loop hands a step's reading to the figure every 50 steps, as a session's steps do. Interleaved
pairs (``benchmarks/_pairs.py``): the loop alone, and the loop with a sampler started
just before it and stopped right after; the table gives the ratio with its 95 % interval, the ticks and
wake-ups per second, the sampler's own CPU time per tick and per second of the loop (what it holds the GIL
for: counted, so it is a figure even where the machine's noise hides the ratio).

    PYTHONPATH=src python3 benchmarks/sampler_cost.py [--seconds 2] [--pairs 10] [--interval 0.05]
"""

from __future__ import annotations

import argparse
import datetime
import platform
import sys
import time
from typing import Any

import torch

from _machine import cpu_name
from _pairs import fmt_interval, measure_pairs, pin, table
from torchmem.run.sampler import Figure, Sampler
from torchmem.run.timeline import Timeline


def python_loop(steps: int, observe: Any = None, every: int = 50) -> float:
    """Seconds of ``steps`` Python-heavy steps; ``observe(value)`` every ``every`` steps (a session's step
    readings: the watcher's stride on such a loop), with the value the step read."""
    x = torch.ones(8)
    d: dict[int, int] = {}
    t0 = time.perf_counter()
    for i in range(steps):
        for j in range(40):
            d[j] = d.get(j, 0) + i
        _ = [v * 2 for v in d.values()]
        x.add_(1)
        if observe is not None and i % every == 0:
            observe(100_000_000 + i)
    return time.perf_counter() - t0


def with_sampler(steps: int, interval: float, observe: bool) -> tuple[float, Any]:
    figure, timeline = Figure(), Timeline()
    dev = torch.device("cpu")
    t_start = time.perf_counter()
    count = [0]

    def tick() -> float:
        r = figure.read(dev)
        if r.allocated is not None:
            timeline.keep(time.perf_counter() - t_start, r.allocated)
        return 0.0

    def step_count() -> int:
        count[0] += 1
        return count[0]  # steps are counted: the sampler spaces its ticks as in a session

    s = Sampler(interval, tick, step_count, lambda: False, lambda _t: None)
    s.start()
    dt = python_loop(steps, figure.observe if observe else None)
    s.stop()
    return dt, (s.ticks, s.cpu_s, getattr(s, "wakeups", s.ticks))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--seconds", type=float, default=2.0, help="length of one loop (about)")
    ap.add_argument("--pairs", type=int, default=10)
    ap.add_argument("--interval", type=float, default=0.05, help="the sampler's interval (a session's: 0.05)")
    ap.add_argument("--cpus", default=None)
    args = ap.parse_args()
    pinned = pin(args.cpus, 1)
    t = python_loop(2000)
    steps = max(1000, int(args.seconds / (t / 2000)))
    print(
        f"sampler_cost — {datetime.date.today()}, CPU {cpu_name()}, torch {torch.__version__}, python "
        f"{platform.python_version()}, {pinned}; a Python-heavy loop of {steps} steps (~{args.seconds} s), "
        f"sampler interval {args.interval} s, {args.pairs} interleaved pairs"
    )
    # both sides call observe() alike (a no-op figure on the plain side): only the sampler differs
    idle = Figure()
    p = measure_pairs(
        lambda: python_loop(steps, idle.observe),
        lambda: with_sampler(steps, args.interval, True),
        args.pairs,
    )
    ticks = [x[1][0] for x in p.extra]
    cpu = [x[1][1] for x in p.extra]
    wakes = [x[1][2] for x in p.extra]
    secs = sorted(p.b)[len(p.b) // 2]
    rows = [
        (
            f"{sorted(p.a)[len(p.a) // 2]:.3f}",
            f"{secs:.3f}",
            f"{p.median():.4f}",
            fmt_interval(p.interval(), ".4f"),
            f"{sorted(ticks)[len(ticks) // 2] / secs:.1f}",
            f"{sorted(wakes)[len(wakes) // 2] / secs:.1f}",
            f"{sum(cpu) / max(1, sum(ticks)) * 1e6:.0f}",
            f"{sum(cpu) / sum(p.b) * 1e3:.2f}",
        )
    ]
    print(
        table(
            (
                "loop s",
                "with sampler s",
                "ratio",
                "95% interval",
                "ticks/s",
                "wake-ups/s",
                "µs CPU/tick",
                "sampler ms/s",
            ),
            rows,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
