"""``torchmem run``'s per-step fast path (issue 29): most steps of a long run need nothing but their count,
because the device watcher and the host watcher read every k-th step; :meth:`Session.step` counts those
*quiet* steps with a few attribute updates and runs the full bookkeeping only where a watcher works.

Counted, not timed: which steps took the full path, and whether any quiet step was one at which a watcher
would have read (it must never be: a reading skipped is a verdict changed). Must-say twins: the fast path is
taken on a long flat loop (a fast path that never engages would pass the other checks), and a leak that
starts late in a long run is still found and named.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import torchmem
from torchmem.run import session as session_module
from torchmem.run.overhead import Overhead
from torchmem.run.session import Session
from torchmem.run.watchers import StepWatchers

EVERY_STEP = session_module._EVERY_STEP_RECORDS


def _loop(device: str = "cpu") -> tuple[Any, Any, torch.Tensor]:
    torch.manual_seed(0)
    lin = torch.nn.Linear(16, 16).to(device)
    return lin, torch.optim.SGD(lin.parameters(), lr=1e-3), torch.randn(4, 16, device=device)


class _Checked:
    """Wraps a session's watchers: every quiet step is checked against the schedules as they stand (neither
    the device watcher nor the host watcher would have read at it), and the full steps are listed."""

    def __init__(self, session: Session, monkeypatch: pytest.MonkeyPatch) -> None:
        self.full: list[int] = []
        self.quiet: list[int] = []
        self.missed: list[tuple[int, str]] = []
        watchers = session._watchers
        count = StepWatchers.count
        step = StepWatchers.step

        def checked_count(this: StepWatchers, steps: int = 1) -> int:
            # the quiet lane hands its steps over in one batch at the next full step: each is checked
            # against the schedules as they stood (nothing changes them while the lane counts)
            last = count(this, steps)
            w, host = this.watcher, this._host
            assert w is not None
            sched = w._schedule
            for n in range(last - steps + 1, last + 1):
                if n <= w.warmup + 1 or n % sched.stride_at(n) == 0 or w._attribution.window is not None:
                    self.missed.append((n, "device"))
                if host is not None and (n % host._schedule.stride == 0 or host._scanner.due is not None):
                    self.missed.append((n, "host"))
                self.quiet.append(n)
            if host is not None and host.steps != last:
                self.missed.append((last, "host count"))
            return last

        def listed_step(this: StepWatchers, *a: Any) -> tuple[int, bool, int | None]:
            out = step(this, *a)
            self.full.append(out[0])
            return out

        monkeypatch.setattr(StepWatchers, "count", checked_count)
        monkeypatch.setattr(StepWatchers, "step", listed_step)
        assert watchers is session._watchers


def test_quiet_steps_are_counted_and_never_a_step_a_watcher_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A flat loop of 4,000 optimizer steps: the first 1,000 all take the full path (each writes its step
    record); after them most steps are quiet, none of them a reading step of either watcher, and every step is
    counted by both watchers and the session."""
    lin, opt, x = _loop()
    steps = 4000
    s = Session(str(tmp_path / "run.jsonl"), device="cpu", status=False, argv=["loop.py"]).start()
    checked = _Checked(s, monkeypatch)
    calls = []  # the steps that reached the session: the optimizer hook counts the quiet ones itself
    session_step = s._source._step
    monkeypatch.setattr(s._source, "_step", lambda: (calls.append(1), session_step())[1])
    try:
        for _ in range(steps):
            opt.zero_grad(set_to_none=True)
            lin(x).sum().backward()
            opt.step()
        w, host = s._watchers.watcher, s._watchers._host
        assert w is not None and host is not None
        running = s._step_count()  # the session's count, the quiet lane's steps not taken yet included
        stride = w._schedule.stride
        # the host watcher reads in step with the device watcher (a multiple of its stride): its readings
        # add no full steps of their own (but for the few readings of an alert: the heap rose by more than
        # the host threshold, 4 KiB/step, over one interval; and where the device watcher's stride is over
        # the host's short-run floor, the run's steps so far / 8: Python 3.12 on a slow machine, device 252
        # against a floor of 216 at 1,730 steps)
        hs = host._schedule
        limit = min(hs.floor if hs.short_runs else 1 << 30, hs._max_stride or 1024)
        in_step = hs.stride % w.stride == 0 or hs.alerted or w.stride > limit
    finally:
        res = s.finish(0, "exit")
    assert checked.missed == []
    assert running == steps
    assert in_step, (host._schedule.stride, stride, host._schedule.floor)
    assert (w.steps, host.steps, s._steps) == (steps, steps, steps)  # the lane's last steps taken at the end
    assert res.steps == steps
    assert sorted(checked.full + checked.quiet) == list(range(1, steps + 1))
    assert all(n > EVERY_STEP for n in checked.quiet)
    late_full = [n for n in checked.full if n > EVERY_STEP]
    # the must-say twin: past the first 1,000 steps the fast path carries most steps (the device watcher's
    # stride on a loop this short is tens of steps; its readings are the full steps)
    assert stride > 4, stride
    assert len(late_full) <= (steps - EVERY_STEP) // 4, (len(late_full), stride)
    # the quiet lane: no quiet step of an optimizer boundary calls the session at all
    assert len(calls) == len(checked.full), (len(calls), len(checked.full))
    assert res.leak is not None and not res.leak.leaking


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_a_leak_that_starts_late_in_a_long_run_is_found_on_the_fast_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, device: str
) -> None:
    """Flat for 1,300 steps (the fast path engaged), then 512 KiB kept per step (twice ``torchmem run``'s
    threshold) for 400 steps, on the CPU and (marked cuda) on a GPU: found and named, and no quiet step was
    one a watcher would have read or attributed at (the attribution window's steps are all full)."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    lin, opt, x = _loop(device)
    kept: list[torch.Tensor] = []
    s = Session(str(tmp_path / "run.jsonl"), device=device, status=False, argv=["loop.py"]).start()
    checked = _Checked(s, monkeypatch)
    quiet_before = 0
    try:
        for i in range(1700):
            opt.zero_grad(set_to_none=True)
            lin(x).sum().backward()
            if i >= 1300:
                kept.append(torch.zeros(131072, device=device))  # 512 KiB a step
            opt.step()
            if i == 1299:
                quiet_before = len(checked.quiet)
                assert quiet_before > 0  # the fast path was on when the leak started
    finally:
        res = s.finish(0, "exit")
    kept.clear()
    assert checked.missed == []
    leak = res.leak
    assert leak is not None and leak.leaking, leak
    assert 500_000 <= leak.bytes_per_step <= 560_000, leak.bytes_per_step
    assert leak.culprits and any(c.holder and "kept" in c.holder for c in leak.culprits), leak.culprits


def test_a_watchers_quiet_steps_are_the_steps_before_its_next_reading() -> None:
    """``Watcher.quiet_steps``: none in the warm-up; with a stride of 8 the steps before the next multiple
    of 8; none where a stride of 1 reads every step."""
    with torchmem.watch(device="cpu", warn=False, stride=8, warmup=3) as w:
        got = []
        for _ in range(40):
            w.step()
            got.append((w.steps, w.quiet_steps()))
    assert got[:3] == [(1, 0), (2, 0), (3, 0)]
    after = dict(got[3:])
    assert after[8] == 7 and after[11] == 4 and after[15] == 0 and after[16] == 7 and after[39] == 0
    with torchmem.watch(device="cpu", warn=False, stride=1, warmup=3) as w1:
        for _ in range(20):
            w1.step()
            assert w1.quiet_steps() == 0


def test_the_median_step_counts_quiet_steps_as_steps() -> None:
    """A full step after 3 quiet ones: the 4 ms since the last full step are 4 steps of 1 ms, not one of
    4 ms (the overhead record compares torchmem's time with the program's step)."""
    o = Overhead()
    o.step_ended(0.0, 0.0, False)
    o.step_began(0.004, steps=4)
    o.step_ended(0.004, 0.004, False)
    o.step_began(0.005)
    assert o.median_step() == pytest.approx(0.001)


def test_quiet_steps_follow_a_short_runs_narrowed_stride() -> None:
    """Where a short run's floor narrows the stride (``stride_at``: a run of n steps is read at least every
    n // 16 steps), the quiet steps end at the first step the floor reads: the same steps as asking every
    step, for every n up to where the floor lets go."""
    with torchmem.watch(device="cpu", warn=False, warmup=3) as w:
        for _ in range(5):
            w.step()
        sched = w._schedule
        sched.stride, sched._floor, sched.fixed = 32, True, None
        assert sched.stride_at(100) == 6 and sched.stride_at(600) == 32  # the floor narrows, then lets go
        for n in range(5, 700):
            w.steps = n
            expected = 0
            m = n + 1
            while m % sched.stride_at(m) and m < n + 32:
                expected, m = expected + 1, m + 1
            assert w.quiet_steps() == expected, n


def test_an_error_counting_quiet_steps_is_said_once_and_every_step_goes_on_in_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A watcher whose ``quiet_steps`` raises: one note, no step lost, the full path from then on."""
    from torchmem.capture.watch import Watcher

    def broken(self: Watcher[Any]) -> int:
        raise RuntimeError("boom")

    monkeypatch.setattr(Watcher, "quiet_steps", broken)
    lin, opt, x = _loop()
    s = Session(str(tmp_path / "run.jsonl"), device="cpu", status=False, argv=["loop.py"]).start()
    checked = _Checked(s, monkeypatch)
    try:
        for _ in range(EVERY_STEP + 200):
            opt.zero_grad(set_to_none=True)
            lin(x).sum().backward()
            opt.step()
    finally:
        res = s.finish(0, "exit")
    assert res.steps == EVERY_STEP + 200
    assert checked.quiet == [] and len(checked.full) == EVERY_STEP + 200
    notes = [
        line
        for line in (tmp_path / "run.jsonl").read_text().splitlines()
        if "every step is read in full" in line
    ]
    assert len(notes) == 1, notes


