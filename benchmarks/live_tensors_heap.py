"""Benchmark: ``torchmem.live_tensors()`` on the heap of a real program (issue 13).

The heap of a program that imported torch, transformers, Lightning, torchmetrics and accelerate (each where
installed) and holds a model with an AdamW optimizer, a torchmetrics metric whose list states got 200
updates, and a few hundred tensors in containers (a dict of lists, objects' attributes, a closure). Times
``live_tensors()`` (holder search included) and counts the tensors of >= 1 MiB whose holder was named. The
anchor, in the same run, is ``gc.get_objects()`` plus one ``gc.get_referrers`` walk, what any holder search
must at least touch. With ``--profile``, a cProfile of one call is printed (top 25 by own time).

    PYTHONPATH=src python3 benchmarks/live_tensors_heap.py [--device cuda] [--repeat 3] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import datetime
import gc
import importlib
import io
import pstats
import statistics
import sys
import time
from typing import Any

import torch

import torchmem

MiB = 1 << 20


def _imports() -> list[str]:
    loaded = []
    for name in ("transformers", "lightning", "pytorch_lightning", "torchmetrics", "accelerate"):
        try:
            importlib.import_module(name)
            loaded.append(name)
        except Exception:
            pass
    return loaded


class Holder:
    def __init__(self, t: torch.Tensor) -> None:
        self.cache = {"latest": t}


def build(device: torch.device) -> dict[str, Any]:
    """The program's state, returned so it stays alive (as module globals would)."""
    torch.manual_seed(0)
    keep: dict[str, Any] = {}
    model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(8)]).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(64, 1024, device=device)).square().mean().backward()
    opt.step()
    keep["model"], keep["opt"] = model, opt
    try:
        import torchmetrics

        metric = torchmetrics.classification.BinaryAUROC(thresholds=None).to(device)  # list states
        for _ in range(200):
            metric.update(torch.rand(2048, device=device), torch.randint(0, 2, (2048,), device=device))
        keep["metric"] = metric
    except Exception as exc:  # not installed, or an API change: said in the table
        keep["metric_error"] = repr(exc)
    keep["history"] = {
        f"run{i}": [torch.randn(256, 1024, device=device) for _ in range(5)] for i in range(20)
    }
    keep["holders"] = [Holder(torch.randn(512, 512, device=device)) for _ in range(40)]
    big = torch.randn(1024, 1024, device=device)

    def closure() -> torch.Tensor:
        return big

    keep["closure"] = closure
    return keep


def anchor() -> float:
    t0 = time.perf_counter()
    objs = gc.get_objects()
    gc.get_referrers(*[o for o in objs if issubclass(type(o), torch.Tensor)][:50])
    del objs
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    device = torch.device(args.device)
    loaded = _imports()
    state = build(device)
    gc.collect()
    objects = len(gc.get_objects())
    times, anchors = [], []
    rep = None
    for _ in range(args.repeat):
        anchors.append(anchor())
        t0 = time.perf_counter()
        rep = torchmem.live_tensors(device)
        times.append(time.perf_counter() - t0)
    assert rep is not None
    big = [t for t in rep.tensors if t.bytes >= MiB]
    named = [t for t in big if t.holder is not None]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(
        f"# {datetime.date.today()} {name}, torch {torch.__version__}, Python {sys.version.split()[0]}; "
        f"imported: {', '.join(loaded) or 'none'}"
    )
    if "metric_error" in state:
        print(f"# torchmetrics metric not built: {state['metric_error']}")
    print("| objects | tensors | >= 1 MiB | named | live_tensors() s (median) | anchor s | ratio |")
    print("|---|---|---|---|---|---|---|")
    t, a = statistics.median(times), statistics.median(anchors)
    print(
        f"| {objects:,} | {len(rep.tensors)} | {len(big)} | {len(named)} | {t:.3f} | {a:.3f} | {t / a:.1f} |"
    )
    for n in rep.notes if hasattr(rep, "notes") else ():
        print(f"# note: {n}")
    unnamed = [t for t in big if t.holder is None][:5]
    for u in unnamed:
        print(f"# unnamed: {u}")
    if args.profile:
        pr = cProfile.Profile()
        pr.enable()
        torchmem.live_tensors(device)
        pr.disable()
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(25)
        print(s.getvalue())
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats("cumtime").print_stats("torchmem", 25)
        print(s.getvalue())


if __name__ == "__main__":
    main()
