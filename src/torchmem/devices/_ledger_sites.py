"""Where a storage was born: the program's frame that allocated it (:func:`birth_site`), and the program's
calls into an engine that allocates on threads of its own (:class:`EngineCalls`).

The ledger (:mod:`torchmem.devices._ledger`) records a birth site for each storage born while a cohort that
wants sites is open; this module decides what that site is.
"""

from __future__ import annotations

import contextlib
import os
import sys
import sysconfig
import threading
import types
from typing import Any, NamedTuple

import torch


class Site(NamedTuple):
    """Where a storage was born: the innermost frame outside torch, torchmem and the standard library."""

    filename: str
    lineno: int
    function: str

    def __str__(self) -> str:
        return f"{os.path.basename(self.filename)}:{self.lineno}"


def internal_dirs() -> tuple[str, ...]:
    dirs = {os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(__file__))}
    for key in ("stdlib", "platstdlib"):
        with contextlib.suppress(KeyError, OSError):
            dirs.add(sysconfig.get_paths()[key])
    return tuple(os.path.join(d, "") for d in dirs if d)


_INTERNAL: tuple[str, ...] | None = None
_DEMO = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "_demo", "")
_internal_code: dict[Any, int] = {}


def birth_site(skip: int = 1) -> Site | None:
    """The user's frame that caused the current allocation (None when every frame is internal).

    Frames of torch, torchmem and the standard library are skipped, and so are installed libraries
    (``site-packages``: transformers' generate, Lightning's loop) when a frame of the program itself is
    further out; a library's frame is the site only when no program frame is on the stack. The decision is
    cached per code object, so a birth costs a few frame hops.
    """
    return _site_in(sys._getframe(skip))


def _site_in(f: types.FrameType | None) -> Site | None:
    """The first program frame from ``f`` outwards (a library's when there is none; see birth_site)."""
    global _INTERNAL
    if _INTERNAL is None:
        _INTERNAL = internal_dirs()
    cache = _internal_code
    library: Site | None = None
    while f is not None:
        code = f.f_code
        kind = cache.get(code)
        if kind is None:
            fn = code.co_filename
            # The bundled demo script lives in the package but is user code.
            if (fn.startswith(_INTERNAL) and not fn.startswith(_DEMO)) or fn.startswith("<frozen"):
                kind = 1  # internal
            elif _LIBRARY in fn or _LIBRARY_DEB in fn:
                kind = 2  # an installed library
            else:
                kind = 0  # the program
            cache[code] = kind
        if not kind:
            return Site(code.co_filename, f.f_lineno, code.co_name)
        if kind == 2 and library is None:
            library = Site(code.co_filename, f.f_lineno, code.co_name)
        f = f.f_back
    return library


_LIBRARY = os.sep + "site-packages" + os.sep
_LIBRARY_DEB = os.sep + "dist-packages" + os.sep


class EngineCalls:
    """The program's call into an engine that allocates on its own threads (CUDA's backward runs on the
    autograd engine's device threads, which have no program frame): births on another thread with no program
    frame are given the caller's site while the call runs."""

    __slots__ = ("caller",)

    def __init__(self) -> None:
        self.caller: tuple[int, Site] | None = None  # (the caller's thread, its site)

    def enter(self, skip: int) -> tuple[int, Site] | None:
        """The call begins; the caller's site is the program frame ``skip`` frames out from here. Returns
        what to hand back to :meth:`leave`."""
        prev = self.caller
        site = birth_site(skip + 1)
        if site is not None:
            self.caller = (threading.get_ident(), site)
        return prev

    def leave(self, prev: tuple[int, Site] | None) -> None:
        self.caller = prev

    def site_elsewhere(self) -> Site | None:
        """The caller's site, for a birth (with no program frame) on a thread other than the caller's."""
        caller = self.caller
        if caller is not None and caller[0] != threading.get_ident():
            return caller[1]
        return None


__all__ = ["EngineCalls", "Site", "birth_site", "internal_dirs"]
