"""``torchmem run [options] script.py [args...]`` (or ``-m module``): run a program under monitoring.

The program runs in this process as ``python script.py args`` would: the same ``sys.argv``, ``__main__``,
``sys.path[0]``, stdout/stderr and exit code. Steps are its optimizer steps (or the returns of the function
named by ``--step-marker``); the timeline is sampled, leaks are watched, an OOM is explained. At the end, a
short summary goes to stderr, the capture file is complete, and ``--html`` writes the report.
"""

from __future__ import annotations

import argparse
import builtins
import os
import runpy
import shlex
import sys
import traceback
import types
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn, TextIO

from torchmem._errors import TorchmemError
from torchmem._warn import TORCHMEM_DIR, module_dir
from torchmem.cli import int_at_least, positive_number


class RunError(TorchmemError):
    """``torchmem run`` cannot start the program (not found, not a file, bad options)."""

    exit_code = 2


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


@dataclass
class Outcome:
    exit_code: int
    reason: str
    exc: BaseException | None


class Program:
    """The program to run, resolved and compiled before monitoring starts, as ``python`` would.

    A script is compiled from its absolute path (as ``__file__`` and tracebacks show it), its folder
    (symlinks resolved) goes first on ``sys.path``; a module is found with the current folder first on
    ``sys.path`` and compiled from its spec. A syntax error or a missing module is printed exactly as
    Python prints it (:class:`ProgramNotStarted`), and no capture is written for a run that never started.
    """

    def __init__(self, argv: list[str], err: TextIO) -> None:
        self.err = err
        self.module: str | None = None
        self.spec: Any = None
        self.code: Any = None
        self.runpy_path: str | None = None  # a folder or zip with __main__.py: runpy runs it
        if argv[:1] == ["-m"]:
            self._init_module(argv[1], argv[2:])
        else:
            self._init_script(argv)

    def _init_script(self, argv: list[str]) -> None:
        if not argv:
            raise RunError(
                "No script to run.", "Usage: torchmem run [options] script.py [args...] (or -m module)."
            )
        script = argv[0]
        if not os.path.exists(script):
            raise RunError(
                f"Script not found: {script!r}.", "Check the path (it is relative to the current directory)."
            )
        self.path = os.path.abspath(script)
        self.name = os.path.splitext(os.path.basename(os.path.normpath(script)))[0]
        self.argv = list(argv)
        self.path0 = os.path.dirname(os.path.realpath(script))
        if os.path.isdir(script) or zipfile.is_zipfile(script):
            main = os.path.join(script, "__main__.py")
            if os.path.isdir(script) and not os.path.exists(main):
                raise RunError(
                    f"{script!r} is a directory without __main__.py.",
                    "Name a .py file or a package with __main__.py.",
                )
            self.runpy_path = script
            self.path0 = script
            return
        try:
            with open(script, "rb") as f:
                source = f.read()
        except OSError as exc:
            raise RunError(f"Cannot read {script!r}: {exc.strerror or exc}.", "Check the file.") from None
        try:
            self.code = compile(source, self.path, "exec", dont_inherit=True)
        except (SyntaxError, ValueError) as exc:  # ValueError: null bytes in the source
            _print_plain(exc, self.err)
            raise ProgramNotStarted(1) from None

    def _init_module(self, name: str, args: list[str]) -> None:
        self.module = name
        self.name = name.rsplit(".", 1)[-1]
        self.path0 = os.getcwd()
        saved = list(sys.path)
        sys.path.insert(0, self.path0)
        try:
            spec = self._find(name)
            if spec.submodule_search_locations is not None:  # a package: its __main__, as python -m
                main_name = name + ".__main__"
                main_spec = self._find(main_name, package=name)
                spec = main_spec
            loader = spec.loader
            if loader is None or not hasattr(loader, "get_code"):
                self._no_module(f"No code object available for {name}")
            try:
                code = loader.get_code(spec.name)
            except SyntaxError as exc:
                _print_plain(exc, self.err)
                raise ProgramNotStarted(1) from None
            except ImportError as exc:
                self._no_module(
                    f"Error while finding module specification for {name!r} ({type(exc).__name__}: {exc})"
                )
            if code is None:
                self._no_module(f"No code object available for {name}")
        finally:
            sys.path[:] = saved
        self.spec = spec
        self.code = code
        self.path = spec.origin or name
        self.argv = [self.path, *args]

    def _find(self, name: str, package: str | None = None) -> Any:
        import importlib.util

        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, AttributeError, TypeError, ValueError) as exc:
            if package is not None:
                self._no_module(
                    f"No module named {name}; {package!r} is a package and cannot be directly executed"
                )
            self._no_module(
                f"Error while finding module specification for {name!r} ({type(exc).__name__}: {exc})"
            )
        if spec is None:
            if package is not None:
                self._no_module(
                    f"No module named {name}; {package!r} is a package and cannot be directly executed"
                )
            self._no_module(f"No module named {name}")
        return spec

    def _no_module(self, text: str) -> NoReturn:
        print(f"torchmem run: {text}", file=self.err)
        raise ProgramNotStarted(1)

    @property
    def protect(self) -> list[str]:
        """Files that must never be outputs: the script (or the module's source)."""
        return [self.path] if self.path and os.path.exists(self.path) else []


