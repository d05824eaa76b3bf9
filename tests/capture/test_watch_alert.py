"""A relaxed reading schedule that sees the figure rise reads more often until it stops rising (the alert):
a long run's watcher reads as rarely as every 256 steps, and a leak that starts late in it must still get
the readings of a verdict before the run ends (CI under load, session 17: a 512 KiB/step leak over the last
400 of 1,700 steps had one reading after it started and was called "noisy").

Must say: the late leak is found under the widest relaxed stride. Must not: a flat run, and a run whose
figure rises once and stays, keep (or return to) the relaxed stride and are not called leaks.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import torchmem
from torchmem.capture import watch_stride
from torchmem.capture.schedule import ALERT_FACTOR, ALERT_READINGS
from torchmem.capture.watch_stride import ReadingSchedule


def _relaxed_schedule(stride: int = 256) -> ReadingSchedule:
    s = ReadingSchedule(warmup=3, stride=None, max_stride=None)
    s.relax(64)
    s.readings = 100  # past relax_after: relaxed
    s.stride = stride
    return s


def test_an_alert_reads_eight_times_as_often_for_eight_readings_then_returns() -> None:
    s = _relaxed_schedule()
    assert s.relaxed and not s.alerted
    s.alert()
    assert s.alerted and s.stride == 256 // ALERT_FACTOR
    for _ in range(ALERT_READINGS - 1):
        s.reading(0, lambda: 0)
        assert s.stride == 32
    s.alert()  # a reading that rose again renews the alert (not narrower still)
    assert s.stride == 32
    for _ in range(ALERT_READINGS):
        s.reading(0, lambda: 0)
    assert not s.alerted and s.stride == 256


def test_a_stride_chosen_during_an_alert_is_taken_when_it_ends() -> None:
    s = _relaxed_schedule()
    s._host_figure = True
    s.alert()
    s.set_stride(1e-4, 2e-5)  # 20 µs on a 100 µs step at 0.1 %: 200
    assert s.stride == 32
    for _ in range(ALERT_READINGS):
        s.reading(0, lambda: 0)
    assert s.stride == 200


def test_no_alert_where_the_schedule_is_not_relaxed_or_the_user_fixed_the_stride() -> None:
    early = ReadingSchedule(warmup=3, stride=None, max_stride=None)
    early.relax(64)
    early.readings, early.stride = 10, 16  # not relaxed yet: its stride is the 0.5 % one
    early.alert()
    assert early.stride == 16 and not early.alerted
    fixed = ReadingSchedule(warmup=3, stride=64, max_stride=None)
    fixed.relax(64)
    fixed.readings, fixed.stride = 100, 64
    fixed.alert()
    assert fixed.stride == 64 and not fixed.alerted
    never = ReadingSchedule(warmup=3, stride=None, max_stride=None)  # a user's watch() without relax
    never.readings, never.stride = 1000, 8
    never.alert()
    assert never.stride == 8


def _run(kept_from: int | None, once: bool = False, steps: int = 1700) -> tuple[Any, list[int], int]:
    """A CPU loop of ``steps`` steps under a watcher relaxed to its widest stride (256) after 16 readings;
    from step ``kept_from`` 512 KiB kept a step (``once``: 64 MiB kept at that step only)."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(16, 16)
    opt = torch.optim.SGD(lin.parameters(), lr=1e-3)
    x = torch.randn(4, 16)
    kept: list[torch.Tensor] = []
    strides: list[int] = []
    # max_stride=1: read every step or two (the heap's 2 % floor) until relaxed at the 16th reading (a
    # stride is chosen again every RETUNE_EVERY readings: 16 here, 64 in a run), within the first few hundred
    # steps however loaded the machine and however fragmented the heap (in a CI worker that ran hundreds of
    # tests, mallinfo2 can cost as much as 2 % of 24 steps of this loop: the heap's floor then read every 24th
    # step, and 64 readings relaxed it only at step ~1,500)
    w = torchmem.watch(device="cpu", source="heap", warn=False, max_stride=1)
    w._relax_after = 16
    w._schedule.relaxed_share = 1e-7  # any reading's cost on any step: the widest stride, 256
    with pytest.MonkeyPatch.context() as mp, w:
        mp.setattr(watch_stride, "RETUNE_EVERY", 16)
        for i in range(steps):
            opt.zero_grad(set_to_none=True)
            lin(x).sum().backward()
            opt.step()
            if kept_from is not None and i >= kept_from and (not once or i == kept_from):
                kept.append(torch.zeros((16 << 20) if once else 131072))
            w.step()
            strides.append(w.stride)
    rep = w.report()
    kept.clear()
    return rep, strides, kept_from or 0


