"""Growth that comes in regular jumps (a validation pass every N steps that keeps its outputs): the periodic
test, with the shapes it must call a leak and those it must not (irregular jumps, jumps given back, growth
that stopped, a single rise), and the watcher's verdict when the jumps are below the threshold."""

from __future__ import annotations

import random
import re

from torchmem.analysis.growth import periodic_rate
from torchmem.analysis.growth_stream import GrowthStream, periodic_growth
from torchmem.analysis.run_growth import detect_run_growth
from torchmem.capture.watch_verdict import GrowthTrack

MiB = 1 << 20
KiB = 1 << 10


def _feed(
    stream: GrowthStream | GrowthTrack, jump_at: set[int], size: object, steps: int, *, every: int = 10
) -> list[bool]:
    """Feed a figure that rises by ``size`` (bytes, or a callable of the jump's index) at each step of
    ``jump_at``, read every ``every`` steps and at the 8 steps after each rise; the leaking flag after each
    reading."""
    value, last, burst, k = 100 * MiB, 100 * MiB, 0, 0
    out: list[bool] = []
    for step in range(1, steps + 1):
        if step in jump_at:
            value += size(k) if callable(size) else size  # type: ignore[operator]
            k += 1
        if step % every == 0 or burst:
            burst = 8 if value > last else max(0, burst - 1)
            last = value
            if isinstance(stream, GrowthTrack):
                stream.add(step, value)
                out.append(stream.growth.leaking)
            else:
                out.append(stream.add(step, value).leaking)
    return out


def test_jumps_every_25_steps_kept_are_a_leak_by_the_fourth_jump() -> None:
    s = GrowthStream(min_bytes_per_step=64 * KiB)
    flags = _feed(s, set(range(25, 601, 25)), 4 * MiB, 600)
    assert s.leaking and s.growth.method == "periodic", s.growth
    assert abs(s.growth.bytes_per_step - 4 * MiB / 25) < 0.15 * 4 * MiB / 25, s.growth
    assert re.search(r"every 2\d steps", s.growth.reason), s.growth.reason
    assert flags.index(True) <= 4 * 10  # found within the readings of the first jumps, not at the run's end


def test_irregular_jumps_are_not_periodic() -> None:
    rng = random.Random(0)
    at, step = set(), 0
    for _ in range(24):
        step += rng.choice((3, 7, 60, 90))  # bucketed shapes met at random: gaps 3..90 steps
        at.add(step)
    s = GrowthStream(min_bytes_per_step=64 * KiB)
    _feed(s, at, 4 * MiB, step)
    assert periodic_rate(list(s._jumps), step, 0) is None
    assert s.growth.method != "periodic"


def test_jumps_of_very_different_sizes_are_not_periodic() -> None:
    s = GrowthStream(min_bytes_per_step=64 * KiB)
    _feed(s, set(range(25, 601, 25)), lambda k: (1 if k % 2 else 9) * MiB, 600)
    assert s.growth.method != "periodic", s.growth


def test_jumps_that_are_given_back_are_not_a_leak() -> None:
    """An evaluation every 25 steps whose results are dropped at the next one: rises and falls back."""
    s = GrowthStream(min_bytes_per_step=64 * KiB)
    _feed(s, set(range(25, 601, 25)), lambda k: -4 * MiB if k % 2 else 4 * MiB, 600)
    assert not s.leaking, s.growth


def test_a_single_rise_is_not_periodic() -> None:
    s = GrowthStream(min_bytes_per_step=64 * KiB)
    _feed(s, {50}, 40 * MiB, 600)
    assert not s.leaking and s.periodic() is None


def test_periodic_growth_that_stopped_for_two_periods_is_not_a_leak_any_more() -> None:
    t = GrowthTrack(64 * KiB, warmup=3)
    flags = _feed(t, set(range(25, 201, 25)), 4 * MiB, 600)
    assert any(flags) and not flags[-1]
    assert t.detected_at is not None and t.stopped_at is not None
    assert t.stopped_at > 200 + 25, t.stopped_at  # not in the flat stretch between two jumps


