"""The staircase test of ``detect_growth``: a short run (8-15 readings) whose growth comes every few steps
is a leak; a cache that fills and stops, noise, a one-time jump and a sawtooth are not."""

from __future__ import annotations

from torchmem.analysis.leaks import detect_growth

MiB = 1 << 20


def _stairs(
    steps: int, every: int, rise: int, stride: int = 2, start: int = 4
) -> tuple[list[int], list[int]]:
    xs = list(range(start, steps + 1, stride))
    return xs, [100 * MiB + rise * ((x - 1) // every) for x in xs]


def test_growth_every_other_step_in_a_short_run_is_a_leak() -> None:
    # a fresh AdamW every 2 steps (+2 MiB each), read every 2 steps with alternating phase: 15 readings
    xs = [4, 6, 8, 9, 10, 11, 12, 14, 16, 18, 20, 21, 22, 23, 24]
    ys = [100 * MiB + 2 * MiB * (x // 2) for x in xs]
    g = detect_growth(xs, ys)
    assert g.leaking and g.method == "staircase", g
    assert abs(g.bytes_per_step - MiB) < 0.1 * MiB
    assert "never fell" in g.reason
    xs, ys = _stairs(30, every=3, rise=3 * MiB)  # 14 readings, a rise every third step
    g = detect_growth(xs, ys)
    assert g.leaking and g.method == "staircase", g
    # a quarter shorter than the period has no rise: not claimed
    xs, ys = _stairs(30, every=3, rise=3 * MiB, stride=1, start=20)
    assert not detect_growth(xs, ys).leaking


def test_a_cache_that_fills_and_stops_is_not_a_staircase() -> None:
    # fills for 8 steps at +1 MiB, then flat: the last quarter does not rise
    xs = list(range(4, 16))
    ys = [100 * MiB + MiB * min(x, 10) for x in xs]
    g = detect_growth(xs, ys)
    assert not g.leaking, g


def test_noise_a_jump_a_sawtooth_and_small_growth_are_not_staircases() -> None:
    xs = list(range(4, 16))
    fell = [100 * MiB + MiB * x - (2 * MiB if x == 9 else 0) for x in xs]  # one fall: not a staircase
    assert detect_growth(xs, fell).method != "staircase"
    jump = [100 * MiB + (8 * MiB if x >= 10 else 0) for x in xs]
    assert not detect_growth(xs, jump).leaking
    saw = [100 * MiB + MiB * (x % 4) for x in xs]
    assert not detect_growth(xs, saw).leaking
    # steady but too little in all (below 12 thresholds): not yet a leak
    small = [100 * MiB + 300 * 1024 * (x // 2) * 2 for x in xs[:8]]
    assert not detect_growth(xs[:8], small).leaking
    # too few readings for any test but the steady one
    xs7, ys7 = _stairs(18, every=2, rise=2 * MiB, stride=2, start=4)
    assert len(xs7) == 8 and detect_growth(xs7[:7], ys7[:7]).method != "staircase"
