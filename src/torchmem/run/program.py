"""The program ``torchmem run`` runs: resolved and compiled before monitoring starts, run in this process as
``python script.py args`` (or ``python -m module``) would run it: the same ``sys.argv``, ``__main__``,
``sys.path[0]``, stdout/stderr and exit code; its uncaught error printed as Python prints it, without
torchmem's frames.
"""

from __future__ import annotations

import builtins
import os
import runpy
import sys
import traceback
import types
import zipfile
from dataclasses import dataclass
from typing import Any, NoReturn, TextIO

from torchmem._errors import TorchmemError
from torchmem._warn import TORCHMEM_DIR, module_dir


class RunError(TorchmemError):
    """``torchmem run`` cannot start the program (not found, not a file, bad options)."""

    exit_code = 2


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
