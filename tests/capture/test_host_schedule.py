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


def _aligned_at(steps: int, other: list[int], **kw: float) -> HostSchedule:
    s = HostSchedule(warmup=3, max_stride=None, share=0.002, ramp=False)
    s.align = lambda: other[0]
    s.start(lambda: 0, secondary=False)
    for _ in range(16):
        s.charge(kw["read_s"])
        s.read(lambda: 0)
    s._figure_costs.clear()
    s._figure_costs.extend([kw["read_s"] / 2] * 4)
    s.time(steps - 10, 0.0)
    s.time(steps, 10 * kw["step_s"])
    s.choose()
    return s


def test_aligned_with_another_watcher_the_stride_is_a_multiple_of_its_stride() -> None:
    """``torchmem run``: the host watcher reads in step with the device watcher, so the steps between are
    quiet for both (one reading step, not two). The budget alone wants every 25th step (see above)."""
    other = [40]
    s = _aligned_at(100_000, other, step_s=2e-3, read_s=1e-4)
    assert s.stride == 40  # the nearest multiple of 40 to 25
    other[0] = 11
    assert s.stride == 11  # the other watcher chose again: still in step at once (the same multiple, 1)
    s.time(100_010, 10 * 2e-3 * 2)
    s.choose()
    assert s.stride == 22  # and at this one's next choice the multiple nearest its budget (2 x 11)
    other[0] = 8
    s = _aligned_at(100_000, other, step_s=2e-3, read_s=1e-4)
    assert s.stride == 24  # 3 x 8
    # must-not: alone (no other watcher), the budget's stride as before
    assert _schedule_at(100_000, step_s=2e-3, read_s=1e-4).stride in (25, 26)


def test_alignment_never_takes_a_short_run_below_its_floor() -> None:
    """A 160-step run keeps a reading every 20 steps at most (8 per doubling): a device watcher reading
    every 48 steps is not followed there, one reading every 8 is (16 = 2 x 8)."""
    s = _aligned_at(160, [48], step_s=2e-3, read_s=1e-4)
    assert s.stride <= 160 // READINGS_PER_DOUBLING and s.stride % 48
    s = _aligned_at(160, [8], step_s=2e-3, read_s=1e-4)
    assert s.stride in (8, 16)
    s = _aligned_at(160, [8], step_s=2e-3, read_s=1e-4)
    # the other widens later past the floor: this one goes back to its own stride, never fewer readings
    s.align = lambda: 64
    assert s.stride <= 20
    # a long run: the other widens a little (40 -> 44) where 1 x 44 is still within this one's floor and
    # cap: still in step, at the lower multiple (not back on its own stride)
    other = [8]
    s = _aligned_at(100_000, other, step_s=2e-3, read_s=1e-4)
    assert s.stride == 24  # 3 x 8
    other[0] = 9
    assert s.stride == 27  # 3 x 9
    s._limit = 30  # (the floor and cap it was chosen within)
    other[0] = 11
    assert s.stride == 22  # 3 x 11 = 33 is over them: 2 x 11
    other[0] = 40
    assert s.stride == s._stride in (25, 26)  # not even 1 x 40 is within them: its own stride


def test_the_heap_read_every_few_readings_is_not_taken_for_the_rest_of_a_reading() -> None:
    """A GPU host (H100, session 17): the C heap's mallinfo2 takes ~218 µs, the RSS and the Python around a
    reading ~70 µs, a step 1.5 ms. The heap is read every m-th reading; the cost of the rest is the readings
    without it, not the median of all (which is either kind's by their proportion: the schedule swung
    between reading the heap every reading and every 4th). Steady at the budget's spacing, and after
    ``relax`` at the relaxed share's."""
    s = HostSchedule(warmup=3, max_stride=None, share=0.002, ramp=False)
    s.relax(64, 0.0005)
    s.start(lambda: 0, secondary=True)
    s._figure_costs.clear()
    n, k, t, seen = 20_000, 0, 0.0, []  # a long run: the short-run floor is far
    for _ in range(400):
        n, t, k = n + s.stride, t + s.stride * 1.5e-3, k + 1
        heap = k % s.heap_every == 0
        if heap:
            s.read(lambda: 0)
            s._figure_costs.append(218e-6)
        s.charge(70e-6 + (218e-6 if heap else 0.0))
        s.time(n, t)
        if k % 16 == 0:
            s.choose()
            seen.append((k, s.stride, s.heap_every, s.share_now))
    late = [(stride, every) for k, stride, every, share in seen if 32 <= k < 64]
    # 0.1 % of a step for the rest: one reading every 47 steps; for the heap: every 4th of them
    assert late and all(stride == 47 and every == 4 for stride, every in late), seen
    relaxed = [(stride, every) for k, stride, every, share in seen if k >= 96]
    assert all(stride == 187 and every == 4 for stride, every in relaxed), seen
    assert seen[-1][3] == 0.0005 and "0.05 %" in s.note()
