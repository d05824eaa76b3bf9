"""Exceptions as torchmem walks them: the cause/context chain, the OOM types, and freeing finished frames.

One copy of each, used by the OOM diagnosis, the guard, the batch-size search and ``release()``. Nothing here
reads a message's text (that is :mod:`torchmem.analysis.oom`) or touches a device.
"""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Iterator
from typing import Any


def exception_chain(exc: BaseException | None) -> Iterator[BaseException]:
    """``exc``, then every exception linked to it by ``__cause__``/``__context__`` (and the members of an
    ``ExceptionGroup``), each once, depth first with the cause before the context; cycles are safe.

    Example:
        >>> try:
        ...     try:
        ...         raise KeyError("inner")
        ...     except KeyError as e:
        ...         raise ValueError("outer") from e
        ... except ValueError as outer:
        ...     [type(e).__name__ for e in exception_chain(outer)]
        ['ValueError', 'KeyError']
    """
    seen: set[int] = set()
    stack: list[BaseException] = [exc] if exc is not None else []
    while stack:
        e = stack.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        nxt: list[BaseException] = []
        if e.__cause__ is not None:
            nxt.append(e.__cause__)
        if e.__context__ is not None and e.__context__ is not e.__cause__:
            nxt.append(e.__context__)
        nxt.extend(x for x in getattr(e, "exceptions", ()) or () if isinstance(x, BaseException))
        stack.extend(reversed(nxt))


def oom_types() -> tuple[type[BaseException], ...]:
    """The out-of-memory exception types of the torch in use (``torch.OutOfMemoryError`` and its alias);
    empty when torch is not imported or predates them."""
    torch = sys.modules.get("torch")
    out: list[type[BaseException]] = []
    if torch is None:
        return ()
    cuda = getattr(torch, "cuda", None)
    for obj in (getattr(torch, "OutOfMemoryError", None), getattr(cuda, "OutOfMemoryError", None)):
        if isinstance(obj, type) and issubclass(obj, BaseException) and obj not in out:
            out.append(obj)
    return tuple(out)


def clear_frames(tb: types.TracebackType | None) -> int:
    """Clear the locals of every finished frame of ``tb`` so what they hold dies now; the number cleared.

    ``traceback.clear_frames`` alone is not enough before Python 3.13: reading ``frame.f_locals`` of a
    finished frame (holder searches and diagnoses do) leaves a snapshot dict on the frame that
    ``frame.clear()`` does not empty, so every local stays alive until someone reads ``f_locals`` again —
    after ``empty_cache()``, too late. Reading it once more after the clear re-syncs the snapshot, which
    drops the cleared names. A frame still executing is left alone (its locals are the program's).
    """
    frame: types.FrameType | None = None
    n = 0
    while tb is not None:
        frame = tb.tb_frame
        try:
            frame.clear()
        except RuntimeError:  # still executing
            pass
        else:
            n += 1
            if sys.version_info < (3, 13):
                with contextlib.suppress(Exception):
                    frame.f_locals  # noqa: B018 - the read re-syncs the snapshot
        tb = tb.tb_next
    del frame
    return n


def clear_exception_frames(exc: BaseException | None, *, drop_tracebacks: bool = True) -> int:
    """:func:`clear_frames` for ``exc`` and every exception in its chain; the number of frames cleared.

    With ``drop_tracebacks`` the tracebacks are detached too (``__traceback__ = None``), so the frames
    themselves can be freed.
    """
    n = 0
    for e in exception_chain(exc):
        tb: Any = e.__traceback__
        if tb is not None:
            n += clear_frames(tb)
            if drop_tracebacks:
                e.__traceback__ = None
    return n


__all__ = ["clear_exception_frames", "clear_frames", "exception_chain", "oom_types"]