def test_the_flat_stretch_between_two_jumps_is_not_growth_that_stopped() -> None:
    """A watcher that reads several flat readings between two jumps (the alert's burst) does not say the
    growth stopped, nor that the last jump was a one-time rise."""
    t = GrowthTrack(64 * KiB, warmup=3)
    flags = _feed(t, set(range(25, 601, 25)), 4 * MiB, 590)
    assert flags[-1] and t.stopped_at is None
    verdict, reason, _, _ = t.verdict(590, 10)
    assert verdict == "leak" and "one-time" not in reason, reason


def test_jumps_below_the_threshold_are_said_with_their_period_and_the_option() -> None:
    t = GrowthTrack(256 * KiB, warmup=3)
    _feed(t, set(range(25, 601, 25)), 4 * MiB, 590)
    verdict, reason, rate, _ = t.verdict(590, 10)
    assert verdict == "below_threshold", (verdict, reason)
    assert re.search(r"about 4\.00 MiB every 2\d steps", reason), (
        reason
    )  # read every 10 steps: 25 +- the grid
    assert "one-time" not in reason and "--min-growth" in reason, reason
    assert 0.8 * 4 * MiB / 25 < rate < 1.2 * 4 * MiB / 25


def test_steady_growth_read_every_few_steps_is_not_said_to_come_in_jumps() -> None:
    """+80 KiB every step, read every 12 steps: each reading sees a rise of ~1 MiB. Below the threshold it is
    said to rise at every reading, not "every 12 steps, flat between"."""
    t = GrowthTrack(256 * KiB, warmup=3)
    for step in range(12, 601, 12):
        t.add(step, 100 * MiB + 80 * KiB * step)
    verdict, reason, _, _ = t.verdict(600, 12)
    assert verdict == "below_threshold", (verdict, reason)
    assert "flat between" not in reason, reason


def test_jumps_that_resume_after_a_flat_stretch_clear_the_stopped_verdict() -> None:
    """A loop that ran fast at first (+1 MiB every step: a leak), paused, then keeps 1.5 MiB every 10 steps
    (below the 256 KiB/step threshold): growth did not stop. The watcher had said "growth seen at step 60
    stopped at step 100" to the end of a run whose memory still rose every 10 steps; now the jumps after the
    flat stretch clear it, and the verdict is the growth below the threshold with its period."""
    t = GrowthTrack(256 * KiB, warmup=3)
    value = 1024 * MiB  # (a total that doubles the figure would be a leak whatever the rate)
    stopped = None
    for step in range(1, 601):
        if step <= 60:
            value += MiB
        elif step > 150 and step % 10 == 0:
            value += 3 * MiB // 2
        if step % 5 == 0:
            t.add(step, value)
        if step == 150:
            stopped = t.stopped_at
    assert t.detected_at is not None and stopped is not None  # the first growth did stop, for a while
    assert t.stopped_at is None
    verdict, reason, _, _ = t.verdict(600, 5)
    assert verdict == "below_threshold", (verdict, reason)
    assert "1.50 MiB every 10 steps, flat between" in reason, reason


def test_growth_that_stopped_stays_stopped_when_nothing_rises_after() -> None:
    """Must not: the same first growth, then flat to the end — stopped, whatever the readings."""
    t = GrowthTrack(256 * KiB, warmup=3)
    for step in range(5, 601, 5):
        t.add(step, 1024 * MiB + MiB * min(step, 60))
    assert t.detected_at is not None and t.stopped_at is not None
    assert t.verdict(600, 5)[0] == "stopped"


