"""One way to tell the user something went wrong inside torchmem without ever breaking their program.

Every warning torchmem issues goes through :func:`emit_warning`, which attributes it to the *user's* line:
the innermost frame that belongs neither to torchmem nor to torch (a watcher's step runs inside torch's
optimizer hook, a ledger error inside a dispatch mode), preferring code that is not a library either, so that
a loop driven by a framework (Lightning, Transformers: site-packages) points at the script that started it.
"""

from __future__ import annotations

import functools
import linecache
import logging
import os
import sys
import sysconfig
import warnings
from collections.abc import Callable
from types import FrameType
from typing import IO

_log = logging.getLogger("torchmem")

_INTERNAL, _LIBRARY, _USER = 0, 1, 2

TORCHMEM_DIR = os.path.dirname(os.path.abspath(__file__))
"""The torchmem package's folder (frames from files under it are torchmem's own)."""
# The demo script is a user program that ships inside the package (``torchmem demo`` runs it).
_DEMO = os.path.join(TORCHMEM_DIR, "_demo")


def module_dir(module: str) -> str | None:
    """The folder of an imported module or package (``None`` when it is not imported or has no file)."""
    mod = sys.modules.get(module)
    f = getattr(mod, "__file__", None)
    return os.path.dirname(os.path.abspath(f)) if isinstance(f, str) else None


def _under(path: str, root: str | None) -> bool:
    return root is not None and (path == root or path.startswith(root + os.sep))


@functools.lru_cache(maxsize=1)
def _library_roots() -> tuple[str, ...]:
    """Directories of the standard library and of installed packages."""
    roots: set[str] = set()
    std = module_dir("os")
    if std:
        roots.add(std)
    paths = sysconfig.get_paths()
    for key in ("stdlib", "purelib", "platlib"):
        p = paths.get(key)
        if p:
            roots.add(os.path.abspath(p))
    try:
        import site

        roots.update(os.path.abspath(p) for p in site.getsitepackages())
        roots.add(os.path.abspath(site.getusersitepackages()))
    except Exception:  # a stripped-down interpreter (embedded, frozen)
        pass
    return tuple(sorted(roots))


@functools.lru_cache(maxsize=2048)
def _origin(filename: str, module: str) -> int:
    """Whose code a frame runs: torchmem's or torch's (internal), a library's, or the user's."""
    if filename.startswith("<frozen "):  # importlib, runpy, zipimport
        return _INTERNAL
    path = filename if filename.startswith("<") else os.path.abspath(filename)
    if _under(path, _DEMO):
        return _USER
    top = module.partition(".")[0]
    if top in ("torchmem", "torch", "runpy", "importlib") or _under(path, TORCHMEM_DIR):
        return _INTERNAL
    if _under(path, module_dir("torch")):
        return _INTERNAL
    parts = path.split(os.sep)
    if "site-packages" in parts or "dist-packages" in parts:
        return _LIBRARY
    if any(_under(path, root) for root in _library_roots()):
        return _LIBRARY
    return _USER


def user_frame(start: FrameType | None) -> FrameType | None:
    """The frame a warning about ``start``'s call stack should point at (``None``: all of it is internal).

    Walking outwards from ``start``: the first frame of the user's own code (neither torchmem, torch, the
    standard library nor an installed package); where there is none, the first frame outside torchmem and
    torch (a framework's loop, the standard library).
    """
    fallback: FrameType | None = None
    f = start
    while f is not None:
        origin = _origin(f.f_code.co_filename, str(f.f_globals.get("__name__", "")))
        if origin == _USER:
            return f
        if origin == _LIBRARY and fallback is None:
            fallback = f
        f = f.f_back
    return fallback


def emit_warning(
    message: str,
    category: type[Warning] = RuntimeWarning,
    *,
    stacklevel: int = 2,
    log_level: int = logging.WARNING,
    warn: bool = True,
) -> Exception | None:
    """Log ``message`` on the ``torchmem`` logger and issue it as a warning on the user's line; never raise.

    The warning's file and line are those of :func:`user_frame` (the user's loop or call, never torchmem's or
    torch's source), with that module's ``__warningregistry__``, so ``"once"``/``"default"`` filters work as
    for a warning issued there. ``stacklevel`` (counted from the caller, as for ``warnings.warn``) is used
    only when every frame on the stack is torchmem's or torch's. Where the warnings filter turns the warning
    into an error, that error is returned instead of raised: a hook, an op or a step must go on.

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("error")
        ...     err = emit_warning("torchmem: a note", log_level=logging.DEBUG)
        >>> type(err).__name__
        'RuntimeWarning'
    """
    _log.log(log_level, message)
    if not warn:
        return None
    caller = sys._getframe(1)
    frame: FrameType | None = None
    try:
        frame = user_frame(caller)
        if frame is None:
            frame = caller
            for _ in range(max(0, stacklevel - 1)):
                if frame.f_back is None:
                    break
                frame = frame.f_back
        g = frame.f_globals
        module = str(g.get("__name__", "<string>"))
        registry = g.setdefault("__warningregistry__", {})
        filename, lineno = frame.f_code.co_filename, frame.f_lineno or 0
        frame = None
        try:  # the source line for the printed warning, also from a zip or a notebook (via the loader)
            linecache.getlines(filename, g)
        except Exception:  # a loader that cannot give source (``python -c``: BuiltinImporter)
            pass
        warnings.warn_explicit(message, category, filename, lineno, module, registry)
    except Exception as exc:  # warnings configured as errors
        return exc
    finally:
        del caller, frame
    return None


def print_safely(text: str, file: IO[str] | None, default: IO[str]) -> None:
    """Print ``text`` to ``file`` (else ``default``) and flush; a closed or broken stream is ignored, so
    reporting never turns a recovery into a new error."""
    try:
        print(text, file=file if file is not None else default, flush=True)
    except Exception:
        pass


class ReportedOnce:
    """Internal errors said once per place: the first error of each ``where`` is worded by ``template``
    (``{where}``, and ``{error}``: ``"TypeError: ..."``) and given to ``say`` (a note list's ``append``, a
    warning, a capture note); later ones of that place are dropped. Never raises: neither the wording nor
    ``say`` can break the hook, op or step that met the error.

    Example:
        >>> notes: list[str] = []
        >>> once = ReportedOnce(notes.append, "internal error in {where} ({error}); the step went on")
        >>> for _ in range(3):
        ...     once("the reading", ValueError("bad"))
        >>> once("the scan", KeyError("k"))
        >>> notes  # doctest: +NORMALIZE_WHITESPACE
        ['internal error in the reading (ValueError: bad); the step went on',
         "internal error in the scan (KeyError: 'k'); the step went on"]
        >>> once.seen("the reading"), once.seen("the hook")
        (True, False)
    """

    def __init__(self, say: Callable[[str], object], template: str) -> None:
        self._say = say
        self._template = template
        self.places: set[str] = set()
        """The places said so far."""

    def seen(self, where: str) -> bool:
        """Whether an error of ``where`` was said."""
        return where in self.places

    def __call__(self, where: str, exc: BaseException) -> None:
        if where in self.places:
            return
        self.places.add(where)
        try:
            self._say(self._template.format(where=where, error=f"{type(exc).__name__}: {exc}"))
        except Exception:
            pass
