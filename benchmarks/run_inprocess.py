"""What ``torchmem run`` costs a host-bound loop, measured inside one process (issue 29's method for the run).

Fresh processes cannot show 2 % on the H100 host: the same plain program's median step varies by ± 25 % from
one process to the next (docs/benchmarks.md, session 15). So here one process runs under ``torchmem run`` and
alternates blocks of steps with torchmem's per-step work switched on and off (interleaved pairs, ``A B`` then
``B A``): off, the step boundaries' hooks are taken out (the ``backward`` wrapper replaced by the original,
the optimizer post-hook removed: no step is counted, nothing is read) and the sampler's ticks do nothing; on,
everything is as ``torchmem run`` left it. The ratio on/off of each pair, its median and a 95 % interval
(``benchmarks/_pairs.py``). What this leaves out, by design: the run's one-time work (start, the first
steps' survivors, scans once growth is found, the end summary), said by the run's own ``overhead`` record.

The switching reaches into torchmem's private objects from the program (the session is found with
``gc.get_objects()``); it is for this measurement only.

    PYTHONPATH=src python3 benchmarks/run_inprocess.py [--device cuda] [--pairs 200] [--block 50]
        [--warmup-steps 600]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from _pairs import Pairs, child_env, overhead_record

PROGRAM = r"""
import gc, json, os, sys, time
import torch
from torch import nn

device = torch.device(sys.argv[1])
pairs, block, warm = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
torch.manual_seed(0)
layers = []
for _ in range(4):
    layers += [nn.Linear(64, 64), nn.ReLU()]
model = nn.Sequential(*layers).to(device)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(16, 64, device=device)
y = torch.randn(16, 64, device=device)
loss_fn = nn.MSELoss()
cuda = device.type == "cuda"


def run(n):
    if cuda:
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(n):
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()
    if cuda:
        torch.cuda.synchronize(device)
    return (time.perf_counter() - t0) / n


run(warm)  # the run finds its step boundary (the optimizer step), warms up, chooses its strides

from torchmem.run.session import Session
import torch.optim.optimizer as optmod

session = next(o for o in gc.get_objects() if isinstance(o, Session))
sampler = session._sampler
tick = sampler._tick
wrapped = torch.autograd.backward
assert getattr(wrapped, "__torchmem_boundary__", False), "torch.autograd.backward is not torchmem's wrapper"
post = optmod._global_optimizer_post_hooks
saved = {}
state = [True]


def switch(on):
    if on == state[0]:
        return
    state[0] = on
    if on:
        torch.autograd.backward = wrapped
        post.update(saved)
        sampler._tick = tick
    else:
        torch.autograd.backward = wrapped.__wrapped__
        saved.clear()
        saved.update(post)
        post.clear()
        sampler._tick = lambda: None


steps_before = session._steps
out = []
for i in range(pairs):
    order = (True, False) if i % 2 == 0 else (False, True)
    got = {}
    for on in order:
        switch(on)
        got[on] = run(block)
    out.append((got[True], got[False]))
switch(True)
print("PAIRS=" + json.dumps({"pairs": out, "steps_counted": session._steps - steps_before}))
"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default=None)
    ap.add_argument("--pairs", type=int, default=200)
    ap.add_argument("--block", type=int, default=50, help="steps in each block")
    ap.add_argument("--warmup-steps", type=int, default=600)
    a = ap.parse_args()
    device = a.device
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    with tempfile.TemporaryDirectory() as d:
        prog = os.path.join(d, "inprocess_mlp.py")
        with open(prog, "w") as f:
            f.write(PROGRAM)
        env = child_env()
        args = [prog, device, str(a.pairs), str(a.block), str(a.warmup_steps)]
        code = (
            "import sys\nfrom torchmem.cli import main\n"
            f"sys.exit(main(['run', '--no-status', '-o', {os.path.join(d, 'run.jsonl')!r}, *{args!r}]))"
        )
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=d, check=False
        )
        if out.returncode != 0:
            print(out.stdout[-2000:], out.stderr[-4000:])
            return 1
        line = next(ln for ln in out.stdout.splitlines() if ln.startswith("PAIRS="))
        data = json.loads(line[len("PAIRS=") :])
        own = overhead_record(Path(d), "run.jsonl")
        overhead = own.get("ratio") if own is not None else None
    pairs = Pairs(a=[off for _on, off in data["pairs"]], b=[on for on, _off in data["pairs"]])
    s = pairs.summary()
    on_us = sorted(pairs.b)[pairs.n // 2] * 1e6
    off_us = sorted(pairs.a)[pairs.n // 2] * 1e6
    print(
        f"device {device}; {pairs.n} pairs of {a.block}-step blocks; steps counted while on: "
        f"{data['steps_counted']}"
    )
    print(f"{'step on (median)':<22}{'step off (median)':<22}{'ratio on/off [95 %]':<30}run's own overhead")
    print(f"{on_us:<22.1f}{off_us:<22.1f}{s:<30}{overhead}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
