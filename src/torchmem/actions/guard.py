"""``torchmem.oom_guard()`` and ``torchmem.install()``: recover from out-of-memory errors."""

from __future__ import annotations

import torch


def find_oom(exc: BaseException | None) -> torch.OutOfMemoryError | None:
    """The ``torch.OutOfMemoryError`` in ``exc`` or its ``__cause__``/``__context__`` chain, if any."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, torch.OutOfMemoryError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ if exc.__cause__ is not None else exc.__context__
    return None
