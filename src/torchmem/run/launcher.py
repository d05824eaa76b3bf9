"""Launching a ``torchmem run``: the capture's name (per rank), one session around the program
(:func:`run_session`), the capture finished on SIGTERM/SIGHUP, the HTML report, and ``--nproc``'s launcher
(torchrun's own, one ``torchmem run`` per rank, then the merged report).
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

from torchmem.run.program import Outcome, Program, ProgramNotStarted, RunError, execute
from torchmem.run.summary import print_summary


@dataclass(frozen=True)
class RunOptions:
    """``torchmem run``'s own options (its command line, parsed)."""

    device: Any = None
    output: str | None = None
    html: str | None = None
    interval: float = 0.05
    step_marker: str | None = None
    modules: bool = False
    memory_viz: str | None = None
    warmup: int = 3
    min_growth: int | None = None
    """The device watcher's leak threshold in bytes per step (``None``: its default, 256 KiB)."""
    nproc: int | None = None
    no_status: bool = False
    quiet: bool = False
    force: bool = False


def run_program(args: RunOptions, program_argv: list[str]) -> int:
    """Run ``program_argv`` (a script and its arguments, or ``["-m", MODULE, ...]``) under ``torchmem run``
    with the options ``args``: its exit code."""
    if args.memory_viz is not None:
        _memory_viz_note(sys.stderr)
    err = sys.stderr
    try:
        program = Program(program_argv, err)
    except ProgramNotStarted as exc:
        return exc.exit_code
    if args.nproc is not None:
        return _launch(args, program_argv, program.name, err)
    from torchmem._outputs import process_rank, unique_name
    from torchmem.capture.ranks import STAMP_ENV, rank_info, rank_path

    rank = process_rank()
    stamp = os.environ.get(STAMP_ENV)
    if rank is None and stamp:  # a rank of `torchmem run --nproc 1`: named as its ranks are
        info = rank_info()
        rank = info.rank if info is not None else None
    html, memory_viz = args.html, args.memory_viz
    if args.output is None:
        stem = f"torchmem-{program.name}"
        capture = unique_name(stem, ".jsonl", rank=rank)
        if stamp and rank is not None and not os.path.lexists(f"{stem}-{stamp}-rank{rank}.jsonl"):
            capture = f"{stem}-{stamp}-rank{rank}.jsonl"  # the name the launcher looks for

        def another_name() -> str:
            return unique_name(stem, ".jsonl", rank=rank)

    else:
        # Each rank its own file, also for a path the user gave: never two ranks into one file.
        capture = args.output if rank is None else rank_path(args.output, rank)
        another_name = None  # type: ignore[assignment]
    if rank is not None:
        html = None if html is None else rank_path(html, rank)
        memory_viz = None if memory_viz is None else rank_path(memory_viz, rank)
    return run_session(
        program,
        capture=capture,
        device=args.device,
        html=html,
        interval=args.interval,
        step_marker=args.step_marker,
        modules=args.modules,
        warmup=args.warmup,
        min_growth=args.min_growth,
        status=False if args.no_status else None,
        quiet=args.quiet,
        memory_viz=memory_viz,
        force=args.force,
        another_name=another_name,
    )[0]


def _memory_viz_note(err: TextIO) -> None:
    """--memory-viz records the CUDA allocator's history: without CUDA, say now that nothing will be written
    (once: a rank of ``--nproc`` leaves it to its launcher)."""
    from torchmem.capture.ranks import STAMP_ENV
    from torchmem.devices import cuda_available

    if not cuda_available() and not os.environ.get(STAMP_ENV):
        print(
            "torchmem: note: --memory-viz records the CUDA allocator's history (memory history needs CUDA); "
            "no CUDA device is visible here, so no snapshot will be written.",
            file=err,
        )


