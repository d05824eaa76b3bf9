"""Growth judged over a whole run: growth large enough to report whatever its rate per step, and growth on a
sampled timeline with no repeating step (a rate per second).

- :func:`detect_run_growth`: :func:`~torchmem.analysis.growth.detect_growth` on the last readings, where the
  threshold never hides growth that is large over the run (:func:`large_total`), with its total in words.
- :func:`timeline_growth` and :func:`timeline_report`: the verdict and the leak report of a ``(seconds,
  bytes)`` timeline.

Pure functions over numbers (re-exported by :mod:`torchmem.analysis.leaks`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from torchmem._format import fmt_bytes
from torchmem.analysis.growth import SMALL_GROWTH, detect_growth
from torchmem.results.leaks import Culprit, Growth, LeakReport

LARGE_TOTAL = 256 << 20
"""Growth over a run reported as a leak whatever its rate per step: 256 MiB."""
LARGE_DOUBLED_MIN = 32 << 20
"""Growth that more than doubled the figure is large from this much on (32 MiB)."""


def large_total(first: float, last: float) -> bool:
    """Whether growth from ``first`` to ``last`` bytes is large over a run: :data:`LARGE_TOTAL` or more, or
    a figure that more than doubled, by :data:`LARGE_DOUBLED_MIN` or more. A per-step threshold never hides
    such growth (:func:`detect_run_growth`).

    Example:
        >>> MiB = 1 << 20
        >>> large_total(114 * MiB, 804 * MiB), large_total(300 * MiB, 500 * MiB), large_total(MiB, 9 * MiB)
        (True, False, False)
    """
    total = last - first
    return total >= LARGE_TOTAL or (total >= LARGE_DOUBLED_MIN and last > 2 * first)


def total_words(first: tuple[float, int], last: tuple[float, int], unit: str = "step") -> str:
    """The growth from ``first`` to ``last`` (``(step, bytes)``; ``(seconds, bytes)`` with ``unit="s"``).

    Example:
        >>> MiB = 1 << 20
        >>> total_words((4, 114 * MiB), (22035, 804 * MiB))
        '+690.00 MiB in all from step 4 to step 22035 (114.00 MiB -> 804.00 MiB, 7.1x)'
    """

    def at(x: float) -> str:
        return f"step {x:.0f}" if unit == "step" else f"{x:.0f} s"

    (x0, y0), (x1, y1) = first, last
    ratio = f", {y1 / y0:.1f}x" if y0 > 0 else ""
    return (
        f"{fmt_bytes(y1 - y0, signed=True)} in all from {at(x0)} to {at(x1)} "
        f"({fmt_bytes(y0)} -> {fmt_bytes(y1)}{ratio})"
    )


def large_growth(
    found: Growth, first: tuple[float, int], last: tuple[float, int], threshold: float, unit: str = "step"
) -> Growth:
    """The leak verdict for growth below ``threshold`` that is large over the run: ``found`` (the growth
    test's leak with a threshold lowered to the run's own rate) with its total and why it is reported."""
    return Growth(
        True,
        found.bytes_per_step,
        found.confidence,
        found.method,
        found.samples,
        f"{found.reason}; {total_words(first, last, unit)}: below the leak threshold of "
        f"{fmt_bytes(threshold)}/{unit}, reported for its total",
        "leak",
        found.bytes_per_step,
        found.min_bytes_per_step,
    )


def run_threshold(first: tuple[float, int], last: tuple[float, int]) -> float | None:
    """The threshold that tests growth found large over a run (:func:`large_total`): half the run's mean
    rate, so that the growth going on now accounts for the total; ``None`` when the growth is not large."""
    (x0, y0), (x1, y1) = first, last
    if x1 <= x0 or not large_total(y0, y1):
        return None
    return max((y1 - y0) / (x1 - x0) / 2, SMALL_GROWTH)


def with_total(g: Growth, first: tuple[float, int], last: tuple[float, int], unit: str = "step") -> Growth:
    """``g`` with the run's total in its reason where the verdict is growth below the threshold and the
    total is large (:func:`large_total`); else ``g``."""
    if g.verdict != "below_threshold" or not large_total(first[1], last[1]):
        return g
    return Growth(
        g.leaking,
        g.bytes_per_step,
        g.confidence,
        g.method,
        g.samples,
        f"{g.reason}; {total_words(first, last, unit)}",
        g.verdict,
        g.trend_per_step,
        g.min_bytes_per_step,
    )


def detect_run_growth(
    steps: Sequence[int],
    values: Sequence[int],
    *,
    first: tuple[int, int] | None = None,
    min_bytes_per_step: float = 256 * 1024,
    window: int = 32,
) -> Growth:
    """:func:`detect_growth` on the last ``window`` readings, where the threshold never hides growth that is
    large over the whole run.

    ``first`` is the run's first reading (``(step, bytes)``, default the first of ``steps``/``values``).
    When the figure grew from it by :data:`LARGE_TOTAL` or more, or more than doubled by
    :data:`LARGE_DOUBLED_MIN` or more (:func:`large_total`), growth still going on at half the run's mean rate
    or more is a leak whatever ``min_bytes_per_step`` says; its reason gives the total and the rate. A
    one-time rise that the steady readings since do not explain is not one.

    Example:
        >>> MiB = 1 << 20
        >>> xs = range(0, 11000, 500)  # 64 KiB/step, read every 500 steps: below the 256 KiB/step threshold
        >>> g = detect_run_growth(xs, [114 * MiB + 65536 * x for x in xs])
        >>> g.leaking, g.bytes_per_step
        (True, 65536.0)
        >>> print(g.reason.split("; ")[1])  # doctest: +NORMALIZE_WHITESPACE
        +656.25 MiB in all from step 0 to step 10500 (114.00 MiB -> 770.25 MiB, 6.8x): below the leak
        threshold of 256.00 KiB/step, reported for its total
    """
    xs, ys = list(steps), list(values)
    g = detect_growth(xs, ys, min_bytes_per_step=min_bytes_per_step, window=window)
    if g.leaking or not ys:
        return g
    start = first if first is not None else (xs[0], ys[0])
    last = (xs[-1], ys[-1])
    lowered = run_threshold(start, last)
    if lowered is not None and lowered < min_bytes_per_step:
        found = detect_growth(xs, ys, min_bytes_per_step=lowered, window=window, explain=False)
        if found.leaking:
            return large_growth(found, start, last, min_bytes_per_step)
    return with_total(g, start, last)


TIMELINE_MIN_BYTES_PER_SECOND = 1 << 20
"""The timeline verdict's leak threshold: 1 MiB/s (a process that keeps what it allocates at that pace)."""
TIMELINE_WINDOW = 64
"""Readings of the timeline the verdict judges."""


