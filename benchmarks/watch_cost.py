"""Benchmark: what public ``torchmem.watch()`` costs per step, and whether that grows with the run (issue 29).

For each model (``--model``, a comma-separated list) and each run length (``--steps``, default 1,000, 10,000
and 100,000 steps; or ``--seconds S``: as many steps as take about S seconds, from a probe of the step) the
plain loop and the same loop wrapped in ``torchmem.watch()`` (light mode, the default source: on CUDA the
allocator's counters, on the CPU the C heap; ``--source`` picks another) run as interleaved pairs (``A B``,
``B A``; ``benchmarks/_pairs.py``: pinned CPU and threads, ``gc.collect()`` before each run). Each pair gives
the watcher's added µs per step and the ratio (``--clock cpu``: timed by the process's CPU time, which
other work on a shared CPU host inflates far less than the wall clock; the watcher starts no thread); the
table has their medians with 95 % intervals (order statistics of the pairs). The cost is flat in the run's
length when the added µs per step do not rise from 1k to 100k steps. The last columns are counted, not
timed: the readings the watcher took per step and the readings it keeps (the report's series, bounded), from
the last watched run of each length.

    PYTHONPATH=src python3 benchmarks/watch_cost.py [--device cpu|cuda] [--model tiny,mlp,resnet18,gpt2]
        [--steps 1000,10000,100000 | --seconds S] [--pairs 10] [--source auto|heap|ledger|allocator]
        [--stride K] [--cpus 1] [--threads 1] [--clock wall|cpu] [--budget SECONDS]

``--steady``: one watcher for the whole measurement (past its warm-up, first readings and first re-tunes),
and each pair a block of plain steps and a block of the same steps each followed by ``w.step()``: the cost of
a long run's step without a watch's start and end in every block, so blocks can be short and pairs many (the
public watcher has no thread: between steps it costs nothing). Many short pairs narrow the interval where
the machine's speed drifts between blocks (a GPU host's plain 1-s loops varied by 22-33 %).

Before the pairs it prints the time it expects them to take (``expect: ...``): with ``--seconds S`` each
model takes about ``2 x pairs x S`` plus its set-up (a few seconds; GPT-2's build ~10 s). ``--budget B``: no
pair starts that would end more than B seconds after the start (the table has the pairs done; a model not
reached by then is skipped).

On an H100 host (issue 29's GPU loops: 60 pairs of ~0.4 s blocks, ~55-70 s a model with its set-up;
``--budget`` stops the pairs in time):

    export PYTHONPATH=src
    python3 benchmarks/watch_cost.py --device cuda --steady --seconds .4 --pairs 60 --budget 120 \
        --model resnet18        # and --model mlp, --model gpt2
    python3 benchmarks/watch_cost.py --device cuda --model tiny --steps 1000,10000 --budget 130

Many short blocks narrow the interval further where the host's speed drifts from block to block (session 14:
1,000+ pairs of ~20 ms blocks, no collection between them):

    python3 benchmarks/watch_cost.py --device cuda --steady --seconds .02 --pairs 1500 --no-collect \
        --budget 150 --model mlp
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
    step: Callable[[], None],
    n: int,
    device: torch.device,
    watch_kwargs: dict[str, Any] | None,
    clock: Callable[[], float] = time.perf_counter,
) -> tuple[float, Any]:
    """µs per step of ``n`` steps, plain (``watch_kwargs`` None) or wrapped in ``torchmem.watch()``; with the
    watcher's counts ``(readings, kept, source, verdict)`` when watched."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    t0 = clock()
    if watch_kwargs is None:
        for _ in range(n):
            step()
        sync()
        return (clock() - t0) / n * 1e6, None
    w = torchmem.watch(range(n), device=device, warn=False, **watch_kwargs)
    for _ in w:
        step()
    sync()
    dt = (clock() - t0) / n * 1e6
    rep = w.report()
    if rep.leaking:
        print(f"  note: the watcher reported a leak: {rep.reason}", file=sys.stderr)
    readings = w._schedule.readings + min(w.warmup, w.steps)
    return dt, (readings, len(rep.series), rep.source, rep.verdict, w._stride)


