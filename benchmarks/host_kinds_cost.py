"""The host watcher's cost, before and after a change to it, in interleaved A/B pairs (issue 26, "Host growth
of every kind"): the per-step time of ``HostWatcher.step()`` in a quiet training loop (nothing grows: what
every ``torchmem run`` pays), the loop's wall time with the watcher, and where growth is seen, what the scan
sequence costs (scans, tracemalloc's traced steps).

Run (A and B are two ``src`` folders, such as a copy with the previous ``capture/host.py`` and this tree):
    OMP_NUM_THREADS=1 python benchmarks/host_kinds_cost.py /tmp/A/src src --pairs 5
Each measurement runs in a fresh interpreter (``python -c``) with ``PYTHONPATH`` set to A or B, in turns.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

_QUIET = r"""
import json, time, torch
from torchmem.capture.host import HostWatcher
torch.set_num_threads(1)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
losses = []
def step():
    loss = model(torch.randn(64, 256)).square().mean()
    opt.zero_grad(); loss.backward(); opt.step()
    losses.append(loss.item())
for _ in range(50):
    step()
w = HostWatcher(warmup=3, node_interval=6.0, node_overhead=0.002)  # as torchmem run makes it
w._share = 0.002
w.start()
inside = 0.0
t0 = time.perf_counter()
for _ in range(STEPS):
    step()
    t1 = time.perf_counter()
    w.step()
    inside += time.perf_counter() - t1
wall = time.perf_counter() - t0
w.stop()
r = w.report()
print(json.dumps({"us_per_step": inside / STEPS * 1e6, "wall_s": wall, "leaking": r.leaking,
                  "scans": len(w._scan_steps)}))
"""

_GROWING = r"""
import json, time, torch
import numpy as np
from torchmem.capture.host import HostWatcher
torch.set_num_threads(1)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
rows, log = [], {}
w = HostWatcher(warmup=3, node_interval=6.0, node_overhead=0.002)
w._share = 0.002
w.start()
t0 = time.perf_counter()
for i in range(STEPS):
    loss = model(torch.randn(64, 256)).square().mean()
    opt.zero_grad(); loss.backward(); opt.step()
    rows.append(np.random.rand(128, 128))
    log[i] = [float(j) for j in range(500)]
    w.step()
wall = time.perf_counter() - t0
w.stop()
r = w.report()
notes = [n for n in r.notes if "tracemalloc" in n]
print(json.dumps({"wall_s": wall, "scan_s": w._scan_seconds, "leaking": r.leaking,
                  "culprits": [c.holder for c in r.culprits], "notes": notes}))
"""


def _run(src: str, code: str, steps: int) -> dict[str, object]:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(src), OMP_NUM_THREADS="1")
    out = subprocess.run(
        [sys.executable, "-c", code.replace("STEPS", str(steps))],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=600,
    )
    data: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return data


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a", help="the 'before' src folder")
    ap.add_argument("b", help="the 'after' src folder")
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3000)
    args = ap.parse_args(argv)
    quiet: dict[str, list[dict[str, object]]] = {"A": [], "B": []}
    growing: dict[str, list[dict[str, object]]] = {"A": [], "B": []}
    for i in range(args.pairs):
        order = ("A", "B") if i % 2 == 0 else ("B", "A")
        for side in order:
            quiet[side].append(_run(args.a if side == "A" else args.b, _QUIET, args.steps))
        for side in order:
            growing[side].append(_run(args.a if side == "A" else args.b, _GROWING, 300))
    print(f"quiet loop, {args.steps} steps of a 256-wide MLP (SGD), {args.pairs} interleaved pairs:")
    for side in ("A", "B"):
        us = [float(r["us_per_step"]) for r in quiet[side]]  # type: ignore[arg-type]
        wall = [float(r["wall_s"]) for r in quiet[side]]  # type: ignore[arg-type]
        print(
            f"  {side}: HostWatcher.step() {statistics.median(us):.2f} us/step (min {min(us):.2f}, max "
            f"{max(us):.2f}); loop {statistics.median(wall):.3f} s; leaking={quiet[side][0]['leaking']}, "
            f"scans={quiet[side][0]['scans']}"
        )
    print("growing loop (numpy rows and a dict of lists kept), 300 steps:")
    for side in ("A", "B"):
        wall = [float(r["wall_s"]) for r in growing[side]]  # type: ignore[arg-type]
        scans = [float(r["scan_s"]) for r in growing[side]]  # type: ignore[arg-type]
        last = growing[side][-1]
        print(
            f"  {side}: loop {statistics.median(wall):.2f} s, scans {statistics.median(scans):.2f} s; "
            f"culprits {last['culprits']}; {last['notes']}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