def _launch(args: RunOptions, program_argv: list[str], name: str, err: TextIO) -> int:
    """``torchmem run --nproc N``: torchrun's own launcher (``torch.distributed.run``, standalone
    rendezvous) runs N ranks of ``python -m torchmem run ... program``; then the merged report."""
    import time
    import uuid

    from torchmem.capture.ranks import JOB_ENV, STAMP_ENV, OOMFlag, rank_path

    n = int(args.nproc or 0)  # set: run_program launches only with --nproc
    if n < 1:
        raise RunError("--nproc must be at least 1.", "For example --nproc 2.")
    if args.output is not None and "{rank}" not in args.output and os.path.isdir(args.output):
        raise RunError(f"--output {args.output!r} is a folder.", "Give a file name, e.g. -o run.jsonl.")
    try:
        from torch.distributed.run import main as torchrun_main
    except Exception as exc:  # a torch built without distributed support
        raise RunError(
            f"--nproc needs torch.distributed ({type(exc).__name__}: {exc}).",
            "Run the program without --nproc.",
        ) from None
    job, stamp = uuid.uuid4().hex[:12], time.strftime("%Y%m%d-%H%M%S")
    own: list[str] = [
        "--no-status",
        "--quiet",
        "--interval",
        str(args.interval),
        "--warmup",
        str(args.warmup),
        *(("--min-growth", str(args.min_growth)) if args.min_growth is not None else ()),
    ]
    for opt, value in (
        ("--output", args.output),
        ("--device", args.device),
        ("--html", args.html),
        ("--step-marker", args.step_marker),
        ("--memory-viz", args.memory_viz),
    ):
        if value is not None:
            own += [opt, str(value)]
    own += ["--modules"] * bool(args.modules) + ["--force"] * bool(args.force)
    cmd = ["--standalone", f"--nproc_per_node={n}", "-m", "torchmem", "run", *own, "--", *program_argv]
    saved = {k: os.environ.get(k) for k in (JOB_ENV, STAMP_ENV)}
    os.environ[JOB_ENV], os.environ[STAMP_ENV] = job, stamp
    code = 0
    try:
        torchrun_main(cmd)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except Exception as exc:  # torchrun's ChildFailedError: the first failed rank's exit code
        failures = getattr(exc, "failures", None) or {}
        codes = [getattr(f, "exitcode", 1) for f in failures.values()]
        try:  # the root cause (earliest), not the ranks torchrun stopped after it (-15: SIGTERM)
            codes.insert(0, getattr(exc.get_first_failure()[1], "exitcode", 1))  # type: ignore[attr-defined]
        except Exception:
            pass
        code = next((c for c in codes if c), 1)
        if code < 0:  # killed by a signal
            code = 128 - code
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    if args.output is not None:
        captures = [rank_path(args.output, k) for k in range(n)]
    else:
        captures = [f"torchmem-{name}-{stamp}-rank{k}.jsonl" for k in range(n)]
    found = [c for c in captures if os.path.exists(c)]
    folder = os.path.dirname(os.path.abspath(found[0] if found else captures[0]))
    OOMFlag(folder, job).remove()
    if not args.quiet and found:
        try:
            from torchmem.analysis.ranks import merge_captures
            from torchmem.capture.file import read_capture
            from torchmem.report.ranks import write_merged

            merged = merge_captures([read_capture(c) for c in found])
            write_merged(merged, err)
        except Exception as exc:
            print(f"torchmem: the merged report could not be made ({type(exc).__name__}: {exc})", file=err)
        print(f"captures: {' '.join(found)}  ({shlex.join(['torchmem', 'report', *found])})", file=err)
    return code