class ProgramNotStarted(Exception):
    """The program could not start (its error is already printed, as Python prints it)."""

    def __init__(self, exit_code: int) -> None:
        super().__init__(exit_code)
        self.exit_code = exit_code


def execute(program: Program, err: TextIO, restore_main: list[Any] | None = None) -> Outcome:
    """Run the program in this process like ``python`` would; return its exit code and how it ended.

    With ``restore_main`` (a list), the program's ``__main__`` stays in ``sys.modules`` when it ends, and the
    module it replaced is appended to the list: the caller puts it back once the session has looked at
    what the program left alive (the loop's survivors, named ``__main__.x`` as the program knows them).
    """
    saved_argv, saved_path = sys.argv, list(sys.path)
    saved_main = sys.modules.get("__main__")
    if restore_main is not None:
        restore_main.append(saved_main)
    sys.argv = list(program.argv)
    if sys.path:
        sys.path[0] = program.path0
    else:
        sys.path.append(program.path0)
    try:
        if program.runpy_path is not None:
            runpy.run_path(program.runpy_path, run_name="__main__")
        else:
            main = types.ModuleType("__main__")
            g = main.__dict__
            g["__builtins__"] = builtins
            if program.spec is not None:
                spec = program.spec
                g.update(
                    __file__=spec.origin,
                    __cached__=spec.cached,
                    __loader__=spec.loader,
                    __spec__=spec,
                    __package__=spec.parent,
                )
            else:
                from importlib.machinery import SourceFileLoader

                g.update(
                    __file__=program.path,
                    __cached__=None,
                    __loader__=SourceFileLoader("__main__", program.path),
                    __spec__=None,
                    __package__=None,
                )
            sys.modules["__main__"] = main
            exec(program.code, g)
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
        _print_exception(e, program, err)
        return Outcome(130, "keyboard_interrupt", e)
    except BaseException as e:  # the program's own error: printed as Python would, exit code 1
        _print_exception(e, program, err)
        return Outcome(1, "exception", e)
    finally:
        sys.argv = saved_argv
        sys.path[:] = saved_path
        if saved_main is not None and restore_main is None:
            sys.modules["__main__"] = saved_main


def _print_plain(exc: BaseException, err: TextIO) -> None:
    """A syntax error as Python prints one for the main script: no traceback, the line and the caret."""
    err.write("".join(traceback.format_exception_only(type(exc), exc)))
    err.flush()


_RUNNER_FILES = (os.path.dirname(runpy.__file__), "<frozen runpy>", "<frozen importlib")


def _is_glue(filename: str, torch_dir: str | None) -> bool:
    """torch frames that only exist because torchmem's dispatch mode or wrappers sit on the call path."""
    if torch_dir is None or not filename.startswith(torch_dir + os.sep):
        return False
    rel = filename[len(torch_dir) + 1 :].replace(os.sep, "/")
    return rel in ("_compile.py", "_ops.py", "utils/_python_dispatch.py", "overrides.py") or rel.startswith(
        "_dynamo/"
    )


