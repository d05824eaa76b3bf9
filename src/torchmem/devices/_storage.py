"""A storage's identity: the one definition the package uses to count each storage once (issue 28).

Views of one tensor, and tensors made with ``set_()`` on its storage, share their storage; a storage is
identified by its C++ ``StorageImpl`` (``UntypedStorage._cdata``), which is unique while the storage lives,
for empty storages too (their data pointers are all 0). ``_cdata`` is private: where it is missing, the
storage's device, data pointer and size stand in (equal for all views of one storage; two empty storages
then share a key, which costs no byte).
"""

from __future__ import annotations

from typing import Any

import torch


def storage_of(t: torch.Tensor) -> Any:
    """``t``'s untyped storage, ``None`` for layouts without one (sparse, nested, functional wrappers)."""
    try:
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError, TypeError, AttributeError):
        return None


def key_of_storage(s: Any) -> int:
    """The identity of the untyped storage ``s`` (see the module's text)."""
    cdata = getattr(s, "_cdata", None)
    if isinstance(cdata, int):
        return cdata
    return hash((str(s.device), int(s.data_ptr()), int(s.nbytes())))


def storage_id(t: torch.Tensor) -> int | None:
    """The identity of ``t``'s storage, the same for all its views; ``None`` without a storage.

    Example:
        >>> import torch
        >>> x = torch.zeros(4)
        >>> storage_id(x) == storage_id(x[1:]) and storage_id(x) != storage_id(torch.zeros(4))
        True
    """
    s = storage_of(t)
    return None if s is None else key_of_storage(s)


__all__ = ["key_of_storage", "storage_id", "storage_of"]
