"""``holders()`` and ``find_holders()``: the entry points, their argument checks and their result types.

Both run one backward search (:mod:`.search`) for all the objects given and return
:class:`~torchmem.results.holders.HolderPath` s: readable paths whose steps carry their kinds. A value the
whole interpreter shares (``None``, ``True``, a small int, the empty tuple, a one-character string) is refused
with :class:`HoldersTargetError`: everything holds it, so its paths would mean nothing. Cost: that of the
search (about 0.45 s at a million gc-tracked objects), bounded by ``time_limit``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import overload

from torchmem._errors import TorchmemError
from torchmem.analysis.holders.search import _BackwardSearch
from torchmem.results.holders import HolderPaths, HolderSearch

_log = logging.getLogger("torchmem")


class HoldersTargetError(TorchmemError, ValueError):
    """:func:`holders` was asked about a value the whole interpreter shares (``None``, ``True``, ``0``, ...).

    Such a value is one object that every module, function and frame refers to, so its "holders" are
    arbitrary paths (``sys.pycache_prefix``, ``__main__.__doc__``) that explain nothing. Also a
    ``ValueError``.
    """


@overload
def holders(obj: object, /, *, max_paths: int = 8, time_limit: float = 5.0) -> HolderPaths: ...


@overload
def holders(
    obj: object, obj2: object, /, *more: object, max_paths: int = 8, time_limit: float = 5.0
) -> list[HolderPaths]: ...


def holders(
    obj: object, *more: object, max_paths: int = 8, time_limit: float = 5.0
) -> HolderPaths | list[HolderPaths]:
    """Who keeps ``obj`` alive: referrer paths from roots a person understands, shortest first.

    Several objects share one search: ``holders(a, b, c)`` returns one list per object. Use
    :func:`find_holders` to learn whether the search was truncated.

    Args:
        obj: The object to explain (usually a tensor).
        *more: More objects, searched together.
        max_paths: Most paths reported per object.
        time_limit: Seconds of CPU time (this thread's) the search may take before it stops with what it
            found: on an idle machine its wall time, on a loaded one less than the wall time.

    Returns:
        For one object, its paths as a :class:`HolderPaths` (a ``list``; ``print()`` shows one path per
        line, the interactive ``repr`` the readable paths in brackets); for several, one such list per
        object. ``str(path)`` (and ``repr(path)``) is the readable path; ``path.typed_steps`` gives each
        step's kind (attribute, item, closure cell, hook, grad_fn, saved tensor, frame local, ...).

    Raises:
        HoldersTargetError: ``obj`` is a value the whole interpreter shares (``None``, ``True``,
            ``False``, ``Ellipsis``, ``NotImplemented``, a small int, the empty tuple or string, a
            one-character string): everything holds it, so its paths would mean nothing.

    Example:
        >>> import torch, torchmem
        >>> cache = {"w": torch.zeros(3)}
        >>> torchmem.holders(cache["w"])  # doctest: +SKIP
        [__main__.cache['w']]
        >>> print(torchmem.holders(cache["w"]))  # doctest: +SKIP
        __main__.cache['w']
    """
    targets = (obj, *more)
    for i, t in enumerate(targets):
        _check_target(t, "holders", f"argument {i + 1}" if more else "")
    search = find_holders(targets, max_paths=max_paths, time_limit=time_limit, exclude=(more,))
    if search.truncated:
        _log.debug("holders(): search truncated (%s)", search.reason)
    if not more:
        return HolderPaths(search.paths[0])
    return [HolderPaths(p) for p in search.paths]


# Values the interpreter shares between all code: their holders are everything, which says nothing.
_SINGLETONS: tuple[tuple[object, str], ...] = (
    (None, "None"),
    (True, "True"),
    (False, "False"),
    (Ellipsis, "Ellipsis"),
    (NotImplemented, "NotImplemented"),
)


def _shared_value(obj: object) -> str | None:
    """Why ``obj`` is one object the whole interpreter shares, or ``None`` when it is not."""
    for value, name in _SINGLETONS:
        if obj is value:
            return f"{name} is a singleton"
    t = type(obj)
    if t is int and -5 <= obj <= 256:  # type: ignore[operator]
        return f"small ints (-5 to 256) are cached: every {obj} in the program is this same object"
    if t is tuple and not obj:
        return "the empty tuple is a single shared object"
    if t is str and not obj:
        return "the empty string is a single shared object"
    if t is str and len(obj) == 1 and ord(obj) < 256:  # type: ignore[arg-type]
        return f"one-character strings are cached: every {obj!r} in the program is this same object"
    if t is bytes and len(obj) <= 1:  # type: ignore[arg-type]
        return "empty and one-byte bytes objects are cached and shared by all code"
    return None


def _check_target(obj: object, fn: str, where: str) -> None:
    why = _shared_value(obj)
    if why is None:
        return
    at = f" ({where})" if where else ""
    raise HoldersTargetError(
        f"{fn}() cannot explain {obj!r}{at}: {why}, referred to by every module, function and frame that "
        "uses it, so its holder paths would be arbitrary (sys.pycache_prefix, __main__.__doc__, ...).",
        "Pass the object whose memory you want explained: a tensor, module, optimizer or container, e.g. "
        "torchmem.holders(model.fc.weight). If a variable you expected to hold a tensor is None, the tensor "
        "was never assigned to it (or was already dropped).",
    )


def find_holders(
    targets: Sequence[object],
    *,
    max_paths: int = 8,
    time_limit: float = 5.0,
    exclude: Iterable[object] = (),
    max_objects: int = 500_000,
) -> HolderSearch:
    """Find the holder paths of several objects in one backward search of the heap.

    Args:
        targets: The objects to explain. The sequence itself is not a holder.
        max_paths: Most paths reported per target.
        time_limit: Seconds of CPU time (this thread's) the search may take; when it runs out the paths
            found so far are returned with ``truncated=True``.
        exclude: Objects that must not count as holders (the caller's own containers of the targets).
            Executing ``torchmem`` frames never count.
        max_objects: Most objects the backward search explores.

    Returns:
        A :class:`HolderSearch` holding only strings and step kinds: the targets are not kept alive.

    Example:
        >>> import torch
        >>> from torchmem.analysis.holders import find_holders
        >>> a, b = torch.zeros(2), torch.ones(2)
        >>> box = [a, {"b": b}]
        >>> r = find_holders([a, b])
        >>> [str(p) for p in r.paths[1]]  # doctest: +SKIP
        ["<stdin>:1 in <module>(), local 'box'[1]['b']", ...]
    """
    for i, t in enumerate(targets):
        _check_target(t, "find_holders", f"targets[{i}]")
    if max_paths < 1:
        raise ValueError(f"max_paths must be at least 1, got {max_paths}")
    if time_limit <= 0:
        raise ValueError(f"time_limit must be positive, got {time_limit}")
    search = _BackwardSearch(targets, max_paths, time_limit, exclude, max_objects)
    try:
        return search.run()
    finally:
        search.close()
