"""The live status line of ``torchmem run`` (on a terminal): redrawn by the sampler, cleared before the
program writes (stdout and stderr are wrapped while it shows), never drawn into a line the program has
begun."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

from torchmem._format import fmt_bytes


class StatusLine:
    """The status line on ``file`` (``enabled``: it is drawn at all) and the program's writes around it."""

    def __init__(self, file: TextIO, enabled: bool) -> None:
        self.file = file
        self.enabled = enabled
        self._lock = threading.RLock()
        self._len = 0
        self._user_line_open = False
        self._streams: list[tuple[str, StatusAwareStream]] = []
        self._forecast_at = 0.0
        self._forecast_text = ""
        self._shown_at = 0.0

    def due(self, now: float) -> bool:
        """Whether the line is to be redrawn at ``now`` (every 0.25 s at most); if so, it counts as drawn."""
        if now - self._shown_at >= 0.25:
            self._shown_at = now
            return True
        return False

    def text(
        self,
        steps: int,
        allocated: int | None,
        reserved: int | None,
        peak: int | None,
        watcher: Any,
        gpus: Any,
        forecast: Callable[[Any], Any],
    ) -> str:
        """The line: the step, the figures, the leak and when the memory runs out at its rate (the
        ``forecast`` of the watcher's report, at most every 2 s), the other GPUs this process uses."""
        text = f"[torchmem] step {steps} | allocated {fmt_bytes(allocated)}"
        if reserved is not None:
            text += f" | reserved {fmt_bytes(reserved)}"
        text += f" | peak {fmt_bytes(peak)}"
        if watcher is not None and watcher.leaking:
            text += f" | LEAK +{fmt_bytes(int(watcher.report().bytes_per_step))}/step"
            text += self._forecast(watcher, forecast)
        if gpus is not None:
            text += gpus.status()  # the other GPUs this process uses
        return text

    def _forecast(self, watcher: Any, forecast: Callable[[Any], Any]) -> str:
        now = time.perf_counter()
        if now - self._forecast_at >= 2.0:
            self._forecast_at = now
            try:
                f = forecast(watcher.report())
                self._forecast_text = f" | {f.short()}" if f is not None else ""
            except Exception:
                self._forecast_text = ""
        return self._forecast_text

    def show(self, text: str) -> None:
        """Draw ``text`` over the line shown (not while the program is in the middle of a line)."""
        with self._lock:
            if self._user_line_open:  # the program is in the middle of a line: do not write into it
                return
            pad = max(0, self._len - len(text))
            self._len = len(text)
            self.file.write("\r" + text + " " * pad)
            self.file.flush()

    def clear(self) -> None:
        with self._lock:
            self._clear_locked()

    def warn(self, text: str) -> None:
        """``torchmem: warning: text`` on the status line's file, the line cleared first."""
        with self._lock:
            self._clear_locked()
            try:
                print(f"torchmem: warning: {text}", file=self.file, flush=True)
            except Exception:
                pass

    def _clear_locked(self) -> None:
        if self.enabled and self._len:
            self.file.write("\r" + " " * self._len + "\r")
            self.file.flush()
            self._len = 0

    def program_write(self, stream: Any, text: str) -> int:
        """The program writes ``text`` to ``stream``: the line is cleared first, under the lock (the sampler
        cannot draw between the clearing and the program's text)."""
        with self._lock:
            try:
                if self._len:
                    self._clear_locked()
                if text:
                    self._user_line_open = not text.endswith("\n")
            except Exception:  # never break the program's output
                pass
            return int(stream.write(text))

    def wrap_streams(self) -> None:
        """Clear the status line before the program prints (stdout and stderr share the terminal)."""
        for name in ("stdout", "stderr"):
            stream = getattr(sys, name)
            if stream is None or isinstance(stream, StatusAwareStream):
                continue
            wrapper = StatusAwareStream(stream, self)
            setattr(sys, name, wrapper)
            self._streams.append((name, wrapper))

    def unwrap_streams(self) -> None:
        for name, wrapper in self._streams:
            if getattr(sys, name) is wrapper:  # the program may have replaced it: then leave it
                setattr(sys, name, wrapper._tm_stream)
        self._streams = []


class StatusAwareStream:
    """``sys.stdout``/``sys.stderr`` while the live status line shows: the line is cleared before the
    program writes, and redrawn only once the program's line is complete. Its own attributes are named
    ``_tm_*``: every other name is the wrapped stream's."""

    def __init__(self, stream: Any, line: StatusLine) -> None:
        self._tm_stream = stream
        self._tm_line = line

    def write(self, text: str) -> int:
        return self._tm_line.program_write(self._tm_stream, text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tm_stream, name)
