"""Where ``torchmem run``'s cost on a host-bound loop goes: the program under ``torchmem run`` with one part
of the run switched off at a time (monkeypatched in the launching process, for this measurement only), as
interleaved rounds of fresh processes, each step's wall time written by the program
(``TORCHMEM_BENCH_STEP_TIMES``).

Variants: ``plain`` (``python prog``), ``run`` (``torchmem run``, every part), ``no_sampler`` (no sampler
thread), ``no_host`` (no host watcher), ``no_survivors`` (no loop survivors), ``no_reading`` (the device
watcher counts steps but reads nothing), ``bare`` (all four off: what is left is the step boundaries' hooks
and the session around the program). For each: the loop's time and the median and mean step against
``plain`` of the same round (median over rounds, with the spread). A part whose removal brings the
median step back to ``plain`` costs every step (a hook); one that moves only the mean costs now and then.

    PYTHONPATH=src python3 benchmarks/run_parts.py --rounds 6 --steps 4000 [--device cuda]
        [--variants plain,run,no_sampler,...] [--program benchmarks/programs/hostbound_mlp.py] [--pin 5]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile

from _pairs import child_env

_PATCHES = {
    "no_sampler": "import torchmem.run.sampler as m; m.Sampler.start = lambda self: None",
    "no_host": "import torchmem.run.watchers as m; m.new_host = lambda *a, **k: None",
    "no_survivors": "import torchmem.run.watchers as m; m.new_survivors = lambda *a, **k: None",
    "no_reading": "import torchmem.capture.watch as m; m.Watcher._step = lambda self: None",
}
_PATCHES["bare"] = "; ".join(_PATCHES.values())
# ... and the session's step bookkeeping too: what is left is the boundaries' hooks (their events counted)
_PATCHES["hooks_only"] = (
    _PATCHES["bare"] + "; import torchmem.run.session as s; s.Session.step = lambda self: None"
)
# The program run as ``__main__`` by runpy (as ``torchmem run`` runs it) in a process without torchmem, and
# in one that imported what ``torchmem run`` imports: what is left of ``bare`` is the session's own.
_RUNPY = {
    "runpy": "import runpy, sys",
    "runpy_imports": "import runpy, sys, torchmem.cli, torchmem.run.session, torchmem.run.launcher",
    # CUDA initialised, the allocator's statistics and NVML read before the program starts (as a session
    # does), and nothing else of torchmem
    "early_cuda": (
        "import runpy, sys, torch; torch.cuda.init(); torch.cuda.memory_stats(0); "
        "import pynvml; pynvml.nvmlInit(); "
        "pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0))"
    ),
}
VARIANTS = ("plain", "run", *_PATCHES, *_RUNPY)


def _command(variant: str, program: str, capture: str, device: str, steps: int) -> list[str]:
    args = [program, "--device", device, "--steps", str(steps)]
    if variant == "plain":
        return [sys.executable, *args]
    if variant in _RUNPY:
        code = f"{_RUNPY[variant]}; sys.argv = {args!r}; runpy.run_path({program!r}, run_name='__main__')"
        return [sys.executable, "-c", code]
    patch = _PATCHES.get(variant, "")
    code = (
        f"import sys; {patch}\n"
        "from torchmem.cli import main\n"
        f"sys.exit(main(['run', '--no-status', '-q', '-o', {capture!r}, *{args!r}]))"
    )
    return [sys.executable, "-c", code]


def _one(variant: str, program: str, device: str, steps: int, pin: str | None) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as d:
        times = os.path.join(d, "steps.txt")
        env = child_env(TORCHMEM_BENCH_STEP_TIMES=times)
        cmd = _command(variant, program, os.path.join(d, "run.jsonl"), device, steps)
        if pin:  # every thread of the process on these CPUs (the sampler's with the loop's)
            cmd = ["taskset", "-c", pin, *cmd]
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=d, check=False)
        if out.returncode != 0:
            raise SystemExit(f"{variant} failed ({out.returncode}):\n{out.stderr[-3000:]}")
        loop = next(
            float(ln.split("=")[1]) for ln in out.stdout.splitlines() if ln.startswith("LOOP_SECONDS=")
        )
        with open(times) as f:
            st = [float(x) for x in f]
    st = st[len(st) // 10 :]  # past the first tenth (warm-up, the watchers' early readings)
    return {"loop": loop, "median": statistics.median(st), "mean": statistics.fmean(st)}


def _spread(xs: list[float]) -> str:
    xs = sorted(xs)
    return f"{statistics.median(xs):.3f} [{xs[0]:.3f}, {xs[-1]:.3f}]"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument(
        "--program", default=os.path.join(os.path.dirname(__file__), "programs", "hostbound_mlp.py")
    )
    ap.add_argument("--out", default=None)
    ap.add_argument("--pin", default=None, help="CPU list for every run (taskset -c), e.g. 5")
    a = ap.parse_args()
    variants = [v for v in a.variants.split(",") if v]
    if "plain" not in variants:
        variants.insert(0, "plain")
    rng = random.Random(0)
    rows: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    for r in range(a.rounds):
        order = variants[:]
        rng.shuffle(order)
        for v in order:
            rows[v].append(_one(v, os.path.abspath(a.program), a.device, a.steps, a.pin))
        print(
            f"round {r + 1}: " + ", ".join(f"{v} {rows[v][-1]['median'] * 1e6:.0f} µs" for v in variants),
            flush=True,
        )
    heads = ("variant", "loop / plain", "median step / plain", "mean step / plain")
    print("\n" + "".join(f"{h:<26}" for h in heads) + "median µs")
    for v in variants:
        ratio = {k: [x[k] / p[k] for x, p in zip(rows[v], rows["plain"])] for k in ("loop", "median", "mean")}
        med_us = statistics.median(x["median"] for x in rows[v]) * 1e6
        cells = [v] + [_spread(ratio[k]) for k in ("loop", "median", "mean")]
        print("".join(f"{c:<26}" for c in cells) + f"{med_us:.1f}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
