"""Which threads have the ledger on: the ledger's dispatch mode pushed on each thread that turns it on (once
per thread, however many users there nest), the users counted across threads, and the program's other
threads followed (each turns the mode on itself, at its next Python event).

:class:`ThreadSwitch` knows nothing of what the mode records: the ledger hands it a factory of its mode and
what to do when the last user is gone (forget every count), and shares its lock with it, so that the last
user leaving and the counts being forgotten are one step for the recording path.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch


def dispatch_depth() -> int:
    """How many dispatch modes the calling thread has on (0 where torch cannot say)."""
    fn = getattr(torch._C, "_len_torch_dispatch_stack", None)
    try:
        return int(fn()) if fn is not None else 0
    except Exception:
        return 0


class ThreadSwitch:
    """Turns a dispatch mode on and off per thread for the users of one ledger, and follows other threads.

    ``make_mode()`` builds the mode to push on a thread; ``on_idle()`` runs under ``lock`` when the last user
    is gone (on any thread).
    """

    def __init__(
        self, lock: threading.RLock, make_mode: Callable[[], Any], on_idle: Callable[[], None]
    ) -> None:
        self._lock = lock
        self._make_mode = make_mode
        self._on_idle = on_idle
        self.local = threading.local()  # per thread: depth (its users, nested), mode (the one pushed)
        self._users = 0
        self._following = 0  # follow() users
        self._followed: set[int] = set()  # idents of the threads recording while followed
        self._releasing: set[int] = set()  # followed threads that have not turned recording off yet

    @property
    def users(self) -> int:
        """Users of the ledger on every thread (a followed thread counts as one while it records)."""
        return self._users

    @property
    def followed(self) -> frozenset[int]:
        """The threads recording because they are followed."""
        return frozenset(self._followed)

    @property
    def releasing(self) -> frozenset[int]:
        """The threads no longer followed that have not turned their recording off yet."""
        return frozenset(self._releasing)

    # -- the calling thread ----------------------------------------------------------------------
    @contextmanager
    def on(self) -> Iterator[None]:
        """The calling thread records for the duration of the block (re-entrant)."""
        # Users of one thread may end in any order (a watcher started before a limit and stopped after
        # it): count them, push the mode on the first and pop it with the last, whoever that is.
        with self._lock:
            self._users += 1
        tls = self.local
        depth = getattr(tls, "depth", 0)
        if depth == 0:
            mode = self._make_mode()
            mode.__enter__()
            tls.mode = mode
        tls.depth = depth + 1
        try:
            yield
        finally:
            tls.depth = getattr(tls, "depth", 1) - 1
            if tls.depth == 0:
                pushed: Any = getattr(tls, "mode", None)
                tls.mode = None
                if pushed is not None:
                    pushed.__exit__(None, None, None)
            with self._lock:
                self._users -= 1
                if self._users == 0:
                    self._on_idle()

    def on_this_thread(self) -> bool:
        return getattr(self.local, "depth", 0) > 0

    # -- the program's other threads -------------------------------------------------------------
    def follow(self) -> bool:
        """Turn recording on in the program's other Python threads too, until :meth:`unfollow` (see
        ``Ledger.follow_threads``). Returns whether it did."""
        set_all = getattr(threading, "setprofile_all_threads", None)
        if set_all is None or sys.getprofile() is not None or threading.getprofile() is not None:
            return False
        with self._lock:
            if self._following:
                self._following += 1
                return True
            self._following = 1
        main = threading.get_ident()
        set_all(lambda frame, event, arg: self._follow_here(main))
        threading.setprofile(None)  # threads started from now on: not followed (a new thread gets nothing)
        return True

    def unfollow(self) -> None:
        """Undo :meth:`follow` (see ``Ledger.unfollow_threads``)."""
        with self._lock:
            if self._following == 0:
                return
            self._following -= 1
            if self._following:
                return
            followed, self._followed = self._followed, set()
            self._releasing |= followed
            self._users -= len(followed)
            if followed and self._users <= 0:
                self._users = 0
                self._on_idle()
        set_all = getattr(threading, "setprofile_all_threads", None)
        if set_all is None:
            return
        alive = {t.ident for t in threading.enumerate()}
        with self._lock:
            self._releasing &= alive  # those that ended: their state went with them
            pending = bool(self._releasing)
        set_all((lambda frame, event, arg: self._unfollow_here()) if pending else None)
        threading.setprofile(None)

    def _follow_here(self, main: int) -> None:
        """On a thread, at its first Python event after :meth:`follow`: turn recording on here."""
        sys.setprofile(None)  # one-shot, this thread only
        try:
            ident = threading.get_ident()
            name = threading.current_thread().name
            if ident == main or name.startswith("torchmem") or not self._following or self.on_this_thread():
                return
            if dispatch_depth() != 0:  # the thread's own mode (fake tensors, a profiler): leave it alone
                return
            mode = self._make_mode()
            with self._lock:
                if not self._following:
                    return
                mode.__enter__()  # counted only once it is on
                self._users += 1
                self._followed.add(ident)
            self.local.mode = mode
            self.local.depth = 1
        except Exception:  # never break the program's thread
            return

    def _unfollow_here(self) -> None:
        sys.setprofile(None)
        try:
            ident = threading.get_ident()
            with self._lock:
                if ident not in self._releasing:
                    return
                self._releasing.discard(ident)
            mode: Any = getattr(self.local, "mode", None)
            self.local.mode = None
            self.local.depth = 0
            if mode is not None and dispatch_depth() > 0:
                mode.__exit__(None, None, None)
        except Exception:
            return


__all__ = ["ThreadSwitch", "dispatch_depth"]