def test_on_the_cpu_one_heap_reading_serves_both_watchers(tmp_path: Path) -> None:
    """``torchmem run`` on the CPU: the device watcher and the host watcher both read the C heap, in step.
    Where the device watcher read at the boundary, the host watcher takes that reading (the same bytes, not
    read again); it reads the heap itself only at boundaries where the device watcher did not read."""
    lin, opt, x = _loop()
    s = Session(str(tmp_path / "run.jsonl"), device="cpu", status=False, argv=["loop.py"]).start()
    w, host = s._watchers.watcher, s._watchers._host
    assert w is not None and host is not None and host.source == "heap"
    device_reads: list[tuple[int, int]] = []
    reader = w._reader

    def device_reader() -> int:
        v = reader()
        device_reads.append((w.steps, v))
        return v

    w._reader = device_reader
    shared: list[bool] = []  # each shared reading: the device watcher's of this very boundary
    own: list[bool] = []  # each heap reading of the host watcher's own: whether the device read here
    took, read = host._schedule.took, host._schedule.read

    def checked_took(v: int) -> int:
        shared.append(bool(device_reads) and device_reads[-1] == (w.steps, v))
        return took(v)

    def own_read(reader: Callable[[], int | None]) -> int | None:
        # the schedule's readings only: the heap read around torchmem's own work (a scan's cost, which a
        # loaded machine's heap noise may start) is not a reading of the figure
        own.append(w.figure_read_now() is not None)
        return read(reader)

    host._schedule.took = checked_took  # type: ignore[method-assign]
    host._schedule.read = own_read  # type: ignore[method-assign]
    try:
        for _ in range(3000):
            opt.zero_grad(set_to_none=True)
            lin(x).sum().backward()
            opt.step()
    finally:
        s.finish(0, "exit")
    assert len(shared) >= 20 and all(shared), shared
    assert not any(own), own  # read itself only where the device watcher had not
    # (how many of the host's readings fall in step with the device watcher's depends on both strides,
    # which the readings' cost on this machine chooses: a fragmented worker heap made the host read on its
    # own 48 times against 39 shared in CI; what is tested here is that a shared one is never read twice)


def test_the_median_step_is_the_median_of_an_even_count_too() -> None:
    """The program's median step is ``statistics.median`` (torchmem's one median): of 1, 2, 3 and 10 ms steps,
    2.5 ms (the upper middle value, 3 ms, was the overhead record's own median before)."""
    o = Overhead()
    assert o.median_step() is None
    t = 0.0
    o.step_ended(t, t, False)
    for d in (0.001, 0.002, 0.003, 0.010):
        t += d
        o.step_began(t)
        o.step_ended(t, t, False)
    assert o.median_step() == pytest.approx(0.0025)
