"""Notebooks: ``%load_ext torchmem`` gives the ``%torchmem`` line magic and the ``%%torchmem`` cell magic, and
installs the OOM handler (an out-of-memory error in a cell prints its diagnosis and gives back what the
failed cell pinned).

- ``%torchmem`` (or ``%torchmem stats [device]``): the reading and where this process's memory goes;
- ``%torchmem live [device]``: the live tensors, grouped by owner;
- ``%torchmem release name [name ...]``: frees what those variables hold (``torchmem.release``), including
  IPython's output history entries and the last traceback that hold them, and prints the report;
- ``%%torchmem [device]`` on a cell: runs it, then says what it allocated at its peak and what it made that
  is still alive, by line and holder.

Nothing here runs at import; IPython calls :func:`load` through ``torchmem.load_ipython_extension``.
"""

from __future__ import annotations

import shlex
from typing import Any

_USAGE = (
    "usage: %torchmem [stats [device]] | %torchmem live [device] | %torchmem release name [name ...]\n"
    "       %%torchmem [device]   (on a cell: what it allocated and what it left alive)"
)


def load(shell: Any) -> None:
    """Register the magics on ``shell`` and install the OOM handler (``torchmem.install()``)."""
    from torchmem.integrations.excepthook import install

    def magic(line: str, cell: str | None = None) -> None:
        try:
            if cell is None:
                _line(shell, line)
            else:
                _cell(shell, line, cell)
        except _Usage as exc:
            print(f"torchmem: {exc}\n{_USAGE}")

    shell.register_magic_function(magic, magic_kind="line_cell", magic_name="torchmem")
    install()


class _Usage(Exception):
    pass


def _args(line: str) -> list[str]:
    try:
        return shlex.split(line)
    except ValueError as exc:
        raise _Usage(f"cannot read the arguments ({exc})") from None


def _line(shell: Any, line: str) -> None:
    from torchmem.actions.release import release
    from torchmem.capture.read import live_tensors, stats

    args = _args(line)
    what = args[0] if args else "stats"
    rest = args[1:]
    if what == "stats":
        s = stats(rest[0] if rest else None)
        print(s)
        print()
        print(s.breakdown())
    elif what == "live":
        print(live_tensors(rest[0] if rest else None))
    elif what == "release":
        if not rest:
            raise _Usage("name what to free: %torchmem release model optimizer")
        missing = [n for n in rest if n not in shell.user_ns]
        if missing:
            raise _Usage(f"no variable named {', '.join(missing)} in the notebook")
        print(release(*(shell.user_ns[n] for n in rest)))
    else:
        raise _Usage(f"unknown command {what!r}")


def _cell(shell: Any, line: str, cell: str) -> None:
    from torchmem._format import fmt_bytes
    from torchmem.capture.memcheck import check_calls, left_lines

    args = _args(line)
    device = args[0] if args else None
    outcome: list[Any] = []
    # The peak is measured as track() does: exact, and the notebook's own view of torch's peak counters stays.
    result = check_calls(
        lambda: outcome.append(shell.run_cell(cell, store_history=False)),
        device=device,
        max_leak=0,
        max_peak=0,
        name="the cell",
    )
    peak = "n/a" if result.peak is None else fmt_bytes(result.peak)
    head = (
        f"torchmem [{result.device}]: the cell peaked at {peak} above its start; "
        f"{fmt_bytes(result.left)} of what it made is still alive"
    )
    ran = outcome[0] if outcome else None
    if ran is not None and not getattr(ran, "success", True):
        head += " (the cell raised)"
    print(head + (":" if result.left else ""))
    if result.left and result.survivors is not None:
        print("\n".join(left_lines(result.survivors, fix=False)))


__all__ = ["load"]
