"""HostSchedule: every how many steps the host figures are read, from the steps' time and the readings'
cost (given here as numbers: the schedule only does arithmetic on what the watcher measured)."""

from __future__ import annotations

from torchmem.capture.host_schedule import READINGS_PER_DOUBLING, HostSchedule


def _schedule_at(steps: int, *, step_s: float, read_s: float, secondary: bool = False) -> HostSchedule:
    """A schedule as ``torchmem run`` makes it on the CPU (no ramp, 0.2 % of a step), its steps timed
    ``step_s`` apart and its readings costing ``read_s``, chosen again at step ``steps``."""
    s = HostSchedule(warmup=3, max_stride=None, share=0.002, ramp=False)
    s.start(lambda: 0, secondary=secondary)
    for _ in range(16):
        s.charge(read_s)
        s.read(lambda: 0)
    s._figure_costs.clear()
    s._figure_costs.extend([read_s / 2] * 4)
    s.time(steps - 10, 0.0)
    s.time(steps, 10 * step_s)
    s.choose()
    return s


def test_a_short_run_keeps_readings_enough_for_a_verdict() -> None:
    # 2 ms steps, 100 µs readings: the budget (0.2 %) wants one reading every 25 steps; a 150-step run
    # would end with ~6 readings after its warm-up, too few to judge
    for n, most in ((20, 2), (80, 10), (160, 20)):
        s = _schedule_at(n, step_s=2e-3, read_s=1e-4)
        assert s.stride <= max(1, n // READINGS_PER_DOUBLING) == most, (n, s.stride)
    # a long run reaches the budget's stride and stays there
    assert _schedule_at(100_000, step_s=2e-3, read_s=1e-4).stride in (25, 26)  # 100 µs / (0.2 % of 2 ms)
    # with the heap read every m-th reading beside the RSS, the heap's own spacing is capped too
    s = _schedule_at(160, step_s=2e-3, read_s=1e-4, secondary=True)
    assert s.stride * s.heap_every <= 20


def test_a_cheap_reading_of_a_slow_step_is_read_every_step() -> None:
    assert _schedule_at(100_000, step_s=0.1, read_s=1e-5).stride == 1


def test_without_short_runs_only_the_budget_counts() -> None:
    # torchmem run on a GPU: the budget's stride from the first choice (scans inside a short run of big
    # steps cost seconds there)
    s = HostSchedule(warmup=3, max_stride=None, share=0.002, ramp=False, short_runs=False)
    s.start(lambda: 0, secondary=False)
    for _ in range(16):
        s.charge(1e-4)
    s.time(10, 0.0)
    s.time(20, 0.02)
    s.choose()
    assert s.stride >= 25
