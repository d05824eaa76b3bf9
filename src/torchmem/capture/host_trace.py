"""What :class:`torchmem.capture.host.HostWatcher` says besides its verdict (:class:`HostNotes`: its notes and
the errors it met, each once), and its tracing windows with the accounting of its own work
(:class:`HostTracer`).

Between the first two scans of a sequence tracemalloc traces Python allocations (the lines that keep what
they allocate), between the last two where the new instances of growing types are made; the scans
themselves run untraced. What torchmem's own work (a scan, a node count, a snapshot) leaves on the C heap,
and what tracemalloc's tables grow by, is not the program's: the offsets subtract it from later readings.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import time
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any

from torchmem._warn import ReportedOnce
from torchmem.analysis.host_state import LineGrowth, growing_lines
from torchmem.capture.host_objects import creation_line, minus, traced_lines

_log = logging.getLogger("torchmem")


class HostNotes:
    """The watcher's notes for the report, and the internal errors it met (each reported once)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.error = ReportedOnce(
            self._said, "internal error in the host watcher's {where} ({error}); the program went on"
        )
        """Report an internal error of ``(where, exc)``, once per place."""

    def add(self, note: str) -> None:
        self.lines.append(note)

    def _said(self, note: str) -> None:
        self.lines.append(note)
        _log.warning("torchmem: %s", note)


def traces_memory() -> int:
    """Bytes tracemalloc uses for its own tables (0 when not tracing)."""
    return tracemalloc.get_tracemalloc_memory() if tracemalloc.is_tracing() else 0


