"""What a watcher's readings say: :class:`GrowthTrack` keeps the readings (the detector's window, the series
for the report) and decides the verdict, and :func:`build_report` makes the :class:`LeakReport` of it.

The detector (:class:`~torchmem.analysis.leaks.GrowthStream`) judges the last :data:`WINDOW_READINGS`
readings after the warm-up at O(1) per reading; a second one judges them at the run's own rate once the
growth since the first reading is large (a threshold never hides growth that is large over the run). When
nothing is found, the verdict always says why: too few steps (and how many are needed), flat, noisy, below
the threshold (with the value that would report it), stopped, or growth inside each call that falls back.
"""

from __future__ import annotations

from torchmem._format import fmt_bytes
from torchmem.analysis.growth import (
    STEADY_READINGS,
    WINDOW_READINGS,
    below_threshold_reason,
    periodic_words,
)
from torchmem.analysis.leaks import (
    STEADY_EVIDENCE,
    GrowthStream,
    detect_growth,
    inner_growth,
    large_growth,
    run_threshold,
    short_run_growth,
    with_total,
)
from torchmem.results.leaks import Culprit, Growth, LeakReport


class GrowthTrack:
    """The readings of one watch and the growth they show.

    ``stream``: the detector over the last :data:`WINDOW_READINGS` readings after the warm-up. ``series``:
    every reading kept for the report (every one up to 4096, then every 2nd, 4th, ...: bounded). ``growth``:
    the detector's finding at the last reading; ``detected_at`` / ``stopped_at``: the steps where growth was
    first found and where it stopped.
    """

    def __init__(self, min_bytes_per_step: int, warmup: int) -> None:
        self.min_bytes_per_step = min_bytes_per_step
        self.warmup = warmup
        self.stream = GrowthStream(min_bytes_per_step, STEADY_READINGS, WINDOW_READINGS)
        self.series: list[tuple[int, int]] = []
        self._keep_every = 1
        # A threshold never hides growth that is large over the run: the first reading after the warm-up,
        # and the same test at the run's own rate once the growth since it is large (see _over_the_run).
        self._run_first: tuple[int, int] | None = None
        self._run_stream: GrowthStream | None = None
        self.growth: Growth = Growth(False, 0.0, 0.0, "none", 0, "no steps yet")
        self._explained: tuple[tuple[int, int], Growth] | None = None
        self.detected_at: int | None = None
        self.stopped_at: int | None = None

    def keep(self, n: int, value: int) -> None:
        """Keep the reading of step ``n`` in the series, if the series keeps that step."""
        if n % self._keep_every:
            return
        self.series.append((n, value))
        if len(self.series) >= 4096:
            self.series = self.series[::2]
            self._keep_every *= 2

    def add(self, n: int, value: int) -> Growth | None:
        """A reading after the warm-up, judged: the growth it shows (``None`` before two readings)."""
        stream = self.stream
        growth = stream.add(n, value)
        if self._run_first is None:
            self._run_first = (n, value)
        growth = self._over_the_run(n, value, growth)
        if len(stream.values) < 2:
            return None
        self.growth = growth
        if growth.leaking:
            if self.detected_at is None:
                self.detected_at = n
            self.stopped_at = None
        elif self.detected_at is not None and self.stopped_at is None and self._flat():
            self.stopped_at = n
        elif self.stopped_at is not None and self._rose_since(self.stopped_at):
            self.stopped_at = None  # the flat stretch was the gap between two jumps of regular growth
        return growth

    def _rose_since(self, step: int) -> bool:
        """Growth in regular jumps (:meth:`GrowthStream.periodic`) went on after ``step``."""
        jumps = self.stream.jumps
        return bool(jumps) and jumps[-1][0] > step and self.stream.periodic() is not None

    def _over_the_run(self, n: int, value: int, growth: Growth) -> Growth:
        """``growth``, or a leak where growth below ``min_bytes_per_step`` is large over the run.

        Once the figure grew since the first reading after the warm-up by 256 MiB or more, or more than
        doubled by 32 MiB or more (:func:`~torchmem.analysis.leaks.large_total`), the growth test also runs
        at half the run's mean rate (a second :class:`GrowthStream`, O(1) per reading like the first): growth
        still going on at that pace is a leak whatever the threshold, reported with its total. A one-time
        rise is not: the readings since do not rise at that pace.
        """
        first = self._run_first
        rs = self._run_stream
        if rs is None:
            if first is None:
                return growth
            thr = run_threshold(first, (n, value))
            if thr is None or thr >= self.min_bytes_per_step:
                return growth
            rs = self._run_stream = GrowthStream(thr, STEADY_READINGS, WINDOW_READINGS)
            for x, y in list(zip(self.stream.steps, self.stream.values))[:-1]:
                rs.add(x, y)
        found = rs.add(n, value)
        if growth.leaking or not found.leaking or first is None:
            return growth
        return large_growth(found, first, (n, value), self.min_bytes_per_step)

    def _flat(self) -> bool:
        """The last 5 readings are flat, and, where the growth came in regular jumps, for longer than two of
        its periods (a flat stretch between two jumps is not growth that stopped)."""
        values = self.stream.values
        k = 5
        if len(values) < k:
            return False
        tail = [values[-i] for i in range(1, k + 1)]
        if max(tail) - min(tail) >= self.min_bytes_per_step * (k - 1) / 2:
            return False
        return self.stream.periodic() is None

    def verdict(self, steps: int, stride: int) -> tuple[str, str, float, float]:
        """``(verdict, reason, growth per step, confidence)`` after ``steps`` steps read every ``stride``:
        never a bare "no leak"; always why."""
        warmup = self.warmup
        post_steps, post_values = self.stream.steps, self.stream.values
        first = warmup + STEADY_READINGS * stride  # the step of the first possible verdict
        reads = f"{STEADY_READINGS} readings" + (f", one every {stride} steps" if stride > 1 else "")
        # (growth smaller than STEADY_EVIDENCE thresholds over those readings needs more of them)
        big = fmt_bytes(int(STEADY_EVIDENCE * self.min_bytes_per_step / ((STEADY_READINGS - 1) * stride)))
        reads += f"; growth under {big}/step needs more"
        if steps == 0:
            return (
                "no_steps",
                "no steps were recorded (the loop ran 0 times, or step() was never called): wrap the loop "
                "(`for batch in torchmem.watch(loader)`), call `w.step()` at the end of each step, or, with "
                "optimizer_steps=True, check that `optimizer.step()` runs on the thread that started the "
                "watch",
                0.0,
                0.0,
            )
        short = self.short_run(steps)
        if short is not None:
            return "leak", short.reason, short.bytes_per_step, short.confidence
        if steps <= warmup:
            return (
                "too_few",
                f"{steps} step(s), all within the {warmup}-step warm-up: not enough to judge; the "
                f"first verdict needs {first} steps (warm-up {warmup} + {reads}): run more steps, or "
                "pass a smaller warmup=",
                0.0,
                0.0,
            )
        g = self.growth
        if g.leaking:
            # Growth that fell back at the end of each call, seen again in the last one: the sawtooth of a
            # state carried inside each call, not a leak across calls.
            inner = self._inner(g.confidence)
            return inner if inner is not None else ("leak", g.reason, g.bytes_per_step, g.confidence)
        if len(post_values) < STEADY_READINGS:
            return (
                "too_few",
                f"{steps} steps, {len(post_values)} reading(s) after the {warmup}-step "
                f"warm-up: not enough to judge; the first verdict needs {first} steps (warm-up "
                f"{warmup} + {reads}): run more steps",
                0.0,
                g.confidence,
            )
        key = (steps, len(post_values))
        if self._explained is None or self._explained[0] != key:
            g = detect_growth(list(post_steps), list(post_values), min_bytes_per_step=self.min_bytes_per_step)
            periodic = self.stream.periodic()
            if periodic is not None and periodic[0] < self.min_bytes_per_step:
                # jumps at a regular interval, too small for the threshold: said as such (the window may
                # hold only a few of them and call the last "a one-time rise")
                rate, size, gap = periodic
                reason = (
                    f"{periodic_words(self.stream.jumps, size, gap)}, and never gives it back; "
                    + below_threshold_reason(rate, self.min_bytes_per_step)
                )
                g = Growth(
                    False,
                    0.0,
                    g.confidence,
                    "none",
                    g.samples,
                    reason,
                    "below_threshold",
                    rate,
                    self.min_bytes_per_step,
                )
            if self._run_first is not None:
                g = with_total(g, self._run_first, (post_steps[-1], post_values[-1]))
            self._explained = (key, g)
        g = self._explained[1]
        verdict = "stopped" if self.stopped_at is not None else g.verdict
        if verdict in ("stopped", "noisy", "flat", "below_threshold"):
            inner = self._inner(g.confidence)
            if inner is not None:
                return inner
        return verdict, g.reason, g.trend_per_step, g.confidence

    def _inner(self, confidence: float) -> tuple[str, str, float, float] | None:
        """The verdict of growth inside each call (:func:`inner_growth`), ``None`` where the series is no
        such sawtooth."""
        inner = inner_growth(self.series, self.min_bytes_per_step)
        if inner is None:
            return None
        rate, length, height, ramps = inner
        return (
            "inner_growth",
            f"the figure climbs by {fmt_bytes(int(rate))}/step for about {length} steps and falls "
            f"back at the end ({ramps} times): each call's peak grows by {fmt_bytes(height)} with "
            "its inner loop, and with the loop's length (a graph or state carried from one iteration "
            "to the next); nothing is kept across calls. Fix: run the loop under torch.no_grad() "
            "(or torch.inference_mode()) when no gradient is needed, else detach what one iteration "
            "hands to the next (`h = h.detach()`)",
            rate,
            confidence,
        )

    def short_run(self, steps: int) -> Growth | None:
        """A run too short for the growth tests, judged on its readings from the first step (warm-up
        included) when its growth is overwhelming (:func:`short_run_growth`)."""
        if self.growth.leaking or steps == 0 or len(self.stream.values) >= STEADY_READINGS:
            return None
        return short_run_growth(self.series, self.min_bytes_per_step)


