"""The processes the program starts (``mp.spawn``, ``multiprocessing``, hogwild): noted (their memory is not
this process's), followed when they train (each records its own capture, ``<capture>.proc<k>.jsonl``, with
a session of its own), DataLoader workers counted apart."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any


class Followers:
    """The hook on ``multiprocessing``'s ``BaseProcess.start`` while a session runs (:meth:`install`,
    :meth:`remove`), and what it saw.

    ``records`` and ``ranks`` are the session's :class:`~torchmem.run.records.Records` and
    :class:`~torchmem.run.rank_state.RankState`; ``gpus`` gives the session's GPU watch (or ``None``),
    ``options`` the session options a followed child takes over (``capture.ranks.FollowedTarget``), and
    ``session_type`` is the session class a child runs.
    """

    def __init__(
        self,
        capture: str,
        records: Any,
        ranks: Any,
        gpus: Callable[[], Any],
        options: Callable[[], dict[str, Any]],
        session_type: Callable[..., Any],
    ) -> None:
        self._capture = capture
        self._records = records
        self._ranks = ranks
        self._gpus = gpus
        self._options = options
        self._session_type = session_type
        self._pid = os.getpid()
        self._children: list[str] = []  # processes the program started (not DataLoader workers)
        self._followed: list[str] = []  # captures of the child processes that record their own
        self._workers = 0
        self._lock = threading.Lock()
        self._saved_start: Any = None

    @property
    def children(self) -> tuple[str, ...]:
        """The processes the program started, described (DataLoader workers excluded)."""
        return tuple(self._children)

    @property
    def followed(self) -> tuple[str, ...]:
        """The captures the followed child processes write."""
        return tuple(self._followed)

    def install(self) -> None:
        """Note the processes the program starts; the hook is removed by :meth:`remove`."""
        import multiprocessing.process as mpp

        original = mpp.BaseProcess.start
        followers = self

        def start(proc: Any) -> None:
            try:
                followers.before_start(proc)
            except Exception:
                pass
            original(proc)
            try:
                followers.started(proc)
            except Exception:
                pass

        start.__wrapped__ = original  # type: ignore[attr-defined]
        self._saved_start = original
        mpp.BaseProcess.start = start  # type: ignore[method-assign,assignment]

    def remove(self) -> None:
        import multiprocessing.process as mpp

        if self._saved_start is not None and getattr(mpp.BaseProcess.start, "__wrapped__", None) is (
            self._saved_start
        ):
            mpp.BaseProcess.start = self._saved_start  # type: ignore[method-assign,assignment]
        self._saved_start = None

    def started(self, proc: Any) -> None:
        """``proc`` started: a DataLoader worker is counted, any other process noted."""
        if os.getpid() != self._pid or self._records.disabled:
            return
        target = getattr(proc, "_target", None)
        gpus = self._gpus()
        if getattr(target, "__module__", "") == "torch.utils.data._utils.worker":
            self._workers += 1
            if gpus is not None and proc.pid:
                gpus.skip([int(proc.pid)])  # the DataLoader checks describe workers
            return
        followed = getattr(proc, "_tm_capture", None)
        from torchmem.capture.ranks import FollowedTarget

        if isinstance(target, FollowedTarget):
            target = target.target
        what = getattr(target, "__qualname__", None) or type(proc).__name__
        desc = f"{proc.name} (pid {proc.pid}, {what})"
        self._children.append(desc)
        if gpus is not None and proc.pid:
            from torchmem.capture.gpus import _site

            gpus.child_started(int(proc.pid), f"{what} (multiprocessing)", _site(), bool(followed))
        if followed:
            self._records.note(f"the program started process {desc}; it records its own capture {followed}")
        else:
            self._records.note(f"the program started process {desc}; its memory is not in this capture")

    def before_start(self, proc: Any) -> None:
        """Wrap a training child's target (capture/ranks.FollowedTarget) so it records its own capture."""
        if os.getpid() != self._pid or self._records.disabled:
            return
        from torchmem.capture.ranks import FollowedTarget, child_capture, should_follow, spawn_index

        target = getattr(proc, "_target", None)
        if target is None or not should_follow(target):
            return
        with self._lock:
            index = spawn_index(proc)
            if index is None or any(c == child_capture(self._capture, index) for c in self._followed):
                index = len(self._followed)
                while child_capture(self._capture, index) in self._followed:
                    index += 1
            capture = child_capture(self._capture, index)
            self._followed.append(capture)
            job = self._ranks.job_for_children()
        options = {**self._options(), "job": job}
        proc._target = FollowedTarget(target, capture, index, options, self._session_type)
        proc._tm_capture = capture
