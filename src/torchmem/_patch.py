"""One rule for every hook torchmem installs on the program's objects: replace an attribute by a wrapper of
it, and put the original back later only where the attribute still holds that wrapper (the program may have
replaced it meanwhile: then it stays the program's)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def wrap_attribute(owner: Any, name: str, make: Callable[[Any], Any]) -> Callable[[], None]:
    """Set ``owner.<name>`` to ``make(original)`` (with ``__wrapped__ = original``); return the undo.

    The original is the owner's own entry where it has one (a class's function, not a bound method), else
    what ``getattr`` finds (an inherited attribute: the undo then sets the original on the owner itself).

    Example:
        >>> import types
        >>> m = types.SimpleNamespace(f=lambda: 1)
        >>> undo = wrap_attribute(m, "f", lambda f: lambda: f() + 1)
        >>> m.f(), undo(), m.f()
        (2, None, 1)
    """
    own = getattr(owner, "__dict__", {})
    original = own[name] if name in own else getattr(owner, name)
    wrapper = make(original)
    wrapper.__wrapped__ = original
    setattr(owner, name, wrapper)

    def undo() -> None:
        if getattr(owner, "__dict__", {}).get(name) is wrapper:
            setattr(owner, name, original)

    return undo


__all__ = ["wrap_attribute"]