def run_session(
    program: Program | str,
    argv: list[str] | None = None,
    *,
    capture: str,
    device: Any = None,
    html: str | None = None,
    interval: float = 0.05,
    step_marker: str | None = None,
    modules: bool = False,
    warmup: int = 3,
    min_growth: int | None = None,
    status: bool | None = None,
    quiet: bool = False,
    err: TextIO | None = None,
    memory_viz: str | None = None,
    force: bool = False,
    another_name: Callable[[], str] | None = None,
) -> tuple[int, Any]:
    """Run a program under a monitoring session: its exit code and the session's
    :class:`~torchmem.run.session.SessionResult`.

    ``another_name`` (for a capture name torchmem chose) gives a new name when another process created a file
    of the chosen name first (runs of one program started in the same second).

    ``program`` is a :class:`Program` or a script path (then ``argv`` is its command line). Every output
    is checked before the program starts (nothing is ever written over a file torchmem did not write, nor
    over the program); a program that cannot start (syntax error, missing module) writes no capture.
    """
    from torchmem._outputs import check_output
    from torchmem.run.session import Session

    err = err if err is not None else sys.stderr
    if not isinstance(program, Program):
        program = Program(list(argv) if argv is not None else [program], err)
    protect = program.protect
    outputs = [(capture, "capture"), (html, "html"), (memory_viz, "pickle")]
    given = [(os.path.abspath(p), k) for p, k in outputs if p is not None]
    for a in range(len(given)):
        for b in range(a + 1, len(given)):
            if given[a][0] == given[b][0]:
                raise RunError(
                    f"The {given[a][1]} and the {given[b][1]} outputs are the same file {given[a][0]!r}.",
                    "Give each output its own path.",
                )
    if html is not None:
        check_output(html, "html", force=force, protect=protect)
    if memory_viz is not None:
        check_output(memory_viz, "pickle", force=force, protect=protect)
    from torchmem._outputs import OutputExistsError

    for attempt in range(64):
        try:
            session = Session(
                capture,
                device=device,
                interval=interval,
                status=status,
                step_marker=step_marker,
                modules=modules,
                argv=program.argv,
                status_file=err,
                warmup=warmup,
                min_growth=min_growth,
                memory_viz=memory_viz,
                force=force,
                protect=protect,
            ).start()  # an unusable capture path fails here, before the program runs
            break
        except (OutputExistsError, FileExistsError):
            if another_name is None or attempt == 63:
                raise
            capture = another_name()  # another run took this name a moment ago
    outcome = Outcome(1, "exception", None)
    saved_main: list[Any] = []
    guard = _finish_on_signal(session, capture, html, err, quiet, force)
    try:
        outcome = execute(program, err, saved_main)
    finally:
        with guard.holding():  # a SIGTERM now waits for the capture to be complete, then ends the process
            try:
                result = session.finish(outcome.exit_code, outcome.reason, outcome.exc)
            finally:
                if saved_main and saved_main[0] is not None:
                    sys.modules["__main__"] = saved_main[0]  # the program's namespace goes only now
                saved_main.clear()
            outcome.exc = None
            if not quiet:
                print_summary(result, err)
            if html is not None:
                _write_html(capture, html, err, force)
        guard.remove()
    return outcome.exit_code, result


def _finish_on_signal(
    session: Any, capture: str, html: str | None, err: TextIO, quiet: bool, force: bool
) -> Any:
    """SIGTERM / SIGHUP (a launcher stopping this rank, a closed terminal), where the program leaves them at
    their default: the capture is finished (end record "signal", exit code -N, the summary), then the process
    dies of the signal as it would have without torchmem."""
    from torchmem.capture.signals import SignalGuard

    def on_signal(signum: int) -> None:
        result = session.finish(-signum, "signal", None)
        if not quiet:
            print_summary(result, err)
        if html is not None:
            _write_html(capture, html, err, force)

    return SignalGuard(on_signal).install()


def _write_html(capture: str, html: str, err: TextIO, force: bool) -> None:
    try:
        from torchmem.capture.file import read_capture
        from torchmem.report.html import write_html

        write_html(read_capture(capture), html, force=force)
        print(f"torchmem: HTML report: {html}", file=err)
    except Exception as exc:  # the program's exit code is what matters; say why the report is missing
        print(f"torchmem: the HTML report could not be written ({type(exc).__name__}: {exc})", file=err)
