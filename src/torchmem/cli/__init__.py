"""The ``torchmem`` command line: one module per command, ``main(argv) -> int``.

Errors map to exit codes here and only here: a :class:`~torchmem.TorchmemError` prints its message and
hint and exits with its ``exit_code``; a wrong command line exits 2 (argparse); Ctrl-C exits 130.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Any

from torchmem._errors import TorchmemError

# Command -> its module, imported when the command runs (or when the full help is printed): `torchmem lint`
# must not import torch, which the other commands' modules do.
_COMMANDS: dict[str, Any] = {
    "stats": "torchmem.cli.stats",
    "explain": "torchmem.cli.explain",
    "run": "torchmem.cli.run",
    "report": "torchmem.cli.report",
    "demo": "torchmem.cli.demo",
    "estimate": "torchmem.cli.estimate",
    "lint": "torchmem.cli.lint",
}


def _command(name: str) -> Any:
    mod = _COMMANDS[name]
    if isinstance(mod, str):
        mod = _COMMANDS[name] = importlib.import_module(mod)
    return mod


def _parser(only: str | None = None) -> argparse.ArgumentParser:
    from torchmem._version import __version__

    p = argparse.ArgumentParser(
        prog="torchmem", description="Answers PyTorch device-memory questions: where it went, who holds it."
    )
    p.add_argument("--version", action="version", version=f"torchmem {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for name in [only] if only in _COMMANDS else list(_COMMANDS):
        _command(name).add_parser(sub)
    return p


def _subparser(parser: argparse.ArgumentParser, command: str | None) -> argparse.ArgumentParser | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            return action.choices[command]  # type: ignore[no-any-return]
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI with ``argv`` (default ``sys.argv[1:]``) and return the exit code."""
    raw = list(argv) if argv is not None else sys.argv[1:]
    program: list[str] | None = None
    cmd_at = next((i for i, a in enumerate(raw) if not a.startswith("-")), None)
    parser = _parser(raw[cmd_at] if cmd_at is not None else None)  # only that command's module is imported
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
        return int(exc.code) if isinstance(exc.code, int) else 2
    if args.command is None:
        parser.print_help(sys.stdout)
        return 0
    try:
        return int(_command(args.command).run(args))
    except TorchmemError as exc:
        print(f"torchmem: error: {exc.message}", file=sys.stderr)
        if exc.hint:
            print(f"hint: {exc.hint}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())
