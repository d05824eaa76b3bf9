"""The capture file of a session: every record written under one lock, the step records kept by the loop and
written in batches by the sampler, and nothing written at all from a forked child."""

from __future__ import annotations

import collections
import threading
from typing import Any

import torch


class Records:
    """Writes a session's records (``capture/file.CaptureWriter``): :meth:`record` and :meth:`note` never
    raise into the program, and do nothing before :meth:`open`, after :meth:`disable` or in a child."""

    def __init__(self) -> None:
        self._writer: Any = None
        self._lock = threading.Lock()
        self._disabled = False
        self._pending_steps: collections.deque[tuple[float, int, int | None]] = collections.deque()

    def open(self, capture: str, **header: Any) -> None:
        """Create the capture file and write its header (raises when the path is unusable)."""
        from torchmem.capture.file import CaptureWriter

        self._writer = CaptureWriter(capture, **header)

    @property
    def disabled(self) -> bool:
        """This process is a forked child: it records nothing."""
        return self._disabled

    def disable(self) -> None:
        """A forked child (DataLoader workers) must never write the parent's capture."""
        self._disabled = True
        self._writer = None

    def record(self, record: str, /, **fields: Any) -> None:
        if self._writer is None or self._disabled:
            return
        with self._lock:
            if record == "sample":
                self._writer.sample(**fields)
            elif record == "step":
                self._writer.step(**fields)
            else:
                self._writer.record(record, **fields)

    def note(self, text: str) -> None:
        try:
            self.record("note", text=text)
        except Exception:  # the writer reports its own failures once
            pass

    def keep_step(self, step: int, allocated: int | None) -> None:
        """A step record, kept here and written by the sampler thread (one batch per tick): a JSON line and a
        write() per step were the largest part of a step's bookkeeping on a GPU host."""
        writer = self._writer
        if writer is not None:
            self._pending_steps.append((writer.elapsed(), step, allocated))
            if len(self._pending_steps) > 4096:  # the sampler is not draining them: write here
                self.flush_steps()

    def flush_steps(self) -> None:
        """Write the step records the loop kept since the last flush (in order, with their own times)."""
        pending = self._pending_steps
        while pending:
            try:
                t, n, allocated = pending.popleft()
            except IndexError:
                return
            self.record("step", step=n, allocated=allocated, t=t)

    def stats(self, device: torch.device, when: str) -> None:
        """The device's full statistics now, as a ``stats`` record (``when``: start, end, ...)."""
        try:
            from torchmem.capture.snapshot import read_stats

            s = read_stats(device, probe=False)  # no probe process on the program's time
            try:
                bd: Any = s.breakdown().to_dict()
            except Exception:
                bd = None
            self.record("stats", when=when, stats=s.to_dict(), breakdown=bd)
        except Exception as exc:
            self.note(f"stats at {when} could not be read ({type(exc).__name__}: {exc})")

    def close(self, *, exit_code: int | None, reason: str, steps: int, seconds: float) -> None:
        """The end record; the capture is complete."""
        if self._writer is not None and not self._disabled:
            with self._lock:
                self._writer.close(exit_code=exit_code, reason=reason, steps=steps, seconds=seconds)
