"""Is this exception (or text) an out-of-memory error? By type first; by message only where torch gives
no type.

:func:`oom_exception` walks the exception's ``__cause__``/``__context__`` chain
(:func:`torchmem._exceptions.exception_chain`) for torch's OOM type (:func:`torchmem._exceptions.oom_types`);
only plain ``RuntimeError`` s and ``MemoryError`` s — and torch's ``AcceleratorError``/``DistBackendError`` —
have their text parsed (ROCm on old torch, torch 1.x, the CPU allocator, cuBLAS and the driver raise memory
errors without the type). Cost: one walk of the chain, and one message parse per such foreign exception.
"""

from __future__ import annotations

from torchmem._exceptions import exception_chain, oom_types
from torchmem.analysis.oom.messages import parse_oom_message

#: Exception types, by name, whose text is read for a memory error: torch raises these without the OOM type.
_READ_BY_NAME = ("DistBackendError", "AcceleratorError")


def oom_exception(exc: BaseException) -> BaseException | None:
    """The OOM in ``exc``'s ``__cause__``/``__context__`` chain (``exc`` itself first), or ``None``.

    Matched by type (``torch.OutOfMemoryError``, which ``torch.cuda.OutOfMemoryError`` aliases); a plain
    ``RuntimeError`` (or ``MemoryError``) counts when its text is a memory error torch raises without the
    OOM type (ROCm on old torch, torch 1.x, the CPU allocator, cuBLAS, the driver).

    Example:
        >>> import torch
        >>> try:
        ...     try:
        ...         raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")
        ...     except RuntimeError as e:
        ...         raise ValueError("step failed") from e
        ... except ValueError as outer:
        ...     type(oom_exception(outer)).__name__
        'OutOfMemoryError'
    """
    types = oom_types()
    chain = list(exception_chain(exc))
    for e in chain:
        if types and isinstance(e, types):
            return e
    for e in chain:
        if type(e) in (RuntimeError, MemoryError) or type(e).__name__ in _READ_BY_NAME:
            parsed = parse_oom_message(str(e))
            if parsed is not None and parsed.is_oom:
                return e
        elif isinstance(e, MemoryError):
            return e
    return None


def is_oom(exc_or_message: BaseException | str) -> bool:
    """True when an exception (or its cause/context chain), or a text, reports running out of memory.

    Example:
        >>> import torch, torchmem
        >>> torchmem.is_oom("HIP out of memory. Tried to allocate 20.00 MiB")
        True
        >>> torchmem.is_oom(ValueError("CUDA out of memory"))   # a foreign type: not an OOM by type
        False
        >>> torchmem.is_oom(RuntimeError("wrapper").with_traceback(None)) is False
        True
    """
    if isinstance(exc_or_message, str):
        p = parse_oom_message(exc_or_message)
        return p is not None and p.is_oom
    if isinstance(exc_or_message, BaseException):
        return oom_exception(exc_or_message) is not None
    return False


__all__ = ["is_oom", "oom_exception"]
