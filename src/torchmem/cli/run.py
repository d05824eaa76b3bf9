"""``torchmem run [options] script.py [args...]`` (or ``-m module``): run a program under monitoring.

The program runs in this process as ``python script.py args`` would: the same ``sys.argv``, ``__main__``,
``sys.path[0]``, stdout/stderr and exit code. Steps are its optimizer steps (or the returns of the function
named by ``--step-marker``); the timeline is sampled, leaks are watched, an OOM is explained. At the end, a
short summary goes to stderr, the capture file is complete, and ``--html`` writes the report.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import traceback
from dataclasses import dataclass
from typing import Any, TextIO

from torchmem._errors import TorchmemError


class RunError(TorchmemError):
    """``torchmem run`` cannot start the program (not found, not a file, bad options)."""

    exit_code = 2


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "run",
        help="run a Python script (or -m module) under memory monitoring, with no code change",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("-m", dest="module", metavar="MODULE", help="run a library module as a script")
    p.add_argument("--device", "-d", help="device to monitor (default: the current accelerator, else CPU)")
    p.add_argument(
        "--output", "-o", metavar="CAPTURE", help="capture file (default: torchmem-<script>.jsonl here)"
    )
    p.add_argument("--html", metavar="PATH", help="also write the self-contained HTML report there")
    p.add_argument("--interval", type=float, default=0.05, help="timeline sampling period in seconds")
    p.add_argument("--step-marker", metavar="FUNCTION", help="count a step at each return of this function")
    p.add_argument("--modules", action="store_true", help="per-module profile of the second step")
    p.add_argument(
        "--memory-viz",
        metavar="PATH",
        help="CUDA: record allocator history, write the snapshot pickle pytorch.org/memory_viz opens",
    )
    p.add_argument("--warmup", type=int, default=3, help="steps the leak detector ignores at the start")
    p.add_argument("--no-status", action="store_true", help="no live status line, even on a terminal")
    p.add_argument("--quiet", "-q", action="store_true", help="no summary at the end")
    p.add_argument("argv", nargs=argparse.REMAINDER, metavar="script.py [args]", help="the program")


@dataclass
class Outcome:
    exit_code: int
    reason: str
    exc: BaseException | None


def _target(args: argparse.Namespace) -> tuple[str, list[str], str]:
    """(what to run, its sys.argv, a short name for files)."""
    argv = list(args.argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if args.module:
        return args.module, [args.module, *argv], args.module.rsplit(".", 1)[-1]
    if not argv:
        raise RunError(
            "No script to run.", "Usage: torchmem run [options] script.py [args...] (or -m module)."
        )
    script = argv[0]
    if not os.path.exists(script):
        raise RunError(
            f"Script not found: {script!r}.", "Check the path (it is relative to the current directory)."
        )
    if os.path.isdir(script) and not os.path.exists(os.path.join(script, "__main__.py")):
        raise RunError(
            f"{script!r} is a directory without __main__.py.",
            "Name a .py file or a package with __main__.py.",
        )
    name = os.path.splitext(os.path.basename(os.path.normpath(script)))[0]
    return script, argv, name


def execute(target: str, argv: list[str], module: bool, err: TextIO) -> Outcome:
    """Run the program in this process like ``python`` would; return its exit code and how it ended."""
    saved_argv, saved_path0 = sys.argv, sys.path[0] if sys.path else None
    sys.argv = list(argv)
    if not module:
        path0 = os.path.dirname(os.path.abspath(target))
        if sys.path:
            sys.path[0] = path0
        else:
            sys.path.append(path0)
    try:
        if module:
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(target, run_name="__main__")
        return Outcome(0, "exit", None)
    except SystemExit as e:
        code = e.code
        if code is None:
            return Outcome(0, "exit", None)
        if isinstance(code, int):
            return Outcome(code, "exit", None)
        print(code, file=err)
        return Outcome(1, "exit", None)
    except KeyboardInterrupt as e:
        _print_exception(e, target, err)
        return Outcome(130, "keyboard_interrupt", e)
    except BaseException as e:  # the program's own error: printed as Python would, exit code 1
        _print_exception(e, target, err)
        return Outcome(1, "exception", e)
    finally:
        sys.argv = saved_argv
        if saved_path0 is not None and sys.path:
            sys.path[0] = saved_path0


def _print_exception(e: BaseException, target: str, err: TextIO) -> None:
    """The traceback Python would print, without torchmem's and runpy's frames."""
    tb = e.__traceback__
    here = (
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        os.path.dirname(runpy.__file__),
        "<frozen runpy>",
    )
    while tb is not None and tb.tb_frame.f_code.co_filename.startswith(here):
        tb = tb.tb_next
    traceback.print_exception(type(e), e, tb if tb is not None else e.__traceback__, file=err)


def run(args: argparse.Namespace) -> int:
    target, argv, name = _target(args)
    if args.interval <= 0:
        raise RunError("--interval must be positive.", "For example --interval 0.05.")
    capture = args.output or f"torchmem-{name}.jsonl"
    return run_session(
        target,
        argv,
        module=bool(args.module),
        capture=capture,
        device=args.device,
        html=args.html,
        interval=args.interval,
        step_marker=args.step_marker,
        modules=args.modules,
        warmup=args.warmup,
        status=False if args.no_status else None,
        quiet=args.quiet,
        memory_viz=args.memory_viz,
    )[0]


def run_session(
    target: str,
    argv: list[str],
    *,
    module: bool = False,
    capture: str,
    device: Any = None,
    html: str | None = None,
    interval: float = 0.05,
    step_marker: str | None = None,
    modules: bool = False,
    warmup: int = 3,
    status: bool | None = None,
    quiet: bool = False,
    err: TextIO | None = None,
    memory_viz: str | None = None,
) -> tuple[int, Any]:
    """Run a program under a monitoring session: its exit code and the session's
    :class:`~torchmem.capture.session.SessionResult`."""
    from torchmem.capture.session import Session

    err = err if err is not None else sys.stderr
    if html is not None:
        _check_writable(html)
    if memory_viz is not None:
        _check_writable(memory_viz)
    session = Session(
        capture,
        device=device,
        interval=interval,
        status=status,
        step_marker=step_marker,
        modules=modules,
        argv=argv,
        status_file=err,
        warmup=warmup,
        memory_viz=memory_viz,
    ).start()  # an unwritable capture path fails here, before the program runs
    outcome = Outcome(1, "exception", None)
    try:
        outcome = execute(target, argv, module, err)
    finally:
        result = session.finish(outcome.exit_code, outcome.reason, outcome.exc)
        outcome.exc = None
        if not quiet:
            _summary(result, err)
        if html is not None:
            _write_html(capture, html, err)
    return outcome.exit_code, result


def _check_writable(path: str) -> None:
    d = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(d):
        raise RunError(f"Cannot write {path!r}: the directory {d!r} does not exist.", "Create it first.")
    if not os.access(d, os.W_OK):
        raise RunError(f"Cannot write {path!r}: no permission in {d!r}.", "Choose another path.")


def _summary(result: Any, err: TextIO) -> None:
    from torchmem._format import fmt_bytes

    lines = [
        f"torchmem: {result.steps} steps in {result.seconds:.1f} s, peak allocated "
        f"{fmt_bytes(result.peak_allocated)}"
        + (f", peak reserved {fmt_bytes(result.peak_reserved)}" if result.peak_reserved is not None else "")
        + f"; ended by {result.reason}"
        + (f" (exit code {result.exit_code})" if result.exit_code else "")
    ]
    leak = result.leak
    if leak is not None and (leak.leaking or leak.detected_at is not None):
        lines.append(str(leak))
    elif leak is not None and result.steps:
        lines.append(f"no leak: {leak.reason}")
    if result.oom is not None:
        lines.append(str(result.oom))
    lines.append(f"capture: {result.capture}  (torchmem report {result.capture} --html report.html)")
    print("\n".join(lines), file=err)


def _write_html(capture: str, html: str, err: TextIO) -> None:
    try:
        from torchmem.capture.file import read_capture
        from torchmem.report.html import write_html

        write_html(read_capture(capture), html)
        print(f"torchmem: HTML report: {html}", file=err)
    except Exception as exc:  # the program's exit code is what matters; say why the report is missing
        print(f"torchmem: the HTML report could not be written ({type(exc).__name__}: {exc})", file=err)