def _dense_after_rises(
    jump_at: set[int], size: int, steps: int, every: int = 4
) -> tuple[list[int], list[int]]:
    """A host figure's readings: every ``every`` steps, and at each of the 8 steps after a rise (the host
    schedule reads more often while the figure moves), rising by ``size`` at each step of ``jump_at``."""
    xs, ys, value, last, burst = [], [], 220 * MiB, 220 * MiB, 0
    for step in range(1, steps + 1):
        if step in jump_at:
            value += size
        if step % every == 0 or burst:
            burst = 8 if value > last else max(0, burst - 1)
            last = value
            xs.append(step)
            ys.append(value)
    return xs, ys


def test_a_validation_pass_every_20_steps_read_densely_is_a_periodic_leak_not_a_one_time_rise() -> None:
    # Lightning's `validation_step_outputs` never cleared (CPU, session 26): +15.6 MiB at each validation,
    # every 20 steps; the host report said "flat for the last 11 readings (since step 224), after a one-time
    # rise of 31.26 MiB before it: not a leak" and then "no leak now on host".
    xs, ys = _dense_after_rises(set(range(80, 241, 20)), int(15.6 * MiB), 240)
    g = detect_run_growth(xs, ys, min_bytes_per_step=4096)
    assert "one-time rise" not in g.reason, g.reason
    p = periodic_growth(xs, ys, min_bytes_per_step=4096)
    assert p is not None and p.leaking and p.method == "periodic", p
    assert "every 20 steps" in p.reason, p.reason


def test_a_rise_that_happened_once_is_still_a_one_time_rise() -> None:
    # must not: optimizer state made at the first step, then nothing (read densely after it, then sparsely)
    xs, ys = _dense_after_rises({180}, 64 * MiB, 240)
    g = detect_run_growth(xs, ys, min_bytes_per_step=4096)
    assert not g.leaking and "one-time rise" in g.reason, g.reason
    assert periodic_growth(xs, ys, min_bytes_per_step=4096) is None
    # two rises far apart are no staircase either: the flat tail is longer than the stretch between them
    xs, ys = _dense_after_rises({150, 170}, 32 * MiB, 240)
    g = detect_run_growth(xs, ys, min_bytes_per_step=4096)
    assert not g.leaking and "one-time rise" in g.reason, g.reason
    assert periodic_growth(xs, ys, min_bytes_per_step=4096) is None


def test_an_irregular_jump_before_regular_ones_does_not_hide_them() -> None:
    # a second rise within one validation pass (step 108), then jumps every 20 steps: the last six agree
    jumps = [(102, 16 * MiB, 300 * MiB, 100), (108, 12 * MiB, 316 * MiB, 104)]
    jumps += [(124 + 20 * k, 16 * MiB, (328 + 16 * k) * MiB, 120 + 20 * k) for k in range(6)]
    found = periodic_rate(jumps, 240, 440 * MiB)
    assert found is not None and abs(found[0] - 16 * MiB / 20) < 0.15 * 16 * MiB / 20, found
    # must not: the same jumps with the regular ones given back since (the figure fell back)
    assert periodic_rate(jumps, 240, 300 * MiB) is None


def _jumps(sizes: list[float], period: int, *, read_every: int) -> list[tuple[int, int, int, int]]:
    """``(step, rise, value before, step of the reading before)`` of jumps of ``sizes`` one per ``period``."""
    out, value = [], 100 * MiB
    for k, v in enumerate(sizes, 1):
        out.append((period * k, int(v), value, period * k - read_every))
        value += int(v)
    return out


def test_one_jump_split_over_two_readings_does_not_shorten_the_period() -> None:
    """15.6 MiB every 20 steps, one of them read mid-way (12.15 MiB, the rest below the threshold in the
    next reading): one jump is 15.6 MiB and the period 20, not 12.15 MiB every 15."""
    sizes = [15.6 * MiB, 15.6 * MiB, 12.15 * MiB, 15.6 * MiB, 15.6 * MiB, 15.6 * MiB]
    jumps = _jumps(sizes, 20, read_every=5)
    got = periodic_rate(jumps, 125, jumps[-1][2] + jumps[-1][1])
    assert got is not None
    rate, size, period = got
    assert abs(size - 15.6 * MiB) < 0.05 * 15.6 * MiB, size / MiB
    assert 18 <= period <= 22, period
    assert abs(rate - 15.6 * MiB / 20) < 0.15 * 15.6 * MiB / 20, rate


