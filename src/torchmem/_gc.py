"""How many objects were frozen (``gc.freeze()``) when torchmem was imported: the interpreter freezes some
of its own at start-up (375 on CPython 3.12), and a heap walk that cannot see frozen objects should speak only
of the ones the program froze since. Reading the count changes nothing."""

from __future__ import annotations

import gc

FROZEN_AT_IMPORT = gc.get_freeze_count()


def frozen_since_import() -> int:
    """Objects frozen by ``gc.freeze()`` since torchmem was imported (0: none, or ``gc.unfreeze()`` ran)."""
    return max(0, gc.get_freeze_count() - FROZEN_AT_IMPORT)


__all__ = ["FROZEN_AT_IMPORT", "frozen_since_import"]
