"""Where the full steps of a long ``torchmem run`` go: each part timed where it runs, in the loop.

Past its first 1,000 steps a run only counts most steps (the quiet lane); the *full* steps, where the device
watcher or the host watcher reads, carry the per-step cost that remains. Their parts cost several times more
in the loop than timed alone (a CUDA reading: 12 µs at the start, 65-85 µs in the loop on an H100 host; the C
heap's mallinfo2: 20 µs hot, ~220 µs in the loop there), so this program runs a training loop under a
:class:`~torchmem.run.session.Session`, then wraps the session's parts (the step work, each watcher's step,
the readers, the statistics, the host watcher's occasional part) with timers for ``--steps`` more steps and
prints, per part: how many times it ran, its median and mean time, and its time per step of the loop. The
strides the schedules chose are printed after. The wrapping reaches into torchmem's private objects; it is for
this measurement only (docs/benchmarks.md, session 17).

    PYTHONPATH=src:benchmarks python3 benchmarks/run_fullstep.py [--model mlp] [--device cuda]
        [--warmup-steps 3000] [--steps 6000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch

from _models import MODELS, make_step
from torchmem.run.session import Session


def _timed(acc: dict[str, list[float]], obj: Any, name: str, label: str) -> None:
    original: Callable[..., Any] = getattr(obj, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            acc.setdefault(label, []).append(time.perf_counter() - t0)

    setattr(obj, name, wrapper)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="mlp", choices=MODELS)
    ap.add_argument("--device", default=None)
    ap.add_argument("--warmup-steps", type=int, default=3000)
    ap.add_argument("--steps", type=int, default=6000)
    a = ap.parse_args()
    device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    step, what = make_step(a.model, device)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    acc: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as d:
        s = Session(os.path.join(d, "run.jsonl"), device=str(device), status=False, argv=["loop.py"]).start()
        try:
            for _ in range(a.warmup_steps):
                step()
            sync()
            w, host = s._watchers.watcher, s._watchers._host
            if w is None or host is None:
                print("no device watcher or no host watcher: nothing to time", file=sys.stderr)
                return 1
            parts = (
                (s, "_step_work", "full step (all of it)"),
                (s._watchers, "quiet_steps", "quiet-steps arithmetic"),
                (w, "step", "device watcher step"),
                (w, "_reader", "  its reading"),
                (w._track, "add", "  its statistics"),
                (w._attribution, "after_reading", "  its attribution look"),
                (host, "step", "host watcher step"),
                (host, "_read", "  its C-heap reading"),
                (host, "_slow", "  its occasional part"),
            )
            for obj, name, label in parts:
                _timed(acc, obj, name, label)
            t0 = time.perf_counter()
            for _ in range(a.steps):
                step()
            sync()
            per_step = (time.perf_counter() - t0) / a.steps
        finally:
            s.finish(0, "exit")
    print(f"{what} on {device}: {a.steps:,} steps after {a.warmup_steps:,}, a step {per_step * 1e6:.1f} µs")
    print(f"{'part':<28}{'runs':>7}{'median µs':>12}{'mean µs':>10}{'µs a step':>11}")
    for _obj, _name, label in parts:
        times = acc.get(label, [])
        if not times:
            continue
        print(
            f"{label:<28}{len(times):>7}{statistics.median(times) * 1e6:>12.1f}"
            f"{statistics.mean(times) * 1e6:>10.1f}{sum(times) / a.steps * 1e6:>11.2f}"
        )
    sched = host._schedule
    print(
        f"device watcher: every {w.stride} steps; host watcher: every {sched.stride} steps, the C heap every "
        f"{sched.stride * sched.heap_every} (its share now {sched.share_now * 100:g} %)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
