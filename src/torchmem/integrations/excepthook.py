"""``torchmem.install()`` / ``uninstall()``: every uncaught OOM explained and its memory given back.

A ``sys.excepthook`` (chained to the one installed before) and, when IPython runs, the IPython custom
exception handler (:mod:`torchmem.integrations.ipython`). The recovery itself is
:func:`torchmem.actions.guard.recover`; this module only connects it to the interpreter's hooks, which is
why it lives in integrations (actions never import integrations).
"""

from __future__ import annotations

import sys
import threading
import types
from collections.abc import Callable
from typing import IO, Any

from torchmem._warn import print_safely
from torchmem.actions.guard import find_oom, recover


class _Installed:
    def __init__(self) -> None:
        self.previous_hook: Callable[..., Any] | None = None
        self.hook: Callable[..., Any] | None = None
        self.file: IO[str] | None = None
        self.quiet = False
        self.shell: Any = None
        self.shell_saved: tuple[Any, Any] | None = None


_state = _Installed()
_tls = threading.local()


def _excepthook(etype: type[BaseException], value: BaseException, tb: types.TracebackType | None) -> None:
    # Reinstalled under a hook that wraps an earlier torchmem hook, the chain reaches this function twice:
    # the inner call prints the usual traceback and stops the loop.
    if getattr(_tls, "active", False):
        sys.__excepthook__(etype, value, tb)
        return
    _tls.active = True
    try:
        _handle(etype, value, tb)
    finally:
        _tls.active = False


def _handle(etype: type[BaseException], value: BaseException, tb: types.TracebackType | None) -> None:
    previous = _state.previous_hook or sys.__excepthook__
    if _state.hook is None or not isinstance(value, Exception) or find_oom(value) is None:
        previous(etype, value, tb)
        return
    try:
        previous(etype, value, tb)  # the usual traceback first (it reads source lines, not locals)
        del tb
        result = recover(value, reraised=True)
    except Exception as e:  # the hook must never fail
        print_safely(f"torchmem: OOM recovery failed: {type(e).__name__}: {e}", _state.file, sys.stderr)
        return
    if not _state.quiet:
        print_safely(str(result), _state.file, sys.stderr)


def install(*, file: IO[str] | None = None, quiet: bool = False, ipython: bool = True) -> None:
    """Recover from every uncaught OOM: a ``sys.excepthook``, and the IPython hook when IPython runs.

    The excepthook prints the usual traceback, then the diagnosis, then frees what the traceback's
    finished frames held (``sys.last_traceback`` keeps them alive in a REPL). It chains to the hook that
    was installed before; calling ``install()`` again changes the options only. In IPython/Jupyter, an OOM
    in a cell shows its traceback followed by the diagnosis, and the memory pinned by the traceback and by
    output history (``Out``, ``_``) entries holding tensors on the failing device comes back. Other
    exceptions are left to the usual handlers. :func:`uninstall` undoes it.

    Args:
        file: Where to print (default: ``sys.stderr``; the cell's output in IPython).
        quiet: Recover without printing.
        ipython: Also install the IPython hook when an IPython shell is running.

    Example:
        >>> import torchmem
        >>> torchmem.install()       # doctest: +SKIP
    """
    _state.file = file
    _state.quiet = quiet
    if sys.excepthook is not _excepthook:
        _state.previous_hook = sys.excepthook
        sys.excepthook = _excepthook
    _state.hook = _excepthook
    if ipython:
        from torchmem.integrations.ipython import install_ipython

        install_ipython(_state)


def uninstall() -> None:
    """Undo :func:`install`: restore the previous ``sys.excepthook`` and IPython handler (idempotent).

    If another hook was installed on top of torchmem's since, torchmem's stays in the chain but only
    passes exceptions on.

    Example:
        >>> import torchmem
        >>> torchmem.uninstall()     # doctest: +SKIP
    """
    if sys.excepthook is _excepthook:
        sys.excepthook = _state.previous_hook or sys.__excepthook__
        _state.previous_hook = None
    _state.hook = None
    from torchmem.integrations.ipython import uninstall_ipython

    uninstall_ipython(_state)


__all__ = ["install", "uninstall"]
