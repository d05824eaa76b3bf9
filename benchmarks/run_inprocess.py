"""What ``torchmem run`` costs a host-bound loop, measured inside one process (issue 29's method for the run).

Fresh processes cannot show 2 % on the H100 host: the same plain program's median step varies by ± 25 % from
one process to the next (docs/benchmarks.md, session 15). So here one process runs under ``torchmem run`` and
alternates blocks of steps with torchmem's per-step work switched on and off (interleaved pairs, ``A B`` then
``B A``): off, the step boundaries' hooks are taken out (the ``backward`` wrapper, where it is in place,
replaced by the original, the optimizer post-hook removed: no step is counted, nothing is read) and the
sampler's ticks do nothing; on, everything is as ``torchmem run`` left it. The ratio on/off of each pair,
its median and a 95 % interval (``benchmarks/_pairs.py``). What this leaves out, by design: the run's
one-time work (start, the first steps' survivors, scans once growth is found, the end summary), said by
the run's own ``overhead`` record.

The switching reaches into torchmem's private objects from the program (the session is found with
``gc.get_objects()``); it is for this measurement only.

    PYTHONPATH=src python3 benchmarks/run_inprocess.py [--device cuda] [--model mlp|tiny|resnet18|gpt2]
        [--pairs 200] [--block 50] [--cpus 3] [--part all|hooks|bookkeeping|sampler] [--profile N]
        [--at 2000,20000,100000]
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

from _models import MODELS
from _pairs import Pairs, child_env, overhead_record, pin

PROGRAM = r"""
import gc, json, os, sys, time
import torch
from torch import nn

device = torch.device(sys.argv[1])
pairs, block, warm, name = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
sys.path.insert(0, sys.argv[6])
part, profile_steps = sys.argv[7], int(sys.argv[8])
# the run lengths the pairs are measured at (--at): the first is the warm-up
checkpoints = [int(v) for v in sys.argv[9].split(",")] if len(sys.argv) > 9 and sys.argv[9] else [warm]
from _models import make_step

step, what = make_step(name, device)
cuda = device.type == "cuda"


def run(n):
    if cuda:
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    if cuda:
        torch.cuda.synchronize(device)
    return (time.perf_counter() - t0) / n


run(checkpoints[0])  # the run finds its step boundary (the optimizer step), warms up, chooses its strides
done = checkpoints[0]

from torchmem.run.session import Session
import torch.optim.optimizer as optmod

session = next(o for o in gc.get_objects() if isinstance(o, Session))
sampler = session._sampler
tick = sampler._tick
# torchmem's backward() wrapper, where it is in place (once the optimizer step counts the steps it is taken
# out, torch's own backward() back: then there is nothing to switch)
wrapped = torch.autograd.backward
ours = getattr(wrapped, "__torchmem_boundary__", False)
unwrapped = getattr(wrapped, "__wrapped__", wrapped) if ours else wrapped
post = optmod._global_optimizer_post_hooks
saved = {}
state = [True]


source = session._source
bookkeeping = source._step


def switch(on):
    # Turn `part` of the per-step work on or off: all (the boundaries' hooks and the sampler's ticks),
    # hooks (the hooks alone), bookkeeping (the session's step work, the hooks still running), sampler.
    if on == state[0]:
        return
    state[0] = on
    hooks = part in ("all", "hooks")
    ticks = part in ("all", "sampler")
    if on:
        if hooks:
            torch.autograd.backward = wrapped
            post.update(saved)
        if ticks:
            sampler._tick = tick
        if part == "bookkeeping":
            source._step = bookkeeping
    else:
        if hooks:
            torch.autograd.backward = unwrapped
            saved.clear()
            saved.update(post)
            post.clear()
        if ticks:
            sampler._tick = lambda: None
        if part == "bookkeeping":
            source._step = lambda: None


steps_before = session._steps
rounds = []
# The garbage collector's passes in the on and off blocks, by generation: torchmem's allocations at the
# step boundaries bring the collections sooner (a full pass walks every object of a framework's heap).
collections = {True: [0, 0, 0], False: [0, 0, 0]}
phase = [True]


def on_gc(event, info):
    if event == "start":
        collections[phase[0]][info["generation"]] += 1


gc.callbacks.append(on_gc)
for at in checkpoints:
    if at > done:  # the run goes on (torchmem on) to the next length measured
        switch(True)
        phase[0] = True
        run(at - done)
        done = at
    out = []
    for i in range(pairs):
        order = (True, False) if i % 2 == 0 else (False, True)
        got = {}
        for on in order:
            switch(on)
            phase[0] = on
            got[on] = run(block)
        out.append((got[True], got[False]))
    done += 2 * pairs * block
    rounds.append({"at": at, "pairs": out, "counted": session._steps})