def test_readings_that_span_two_jumps_still_give_one_jump_and_its_period() -> None:
    """Read every 30 steps, 4 MiB every 25: some readings see two jumps (8 MiB); one jump stays 4 MiB."""
    sizes = [4 * MiB, 4 * MiB, 4 * MiB, 8 * MiB, 4 * MiB, 4 * MiB, 8 * MiB]
    at = [30, 60, 90, 120 + 30, 180, 210, 270]
    value, jumps = 100 * MiB, []
    prev = 0
    for a, v in zip(at, sizes):
        jumps.append((a, int(v), value, prev))
        value += int(v)
        prev = a
    got = periodic_rate(jumps, 280, value)
    assert got is not None
    _rate, size, period = got
    assert size == 4 * MiB and 20 <= period <= 30, (size / MiB, period)


def test_stair_spacing_is_the_steps_between_rises_of_a_figure_flat_between_them() -> None:
    from torchmem.analysis.growth_stream import stair_spacing

    def spacing(values: list[int]) -> float | None:
        s = GrowthStream(min_bytes_per_step=4 * KiB)
        for x, y in zip(xs, values):
            s.add(x, y)
        return stair_spacing(s.jumps)

    xs = list(range(0, 200, 2))
    got = spacing([100 * MiB + (x // 25) * 2 * MiB for x in xs])
    assert got is not None and 24 <= got <= 26, got  # read every 2 steps
    assert spacing([100 * MiB + x * 64 * KiB for x in xs]) is None  # growth at every reading: not stairs
    assert spacing([100 * MiB + (8 * MiB if x >= 100 else 0) for x in xs]) is None  # one rise
    assert spacing([100 * MiB + (x * 7919) % 3000 for x in xs]) is None  # noise under the threshold


def test_the_stairs_verdict_is_the_streams_own_in_the_run_and_at_its_end() -> None:
    from torchmem.capture.host_readings import HostReadings

    xs = list(range(0, 200, 2))

    def fed(values: list[int]) -> tuple[GrowthStream, HostReadings]:
        s = GrowthStream(min_bytes_per_step=4 * KiB)
        rd = HostReadings(warmup=0, min_bytes_per_step=4 * KiB)
        for x, y in zip(xs, values):
            s.add(x, y)
            rd.add_figure(x, y, warm=False)
            rd.evaluate(x)
        return s, rd

    stairs = [100 * MiB + (x // 25) * 2 * MiB for x in xs]  # a validation pass every 25 steps, kept
    s, rd = fed(stairs)
    g = s.stairs()
    assert g is not None and g.leaking and g.method == "periodic", g
    assert "every 25 steps, flat between" in g.reason, g.reason
    assert periodic_growth(xs, stairs, min_bytes_per_step=4 * KiB) == g  # the finished series: the same
    assert rd.stairs() == g and rd.growth.method == "periodic"  # the host readings: the same, in the run
    # growth at every reading, one rise, noise: no stairs verdict (the window's tests judge the first)
    for values in (
        [100 * MiB + x * 64 * KiB for x in xs],
        [100 * MiB + (8 * MiB if x >= 100 else 0) for x in xs],
        [100 * MiB + (x * 7919) % 3000 for x in xs],
    ):
        s, rd = fed(values)
        assert s.stairs() is None and rd.stairs() is None
        assert periodic_growth(xs, values, min_bytes_per_step=4 * KiB) is None
    assert GrowthStream().stairs() is None  # no readings