def build_report(
    track: GrowthTrack,
    *,
    device: str,
    source: str,
    mode: str,
    steps: int,
    stride: int,
    culprits: tuple[Culprit, ...],
    notes: list[str],
    excluded: int,
) -> LeakReport:
    """The :class:`LeakReport` of a watch after ``steps`` steps: the verdict of ``track``'s readings,
    ``culprits``, and ``notes`` (the stride's first) with what the figure ``source`` is; ``excluded``: bytes
    of a host figure that turning the ledger on and off changed, left out of the readings."""
    verdict, reason, trend, confidence = track.verdict(steps, stride)
    growth = track.growth
    short = verdict == "leak" and not growth.leaking  # a short run's overwhelming growth
    notes = list(notes)
    if source == "ledger":
        notes.append("figures: torchmem's exact tensor accounting (this device has no allocator statistics)")
    elif source in ("heap", "rss"):
        what = (
            "the C heap in use (glibc mallinfo2: CPU tensor storages, autograd graphs and other native "
            "allocations)"
            if source == "heap"
            else "the process's resident set size (RSS; the C heap cannot be read here)"
        )
        notes.append(
            f"figures: {what}; allocation sites from torchmem's exact tensor accounting, on only while "
            "growth was being attributed"
            + (
                f" (what turning it on and off and naming the culprits changed, {fmt_bytes(excluded)}, is "
                "left out)"
                if excluded
                else ""
            )
        )
    return LeakReport(
        device=device,
        source=source,
        mode=mode,
        steps=steps,
        warmup=track.warmup,
        leaking=verdict == "leak",
        bytes_per_step=trend if short else growth.bytes_per_step if verdict == "leak" else 0.0,
        confidence=confidence,
        detected_at=steps if short else track.detected_at,
        stopped_at=track.stopped_at,
        reason=reason,
        culprits=culprits,
        series=tuple(track.series),
        notes=tuple(notes),
        verdict=verdict,
        trend_per_step=trend,
        min_bytes_per_step=track.min_bytes_per_step,
    )


__all__ = ["STEADY_READINGS", "WINDOW_READINGS", "GrowthTrack", "build_report"]