gc.callbacks.remove(on_gc)
switch(True)
profile = []
if profile_steps:
    # Where an "on" step's torchmem time goes: cProfile over that many steps, torchmem's own functions
    # by their cumulative time per step (cProfile slows every call: compare the entries, not the totals).
    import cProfile, pstats

    prof = cProfile.Profile()
    prof.enable()
    run(profile_steps)
    prof.disable()
    st = pstats.Stats(prof)
    for (file, line, fn), (cc, nc, tt, ct, callers) in st.stats.items():
        if "torchmem" in file and "benchmarks" not in file:
            profile.append((ct / profile_steps * 1e6, tt / profile_steps * 1e6, nc / profile_steps,
                            f"{file.rsplit('torchmem/', 1)[-1]}:{line}:{fn}"))
    profile.sort(reverse=True)
counted = session._steps - steps_before
result = {"rounds": rounds, "steps_counted": counted, "what": what, "profile": profile[:30]}
result["gc"] = [collections[True], collections[False]]
print("PAIRS=" + json.dumps(result))
"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default=None)
    ap.add_argument("--pairs", type=int, default=200)
    ap.add_argument("--block", type=int, default=50, help="steps in each block")
    ap.add_argument("--warmup-steps", type=int, default=600)
    ap.add_argument("--model", default="mlp", help=f"one of {', '.join(MODELS)} (benchmarks/_models.py)")
    ap.add_argument(
        "--part",
        default="all",
        choices=("all", "hooks", "bookkeeping", "sampler"),
        help="what is switched off in the 'off' blocks (default: all: the hooks and the sampler's ticks)",
    )
    ap.add_argument(
        "--profile", type=int, default=0, help="then cProfile this many 'on' steps: torchmem's share"
    )
    ap.add_argument(
        "--at",
        default="",
        help="run lengths (steps) to measure the pairs at, e.g. 2000,20000,100000: is the cost flat in the "
        "run's length? (default: once, after --warmup-steps)",
    )
    ap.add_argument("--cpus", default=None, help="CPUs to pin to (default: the last one; 4 on CUDA)")
    a = ap.parse_args()
    if a.model not in MODELS:
        ap.error(f"unknown --model {a.model!r}; known: {', '.join(MODELS)}")
    device = a.device
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    pinned = pin(a.cpus, threads=1, count=4 if device.startswith("cuda") else 1)
    with tempfile.TemporaryDirectory() as d:
        prog = os.path.join(d, "inprocess_mlp.py")
        with open(prog, "w") as f:
            f.write(PROGRAM)
        env = child_env()
        here = os.path.dirname(os.path.abspath(__file__))
        args = [
            prog,
            device,
            str(a.pairs),
            str(a.block),
            str(a.warmup_steps),
            a.model,
            here,
            a.part,
            str(a.profile),
            a.at,
        ]
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
    print(
        f"device {device}; {data['what']}; off: {a.part}; {a.pairs} pairs of {a.block}-step blocks; "
        f"{pinned}; steps counted while on: {data['steps_counted']}"
    )
    print(
        f"{'steps run before':<18}{'step on (median)':<20}{'step off (median)':<20}"
        f"{'ratio on/off [95 %]':<30}run's own overhead (whole run)"
    )
    for r in data["rounds"]:
        pairs = Pairs(a=[off for _on, off in r["pairs"]], b=[on for on, _off in r["pairs"]])
        on_us = sorted(pairs.b)[pairs.n // 2] * 1e6
        off_us = sorted(pairs.a)[pairs.n // 2] * 1e6
        print(f"{r['at']:<18,}{on_us:<20.1f}{off_us:<20.1f}{pairs.summary():<30}{overhead}")
    gc_on, gc_off = data["gc"]
    print(f"garbage collections (generations 0/1/2) in the on blocks {gc_on}, in the off blocks {gc_off}")
    if data["profile"]:
        print(
            f"\ncProfile of {a.profile} 'on' steps, torchmem's functions "
            "(per step; cProfile's own cost included)"
        )
        print(f"{'cumulative µs':>14}{'own µs':>10}{'calls':>8}  function")
        for cum, own_us, calls, fn in data["profile"]:
            print(f"{cum:>14.1f}{own_us:>10.1f}{calls:>8.2f}  {fn}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