def user_traceback(tb: types.TracebackType | None, program_file: str | None) -> types.TracebackType | None:
    """``tb`` without torchmem's frames: the runner at the top, and the dispatch-mode frames torchmem puts
    between a torch op and the user's line (with the torch glue around them). What is left is the
    traceback plain ``python`` prints for the same error."""
    entries: list[types.TracebackType] = []
    while tb is not None:
        entries.append(tb)
        tb = tb.tb_next
    names = [e.tb_frame.f_code.co_filename for e in entries]
    own = [(n.startswith(TORCHMEM_DIR + os.sep) and n != program_file) for n in names]
    keep = [True] * len(entries)
    # the runner: torchmem's cli, runpy, importlib at the top
    i = 0
    while i < len(entries) and (own[i] or names[i].startswith(_RUNNER_FILES)):
        keep[i] = False
        i += 1
    tdir = module_dir("torch")
    for j in range(i, len(entries)):
        if not own[j]:
            continue
        keep[j] = False
        k = j - 1
        while k >= i and _is_glue(names[k], tdir):
            keep[k] = False
            k -= 1
        k = j + 1
        while k < len(entries) and _is_glue(names[k], tdir):
            keep[k] = False
            k += 1
    kept = [e for e, ok in zip(entries, keep) if ok]
    if not kept:
        return entries[-1] if entries else None
    out: types.TracebackType | None = None
    for e in reversed(kept):
        out = types.TracebackType(out, e.tb_frame, e.tb_lasti, e.tb_lineno)
    return out


def _print_exception(e: BaseException, program: Program, err: TextIO) -> None:
    """The traceback Python would print, without torchmem's frames (also in chained exceptions).

    A ``sys.excepthook`` the program installed is called, as Python calls it for an uncaught error.
    """
    seen: set[int] = set()
    stack: list[BaseException] = [e]
    while stack:
        x = stack.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        try:
            x.__traceback__ = user_traceback(x.__traceback__, program.path)
        except Exception:  # a traceback we cannot rebuild is printed as it is
            pass
        stack += [c for c in (x.__cause__, x.__context__) if c is not None]
        stack += [c for c in getattr(x, "exceptions", ()) if isinstance(c, BaseException)]
    hook = sys.excepthook
    if hook is not sys.__excepthook__ and err is sys.stderr:
        try:
            hook(type(e), e, e.__traceback__)
            return
        except Exception:
            pass
    traceback.print_exception(type(e), e, e.__traceback__, file=err)


def run(args: argparse.Namespace) -> int:
    if args.interval <= 0:
        raise RunError("--interval must be positive.", "For example --interval 0.05.")
    if args.memory_viz is not None:
        _memory_viz_note(sys.stderr)
    program_argv = list(args.argv)  # ["-m", MODULE, ...] for a module (cli.main splits the command line)
    if args.module:  # `-m` given to argparse itself: a Namespace built without cli.main's split
        program_argv = ["-m", args.module, *program_argv]
    err = sys.stderr
    try:
        program = Program(program_argv, err)
    except ProgramNotStarted as exc:
        return exc.exit_code
    if getattr(args, "nproc", None) is not None:
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


def _launch(args: argparse.Namespace, program_argv: list[str], name: str, err: TextIO) -> int:
    """``torchmem run --nproc N``: torchrun's own launcher (``torch.distributed.run``, standalone
    rendezvous) runs N ranks of ``python -m torchmem run ... program``; then the merged report."""
    import time
    import uuid

    from torchmem.capture.ranks import JOB_ENV, STAMP_ENV, OOMFlag, rank_path

    n = int(args.nproc)
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
    status: bool | None = None,
    quiet: bool = False,
    err: TextIO | None = None,
    memory_viz: str | None = None,
    force: bool = False,
    another_name: Callable[[], str] | None = None,
) -> tuple[int, Any]:
    """Run a program under a monitoring session: its exit code and the session's
    :class:`~torchmem.capture.session.SessionResult`.

    ``another_name`` (for a capture name torchmem chose) gives a new name when another process created a file
    of the chosen name first (runs of one program started in the same second).

    ``program`` is a :class:`Program` or a script path (then ``argv`` is its command line). Every output
    is checked before the program starts (nothing is ever written over a file torchmem did not write, nor
    over the program); a program that cannot start (syntax error, missing module) writes no capture.
    """
    from torchmem._outputs import check_output
    from torchmem.capture.session import Session

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
                _summary(result, err)
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
            _summary(result, err)
        if html is not None:
            _write_html(capture, html, err, force)

    return SignalGuard(on_signal).install()


