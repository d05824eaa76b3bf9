"""The out-of-memory errors of a run: every one the program raised (on any thread, seen by the OOM
observer), written once it is known whether the program caught it, and the one that ended the run
explained."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

import torch


class OOMLog:
    """The OOMs a session saw. ``records``: its :class:`~torchmem.run.records.Records`; ``steps`` gives the
    step count; ``on_oom`` is told each OOM's site (the job's flag: capture/ranks.py)."""

    def __init__(self, records: Any, steps: Callable[[], int], on_oom: Callable[[Any], None]) -> None:
        self._records = records
        self._steps = steps
        self._on_oom = on_oom
        self._pid = os.getpid()
        self._events: list[Any] = []  # every OOM event, in order
        self._pending: list[tuple[Any, int]] = []  # (event, step) not yet written
        self._lock = threading.Lock()
        self._caught: list[Any] = []

    @property
    def events(self) -> tuple[Any, ...]:
        return tuple(self._events)

    @property
    def caught(self) -> tuple[Any, ...]:
        """The OOMs the program caught and went on."""
        return tuple(self._caught)

    @property
    def pending(self) -> bool:
        """Some OOM is not written yet."""
        return bool(self._pending)

    def on_event(self, event: Any) -> None:
        """An OOM was raised (on any thread): written once we know whether the program caught it."""
        if self._records.disabled or os.getpid() != self._pid:
            return
        with self._lock:
            self._events.append(event)
            self._pending.append((event, self._steps()))
        self._on_oom(getattr(event, "site", None))

    def flush(self, caught_by: BaseException | None, final: bool = False) -> None:
        """Write the pending OOM events: at a step boundary they were all caught (the program went on); at
        the end, the one that ended the program (``caught_by``) is not."""
        with self._lock:
            pending, self._pending = self._pending, []
        if not pending:
            return
        uncaught = None
        if final and caught_by is not None:
            from torchmem.capture.oom import match_event

            uncaught = match_event([e for e, _ in pending], caught_by)
        for event, step in pending:
            if event is not uncaught:
                self._caught.append(event)
            d = event.diagnosis
            self._records.record(
                "oom",
                diagnosis=d.to_dict() if d is not None else {},
                step=step,
                caught=event is not uncaught,
                site=event.site,
                event=event.to_dict() | {"diagnosis": None},
            )

    def finish(self, final_exc: BaseException | None, device: torch.device, leak: Any) -> Any:
        """At the end: the pending OOMs written, and the OOM that ended the program (``final_exc``, else
        ``None``) explained (an ``OOMDiagnosis``, returned)."""
        matched = None
        if final_exc is not None and self._events:
            from torchmem.capture.oom import match_event

            with self._lock:
                matched = match_event([e for e, _ in self._pending], final_exc)
        try:
            self.flush(caught_by=final_exc, final=True)
        except Exception as e:
            self._records.note(f"the recorded OOMs could not be written ({type(e).__name__}: {e})")
        oom = None
        if final_exc is not None:
            try:
                from torchmem.capture.oom import explain_oom

                oom = explain_oom(final_exc, device=device, leak=leak if leak and leak.leaking else None)
                if matched is None:  # not seen when raised (an OOM outside the observers): written now
                    self._records.record(
                        "oom", diagnosis=oom.to_dict(), step=self._steps(), caught=False, site=None
                    )
            except Exception as e:
                self._records.note(f"the OOM could not be explained ({type(e).__name__}: {e})")
        return oom
