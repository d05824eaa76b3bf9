"""One decorator form for torchmem's context managers (``track()``, ``budget()``, ``oom_guard()``)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, TypeVar, cast

F = TypeVar("F", bound=Callable[..., Any])


class ContextDecorator:
    """``@obj`` on a function runs every call inside ``with obj:`` (the object's ``__enter__``/``__exit__``).

    Unlike :class:`contextlib.ContextDecorator` the same object is entered each time (no copy), so what the
    last call measured stays readable on it (``tracker.result``, ``guard.oom``). A call whose exception the
    context manager swallows returns ``None``.
    """

    def __call__(self, fn: F) -> F:
        manager = cast(AbstractContextManager[Any], self)  # subclasses define __enter__/__exit__

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with manager:
                return fn(*args, **kwargs)
            return None  # reached only when __exit__ swallowed the exception

        return cast(F, wrapper)


__all__ = ["ContextDecorator"]
