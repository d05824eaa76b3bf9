"""IPython / Jupyter: an OOM in a cell prints its diagnosis and gives back what its traceback pinned.

Installed by :func:`torchmem.install` through ``shell.set_custom_exc``; IPython matches the handler like an
``except`` clause, so it sees ``torch.OutOfMemoryError`` raised by a cell (an OOM wrapped in another
exception type is left to IPython's usual display). A handler installed before keeps its exceptions.
"""

from __future__ import annotations

import sys
import types
from typing import Any

import torch

from torchmem._warn import print_safely


def _shell() -> Any:
    ipy = sys.modules.get("IPython")
    get = getattr(ipy, "get_ipython", None) if ipy is not None else None
    return get() if get is not None else None


def _make_handler(state: Any, previous: Any, previous_types: tuple[type[BaseException], ...]) -> Any:
    # IPython calls a custom handler from run_code and ignores what it returns (IPython 7-9): the handler
    # must display the traceback itself, as IPython's own showtraceback() would have.
    def handler(
        shell: Any,
        etype: type[BaseException],
        value: BaseException,
        tb: types.TracebackType | None,
        tb_offset: int | None = None,
    ) -> list[str]:
        from torchmem.actions.guard import find_oom, recover

        if state.hook is None or find_oom(value) is None:
            # IPython matches custom exceptions like an except clause: by isinstance
            if previous is not None and issubclass(etype, previous_types):
                out = previous(etype, value, tb, tb_offset=tb_offset)
                return list(out) if isinstance(out, list) else []
            shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
            return []
        # The traceback first, while the frames are intact (this also sets sys.last_*); then free what
        # they hold, and the diagnosis after the traceback, where the eye lands.
        shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
        del tb
        result = recover(value, reraised=True, ipython=shell)
        if not state.quiet:
            print_safely(str(result), state.file, sys.stdout)
        return []

    handler._torchmem = True  # type: ignore[attr-defined]
    return handler


def install_ipython(state: Any) -> bool:
    """Register the OOM handler with the running IPython shell (idempotent). False when none runs."""
    shell = _shell()
    if shell is None or not hasattr(shell, "set_custom_exc"):
        return False
    if state.shell is shell and state.shell_saved is not None:
        return True  # already installed on this shell (options live in `state`)
    saved = (tuple(getattr(shell, "custom_exceptions", ())), getattr(shell, "CustomTB", None))
    prev_types = saved[0]
    previous = saved[1] if prev_types else None
    types_ = (*(t for t in prev_types if t is not torch.OutOfMemoryError), torch.OutOfMemoryError)
    shell.set_custom_exc(types_, _make_handler(state, previous, prev_types))
    state.shell = shell
    state.shell_saved = saved
    return True


def uninstall_ipython(state: Any) -> None:
    """Put back the shell's previous custom exception handler (idempotent)."""
    shell, saved = state.shell, state.shell_saved
    state.shell = None
    state.shell_saved = None
    if shell is None or saved is None:
        return
    shell.custom_exceptions = saved[0]
    if saved[1] is not None:
        shell.CustomTB = saved[1]
