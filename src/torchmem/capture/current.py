"""The session ``torchmem run`` (or ``torchmem demo``) runs in this process, for the on-demand reports the
program asks for (capture/ondemand.py). Held weakly: the registry never keeps a session alive."""

from __future__ import annotations

import weakref
from typing import Any, Protocol


class RunningSession(Protocol):
    """What the on-demand reports ask of the running session."""

    @property
    def running(self) -> bool: ...

    def survivors_now(self, time_limit: float = 2.0) -> Any: ...


_current: weakref.ref[Any] | None = None


def current_session() -> RunningSession | None:
    """The session running now in this process, if any (``torchmem run``), else ``None``."""
    ref = _current
    session = ref() if ref is not None else None
    return session if session is not None and session.running else None


def set_current(session: RunningSession) -> None:
    """``session`` runs now in this process."""
    global _current
    _current = weakref.ref(session)


def clear_current(session: RunningSession) -> None:
    """``session`` ends: it is no longer the current one (if it still was)."""
    global _current
    if _current is not None and _current() is session:
        _current = None