def probe_step_s(step: Callable[[], None], device: torch.device, seconds: float = 0.3) -> float:
    """Seconds per step of ``step``, from as many steps as take about ``seconds`` (the first few timed to
    size the rest)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    n = 4
    while True:
        sync()
        t0 = time.perf_counter()
        for _ in range(n):
            step()
        sync()
        dt = time.perf_counter() - t0
        if dt >= seconds or n >= 1 << 20:
            return dt / n
        n = max(n * 2, int(n * seconds / max(dt, 1e-6)))


def bench_model(
    name: str, dev: torch.device, args: argparse.Namespace, kwargs: dict[str, Any], deadline: float | None
) -> list[Any]:
    """The table's rows for one model: one per run length (no pair starts that would end past
    ``deadline``)."""
    t_setup = time.perf_counter()
    step, what = make_step(name, dev)
    for _ in range(50 if dev.type == "cuda" else 20):  # warm up: lazy init, allocator caches, autotuning
        step()
    for _ in torchmem.watch(range(20), device=dev, warn=False, **kwargs):  # the watcher's one-time work
        step()
    step_s = probe_step_s(step, dev)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    if args.seconds is not None:
        lengths = [max(10 if args.steady else 30, round(args.seconds / step_s))]
    else:
        lengths = [int(x) for x in args.steps.split(",")]
    expect = sum(2 * args.pairs * n * step_s for n in lengths)
    print(
        f"  {name}: {what}; {step_s * 1e6:.0f} µs/step; set-up {time.perf_counter() - t_setup:.1f} s; "
        f"expect: {args.pairs} pairs x {lengths} steps ~ {expect:.0f} s",
        file=sys.stderr,
    )
    rows = []
    steady = _SteadyWatch(step, dev, kwargs, clock, step_s) if args.steady else None
    for n in lengths:

        def plain(n: int = n) -> tuple[float, Any]:
            return run_loop(step, n, dev, None, clock)

        def watched(n: int = n) -> tuple[float, Any]:
            if steady is not None:
                return steady.block(n)
            return run_loop(step, n, dev, kwargs, clock)

        def stop(longest: float, n: int = n) -> bool:  # (before the first pair: the probe's estimate)
            if deadline is not None and time.perf_counter() + max(longest, 2 * n * step_s) > deadline:
                print(f"  {name}: stopped at the budget's end", file=sys.stderr)
                return True
            return False

        p = measure_pairs(plain, watched, args.pairs, stop=stop, collect=not args.no_collect)
        readings, kept, source, verdict, stride = p.extra[-1][1]
        if steady is not None:
            readings, n_read = steady.readings_in_blocks, steady.steps_in_blocks
        else:
            n_read = n
        plain_sorted = sorted(p.a)
        spread = (plain_sorted[-1] - plain_sorted[0]) / plain_sorted[len(p.a) // 2] if p.a else 0.0
        rows.append(
            (
                name,
                n,
                p.n,
                f"{plain_sorted[len(p.a) // 2]:.2f}",
                f"{spread * 100:.1f}%",
                f"{sorted(p.b)[len(p.b) // 2]:.2f}",
                f"{p.diff_median():+.2f}",
                fmt_interval(p.diff_interval(), "+.2f"),
                f"{p.median():.3f}",
                fmt_interval(p.interval()),
                f"{readings / max(1, n_read):.3f}",
                kept,
                f"{source}/{stride}",
                verdict,
            )
        )
        print(f"  {name}, {n} steps done: ratio {p.summary()}", file=sys.stderr)
    if steady is not None:
        steady.stop()
    return rows


class _SteadyWatch:
    """``--steady``: one watcher for the whole measurement, past its warm-up and first readings; a watched
    block is ``n`` steps each followed by ``w.step()``, the plain block the same steps without it (the public
    watcher has no thread: between its steps it costs nothing). It measures the cost of a long run's step,
    without a watch's start and end in every block."""

    def __init__(
        self,
        step: Callable[[], None],
        dev: torch.device,
        kwargs: dict[str, Any],
        clock: Callable[[], float],
        step_s: float,
    ) -> None:
        self.step, self.dev, self.clock = step, dev, clock
        self.w = torchmem.watch(device=dev, warn=False, **kwargs)
        self.w.__enter__()
        # the warm-up, the first readings and the first re-tunes of the stride (100-300 steps, ~3 s at most)
        for _ in range(max(100, min(300, int(3.0 / step_s)))):
            step()
            self.w.step()
        self.readings_in_blocks = 0
        self.steps_in_blocks = 0

    def block(self, n: int) -> tuple[float, Any]:
        sync = torch.cuda.synchronize if self.dev.type == "cuda" else (lambda: None)
        w, step = self.w, self.step
        before = w._schedule.readings
        sync()
        t0 = self.clock()
        for _ in range(n):
            step()
            w.step()
        sync()
        dt = (self.clock() - t0) / n * 1e6
        self.readings_in_blocks += w._schedule.readings - before
        self.steps_in_blocks += n
        rep = w.report()
        if rep.leaking:
            print(f"  note: the watcher reported a leak: {rep.reason}", file=sys.stderr)
        return dt, (w._schedule.readings, len(rep.series), rep.source, rep.verdict, w._stride)

    def stop(self) -> None:
        self.w.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--model", default="tiny", help=f"comma-separated, of {', '.join(MODELS)}")
    ap.add_argument("--steps", default="1000,10000,100000")
    ap.add_argument("--seconds", type=float, default=None, help="each loop ~ this long (instead of --steps)")
    ap.add_argument("--pairs", type=int, default=10)
    ap.add_argument("--budget", type=float, default=None, help="seconds in all: no pair starts past them")
    ap.add_argument(
        "--steady",
        action="store_true",
        help="one watcher for the whole run: pairs of plain and watched blocks (a long run's step cost)",
    )
    ap.add_argument("--source", default="auto", help="watch()'s source (default: auto)")
    ap.add_argument("--stride", type=int, default=None, help="watch()'s stride (default: chosen by it)")
    ap.add_argument("--cpus", default=None, help="CPUs to pin to (default: the last one)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--no-collect",
        action="store_true",
        help="no gc.collect() before each block (many short --steady blocks: a collection each would cost "
        "more than the blocks)",
    )
    ap.add_argument(
        "--clock",
        default="wall",
        choices=("wall", "cpu"),
        help="time each loop by the wall clock (default) or by the process's CPU time (a shared CPU host)",
    )
    args = ap.parse_args()
    models = [m.strip() for m in args.model.split(",") if m.strip()]
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        ap.error(f"unknown model(s) {unknown}; known: {MODELS}")
    dev = torch.device(args.device)
    pinned = pin(args.cpus, args.threads, count=4 if dev.type == "cuda" else 1)
    kwargs: dict[str, Any] = {"source": args.source}
    if args.stride is not None:
        kwargs["stride"] = args.stride
    where = torch.cuda.get_device_name(dev) if dev.type == "cuda" else cpu_name()
    print(
        f"watch_cost — {datetime.date.today()}, {dev} ({where}), CPU {cpu_name()}, "
        f"torch {torch.__version__}, python {platform.python_version()}, {pinned}"
    )
    print(
        f"watch(source={args.source!r}); {args.clock} clock; {args.pairs} interleaved pairs per length; "
        "medians with 95 % "
        "intervals; 'spread': (slowest - fastest) / median of the plain loops"
    )
    t0 = time.perf_counter()
    deadline = t0 + args.budget if args.budget is not None else None
    rows = []
    for name in models:
        if deadline is not None and time.perf_counter() > deadline:
            print(f"  {name}: skipped (the budget is spent)", file=sys.stderr)
            continue
        rows += bench_model(name, dev, args, kwargs, deadline)
    print(
        table(
            (
                "model",
                "steps",
                "pairs",
                "plain µs",
                "spread",
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
    print(f"({time.perf_counter() - t0:.0f} s in all)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
