"""The garbage collector as torchmem's heap walks see it.

- How many objects were frozen (``gc.freeze()``) when torchmem was imported: the interpreter freezes some of
  its own at start-up (375 on CPython 3.12), and a heap walk that cannot see frozen objects should speak only
  of the ones the program froze since. Reading the count changes nothing.
- The entries of a dict the program may change meanwhile (``sys.modules``, a module's globals, any dict a
  search names a key of), read at one moment: :func:`items_now`.
"""

from __future__ import annotations

import gc
from collections.abc import Mapping
from typing import Any, TypeVar

_K = TypeVar("_K")
_V = TypeVar("_V")

FROZEN_AT_IMPORT = gc.get_freeze_count()


def frozen_since_import() -> int:
    """Objects frozen by ``gc.freeze()`` since torchmem was imported (0: none, or ``gc.unfreeze()`` ran)."""
    return max(0, gc.get_freeze_count() - FROZEN_AT_IMPORT)


def items_now(d: Mapping[_K, _V]) -> list[tuple[_K, _V]]:
    """The items of ``d`` at one moment. ``list(d.items())`` allocates a tuple per entry, and on Python 3.11
    an allocation may run a garbage collection whose finalizers (or the thread they switch to) change ``d``
    while it is read: "dictionary changed size during iteration". ``dict.copy`` takes the entries without
    running other code (a new dict's keys table, no object allocated per entry); the copy is then read at
    leisure. A mapping that is no dict is read as it is."""
    if isinstance(d, dict):
        return list(dict.copy(d).items())
    return list(d.items())


def values_now(d: Mapping[Any, _V]) -> list[_V]:
    """The values of ``d`` at one moment (see :func:`items_now`)."""
    if isinstance(d, dict):
        return list(dict.copy(d).values())
    return list(d.values())


__all__ = ["FROZEN_AT_IMPORT", "frozen_since_import", "items_now", "values_now"]
