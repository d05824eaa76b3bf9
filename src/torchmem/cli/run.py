"""``torchmem run [options] script.py [args...]`` (or ``-m module``): run a program under monitoring.

The program runs in this process as ``python script.py args`` would: the same ``sys.argv``, ``__main__``,
``sys.path[0]``, stdout/stderr and exit code. Steps are its optimizer steps (or the returns of the function
named by ``--step-marker``); the timeline is sampled, leaks are watched, an OOM is explained. At the end, a
short summary goes to stderr, the capture file is complete, and ``--html`` writes the report.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from torchmem.cli import int_at_least, positive_number, positive_size
from torchmem.run.program import RunError

# Options of ``torchmem run`` that take a value; everything after the program belongs to the program.
_VALUE_OPTIONS = {
    "-m",
    "--device",
    "-d",
    "--output",
    "-o",
    "--html",
    "--interval",
    "--step-marker",
    "--memory-viz",
    "--warmup",
    "--min-growth",
    "--nproc",
}
_FLAG_OPTIONS = {"--modules", "--no-status", "--quiet", "-q", "--force", "-f", "--help", "-h"}

USAGE = "torchmem run [options] script.py [args ...]\n       torchmem run [options] -m module [args ...]"


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "run",
        help="run a Python script (or -m module) under memory monitoring, with no code change",
        description=__doc__,
        usage=USAGE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Everything after the script (or -m module) is the program's own command line, "
        "as with python.",
    )
    p.add_argument("-m", dest="module", metavar="MODULE", help="run a library module as a script")
    p.add_argument("--device", "-d", help="device to monitor (default: the current accelerator, else CPU)")
    p.add_argument(
        "--output",
        "-o",
        metavar="CAPTURE",
        help="capture file (default: a new torchmem-<program>-<date>-<time>[-rank<k>].jsonl here)",
    )
    p.add_argument("--html", metavar="PATH", help="also write the self-contained HTML report there")
    p.add_argument(
        "--force",
        "-f",
        action="store_true",
        help="replace output files torchmem wrote before (never any other file)",
    )
    p.add_argument(
        "--interval", type=positive_number, default=0.05, help="timeline sampling period in seconds"
    )
    p.add_argument("--step-marker", metavar="FUNCTION", help="count a step at each return of this function")
    p.add_argument("--modules", action="store_true", help="per-module profile of the second step")
    p.add_argument(
        "--memory-viz",
        metavar="PATH",
        help="CUDA: record allocator history, write the snapshot pickle pytorch.org/memory_viz opens",
    )
    p.add_argument(
        "--warmup", type=int_at_least(0), default=3, help="steps the leak detector ignores at the start"
    )
    p.add_argument(
        "--min-growth",
        type=positive_size,
        metavar="SIZE",
        help="report device growth from this many bytes per step as a leak (default 256KiB; e.g. 4KiB, 2048)",
    )
    p.add_argument(
        "--nproc",
        type=int_at_least(1),
        metavar="N",
        help="launch N ranks on this machine with torchrun (torch.distributed.run --standalone), each "
        "under torchmem with its own capture (...rank<k>.jsonl), then print the merged report",
    )
    p.add_argument("--no-status", action="store_true", help="no live status line, even on a terminal")
    p.add_argument("--quiet", "-q", action="store_true", help="no summary at the end")
    p.set_defaults(argv=[])


def split_argv(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Split ``torchmem run``'s command line into (its own options, the program's command line).

    As with ``python``: the program starts at the first argument that is not an option of ``torchmem run``
    (the script), or right after ``-m MODULE``, or after ``--``; everything from there is the program's,
    options included. For ``-m``, the program's part starts with ``["-m", MODULE]``.
    """
    own: list[str] = []
    i = 0
    argv = list(argv)
    while i < len(argv):
        a = argv[i]
        if a == "--":
            return own, argv[i + 1 :]
        if a == "-m" or (a.startswith("-m") and not a.startswith("--")):
            module = a[2:] if len(a) > 2 else (argv[i + 1] if i + 1 < len(argv) else None)
            rest = argv[i + (1 if len(a) > 2 else 2) :]
            if module is None:
                return [*own, "-m"], []
            return own, ["-m", module, *rest]
        if not a.startswith("-") or a == "-":
            return own, argv[i:]
        name = a.split("=", 1)[0]
        if name in _VALUE_OPTIONS and "=" not in a:
            own += argv[i : i + 2]
            i += 2
            continue
        if len(a) > 2 and not a.startswith("--") and a[:2] in _VALUE_OPTIONS:  # -oFILE, -dcuda:0
            own.append(a)
            i += 1
            continue
        own.append(a)  # a flag, --opt=value, or an unknown option (argparse says so)
        i += 1
    return own, []


def run(args: argparse.Namespace) -> int:
    if args.interval <= 0:
        raise RunError("--interval must be positive.", "For example --interval 0.05.")
    from torchmem.run.launcher import RunOptions, run_program

    program_argv = list(args.argv)  # ["-m", MODULE, ...] for a module (cli.main splits the command line)
    if args.module:  # `-m` given to argparse itself: a Namespace built without cli.main's split
        program_argv = ["-m", args.module, *program_argv]
    options = RunOptions(
        device=args.device,
        output=args.output,
        html=args.html,
        interval=args.interval,
        step_marker=args.step_marker,
        modules=args.modules,
        memory_viz=args.memory_viz,
        warmup=args.warmup,
        min_growth=args.min_growth,
        nproc=getattr(args, "nproc", None),
        no_status=args.no_status,
        quiet=args.quiet,
        force=args.force,
    )
    return run_program(options, program_argv)