def test_a_leak_that_starts_late_under_the_widest_relaxed_stride_is_found() -> None:
    rep, strides, start = _run(1300)
    assert 256 in strides[:start]  # relaxed to the widest before the leak started
    assert rep.leaking, rep
    assert 500_000 <= rep.bytes_per_step <= 560_000, rep.bytes_per_step
    assert min(strides[start:]) <= 256 // ALERT_FACTOR  # it read more often once the figure rose


def test_a_flat_run_keeps_the_widest_relaxed_stride() -> None:
    rep, strides, _ = _run(None)
    assert 256 in strides[:1200] and strides[-1] == 256, sorted(set(strides))
    assert min(strides[strides.index(256) :]) == 256  # never alerted once relaxed
    assert not rep.leaking


def test_a_figure_that_rises_once_is_no_leak_and_the_stride_returns() -> None:
    rep, strides, start = _run(1000, once=True, steps=3400)
    assert not rep.leaking, rep
    assert min(strides[start:]) <= 256 // ALERT_FACTOR  # the rise alerted it
    assert strides[-1] == 256  # ... and ALERT_READINGS readings later it read as rarely as before


def _host_run(kept_from: int | None, steps: int = 6000) -> tuple[Any, list[int]]:
    """A loop of ``steps`` steps under a host watcher relaxed to its widest stride (1024) after 64
    readings; from step ``kept_from`` 64 KiB of host memory kept a step (a list of bytearrays)."""
    from torchmem.capture.host import HostWatcher

    kept: list[bytearray] = []
    strides: list[int] = []
    w = HostWatcher(warmup=3, share=0.5, ramp=False, short_runs=False)  # a few steps apart until relaxed
    w.relax(64, 1e-9)  # any reading's cost on any step: the widest stride
    w.start()
    a = torch.randn(16, 16)
    try:
        for i in range(steps):
            a @ a
            if kept_from is not None and i >= kept_from:
                kept.append(bytearray(64 * 1024))
            w.step()
            strides.append(w._schedule.stride)
    finally:
        w.stop()
    rep = w.report()
    kept.clear()
    return rep, strides


def test_a_host_leak_that_starts_late_under_the_widest_relaxed_stride_is_found() -> None:
    rep, strides = _host_run(3000)
    assert max(strides[:3000]) >= 512  # relaxed before the leak started
    assert rep.leaking, rep
    assert min(strides[3000:]) <= max(strides[:3000]) // ALERT_FACTOR


def test_a_flat_host_run_keeps_its_relaxed_stride() -> None:
    rep, strides = _host_run(None)
    widest = max(strides)
    assert widest >= 512 and strides[-1] == widest
    assert min(strides[strides.index(widest) :]) == widest  # never alerted once relaxed
    assert not rep.leaking


def test_a_host_alert_returns_to_the_aligned_stride_of_before() -> None:
    """``torchmem run``: the host watcher's stride is a multiple of the device watcher's (both read at the
    same steps). An alert reads on its own steps; when it ends the aligned stride of before is back (not a
    stride chosen from step times up to 16 readings old, whose short-run floor broke the alignment: 213
    against the device watcher's 256 on a 4,000-step CPU run)."""
    from torchmem.capture.host_schedule import HostSchedule

    s = HostSchedule(warmup=3, max_stride=None, share=0.002, ramp=False)
    s.relax(64, 0.0005)
    device_stride = 256
    s.align = lambda: device_stride
    s._stride, s._multiple, s._limit = 256, 2, 1024  # aligned: 2 x 256
    s.readings = 100
    assert s.stride == 512
    s.alert()
    assert s.alerted and s.stride == 512 // ALERT_FACTOR
    for _ in range(ALERT_READINGS):
        s.charge(1e-5)
    assert not s.alerted and s.stride == 512 and s.stride % device_stride == 0