def _ended(reason: str, exit_code: int | None) -> str:
    if reason == "signal" and exit_code is not None and exit_code < 0:
        from torchmem.results.ranks import signal_name

        return signal_name(-exit_code)  # "ended by SIGTERM (exit code -15)"
    return reason


def _summary(result: Any, err: TextIO) -> None:
    from torchmem._format import fmt_bytes

    lines = [
        f"torchmem: {result.steps} steps in {result.seconds:.1f} s, peak allocated "
        f"{fmt_bytes(result.peak_allocated)}"
        + (f", peak reserved {fmt_bytes(result.peak_reserved)}" if result.peak_reserved is not None else "")
        + f"; ended by {_ended(result.reason, result.exit_code)}"
        + (f" (exit code {result.exit_code})" if result.exit_code else "")
    ]
    leak = result.leak
    no_steps = getattr(result, "no_steps", None)
    children = getattr(result, "children", ())
    if leak is not None and (leak.leaking or leak.detected_at is not None or result.steps):
        lines.append(str(leak))
    forecast = getattr(result, "forecast", None)
    if forecast is not None:
        lines.append(f"  forecast: {forecast}")
    survivors = getattr(result, "survivors", None)
    if survivors is not None and survivors.leaking and not (leak is not None and leak.leaking):
        lines.append(str(survivors))  # a loop too short for a verdict, whose leak is still named
    host = getattr(result, "host_leak", None)
    if host is not None and (host.leaking or host.stopped_at is not None):
        lines.append(str(host))
    if no_steps:
        from torchmem.results.leaks import no_steps_text

        lines.append(no_steps_text(leak, no_steps))
    followed = tuple(getattr(result, "child_captures", ()) or ())
    if followed and not no_steps:
        lines.append(
            f"note: the program started {len(children)} process{'es' if len(children) > 1 else ''} "
            f"({', '.join(children[:3])}); {len(followed)} recorded their own capture: "
            f"{', '.join(followed[:4])}{', ...' if len(followed) > 4 else ''}; merged: "
            f"{shlex.join(['torchmem', 'report', *[result.capture, *followed][:6]])}"
        )
    elif children and not no_steps:
        lines.append(
            f"note: the program started {len(children)} process{'es' if len(children) > 1 else ''} "
            f"({', '.join(children[:3])}); "
            "their memory is not in this capture."
        )
    caught = list(getattr(result, "caught_ooms", ()))
    if caught:
        # The most telling one: a retry that ran out of memory while the failed attempt was still alive.
        shown = next((e for e in caught if e.kind == "pinned_by_exception"), caught[0])
        sites = sorted({e.site for e in caught if e.site})
        lines.append(
            f"{len(caught)} out-of-memory error{'s' if len(caught) > 1 else ''} caught by the program"
            + (f" (raised at {', '.join(sites[:3])})" if sites else "")
            + f"; OOM #{shown.index} at {shown.site or 'an unknown line'}:"
        )
        if shown.diagnosis is not None:
            lines.extend("  " + x for x in str(shown.diagnosis).splitlines())
        if len(caught) > 1:
            lines.append(
                f"  every one is in the capture: {shlex.join(['torchmem', 'report', result.capture])}"
            )
    if result.oom is not None:
        lines.append(str(result.oom))
    gpus = getattr(result, "gpus", None)
    if gpus is not None and (gpus.several or gpus.findings or gpus.children):
        lines.extend(gpus.lines())
    overhead = getattr(result, "overhead", None)
    if overhead:
        lines.append(f"note: {overhead}")
    again = shlex.join(["torchmem", "report", result.capture, "--html", "report.html"])
    lines.append(f"capture: {result.capture}  ({again})")
    print("\n".join(lines), file=err)


def _write_html(capture: str, html: str, err: TextIO, force: bool) -> None:
    try:
        from torchmem.capture.file import read_capture
        from torchmem.report.html import write_html

        write_html(read_capture(capture), html, force=force)
        print(f"torchmem: HTML report: {html}", file=err)
    except Exception as exc:  # the program's exit code is what matters; say why the report is missing
        print(f"torchmem: the HTML report could not be written ({type(exc).__name__}: {exc})", file=err)