def _onset(ys: Sequence[int]) -> int:
    """The index of the last reading of the plateau the timeline starts with (the figure within 1 % or 1 MiB
    of its first reading; the program's imports and set-up), 0 when it starts moving at once."""
    tol = max(1 << 20, abs(ys[0]) // 100)
    i = 0
    while i + 1 < len(ys) and abs(ys[i + 1] - ys[0]) <= tol:
        i += 1
    return i


def timeline_growth(
    points: Sequence[tuple[float, int]],
    *,
    min_bytes_per_second: float = TIMELINE_MIN_BYTES_PER_SECOND,
    _tail: bool = True,
) -> Growth | None:
    """Growth on a sampled ``(seconds, bytes)`` timeline (a run with no repeating step), per second.

    The figures of the :class:`Growth` are per second (``bytes_per_step`` is bytes per second), its reason
    speaks of seconds; growth below ``min_bytes_per_second`` that is large over the timeline is a leak with
    its total (:func:`detect_run_growth`). Growth that began late (the program's loop starts after seconds of
    imports and set-up, a plateau before it) is judged on the last half, third or quarter of the timeline
    (16 readings or more) when the whole does not show it. ``None`` for fewer than 8 readings.

    Example:
        >>> MiB = 1 << 20
        >>> g = timeline_growth([(0.05 * i, 90 * MiB + i * 2 * MiB) for i in range(60)])  # 40 MiB/s
        >>> g.leaking, round(g.bytes_per_step / MiB), g.reason
        (True, 40, 'the figure grew by 40.00 MiB/s over the sampled timeline (steady test)')
    """
    if len(points) < 8:
        return None
    t0 = points[0][0]
    dt = max((points[-1][0] - t0) / (len(points) - 1), 1e-3)
    xs = [round((t - t0) / dt) for t, _ in points]
    ys = [v for _, v in points]
    g = detect_run_growth(xs, ys, min_bytes_per_step=min_bytes_per_second * dt, window=TIMELINE_WINDOW)
    if not g.leaking and _tail:
        tails = []
        onset = _onset(ys)
        if onset and len(points) - onset >= 8:  # what followed a plateau at the start (imports, set-up)
            tails.append(points[onset:])
        for part in (2, 3, 4):  # the last half, third, quarter: at least 16 readings
            tail = points[len(points) - len(points) // part :]
            if len(tail) < 16:
                break
            tails.append(tail)
        for tail in tails:
            late = timeline_growth(tail, min_bytes_per_second=min_bytes_per_second, _tail=False)
            if late is not None and late.leaking:
                since = tail[0][0]
                return dataclasses.replace(late, reason=f"{late.reason}, since {since:.1f} s (it began late)")
    rate, trend = g.bytes_per_step / dt, g.trend_per_step / dt
    first, last = (points[0][0], ys[0]), (points[-1][0], ys[-1])
    recent = ys[-TIMELINE_WINDOW:]
    span = (points[-1][0] - points[-len(recent)][0]) if len(recent) > 1 else 0.0
    over = f"over the last {span:.0f} s of the sampled timeline"
    if g.leaking:
        reason = f"the figure grew by {fmt_bytes(rate)}/s over the sampled timeline ({g.method} test)"
        if g.min_bytes_per_step < min_bytes_per_second * dt:
            reason += (
                f"; {total_words(first, last, 's')}: below the leak threshold of "
                f"{fmt_bytes(min_bytes_per_second)}/s, reported for its total"
            )
    elif g.verdict == "below_threshold":
        reason = (
            f"the figure grows by {fmt_bytes(trend)}/s {over}, below the timeline's leak threshold of "
            f"{fmt_bytes(min_bytes_per_second)}/s"
        )
        if large_total(ys[0], ys[-1]):
            reason += f"; {total_words(first, last, 's')}"
    elif g.verdict == "shrinking":
        reason = f"shrinking: the figure falls by {fmt_bytes(-trend)}/s {over}: memory is freed, not kept"
    elif g.verdict == "flat":
        reason = f"flat: no steady growth {over} ({fmt_bytes(recent[0])} -> {fmt_bytes(recent[-1])})"
    else:
        reason = (
            f"no sustained growth: the figure moves within {fmt_bytes(min(recent))}.."
            f"{fmt_bytes(max(recent))} {over} (trend {fmt_bytes(trend, signed=True)}/s)"
        )
    return Growth(
        g.leaking,
        rate,
        g.confidence,
        g.method,
        g.samples,
        reason,
        g.verdict,
        trend,
        g.min_bytes_per_step / dt if g.leaking else min_bytes_per_second,
    )


def timeline_report(
    points: Sequence[tuple[float, int]],
    growth: Growth,
    *,
    device: str,
    source: str,
    culprits: Sequence[Culprit] = (),
    notes: Sequence[str] = (),
) -> LeakReport:
    """The :class:`LeakReport` of a run with no repeating step, from its sampled ``(seconds, bytes)``
    timeline and :func:`timeline_growth`'s verdict: figures per second (``unit="s"``), ``steps`` the seconds
    the timeline covers, ``series`` ``(seconds, bytes)`` (about 256 readings)."""
    pts = list(points)
    return LeakReport(
        device=device,
        source=source,
        mode="light",
        steps=round(pts[-1][0] - pts[0][0]) if pts else 0,
        warmup=0,
        leaking=growth.leaking,
        bytes_per_step=growth.bytes_per_step,
        confidence=growth.confidence,
        detected_at=None,
        stopped_at=None,
        reason=growth.reason,
        culprits=tuple(culprits),
        series=tuple((round(t), v) for t, v in pts[:: max(1, len(pts) // 256)]),
        notes=tuple(notes),
        verdict="leak" if growth.leaking else growth.verdict,
        trend_per_step=growth.trend_per_step,
        min_bytes_per_step=int(TIMELINE_MIN_BYTES_PER_SECOND),
        boundary="second",
        unit="s",
    )


__all__ = [
    "LARGE_DOUBLED_MIN",
    "LARGE_TOTAL",
    "TIMELINE_MIN_BYTES_PER_SECOND",
    "TIMELINE_WINDOW",
    "detect_run_growth",
    "large_growth",
    "large_total",
    "run_threshold",
    "timeline_growth",
    "timeline_report",
    "total_words",
    "with_total",
]
