"""What ``torchmem run script.py`` (no flag) costs in wall-clock time against ``python script.py`` (issue 12).

Each program under ``benchmarks/programs/`` is a self-contained training script written the way people write
them (synthetic data, fixed seed, CPU or CUDA). It runs as a fresh process, plain (``python script.py``, the
anchor) and under ``python -m torchmem run script.py``, as interleaved pairs (``A B``, then ``B A``;
``--pairs``, at least 10 for a figure: ``benchmarks/_pairs.py``), the runner pinned to its CPUs with one
thread per process, each run in its own temporary folder (where ``torchmem run`` writes its capture file).
Two times per run: the whole process (interpreter start, ``import torch``, the program, torchmem's end
summary) and the time the program prints around its own loop (``LOOP_SECONDS=<float>``, its last line),
which leaves out start-up; and the loop's CPU time (``LOOP_CPU_SECONDS``, ``time.process_time()``: every
thread of the process, torchmem's sampler included, as ``torchmem run`` runs the program in its own process),
which a machine shared with other work inflates far less than the wall clock (a preempted process is not
charged for the time it waits). Each figure is the median of the pairs' ratios with its 95 % interval (order
statistics). The ``own`` column is torchmem's own estimate of its cost, the ``overhead`` record of the
same runs' captures (median of its ``ratio``): it should agree with the measured loop ratio.
The ``verdict`` column reads torchmem's end summary on stderr: ``quiet`` (no leak, no
OOM), ``LEAK`` or ``OOM`` — none of these programs leaks, so anything but ``quiet`` is a false alarm (or a
leak in the program); the summary's first line and verdict line are printed under the table.

Run (the CPU figures are meant with one thread per process):

    PYTHONPATH=src python3 benchmarks/run_cost.py [--device cpu|cuda] [--pairs 10] [--programs a,b]
        [--scale 1.0] [--out results.jsonl] [--keep DIR] [--torchmem-args "--no-status"] [--cpus 2-3]

``--budget SECONDS`` sizes each program to that wall time (probe, pairs and all): one plain and one
``torchmem run`` probe at ``--scale`` (default 0.05) give each side's start-up (the process's time outside its
loop: interpreter, ``import torch``, CUDA, torchmem's end summary) and the loop's time per unit of scale;
the loop is then as long as the budget leaves for ``--pairs`` pairs (at least 0.5 s; a budget too small for
that is said), and no pair starts that would end past the budget (the table then has the pairs done; fewer
than 6 leave the interval out). ``--loop-seconds S`` asks for loops of S seconds instead. Both print what
they expect.

On an H100 host (issue 29's GPU loops, each at most 120 s with these knobs; the probe at scale 0.1 runs ~1 s
loops there):

    export PYTHONPATH=src
    python3 benchmarks/run_cost.py --device cuda --budget 120 --scale 0.1 --programs resnet18
    python3 benchmarks/run_cost.py --device cuda --budget 120 --scale 0.1 --programs hostbound_mlp
    python3 benchmarks/run_cost.py --device cuda --budget 120 --scale 0.1 --programs gpt_train

``--device`` (default: cuda if available, else cpu) reaches the programs as ``--device`` and as
``TORCHMEM_BENCH_DEVICE``; ``--scale`` multiplies each program's default number of steps (through
``TORCHMEM_BENCH_SCALE``); ``--out`` appends the header and one JSON object per program (with every run) as
JSON lines; ``--keep`` keeps each run's folder (and capture) under DIR. Exit code 1 when a run failed or a
program was not ``quiet``.

The programs and their targets (torchmem run / plain python, wall clock):

===================  ==============================================================  ======  ======
program              shape                                                           CPU     CUDA
===================  ==============================================================  ======  ======
mnist_cnn            pytorch/examples mnist: 2 convs, Adadelta + StepLR, DataLoader  1.20x   1.02x
gpt_train            GPT-2 (transformers, else nn.TransformerEncoderLayer), AdamW,   1.20x   1.02x
                     warm-up schedule, clipping, bf16 autocast on CUDA
hostbound_mlp        issue 12's host-bound step: 4x Linear(64)+ReLU, SGD, batch 16   2.00x   1.02x
gpubound_matmul      3x Linear(8192), batch 8192 (CPU: 1024), SGD                    1.20x   1.01x
lbfgs_ops            time_sequence_prediction: 2 LSTMCells unrolled, LBFGS closure   2.00x   1.02x
resnet18             ResNet-18 on 32x32 images, SGD momentum (launch-bound on a GPU)  1.20x   1.02x
===================  ==============================================================  ======  ======

Issue 12 sets: usual CPU programs within 1.2x, op-heavy CPU programs within 2x, a real training script on a
GPU within 2 %, the host-bound step within 2 % and a GPU-bound step within 1 %. The host-bound step counts
as op-heavy on the CPU (a few µs per op); the CUDA targets of mnist_cnn and lbfgs_ops are the "real
script" 2 %.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from _machine import cpu_name
from _pairs import Pairs, fmt_interval, measure_pairs, overhead_record, pin

HERE = Path(__file__).resolve().parent
PROGRAMS_DIR = HERE / "programs"

# name -> (target ratio on the CPU, on CUDA)
TARGETS: dict[str, tuple[float, float]] = {
    "mnist_cnn": (1.20, 1.02),
    "gpt_train": (1.20, 1.02),
    "hostbound_mlp": (2.00, 1.02),
    "gpubound_matmul": (1.20, 1.01),
    "lbfgs_ops": (2.00, 1.02),
    "resnet18": (1.20, 1.02),
}

_LOOP = re.compile(r"^LOOP_SECONDS=([0-9.eE+-]+)\s*$", re.MULTILINE)
_LOOP_CPU = re.compile(r"^LOOP_CPU_SECONDS=([0-9.eE+-]+)\s*$", re.MULTILINE)
_SUMMARY_HEAD = re.compile(r"^torchmem: \d+ steps in ")
_LEAK = re.compile(r"\bLEAK\b")
_OOM = re.compile(r"^OOM\b|out-of-memory errors? caught")


@dataclass
class Run:
    """One process: plain python or torchmem run."""

    mode: str  # "plain" or "torchmem"
    pair: int
    rc: int
    wall_s: float
    loop_s: float | None
    cpu_s: float  # user + system CPU time of the process
    loop_cpu_s: float | None = None  # the CPU time of the process over its loop (all its threads)
    summary: list[str] = field(default_factory=list)  # torchmem's end summary (torchmem runs)
    verdict: str = ""
    tail: str = ""  # the last lines of stderr when the run failed
    overhead: dict[str, Any] | None = None  # the capture's own ``overhead`` record (torchmem runs)


@dataclass
class Row:
    program: str
    device: str
    plain_s: float | None
    torchmem_s: float | None
    ratio: float | None
    loop_plain_s: float | None
    loop_torchmem_s: float | None
    loop_ratio: float | None
    target: float
    verdict: str
    summary_first: str
    summary_verdict: str
    runs: list[Run]
    ratio_ci: tuple[float, float] | None = None
    loop_ci: tuple[float, float] | None = None
    own_ratio: float | None = None  # median of the captures' overhead ratio
    loop_cpu_ratio: float | None = None  # the loop's CPU time (all threads), torchmem run / plain
    loop_cpu_ci: tuple[float, float] | None = None


def _torch_facts() -> dict[str, str | bool]:
    """torch's version, CUDA's availability and the GPU's name, read in a child (the parent stays light)."""
    code = (
        "import json, torch\n"
        "c = torch.cuda.is_available()\n"
        "print(json.dumps({'torch': torch.__version__, 'cuda': c, "
        "'gpu': torch.cuda.get_device_name(0) if c else ''}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    facts: dict[str, str | bool] = json.loads(out.stdout.strip().splitlines()[-1])
    return facts


def _summary(stderr: str) -> list[str]:
    """torchmem's end summary: from its last ``torchmem: N steps in`` line to its ``capture:`` line."""
    lines = stderr.splitlines()
    start = next((i for i in range(len(lines) - 1, -1, -1) if _SUMMARY_HEAD.match(lines[i])), None)
    if start is None:
        return []
    block = []
    for line in lines[start:]:
        block.append(line)
        if line.startswith("capture: "):
            break
    return block


def _verdict(summary: list[str]) -> str:
    if not summary:
        return "no summary"
    text = "\n".join(summary)
    if _LEAK.search(text):
        return "LEAK"
    if any(_OOM.search(line) for line in summary):
        return "OOM"
    return "quiet"


def _run_once(mode: str, pair: int, cmd: list[str], env: dict[str, str], keep: Path | None, tag: str) -> Run:
    if keep is not None:
        cwd = keep / tag
        if cwd.exists():
            shutil.rmtree(cwd)
        cwd.mkdir(parents=True)
        tmp = None
    else:
        tmp = tempfile.TemporaryDirectory(prefix="run_cost-")
        cwd = Path(tmp.name)
    try:
        before = os.times()
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        after = os.times()
        overhead = overhead_record(cwd) if mode == "torchmem" else None
    finally:
        if tmp is not None:
            tmp.cleanup()
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    found = _LOOP.findall(proc.stdout)
    loop = float(found[-1]) if found else None
    found_cpu = _LOOP_CPU.findall(proc.stdout)
    run = Run(mode=mode, pair=pair, rc=proc.returncode, wall_s=wall, loop_s=loop, cpu_s=cpu)
    run.loop_cpu_s = float(found_cpu[-1]) if found_cpu else None
    run.overhead = overhead
    if mode == "torchmem":
        run.summary = _summary(proc.stderr)
        run.verdict = _verdict(run.summary)
    if proc.returncode != 0:
        run.verdict = f"exit {proc.returncode}"
        run.tail = "\n".join(proc.stderr.splitlines()[-15:])
    return run


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def measure(
    name: str,
    device: str,
    pairs: int,
    env: dict[str, str],
    torchmem_args: list[str],
    keep: Path | None,
    deadline: float | None = None,
) -> Row:
    script = str(PROGRAMS_DIR / f"{name}.py")
    prog_argv = [script, "--device", device]
    plain_cmd = [sys.executable, *prog_argv]
    tm_cmd = [sys.executable, "-m", "torchmem", "run", *torchmem_args, *prog_argv]
    runs: list[Run] = []
    counter = [0, 0]

    def side(mode: str, cmd: list[str]) -> Any:
        def go() -> tuple[float, Run]:
            k = counter[0 if mode == "plain" else 1]
            counter[0 if mode == "plain" else 1] += 1
            r = _run_once(mode, k, cmd, env, keep, f"{name}-{device}-{k}-{mode}")
            runs.append(r)
            loop = f", loop {r.loop_s:.2f} s" if r.loop_s is not None else ""
            own = r.overhead.get("ratio") if r.overhead else None
            extra = (f", {r.verdict}" if r.verdict else "") + (f", own estimate {own}" if own else "")
            print(f"  {name} pair {k + 1}/{pairs} {mode:<8} {r.wall_s:7.2f} s{loop}{extra}", file=sys.stderr)
            if r.rc != 0:
                print("    " + r.tail.replace("\n", "\n    "), file=sys.stderr)
            return r.wall_s, r

        return go

    def stop(longest: float) -> bool:  # no pair starts that would end past the deadline (the first runs)
        if deadline is not None and longest and time.perf_counter() + longest > deadline:
            print(f"  {name}: stopped at the budget's end", file=sys.stderr)
            return True
        return False

    got = measure_pairs(side("plain", plain_cmd), side("torchmem", tm_cmd), pairs, stop=stop)  # A B, B A
    ok = [(a, b) for a, b in got.extra if a.rc == 0 and b.rc == 0]
    loop_ok = [(a, b) for a, b in ok if a.loop_s and b.loop_s is not None]
    wall_pairs = Pairs([a.wall_s for a, _ in ok], [b.wall_s for _, b in ok])
    loop_pairs = Pairs(
        [a.loop_s for a, _ in loop_ok if a.loop_s], [b.loop_s for _, b in loop_ok if b.loop_s is not None]
    )
    cpu_ok = [(a, b) for a, b in ok if a.loop_cpu_s and b.loop_cpu_s is not None]
    cpu_pairs = Pairs([a.loop_cpu_s or 0.0 for a, _ in cpu_ok], [b.loop_cpu_s or 0.0 for _, b in cpu_ok])
    owns = [float(b.overhead["ratio"]) for _, b in ok if b.overhead and b.overhead.get("ratio") is not None]
    tm_runs = [r for r in runs if r.mode == "torchmem"]
    verdicts = [r.verdict for r in tm_runs]
    bad = [v for v in verdicts if v != "quiet"]
    last = tm_runs[-1].summary if tm_runs else []
    verdict_line = ""
    for line in last[1:]:
        if not line.startswith(("  ", "capture: ")):
            verdict_line = line
            break
    targets = TARGETS.get(name, (1.2, 1.02))
    return Row(
        program=name,
        device=device,
        plain_s=_median([a.wall_s for a, _ in ok]),
        torchmem_s=_median([b.wall_s for _, b in ok]),
        ratio=wall_pairs.median() if wall_pairs.n else None,
        loop_plain_s=_median([a.loop_s for a, _ in loop_ok if a.loop_s is not None]),
        loop_torchmem_s=_median([b.loop_s for _, b in loop_ok if b.loop_s is not None]),
        loop_ratio=loop_pairs.median() if loop_pairs.n else None,
        target=targets[1] if device.startswith("cuda") else targets[0],
        verdict=bad[0] if bad else ("quiet" if verdicts else "n/a"),
        summary_first=last[0] if last else "",
        summary_verdict=verdict_line,
        runs=runs,
        ratio_ci=wall_pairs.interval() if wall_pairs.n else None,
        loop_ci=loop_pairs.interval() if loop_pairs.n else None,
        own_ratio=_median(owns),
        loop_cpu_ratio=cpu_pairs.median() if cpu_pairs.n else None,
        loop_cpu_ci=cpu_pairs.interval() if cpu_pairs.n else None,
    )


def size_to_budget(
    name: str,
    device: str,
    env: dict[str, str],
    torchmem_args: list[str],
    probe_scale: float,
    pairs: int,
    budget: float | None,
    loop_seconds: float | None,
) -> dict[str, str]:
    """``env`` with the ``TORCHMEM_BENCH_SCALE`` that makes ``name``'s loop last ``loop_seconds``, or as long
    as ``budget`` seconds leave for ``pairs`` pairs after the probe (one plain and one ``torchmem run`` at
    ``probe_scale``, which also give each side's start-up)."""
    script = str(PROGRAMS_DIR / f"{name}.py")
    prog_argv = [script, "--device", device]
    probe_env = dict(env, TORCHMEM_BENCH_SCALE=str(probe_scale))
    t0 = time.perf_counter()
    plain = _run_once("plain", -1, [sys.executable, *prog_argv], probe_env, None, "probe")
    tm = _run_once(
        "torchmem",
        -1,
        [sys.executable, "-m", "torchmem", "run", *torchmem_args, *prog_argv],
        probe_env,
        None,
        "",
    )
    probe_s = time.perf_counter() - t0
    if plain.rc != 0 or tm.rc != 0 or not plain.loop_s or tm.loop_s is None:
        print(
            f"  {name}: the probe failed; scale {probe_scale} kept\n    {plain.tail or tm.tail}",
            file=sys.stderr,
        )
        return probe_env
    start_plain = plain.wall_s - plain.loop_s
    start_tm = tm.wall_s - tm.loop_s
    # (the probe's first steps warm up: an over-estimate of a step, on the safe side of the budget)
    per_scale = plain.loop_s / probe_scale
    loop = loop_seconds
    if loop is None:
        assert budget is not None
        loop = ((budget - probe_s) / pairs - start_plain - start_tm) / 2
        if loop < 0.5:
            print(
                f"  {name}: a budget of {budget:.0f} s leaves {loop:.2f} s per loop for {pairs} pairs "
                f"(start-up {start_plain:.1f} s plain, {start_tm:.1f} s torchmem run): loops of 0.5 s",
                file=sys.stderr,
            )
            loop = 0.5
    scale = probe_scale * loop / plain.loop_s
    expect = probe_s + pairs * (start_plain + start_tm + 2 * loop * 1.02)
    print(
        f"  {name}: probe {probe_s:.1f} s (start-up {start_plain:.1f} s plain, {start_tm:.1f} s "
        f"torchmem run; loop {per_scale:.1f} s per unit of scale); scale {scale:.4g}: loops of "
        f"~{loop:.2f} s; expect ~{expect:.0f} s for {pairs} pairs",
        file=sys.stderr,
    )
    return dict(env, TORCHMEM_BENCH_SCALE=f"{scale:.6g}")


def _fmt(x: float | None, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def print_table(header: str, rows: list[Row]) -> None:
    print(header)
    cols = (
        f"{'program':<16} {'device':<6} {'plain s':>8} {'tm s':>8} {'ratio':>6} {'95% interval':>16} "
        f"{'loop plain':>10} {'loop tm':>8} {'loop ratio':>10} {'95% interval':>16} {'loop cpu':>8} "
        f"{'95% interval':>16} {'own':>6} "
        f"{'target':>6} {'met':>3}  verdict"
    )
    print(cols)
    print("-" * len(cols))
    for r in rows:
        # met: the loop's median within the target and its interval's upper end within target + 0.01 (the
        # whole process's ratio where the program prints no loop time)
        fig, ci = (r.loop_ratio, r.loop_ci) if r.loop_ratio is not None else (r.ratio, r.ratio_ci)
        if fig is None:
            met = "n/a"
        else:
            met = "yes" if fig <= r.target and (ci is None or ci[1] <= r.target + 0.01) else "NO"
        print(
            f"{r.program:<16} {r.device:<6} {_fmt(r.plain_s, '8.2f')} {_fmt(r.torchmem_s, '8.2f')} "
            f"{_fmt(r.ratio, '6.3f')} {fmt_interval(r.ratio_ci):>16} {_fmt(r.loop_plain_s, '10.2f')} "
            f"{_fmt(r.loop_torchmem_s, '8.2f')} {_fmt(r.loop_ratio, '10.3f')} {fmt_interval(r.loop_ci):>16} "
            f"{_fmt(r.loop_cpu_ratio, '8.3f')} {fmt_interval(r.loop_cpu_ci):>16} "
            f"{_fmt(r.own_ratio, '6.3f')} {r.target:>6.2f} {met:>3}  {r.verdict}"
        )
    print()
    for r in rows:
        print(f"{r.program}: {r.summary_first or '(no torchmem summary)'}")
        if r.summary_verdict:
            print(f"  {r.summary_verdict}")
        for run in r.runs:
            if run.verdict not in ("quiet", ""):
                flagged = [line for line in run.summary if _LEAK.search(line) or _OOM.search(line)]
                print(f"  pair {run.pair + 1} {run.mode}: {run.verdict}: {' | '.join(flagged) or run.tail}")
            notes = [line for line in run.summary if line.startswith("note: ")]
            if notes and run is r.runs[-1]:
                print("  " + "\n  ".join(notes))


def main() -> int:
    names = sorted(p.stem for p in PROGRAMS_DIR.glob("*.py"))
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available, else cpu)")
    ap.add_argument("--pairs", type=int, default=10, help="interleaved pairs per program (default 10)")
    ap.add_argument("--cpus", default=None, help="CPUs the runs are pinned to (default: the last one)")
    ap.add_argument("--threads", type=int, default=1, help="threads per process (OMP_NUM_THREADS)")
    ap.add_argument("--programs", default=",".join(names), help=f"comma-separated subset of {names}")
    ap.add_argument("--scale", type=float, default=None, help="multiply each program's default steps")
    ap.add_argument("--out", default=None, help="also append the table as JSON lines to this file")
    ap.add_argument("--keep", default=None, help="keep each run's folder (and capture) under this folder")
    ap.add_argument("--torchmem-args", default="", help="options for torchmem run (default: none)")
    ap.add_argument("--budget", type=float, default=None, help="seconds per program, probe and pairs")
    ap.add_argument("--loop-seconds", type=float, default=None, help="size each program's loop to this")
    args = ap.parse_args()

    chosen = [p.strip() for p in args.programs.split(",") if p.strip()]
    unknown = [p for p in chosen if p not in names]
    if unknown:
        ap.error(f"unknown program(s) {unknown}; known: {names}")
    if args.pairs < 1:
        ap.error("--pairs needs at least 1")
    facts = _torch_facts()
    device = args.device or ("cuda" if facts["cuda"] else "cpu")
    if device.startswith("cuda") and not facts["cuda"]:
        ap.error("--device cuda: CUDA is not available")

    # children inherit the affinity and OMP_NUM_THREADS; a GPU run gets 4 CPUs (driver threads, the sampler)
    pinned = pin(args.cpus, args.threads, count=4 if device.startswith("cuda") else 1)
    env = dict(os.environ)
    env["TORCHMEM_BENCH_DEVICE"] = device
    if args.scale is not None:
        env["TORCHMEM_BENCH_SCALE"] = str(args.scale)
    scale = env.get("TORCHMEM_BENCH_SCALE", "1")
    keep = Path(args.keep).resolve() if args.keep else None
    gpu = f", GPU: {facts['gpu']}" if device.startswith("cuda") else ""
    header = (
        f"run_cost — {datetime.date.today()}, CPU: {cpu_name()} ({os.cpu_count()} cores){gpu}, "
        f"torch {facts['torch']}, python {platform.python_version()}, "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, "
        f"{pinned}, scale {scale}, {args.pairs} interleaved pair(s), medians with 95 % intervals"
    )
    print(header, file=sys.stderr)

    tm_args = shlex.split(args.torchmem_args)
    rows = []
    for name in chosen:
        t0 = time.perf_counter()
        penv = env
        if args.budget is not None or args.loop_seconds is not None:
            probe_scale = args.scale if args.scale is not None else 0.05
            penv = size_to_budget(
                name, device, env, tm_args, probe_scale, args.pairs, args.budget, args.loop_seconds
            )
        deadline = t0 + args.budget if args.budget is not None else None
        rows.append(measure(name, device, args.pairs, penv, tm_args, keep, deadline))
        print(
            f"  {name}: {time.perf_counter() - t0:.0f} s (scale {penv.get('TORCHMEM_BENCH_SCALE', '1')})",
            file=sys.stderr,
        )
    print_table(header, rows)
    if args.out:
        with open(args.out, "a", encoding="utf-8") as f:
            f.write(json.dumps({"type": "header", "text": header, "device": device, **facts}) + "\n")
            for r in rows:
                f.write(json.dumps({"type": "row", **asdict(r)}) + "\n")
    failed = any(run.rc != 0 for r in rows for run in r.runs)
    return 1 if failed or any(r.verdict != "quiet" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
