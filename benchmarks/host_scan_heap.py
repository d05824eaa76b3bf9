"""What one host scan sequence costs on a framework-sized heap, before and after a change, in interleaved A/B
pairs: a loop that keeps a dict of 400 floats per step (``--floats``), watched by ``HostWatcher``, in a
process that imported torch, ``torch._dynamo`` (torch's optimizers import it) and transformers (~330,000
gc-tracked objects); the loop stops once the first sequence (three scans, the naming of the dicts) has
ended. Printed: the scans' own seconds (``HostScanner.seconds``) per side, the ratio B/A of each pair, its
median and spread.

Run (A and B are two ``src`` folders, such as ``git archive <commit> src | tar -x -C /tmp/A`` and this tree):
    OMP_NUM_THREADS=1 python benchmarks/host_scan_heap.py /tmp/A/src src --pairs 5
Each measurement runs in a fresh interpreter with ``PYTHONPATH`` set to A or B, in turns (A B A B ...).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

_PROGRAM = r"""
import gc, json, time, torch, torch._dynamo
import transformers
from transformers import GPT2Config  # noqa: F401  (the lazy module loads its configuration classes)
from torchmem.capture.host import HostWatcher
torch.set_num_threads(1)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
kept = []
w = HostWatcher(max_stride=1, holder_time_limit=30.0).start()
for _ in range(200):
    loss = model(torch.randn(4, 16)).square().mean()
    kept.append({f"k{j}": float(j) for j in range(FLOATS)})
    w.step()
    if len(w._scanner.scan_steps) >= 3 and w._scanner.due is None:
        break
w.stop()
r = w.report()
print(json.dumps({"objects": len(gc.get_objects()), "scans": len(w._scanner.scan_steps),
                  "scan_s": w._scanner.seconds, "named": [c.holder for c in r.culprits]}))
"""


def _one(src: str, floats: int) -> dict[str, object]:
    env = dict(os.environ, PYTHONPATH=src, OMP_NUM_THREADS="1")
    out = subprocess.run(
        [sys.executable, "-c", _PROGRAM.replace("FLOATS", str(floats))],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=600,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a", help="the 'before' src folder")
    ap.add_argument("b", help="the 'after' src folder")
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument(
        "--floats",
        type=int,
        default=400,
        help="floats in the dict kept per step (4000: ten times the allocations the scans' tracing sees)",
    )
    args = ap.parse_args()
    runs: dict[str, list[dict[str, object]]] = {"A": [], "B": []}
    for _ in range(args.pairs):
        runs["A"].append(_one(args.a, args.floats))
        runs["B"].append(_one(args.b, args.floats))
    first = runs["A"][0]
    print(
        f"one scan sequence on a heap of ~{first['objects']:,} objects, a dict of {args.floats} floats kept "
        f"per step, {args.pairs} interleaved pairs:"
    )
    for side in "AB":
        secs = [float(r["scan_s"]) for r in runs[side]]  # type: ignore[arg-type]
        named = {str(r["named"]) for r in runs[side]}
        spread = f"{min(secs):.3f}-{max(secs):.3f}"
        print(f"  {side}: scans {statistics.median(secs):.3f} s (median; {spread}), named {named}")
    ratios = [
        float(b["scan_s"]) / float(a["scan_s"])  # type: ignore[arg-type]
        for a, b in zip(runs["A"], runs["B"], strict=True)
    ]
    spread = f"{min(ratios):.3f}-{max(ratios):.3f}"
    print(f"  B/A per pair: median {statistics.median(ratios):.3f} (spread {spread})")


if __name__ == "__main__":
    main()
