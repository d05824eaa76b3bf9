"""The readings of :class:`torchmem.capture.host.HostWatcher`: the host figure's (the C heap's, or the
RSS's) and the RSS's beside it, kept for the report (:class:`HostSeries`) and in the detector's windows, the
verdicts on them (:func:`torchmem.analysis.leaks.detect_growth`), and Python's allocated blocks that tell
growth of the RSS alone apart."""

from __future__ import annotations

import collections
import sys
from collections.abc import Sequence

from torchmem.analysis.growth import WINDOW_READINGS as WINDOW
from torchmem.analysis.growth_stream import GrowthStream, stair_spacing
from torchmem.analysis.leaks import detect_growth
from torchmem.results.leaks import Growth

_QUICK = 12  # readings the steady test looks at on a rising reading between two verdicts
_SERIES_MAX = 4096
_BYTES_PER_BLOCK = 1024  # Python's largest small object (512 B), doubled for pools and arenas


class HostSeries:
    """HostReadings for the report: every one up to 4096, then every 2nd, 4th, ... (bounded)."""

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.values: list[int] = []
        self.keep_every = 1
        self.added = 0

    def add(self, n: int, v: int) -> None:
        self.added += 1
        if n % self.keep_every:
            return
        self.steps.append(n)
        self.values.append(v)
        if len(self.steps) >= _SERIES_MAX:
            self.steps[:] = self.steps[::2]
            self.values[:] = self.values[::2]
            self.keep_every *= 2

    def pairs(self) -> tuple[tuple[int, int], ...]:
        return tuple(zip(self.steps, self.values))

    def rate(self) -> float:
        """Growth per step over the last readings (0 when falling or unknown)."""
        return _rate(self.steps, self.values)


def _rate(steps: Sequence[int], values: Sequence[int]) -> float:
    """Growth per step from the first to the last of the last ``WINDOW`` readings (0 when falling, flat or
    fewer than two)."""
    if len(steps) < 2:
        return 0.0
    i = max(0, len(steps) - WINDOW)
    s0, v0, s1, v1 = steps[i], values[i], steps[-1], values[-1]
    return max(0.0, (v1 - v0) / (s1 - s0)) if s1 > s0 else 0.0


