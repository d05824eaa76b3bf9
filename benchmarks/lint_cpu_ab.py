"""Benchmark: the CPU time of ``lint_paths(jobs=1)`` with this checkout's rules against another version's.

CPU time (``time.process_time`` of a fresh process) survives a machine shared with other work better than
wall time: the figure is the ratio new/old of interleaved pairs (old, new, old, new, ...), median and
spread. The other version is a ``src`` folder, e.g. from ``git archive <commit> src | tar -x -C DIR``.

    git archive 31f7493 src | tar -x -C /tmp/old
    python benchmarks/lint_cpu_ab.py --old-src /tmp/old/src                 # the built 100k-line tree
    python benchmarks/lint_cpu_ab.py --old-src /tmp/old/src --path some/tree --pairs 5

Both sides read, parse, walk and check every file in one process, with the findings counted (they may
differ: the rules differ). No torch import.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lint_speed import build_tree

HERE_SRC = str(Path(__file__).resolve().parent.parent / "src")

CHILD = """
import sys, time
sys.path.insert(0, {src!r})
import torchmem.lint as lint
assert lint.__file__.startswith({src!r}), lint.__file__
t = time.process_time()
n = len(lint.lint_paths([{root!r}], config=False, jobs=1))
print(time.process_time() - t, n)
"""


def cpu_seconds(src: str, root: str) -> tuple[float, int]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD.format(src=src, root=root)],
        capture_output=True,
        text=True,
        check=True,
        env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
    ).stdout.split()
    return float(out[0]), int(out[1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old-src", required=True, help="the other version's src folder")
    ap.add_argument("--path", help="a tree to lint (default: build the 100k-line tree of lint_speed.py)")
    ap.add_argument("--pairs", type=int, default=4)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = args.path or str(Path(tmp) / "tree")
        if not args.path:
            build_tree(Path(root), 100_000)
        old: list[float] = []
        new: list[float] = []
        found = (0, 0)
        for _ in range(args.pairs):
            o, n_old = cpu_seconds(args.old_src, root)
            n, n_new = cpu_seconds(HERE_SRC, root)
            old.append(o)
            new.append(n)
            found = (n_old, n_new)
    ratios = [n / o for n, o in zip(new, old)]
    print(f"tree: {args.path or 'built 100k lines'}; findings old {found[0]}, new {found[1]}")
    print(f"old CPU s: median {statistics.median(old):.2f} ({min(old):.2f}-{max(old):.2f})")
    print(f"new CPU s: median {statistics.median(new):.2f} ({min(new):.2f}-{max(new):.2f})")
    print(f"new/old: median {statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
