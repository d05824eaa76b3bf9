"""A session's place in a distributed job (capture/ranks.py): the header's ``rank`` field, the job's OOM flag
(raised when this process runs out of memory, checked by the sampler: this rank's state at another rank's
OOM), the default process group's facts, and a reading before ``destroy_process_group``."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import torch


class RankState:
    """The rank part of a session writing to ``records`` (a :class:`~torchmem.run.records.Records`).

    ``reading`` reads the session's figure now, ``device`` is the device it watches and ``steps`` its step
    count (all read when needed: they change as the program runs).
    """

    def __init__(
        self,
        capture: str,
        records: Any,
        reading: Callable[[], Any],
        device: Callable[[], torch.device],
        steps: Callable[[], int],
    ) -> None:
        self._capture = capture
        self._records = records
        self._reading = reading
        self._device = device
        self._steps = steps
        self._rank: Any = None
        self._oom_flag: Any = None
        self._flag_raised = False
        self._state_written = False
        self._lock = threading.Lock()
        self._job = ""
        self._pg_written = False
        self._pg_end_read = False  # the reading before destroy_process_group was taken

    @property
    def rank(self) -> Any:
        """This process's place in the job (a ``capture.ranks.RankInfo``), else ``None``."""
        return self._rank

    def header(self) -> dict[str, Any]:
        """The header's ``rank`` field (launcher, rank, local rank, world size, host, job) and the job's OOM
        flag, from the environment only (no process-group call)."""
        try:
            from torchmem.capture.ranks import OOMFlag, rank_info

            info = rank_info()
            if info is None:
                return {}
            self._rank = info
            self._job = info.job
            if info.job and (info.world_size > 1 or info.launcher == "spawn"):
                self._oom_flag = OOMFlag(os.path.dirname(os.path.abspath(self._capture)), info.job)
            return {"rank": info.to_dict()}
        except Exception:
            return {}

    def job_for_children(self) -> str:
        """The job the followed child processes belong to (made now if this process is not in one), and its
        OOM flag."""
        if not self._job:
            import hashlib

            self._job = hashlib.sha1(f"{os.getpid()}|{time.time()}".encode()).hexdigest()[:12]
        if self._oom_flag is None:
            from torchmem.capture.ranks import OOMFlag

            self._oom_flag = OOMFlag(os.path.dirname(os.path.abspath(self._capture)), self._job)
        return self._job

    def on_oom(self, site: Any) -> None:
        """This process raised an out-of-memory error: the job's flag tells the other ranks (once)."""
        if self._oom_flag is not None and not self._flag_raised:
            self._raise_flag(site)

    def _raise_flag(self, site: Any) -> None:
        self._flag_raised = True
        try:
            rank = self._rank.rank if self._rank is not None else None
            self._oom_flag.raise_(
                rank, site=site, step=self._steps(), device=str(self._device()), capture=self._capture
            )
        except Exception:
            pass

    @property
    def watching(self) -> bool:
        """The job has a flag and no rank's OOM was seen yet (the sampler checks it)."""
        return self._oom_flag is not None and self._oom_flag.seen is None

    def check(self) -> None:
        """Another rank's OOM raised the flag: this rank's state now, once."""
        try:
            body = self._oom_flag.check()
        except Exception:
            body = None
        if body is not None:
            self._write_state(body)

    def _write_state(self, trigger: dict[str, Any]) -> None:
        """What this process holds at the moment a rank of the job ran out of memory (a ``rank_state``)."""
        with self._lock:
            if self._state_written:
                return
            self._state_written = True
        try:
            r = self._reading()
            stats: Any = None
            try:
                from torchmem.capture.snapshot import read_stats

                stats = read_stats(self._device(), probe=False).to_dict()
            except Exception:
                stats = None
            self._records.record(
                "rank_state",
                trigger=trigger,
                wall=time.time(),
                step=self._steps(),
                allocated=r.allocated,
                reserved=r.reserved,
                peak_allocated=r.peak_allocated,
                peak_reserved=r.peak_reserved,
                stats=stats,
            )
        except Exception as exc:
            self._records.note(
                f"this rank's state at another rank's OOM could not be read ({type(exc).__name__}: {exc})"
            )

    @property
    def group_written(self) -> bool:
        """The process group's facts are written (or could not be)."""
        return self._pg_written

    def write_group_facts(self) -> None:
        """The default process group's rank, world size, backend, NCCL communicators: once, no collective."""
        dist = sys.modules.get("torch.distributed")
        if dist is None:
            return
        try:
            if not dist.is_available() or not dist.is_initialized():
                return
            from torchmem.capture.ranks import process_group_facts
            from torchmem.results.ranks import estimate_nccl

            facts = process_group_facts()
            if facts is None:
                return
            self._pg_written = True
            nccl = estimate_nccl(os.environ, facts.get("nccl_communicators") or 0)
            self._records.record("rank", **facts, nccl=nccl.to_dict() if nccl is not None else None)
        except Exception as exc:
            self._pg_written = True
            self._records.note(f"the process group could not be described ({type(exc).__name__}: {exc})")

    def before_destroy(self) -> None:
        """The program destroys its process group: a reading while NCCL's communicators still exist (the
        end reading comes after them; NCCL's measured figure is in this one)."""
        if self._records.disabled or self._pg_end_read:
            return
        from torchmem.capture.ranks import process_group_facts

        facts = process_group_facts()
        if facts and facts.get("nccl_communicators"):
            self._pg_end_read = True
            self._records.stats(self._device(), "destroy_process_group")

    def finish(self, exc: BaseException | None) -> None:
        """At the end: the process group's facts if no step wrote them, the flag raised for an OOM that
        ended the run unseen, and this rank's state if a flag was raised and the sampler missed it."""
        if not self._pg_written:
            self.write_group_facts()
        flag = self._oom_flag
        if flag is None:
            return
        if exc is not None and not self._flag_raised:
            try:
                from torchmem.analysis.oom import is_oom

                if is_oom(exc):
                    self._raise_flag(None)
            except Exception:
                pass
        if flag.seen is None:
            self.check()