class HostReadings:
    """The figures' readings, as parallel lists of ints (no per-step object for gc to track), and the
    verdicts on them.

    ``ps``/``pv`` are the detector's window of the host figure (steps, bytes), ``rs``/``rv`` the RSS's beside
    the heap; ``count`` is the number of readings so far."""

    def __init__(self, *, warmup: int, min_bytes_per_step: int) -> None:
        self.warmup = warmup
        self.min_bytes_per_step = min_bytes_per_step
        self.count = 0
        # The series for the report.
        self.series = HostSeries()
        self.rss_series = HostSeries()
        self.ps: collections.deque[int] = collections.deque(maxlen=WINDOW)
        self.pv: collections.deque[int] = collections.deque(maxlen=WINDOW)
        self.rs: collections.deque[int] = collections.deque(maxlen=WINDOW)
        self.rv: collections.deque[int] = collections.deque(maxlen=WINDOW)
        self.run_first: tuple[int, int] | None = None  # the first reading after the warm-up (step, bytes)
        self.growth = Growth(False, 0.0, 0.0, "none", 0, "no steps yet")
        self.rss_growth = Growth(False, 0.0, 0.0, "none", 0, "no steps yet")
        # Python's allocated small-object blocks (``sys.getallocatedblocks()``), read with the occasional part
        # of a reading: growth of the RSS alone is Python's only when these grow too.
        self._blocks: collections.deque[tuple[int, int]] = collections.deque(maxlen=WINDOW)
        self.rss_unexplained = 0.0  # RSS growth per step that no allocator's in-use figure shows
        # The figure's readings as the device watcher judges its own (one growth engine): its periodic test
        # finds growth in stairs during the run (a validation pass every 20 steps keeping its records, which
        # the window's tests see as flat stretches), for the scans to name while the run goes on.
        self._stream = GrowthStream(min_bytes_per_step)
        self.detected_at: int | None = None
        self.since: int | None = None  # the reading since which growth is seen without a break
        self.stopped_at: int | None = None

    @property
    def leaking(self) -> bool:
        return self.growth.leaking or self.rss_growth.leaking

    def tick(self) -> int:
        """One more reading: its number."""
        self.count += 1
        return self.count

    def add_rss(self, n: int, rss: int, *, warm: bool) -> bool:
        """The RSS beside the heap at step ``n``; whether it rose at the threshold's rate over the last
        three readings."""
        self.rss_series.add(n, rss)
        if warm:
            return False
        rs, rv = self.rs, self.rv
        rs.append(n)
        rv.append(rss)
        return (
            len(rv) > 2 and rss > rv[-2] > rv[-3] and rss - rv[-3] >= self.min_bytes_per_step * (n - rs[-3])
        )

    def add_figure(self, n: int, v: int, *, warm: bool) -> bool:
        """The host figure at step ``n`` (torchmem's own work subtracted); whether it rose at the threshold's
        rate over the last three readings."""
        self.series.add(n, v)
        if warm:
            return False
        ps, pv = self.ps, self.pv
        ps.append(n)
        pv.append(v)
        self._stream.add(n, v)
        if self.run_first is None:
            self.run_first = (n, v)
        return len(pv) > 2 and v > pv[-2] > pv[-3] and v - pv[-3] >= self.min_bytes_per_step * (n - ps[-3])

    def stairs(self) -> Growth | None:
        """The figure's stairs verdict (:meth:`GrowthStream.stairs` of its readings after the warm-up), in
        the run and at its end."""
        return self._stream.stairs()

    def stair_spacing(self) -> float | None:
        """Steps between the figure's rises where it grows in stairs (:func:`stair_spacing` of its jumps)."""
        return stair_spacing(self._stream.jumps)

    def rose(self) -> bool:
        """Whether the newest reading of the figure rose at 0.8x the threshold's rate or more since the one
        before (one interval: what alerts a relaxed schedule, see :meth:`HostSchedule.alert`)."""
        ps, pv = self.ps, self.pv
        return len(pv) > 1 and pv[-1] - pv[-2] >= 0.8 * self.min_bytes_per_step * (ps[-1] - ps[-2])

    def read_blocks(self, n: int) -> None:
        if n <= self.warmup or (self._blocks and self._blocks[-1][0] == n):
            return
        self._blocks.append((n, sys.getallocatedblocks()))

    def _blocks_per_step(self) -> float | None:
        """How many of Python's small-object blocks were added per step since the first reading after the
        warm-up (least squares over the readings kept); ``None`` with fewer than two readings."""
        pts = list(self._blocks)
        if len(pts) < 2 or pts[-1][0] == pts[0][0]:
            return None
        mx = sum(x for x, _ in pts) / len(pts)
        my = sum(y for _, y in pts) / len(pts)
        den = sum((x - mx) ** 2 for x, _ in pts)
        return sum((x - mx) * (y - my) for x, y in pts) / den if den else None

    def python_growth(self, g: Growth) -> Growth:
        """RSS growth with a flat C heap counts as a leak only when Python's allocated blocks grow enough
        to make it (a small block is 512 B at most; twice that for pools and arenas). Otherwise the RSS
        grows by memory no allocator holds: pages of memory freed earlier touched again, or a library's own
        mappings. That is not claimed as a leak; it is said in a note."""
        if not g.leaking:
            return g
        per_block = self._blocks_per_step()
        if per_block is None or per_block * _BYTES_PER_BLOCK >= g.bytes_per_step:
            self.rss_unexplained = 0.0
            return g
        self.rss_unexplained = g.bytes_per_step
        return Growth(
            False,
            0.0,
            g.confidence,
            g.method,
            g.samples,
            g.reason,
            "below_threshold",
            g.trend_per_step,
            g.min_bytes_per_step,
        )

    def _judge(self, xs: Sequence[int], ys: Sequence[int], full: bool = True) -> Growth:
        tail = 0 if full else -_QUICK
        return detect_growth(
            list(xs)[tail:], list(ys)[tail:], min_bytes_per_step=self.min_bytes_per_step, explain=False
        )

    def judge_rss(self, n: int, full: bool) -> None:
        """The RSS beside the heap: Python's allocated blocks (sys.getallocatedblocks walks every arena:
        ~0.5 ms on a framework's heap) are read with the full test, and when the RSS grows: what tells
        Python's growth apart."""
        g = self._judge(self.rs, self.rv, full) if len(self.rv) > 1 else None
        if full or (g is not None and g.leaking):
            self.read_blocks(n)
        if g is not None and (full or g.leaking):
            self.rss_growth = self.python_growth(g)

    def evaluate(self, n: int, full: bool = True) -> None:
        g = self._judge(self.ps, self.pv, full)
        if not g.leaking:
            g = self.stairs() or g
        if not full and not g.leaking:
            return  # the steady test alone: it finds growth, the full test withdraws it
        self.growth = g
        if g.leaking or self.rss_growth.leaking:
            if self.detected_at is None:
                self.detected_at = n
            if self.since is None:
                self.since = self.count
            self.stopped_at = None
            return
        self.since = None
        if self.detected_at is not None and self.stopped_at is None:
            self.stopped_at = n

    def heap_rate(self) -> float:
        """The host figure's growth per step now (also below the threshold), 0 when it is not growing."""
        if len(self.pv) < 2:
            return 0.0
        g = detect_growth(list(self.ps), list(self.pv), min_bytes_per_step=self.min_bytes_per_step)
        return max(g.bytes_per_step, g.trend_per_step, 0.0)

    def fresh_rss_rate(self) -> float | None:
        """The RSS's growth per step over its readings since it was last judged afresh (the last ``WINDOW``
        of them; ``None`` before three): the whole run's RSS series spans the scans' own memory."""
        return _rate(self.rs, self.rv) if len(self.rs) >= 3 else None

    def afresh(self, *, figure: bool) -> None:
        """After a scan sequence: the RSS (and with ``figure`` the host figure, an RSS) is judged afresh (the
        scans' memory stays resident after it is freed, and the program reuses it before the RSS grows)."""
        self.rs.clear()
        self.rv.clear()
        if figure:
            self.ps.clear()
            self.pv.clear()
            self._stream = GrowthStream(self.min_bytes_per_step)
