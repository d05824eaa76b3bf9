"""What ``torchrun ... -m torchmem run train.py`` costs each rank of a DDP job against plain ``torchrun
train.py`` (issue 18): a GPU-bound NCCL step (4x Linear(4096), batch 4096, bf16 autocast, AdamW), one GPU per
rank.

Each run is a fresh torchrun job (``--standalone``, ``--nproc`` ranks) in its own temporary folder, plain
(the anchor) then under ``-m torchmem run`` with no flag, paired A B A B. Every rank writes the seconds of its
own loop (600 steps after 20 warm-up steps); the table gives each rank's median loop ratio over the pairs and
the whole job's wall-clock ratio. The merged report of the last torchmem job is printed under the table (the
program does not leak: a LEAK verdict there is a false alarm).

    python benchmarks/ddp_cost.py [--nproc 2] [--pairs 3] [--steps 600]

Target (issue 18): light mode costs at most 1 % of a GPU-bound step on every rank.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROGRAM = HERE.parent / "tests" / "gpu" / "programs" / "multi" / "ddp_train.py"


def _job(tm: bool, nproc: int, steps: int) -> tuple[float, list[float], str]:
    with tempfile.TemporaryDirectory(prefix="ddp_cost-") as d:
        run = ["-m", "torchmem", "run", "-o", "run.jsonl"] if tm else []
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            *run, str(PROGRAM), "t", "--steps", str(steps),
        ]  # fmt: skip
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=d, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            raise SystemExit(f"job failed ({'torchmem' if tm else 'plain'}):\n{proc.stderr[-4000:]}")
        loops = [float((Path(d) / f"t.loop.{r}").read_text()) for r in range(nproc)]
        report = ""
        if tm:
            caps = sorted(str(p) for p in Path(d).glob("run.rank*.jsonl"))
            rep = subprocess.run(
                [sys.executable, "-m", "torchmem", "report", *caps], cwd=d, capture_output=True, text=True
            )
            report = rep.stdout + rep.stderr
    return wall, loops, report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=600)
    args = ap.parse_args()
    import torch  # the runner's own facts only

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    header = (
        f"ddp_cost — {datetime.date.today()}, {args.nproc} ranks on {gpu}, torch {torch.__version__}, "
        f"{args.steps} steps per run, {args.pairs} pair(s) A B, medians"
    )
    print(header, file=sys.stderr)
    walls: list[tuple[float, float]] = []
    loops: list[tuple[list[float], list[float]]] = []
    report = ""
    for k in range(args.pairs):
        pw, pl, _ = _job(False, args.nproc, args.steps)
        tw, tl, report = _job(True, args.nproc, args.steps)
        walls.append((pw, tw))
        loops.append((pl, tl))
        print(f"  pair {k + 1}: plain {pw:.2f} s {pl}, torchmem {tw:.2f} s {tl}", file=sys.stderr)
    print(header)
    print(f"{'rank':<6} {'loop plain s':>12} {'loop torchmem s':>15} {'loop ratio':>10} {'pairs':<24}")
    for r in range(args.nproc):
        ratios = [t[r] / p[r] for p, t in loops]
        print(
            f"{r:<6} {statistics.median(p[r] for p, _ in loops):12.3f} "
            f"{statistics.median(t[r] for _, t in loops):15.3f} {statistics.median(ratios):10.4f} "
            f"{', '.join(f'{x:.4f}' for x in ratios):<24}"
        )
    wr = [t / p for p, t in walls]
    print(
        f"whole job: plain {statistics.median(p for p, _ in walls):.2f} s, torchmem "
        f"{statistics.median(t for _, t in walls):.2f} s, ratio {statistics.median(wr):.4f}"
    )
    print("\nmerged report of the last torchmem job:\n" + report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
