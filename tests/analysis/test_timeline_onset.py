"""The timeline verdict (a run with no repeating step) on the shapes a short metric loop makes: a plateau
while the program imports and sets up, then steady growth read at the sampler's pace. Growth after the
plateau is judged on its own; a buffer that fills over the middle of the timeline and stays full is not a
leak, on the timeline or step by step (the robust test's last quarter must still climb)."""

from __future__ import annotations

import random

import pytest

from torchmem.analysis.leaks import detect_growth, timeline_growth

MiB = 1 << 20


def _timeline(dt: float, plateau: float, length: float, value, seed: int = 0) -> list[tuple[float, int]]:
    rnd = random.Random(seed)
    points, t = [], 0.0
    while t < plateau + length:
        points.append((t, 0 if t < plateau else value(t - plateau, rnd)))
        t += dt
    return points


def _metric_loop(t: float, rnd: random.Random) -> int:
    # 4 update() calls of 512 KiB kept every ~34 ms, temporaries of 0-768 KiB around them
    return int(t / 0.034) * 4 * 512 * 1024 + rnd.choice([0, 256 * 1024, 768 * 1024])


@pytest.mark.parametrize("dt", [0.05, 0.1, 0.15, 0.2, 0.25])
@pytest.mark.parametrize("plateau", [0.3, 1.0, 2.5])
def test_growth_after_a_set_up_plateau_is_a_leak_whatever_the_sampling(dt: float, plateau: float) -> None:
    g = timeline_growth(_timeline(dt, plateau, 2.0, _metric_loop))
    assert g is not None and g.leaking, g
    assert 50 * MiB < g.bytes_per_step < 70 * MiB  # ~60 MiB/s


@pytest.mark.parametrize("dt", [0.05, 0.1, 0.2])
@pytest.mark.parametrize("plateau", [0.5, 1.0])
def test_a_buffer_filled_after_the_plateau_and_full_since_is_not_a_leak(dt: float, plateau: float) -> None:
    points = _timeline(dt, plateau, 3.0, lambda t, _: min(int(t / 0.034), 40) * 512 * 1024)
    g = timeline_growth(points)
    assert g is not None and not g.leaking, g


@pytest.mark.parametrize("dt", [0.05, 0.1, 0.2])
def test_a_sawtooth_after_the_plateau_is_not_a_leak(dt: float) -> None:
    points = _timeline(dt, 1.0, 3.0, lambda t, _: int((t % 0.8) / 0.034) * 512 * 1024)
    g = timeline_growth(points)
    assert g is not None and not g.leaking, g


def test_a_fill_over_the_middle_of_the_window_is_not_robust_growth() -> None:
    # 35 readings: flat, a fill of 20 MiB over the second and third quarters, flat for the last 11 readings.
    # Every quarter's floor is higher than the one before, yet nothing grew in the last quarter.
    ys = [0] * 6 + [MiB * v for v in (1, 2, 4, 6, 7, 8, 10, 12, 13, 14, 16, 18, 19)] + [20 * MiB] * 16
    g = detect_growth(range(len(ys)), ys, min_bytes_per_step=64 * 1024)
    assert not g.leaking, g
    # the same fill going on through the last quarter is growth
    ys = [0] * 6 + [MiB * i for i in range(1, 30)]
    g = detect_growth(range(len(ys)), ys, min_bytes_per_step=64 * 1024)
    assert g.leaking, g
