"""Benchmark: ``torchmem lint`` over a 100k-line tree, against parsing the same tree (the anchor).

Claim (issue 15): a 100k-line tree is checked in under 10 s on this machine. The anchors are what any
checker must pay at least once: ``ast.parse`` of every file, and ``compile`` (what ``python -m py_compile``
does, without writing .pyc files).

    python benchmarks/lint_speed.py                      # builds a 100k-line tree in a temporary folder
    python benchmarks/lint_speed.py --path /some/tree    # or measures an existing one
    python benchmarks/lint_speed.py --lines 300000 --json out.json
    python benchmarks/lint_speed.py --cores 2              # pinned to 2 cores of a bigger, idle machine

Issue 30's target is 100,000 lines/s on 2 cores: `--cores 2` pins this process (and the workers it forks)
to the first two cores it may use, so a quiet many-core machine measures what 2 idle cores do.

Runs are paired (anchor, lint, anchor, lint, ...) and the median of each is reported. No torch import.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _machine import cpu_name
from torchmem.lint import lint_paths
from torchmem.lint._run import _jobs, _usable_cores, iter_files

TRAIN = '''"""Training script {i}: model, data, loops (the shapes tutorials use)."""
import os
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


class Data{i}(Dataset):
    def __init__(self, n):
        self.x = torch.randn(n, 16)
        self.y = torch.randint(0, 4, (n,))

    def __len__(self):
        return len(self.x)

    def __getitem__(self, idx):
        return self.x[idx], self.y[idx]


class Net{i}(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


def train_{i}(model, loader, optimizer, criterion, device):
    model.train()
    total = 0.0
    history = []
    for step, (x, y) in enumerate(loader):
        x, y = x.to(device), y.to(device)
        optimizer.zero_grad()
        out = model(x)
        loss = criterion(out, y)
        loss.backward()
        optimizer.step()
        total += loss.item()
        history.append(loss.detach())
        if step % 100 == 0:
            print(f"step {{step}} loss {{loss.item():.4f}}")
    return total / max(len(loader), 1), history


@torch.no_grad()
def evaluate_{i}(model, loader, device):
    model.eval()
    correct = 0
    for x, y in loader:
        out = model(x.to(device))
        correct += (out.argmax(1) == y.to(device)).sum().item()
    return correct / len(loader.dataset)


def main_{i}():
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = Net{i}().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(Data{i}(256), batch_size=32, shuffle=True, num_workers=2)
    for epoch in range(3):
        loss, _ = train_{i}(model, loader, optimizer, nn.CrossEntropyLoss(), device)
        acc = evaluate_{i}(model, loader, device)
        print(epoch, loss, acc)
    if os.environ.get("SAVE"):
        torch.save(model.state_dict(), "model_{i}.pt")
'''

LIBRARY = '''"""Library-style module {i}: classes, helpers, comprehensions, no training loop."""
from __future__ import annotations

import dataclasses
import re
from typing import Any


@dataclasses.dataclass
class Record{i}:
    name: str
    values: list[float]
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)

    def mean(self) -> float:
        return sum(self.values) / len(self.values) if self.values else 0.0

    def normalised(self) -> list[float]:
        m = self.mean()
        return [v - m for v in self.values]


def parse_{i}(text: str) -> list[Record{i}]:
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, _, rest = line.partition(":")
        nums = [float(x) for x in re.findall(r"[-+]?\\d*\\.?\\d+", rest)]
        out.append(Record{i}(name.strip(), nums))
    return out


def summarise_{i}(records: list[Record{i}]) -> dict[str, float]:
    table = {{}}
    for r in records:
        key = r.name.lower()
        table[key] = table.get(key, 0.0) + r.mean()
    return {{k: round(v, 3) for k, v in sorted(table.items())}}
'''


def build_tree(root: Path, lines: int) -> None:
    i = 0
    written = 0
    while written < lines:
        text = (TRAIN if i % 2 == 0 else LIBRARY).format(i=i)
        folder = root / f"pkg{i // 50}" / f"sub{(i // 10) % 5}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"mod{i}.py").write_text(text)
        written += text.count("\n")
        i += 1


@contextlib.contextmanager
def _no_gc() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def tree_lines(files: list[Path]) -> int:
    return sum(p.read_bytes().count(b"\n") for p in files)


def parse_all(files: list[Path]) -> None:
    # Like lint_paths, with the cyclic collector off (each tree is freed by reference counting), so that the
    # ratio to the anchor compares the checks, not the collector's passes.
    with warnings.catch_warnings(), _no_gc():
        warnings.simplefilter("ignore")
        for p in files:
            try:
                ast.parse(p.read_bytes(), str(p))
            except (SyntaxError, ValueError):
                pass


def compile_all(files: list[Path]) -> None:
    with warnings.catch_warnings(), _no_gc():
        warnings.simplefilter("ignore")
        for p in files:
            try:
                compile(p.read_bytes(), str(p), "exec", dont_inherit=True)
            except (SyntaxError, ValueError):
                pass


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--path", help="an existing tree to measure (default: build one)")
    ap.add_argument("--lines", type=int, default=100_000, help="size of the built tree")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cli", action="store_true", help="also time the `torchmem lint` command (a process)")
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument("--cores", type=int, help="pin to this many cores first (Linux: sched_setaffinity)")
    args = ap.parse_args()
    if args.cores:
        allowed = sorted(os.sched_getaffinity(0))
        if args.cores > len(allowed):
            ap.error(f"--cores {args.cores}: only {len(allowed)} cores are usable here")
        os.sched_setaffinity(0, allowed[: args.cores])

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.path) if args.path else Path(tmp) / "tree"
        if not args.path:
            build_tree(root, args.lines)
        files = list(iter_files([root], None))
        n_lines = tree_lines(files)
        cores = _usable_cores()
        auto = f"lint_paths (jobs={cores})"
        rows: dict[str, list[float]] = {"ast.parse": [], "compile": [], "lint_paths (jobs=1)": [], auto: []}
        findings = 0
        loads: list[float] = []
        for _ in range(args.repeats):  # paired: each round runs every measurement once
            loads.append(os.getloadavg()[0])
            rows["ast.parse"].append(timed(lambda: parse_all(files)))
            rows["compile"].append(timed(lambda: compile_all(files)))
            t0 = time.perf_counter()
            findings = len(lint_paths([root], config=False, jobs=1))
            rows["lint_paths (jobs=1)"].append(time.perf_counter() - t0)
            rows[auto].append(timed(lambda: lint_paths([root], config=False, jobs=cores)))
        if args.cli:
            rows["torchmem lint (process)"] = []
            for _ in range(args.repeats):
                cmd = [sys.executable, "-m", "torchmem", "lint", "-q", "--no-config", str(root)]
                t0 = time.perf_counter()
                proc = subprocess.run(cmd, capture_output=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
                rows["torchmem lint (process)"].append(time.perf_counter() - t0)
                if proc.returncode not in (0, 1):
                    print(f"`torchmem lint` failed ({proc.returncode}): {proc.stderr.decode()[-300:]}")
                    del rows["torchmem lint (process)"]
                    break

    anchor = statistics.median(rows["ast.parse"])
    print(f"machine: {cpu_name()}, {os.cpu_count()} cores, Python {sys.version.split()[0]}")
    print(f"pinned to cores: {sorted(os.sched_getaffinity(0))}" if args.cores else "not pinned")
    print(f"load average (1 min) at each round: {', '.join(f'{x:.1f}' for x in loads)}")
    print(f"lint_paths(jobs=None) would use {_jobs(None, len(files))} process(es) at the load now")
    print(f"tree: {len(files)} files, {n_lines:,} lines ({args.path or 'built'}); findings: {findings}")
    print(f"{'measurement':<26} {'median s':>9} {'x ast.parse':>12} {'lines/s':>10}  spread")
    figures = {}
    for name, samples in rows.items():
        med = statistics.median(samples)
        figures[name] = med
        spread = f"{min(samples):.2f}-{max(samples):.2f} s"
        print(f"{name:<26} {med:>9.2f} {med / anchor:>12.2f} {n_lines / med:>10,.0f}  {spread}")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"files": len(files), "lines": n_lines, "seconds": figures, "load": loads})
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
