"""The ``torchmem`` command line: one module per command, ``main(argv) -> int``.

Errors map to exit codes here and only here (the table is in docs/report.md, "Exit codes"):

* ``0``: done; the command's answer is yes (``estimate``: it fits; ``lint``: nothing found);
* ``1``: ``lint`` found problems; an optional package is missing (``--plot``, ``--serve``); another
  torchmem error;
* ``2``: the command line is wrong: an unknown option, a bad value (the message names the option), options
  that do not go together, a script, model, device or port that cannot be used (argparse, :class:`UsageError`,
  and the API's argument errors met through a command);
* ``3``: a capture or output file cannot be read or written (:class:`~torchmem.TorchmemError` subclasses
  with ``exit_code = 3``); also the "no" of ``estimate`` (does not fit) and ``explain`` (no OOM message);
* ``130``: Ctrl-C. ``torchmem run`` exits with the program's own exit code.

A :class:`~torchmem.TorchmemError` prints its message and hint. ``torchmem --version`` and ``--help`` import
no command module (so no torch): the commands' one-line help is in :data:`HELP`.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import Any

from torchmem._errors import TorchmemError
from torchmem._units import parse_size

USAGE = 2
"""The exit code of a wrong command line."""

# Command -> its module, imported when the command runs: `torchmem lint` must not import torch, which the
# other commands' modules do, and `torchmem --version` / `--help` import none of them.
_COMMANDS: dict[str, Any] = {
    "stats": "torchmem.cli.stats",
    "explain": "torchmem.cli.explain",
    "run": "torchmem.cli.run",
    "report": "torchmem.cli.report",
    "demo": "torchmem.cli.demo",
    "estimate": "torchmem.cli.estimate",
    "lint": "torchmem.cli.lint",
}

HELP = {
    "stats": "memory figures and the nvidia-smi reconciliation per device",
    "explain": "explain an out-of-memory message: every field, the likely causes, the fixes",
    "run": "run a Python script (or -m module) under memory monitoring, with no code change",
    "report": "summarise a capture file (torchmem run); write an HTML report or a PNG timeline",
    "demo": "see torchmem find a real leak in a small training script, then the fix",
    "estimate": "will a model fit on a GPU: a device-free estimate (fake tensors) of its peak memory",
    "lint": "find memory anti-patterns in PyTorch source (static; no torch needed)",
}
"""Each command's line in ``torchmem --help``: the text its module's ``add_parser`` gives (a test checks)."""

# Errors of the API that mean a wrong argument when a command line gave it (exit 2, not their own 1).
_ARGUMENT_ERRORS = frozenset({"torchmem.analysis.estimate.FitArgumentError"})


class UsageError(TorchmemError):
    """The command line cannot be carried out as given: a bad option value, options that do not go together,
    captures that are not of one job."""

    exit_code = USAGE


# -- option types: a bad value is argparse's error (exit 2), naming the option ----------------------------


def int_at_least(low: int) -> Callable[[str], int]:
    """An argparse ``type`` for an integer of at least ``low``: ``--warmup -5`` ->
    ``argument --warmup: must be 0 or more, not -5``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, not {text!r}") from None
        if value < low:
            want = "a positive integer" if low == 1 else f"{low} or more"
            raise argparse.ArgumentTypeError(f"must be {want}, not {value}")
        return value

    parse.__name__ = "int"
    return parse


def positive_number(text: str) -> float:
    """An argparse ``type`` for a number above 0 (seconds, intervals)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, not {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, not {text}")
    return value


def positive_size(text: str) -> int:
    """An argparse ``type`` for a size in bytes above 0 (``4KiB``, ``0.5MiB``, ``2048``)."""
    size = parse_size(text)
    if size is None or size <= 0:
        raise argparse.ArgumentTypeError(f"a positive size such as 4KiB or 2048 bytes, not {text!r}")
    return size


def port_number(text: str) -> int:
    """An argparse ``type`` for a TCP port (0: any free port)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, not {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"needs a port number (0-65535), not {value}")
    return value


# -- the parser -------------------------------------------------------------------------------------------


def _command(name: str) -> Any:
    mod = _COMMANDS[name]
    if isinstance(mod, str):
        mod = _COMMANDS[name] = importlib.import_module(mod)
    return mod


def _parser(only: str | None = None) -> argparse.ArgumentParser:
    from torchmem._version import __version__

    p = argparse.ArgumentParser(
        prog="torchmem",
        description="Answers PyTorch device-memory questions: where it went, who holds it.",
        epilog="Exit codes: 0 done, 1 lint findings or another error, 2 a wrong command line, 3 a capture "
        "or output file problem (estimate: does not fit; explain: no OOM found), 130 Ctrl-C; "
        "torchmem run exits with the program's code.",
    )
    p.add_argument("--version", action="version", version=f"torchmem {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMANDS:
        if name == only:
            _command(name).add_parser(sub)
        else:  # listed in the help, its module not imported
            sub.add_parser(name, help=HELP[name], add_help=False)
    return p


def _subparser(parser: argparse.ArgumentParser, command: str | None) -> argparse.ArgumentParser | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            return action.choices[command]  # type: ignore[no-any-return]
    return None


def exit_code(exc: TorchmemError) -> int:
    """The exit code of a :class:`~torchmem.TorchmemError` that ends a command."""
    names = {f"{c.__module__}.{c.__qualname__}" for c in type(exc).__mro__}
    return USAGE if names & _ARGUMENT_ERRORS else int(exc.exit_code)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI with ``argv`` (default ``sys.argv[1:]``) and return the exit code."""
    raw = list(argv) if argv is not None else sys.argv[1:]
    program: list[str] | None = None
    cmd_at = next((i for i, a in enumerate(raw) if not a.startswith("-")), None)
    command = raw[cmd_at] if cmd_at is not None and raw[cmd_at] in _COMMANDS else None
    parser = _parser(command)  # only that command's module is imported
    if cmd_at is not None and raw[cmd_at] == "run":  # the program's own options are not torchmem's
        own, program = _command("run").split_argv(raw[cmd_at + 1 :])
        raw = [*raw[: cmd_at + 1], *own]
    try:
        args, extra = parser.parse_known_args(raw)
        if extra:  # said by the command's own parser, with its own usage line
            sub = _subparser(parser, getattr(args, "command", None))
            (sub or parser).error(f"unrecognized arguments: {' '.join(extra)}")
        if program is not None:
            args.argv = program
    except SystemExit as exc:  # argparse: --help, --version, usage errors
        return int(exc.code) if isinstance(exc.code, int) else USAGE
    if args.command is None:
        parser.print_help(sys.stdout)
        return 0
    try:
        return int(_command(args.command).run(args))
    except TorchmemError as exc:
        print(f"torchmem: error: {exc.message}", file=sys.stderr)
        if exc.hint:
            print(f"hint: {exc.hint}", file=sys.stderr)
        return exit_code(exc)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())