class HostTracer:
    """tracemalloc's windows during a scan sequence, and the offsets of torchmem's own work.

    Args:
        raw: The C heap now, raw (``None`` where it is not the figure or cannot be read).
        notes: Where errors are reported.
        min_bytes_per_step: The watcher's threshold (the growing lines' is at most 1 KiB/step).
    """

    def __init__(self, raw: Callable[[], int | None], notes: HostNotes, *, min_bytes_per_step: int) -> None:
        self._raw = raw
        self._notes = notes
        self._min_bytes = min_bytes_per_step
        self.mode = ""  # "ours": torchmem started tracemalloc; "theirs": the program did
        self._tm_mark = 0
        # What torchmem's own work left on the C heap: subtracted from the readings.
        self.offset = 0
        self._excluded_primary = 0
        self.seconds = 0.0  # time in snapshots at step boundaries (torchmem's work, not the readings')
        self._lines0: dict[str, tuple[int, int]] = {}  # at the start of tracing (a program that traces)
        self._lines1: tuple[int, dict[str, tuple[int, int]]] | None = None  # at the first step traced
        self._line_window = False  # tracing from the first scan to the second, to find growing lines
        self.line_facts: tuple[LineGrowth, ...] = ()
        self._traced_from: tuple[int, float, float] | None = None  # step, time, step time before
        self._trace_notes: list[tuple[float, list[tuple[int, int, float]]]] = []  # step time before, windows
        self.traced: tuple[float, float] | None = None  # Python allocations kept per step (all, in the heap)

    # -- torchmem's own work ---------------------------------------------------------------------------
    def figures(self) -> int | None:
        """The C heap now, raw (``None`` where it is not the figure or cannot be read). Only the heap gets
        offsets: the RSS keeps what torchmem's work touched and gives it back when it likes (the program
        reuses it first), so after a scan the RSS is judged afresh instead."""
        return self._raw()

    @contextlib.contextmanager
    def own_work(self) -> Iterator[None]:
        """torchmem's own work inside a step: what it leaves on the heap (and in the RSS) is not the
        program's, so it is subtracted from later readings."""
        h0 = self.figures()
        self._excluded_primary = 0
        self._tm_mark = traces_memory()
        try:
            yield
        finally:
            self._exclude_traces()
            h1 = self.figures()
            if h0 is not None and h1 is not None:
                self.offset += h1 - h0 - self._excluded_primary

    def _exclude_traces(self) -> None:
        """What tracemalloc's own tables grew by during torchmem's work is not torchmem's state: it goes
        when tracing stops (and is left out of the offsets there)."""
        if self.mode == "ours":
            now = traces_memory()
            self._excluded_primary += now - self._tm_mark
            self._tm_mark = now

    def exclude(self, h0: int | None) -> None:
        """Leave what changed since ``h0``/``r0`` out of the offsets: memory that lives during the program's
        steps (a trace, a site window), which the readings see come and go."""
        h1 = self.figures()
        if h0 is not None and h1 is not None:
            self._excluded_primary += h1 - h0

    # -- tracing ---------------------------------------------------------------------------------------
    def start(self) -> None:
        """Trace Python allocations until the next scan, to learn where new objects are created (unless the
        program traces them itself: then its traces are read)."""
        if self.mode:
            return
        if tracemalloc.is_tracing():
            self.mode = "theirs"
            return
        h0 = self.figures()
        tracemalloc.start(16)
        self.mode = "ours"
        self.exclude(h0)
        self._tm_mark = traces_memory()

    def stop(self) -> None:
        mode, self.mode = self.mode, ""
        if mode == "ours":
            self._exclude_traces()
            h0 = self.figures()
            tracemalloc.stop()
            self.exclude(h0)
            self._tm_mark = 0

    def begin(self, n: int, *, lines: bool, step_time: float) -> None:
        """Trace Python allocations (tracemalloc) until the next scan: after the first scan to find the lines
        that keep what they make (``lines``: a snapshot at the next step boundary and one at the second scan
        tell them from those whose objects are freed), after the second to learn where the new instances of
        growing types are made. The scans themselves run untraced. ``step_time``: a step's time before."""
        self.start()
        if self.mode:
            if lines or not self._trace_notes:
                self._trace_notes.append((step_time, []))
                del self._trace_notes[:-2]
            self._line_window = lines
            self._lines0 = (self.snapshot_lines() or {}) if lines and self.mode == "theirs" else {}
            self._traced_from = (n, time.perf_counter(), step_time)

    def wants_snapshot(self, n: int, due: int | None) -> bool:
        """Step ``n`` is the first boundary of a line window, before the scan due."""
        return self._line_window and self._lines1 is None and n < (due or 0)

    def mid_snapshot(self, n: int) -> None:
        """The first step boundary while tracing for lines: what the traced lines keep after one step."""
        t0 = time.perf_counter()
        try:
            with self.own_work():
                lines = self.snapshot_lines()
                if lines is not None:
                    self._lines1 = (n, lines)
        finally:
            self.seconds += time.perf_counter() - t0

    def trace_cost(self, n: int) -> None:
        """The time of the steps traced since :meth:`begin` (with torchmem's own work in them)."""
        if self._traced_from is None or self.mode != "ours":
            return
        n0, t0, _ = self._traced_from
        self._traced_from = None
        if n > n0 and self._trace_notes:
            self._trace_notes[-1][1].append((n0 + 1, n, (time.perf_counter() - t0) / (n - n0)))

    def snapshot_lines(self, *, then_stop: bool = False) -> dict[str, tuple[int, int]] | None:
        """What the traced lines keep now (:func:`traced_lines` of a snapshot); with ``then_stop``, tracing
        stops once the snapshot is taken, before its traces are grouped (tracing costs each allocation of
        the grouping a traceback: ~4x its time)."""
        snap = None
        try:
            snap = tracemalloc.take_snapshot()
        except Exception as exc:
            self._notes.error("tracemalloc snapshot", exc)
        finally:
            if then_stop:
                self.stop()
        if snap is None:
            return None
        try:
            return traced_lines(snap)
        except Exception as exc:
            self._notes.error("tracemalloc snapshot", exc)
            return None

    def end_line_window(self) -> dict[str, tuple[int, int]] | None:
        """At the second scan: where the program allocated what is still alive since tracing started (before
        the scan allocates), then tracing stops. ``None`` when no line window was on."""
        if not self._line_window:
            return None
        return self.snapshot_lines(then_stop=True)

    def line_growth(self, first: int, second: int, lines: dict[str, tuple[int, int]] | None) -> None:
        """The lines that keep what they make, from the snapshots of the first window (the scans at steps
        ``first`` -> ``second``), and the Python allocations kept per step."""
        mid, self._lines1 = self._lines1, None
        base, self._lines0 = self._lines0, {}
        self._line_window = False
        self.line_facts, self.traced = (), None
        if lines is None or mid is None or not first < mid[0] < second:
            return
        a, b = minus(mid[1], base), minus(lines, base)
        gap = second - mid[0]
        self.line_facts = tuple(
            growing_lines(
                {k: v[0] for k, v in a.items()},
                {k: v[0] for k, v in b.items()},
                mid[0] - first,
                gap,
                min_bytes_per_step=min(1024.0, self._min_bytes),
            )
        )
        traced = max(0.0, sum(v[0] for v in b.values()) - sum(v[0] for v in a.values())) / gap
        traced_heap = max(0.0, sum(v[1] for v in b.values()) - sum(v[1] for v in a.values())) / gap
        self.traced = (traced, traced_heap)

    def forget_lines(self) -> None:
        """The growing lines of a sequence that named nothing."""
        self.line_facts = ()

    def reset(self) -> None:
        """The end of a scan sequence: no window is open any more."""
        self._lines0, self._lines1, self._traced_from, self._line_window = {}, None, None, False

    def creation_sites(self, samples: dict[str, list[Any]]) -> dict[str, str | None]:
        """For each sampled type, the user's line that created most of its sampled new instances (``None``
        where tracemalloc has no exact trace of them: objects reused from a free list, such as dicts, lists
        and floats, whose line is then the growing line closest to their rate)."""
        if not self.mode or not samples:
            return {}
        out: dict[str, str | None] = {}
        for k, objs in samples.items():
            # Built-in types reuse freed objects (free lists): the trace at their address may be another's.
            exact = [o for o in objs if type(o).__module__ != "builtins"]
            found = collections.Counter(s for s in map(creation_line, exact) if s)
            out[k] = found.most_common(1)[0][0] if found else None
        return out

    def text(self) -> list[str]:
        """What tracing cost, per scan sequence: the steps traced and their time against the steps before."""
        out = []
        for before, windows in self._trace_notes:
            steps = sum(b - a + 1 for a, b, _ in windows)
            if not steps:
                continue
            each = sum((b - a + 1) * t for a, b, t in windows) / steps
            which = ", ".join(f"{a}-{b}" if b > a else str(a) for a, b, _ in windows)
            compared = f", against {before * 1e3:.2f} ms before" if before > 0 else ""
            out.append(
                f"tracemalloc traced Python allocations for {steps} steps (steps {which}) to find what keeps "
                f"growing: a step took {each * 1e3:.2f} ms with it{compared}"
            )
        return out
