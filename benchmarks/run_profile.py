"""Where ``torchmem run``'s own time goes, per step: a cProfile of one program under ``torchmem run``.

``run_cost.py`` says *how much* ``torchmem run`` costs; this says *where*. The program runs in this
process under ``python -m torchmem run`` (through ``torchmem.cli.main``) with cProfile on the main thread
(the sampler thread is not profiled: its cost is the ``sampler`` part of the capture's ``overhead`` record).
The table lists torchmem's own functions by cumulative time, per step of the program, and the capture's
``overhead`` record.
cProfile slows every Python call, so the absolute figures are inflated; the ranking is what this is for.

    python benchmarks/run_profile.py benchmarks/programs/mnist_cnn.py [--device cuda] [--top 25]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import sys
import tempfile


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("program")
    ap.add_argument("--device", default=None)
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    from torchmem.cli import main as cli

    out = tempfile.mkdtemp(prefix="torchmem-run-profile-")
    capture = os.path.join(out, "run.jsonl")
    argv = ["run", "--no-status", "-o", capture, a.program]
    if a.device:
        argv += ["--device", a.device]
    prof = cProfile.Profile()
    prof.enable()
    rc = cli(argv)
    prof.disable()
    with open(capture) as f:
        records = [json.loads(line) for line in f]
    overhead = next((r for r in records if r.get("type") == "overhead"), None)
    steps = max(int((overhead or {}).get("steps") or 1), 1)
    st = pstats.Stats(prof)
    rows = []
    for (file, line, name), (_cc, nc, _tt, ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        if "torchmem" in file and "benchmarks" not in file:
            rows.append((ct, nc, f"{file.rsplit('torchmem/', 1)[-1]}:{line} {name}"))
    rows.sort(reverse=True)
    print(f"exit code {rc}; {steps} steps; overhead record: {json.dumps(overhead)}")
    print(f"{'cum s':>8} {'µs/step':>9} {'calls':>9}  function")
    for ct, nc, where in rows[: a.top]:
        print(f"{ct:8.3f} {ct / steps * 1e6:9.1f} {nc:9d}  {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
