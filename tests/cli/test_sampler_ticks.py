"""``torchmem run``'s sampler thread (issue 29): fewer wake-ups once steps are counted, and on the CPU a tick
takes a step's fresh reading instead of walking the C heap again; every other read stays fresh."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch

from torchmem.devices._host import heap_in_use
from torchmem.run import sampler
from torchmem.run.sampler import SAMPLER_THREAD, Figure, spacing


def test_ticks_keep_their_pace_without_steps_and_spread_out_with_them() -> None:
    # no step yet (the timeline is the verdict) or the first 20 ticks: the session's interval
    assert spacing(0.05, 100, 100e-6, 0) == 0.05
    assert spacing(0.05, 5, 100e-6, 40) == 0.05
    # steps counted: at least 0.25 s apart (a 100 µs tick would allow 33 ms under 0.3 %)
    assert spacing(0.05, 25, 100e-6, 40) == 0.25
    # a costly tick (3 ms): 1 s would keep it under 0.3 %; 0.5 s at most
    assert spacing(0.05, 25, 3e-3, 40) == 0.5


def _read_on(name: str, figure: Figure) -> Any:
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(figure.read(torch.device("cpu"))), name=name)
    t.start()
    t.join()
    return out[0]


@pytest.mark.skipif(heap_in_use() is None, reason="the C heap cannot be read here (not glibc >= 2.33)")
def test_a_tick_takes_a_fresh_step_reading_and_other_reads_read_the_heap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    figure = Figure()
    step_value = 12_345  # no heap is this small: a reading of it is the step's
    figure.observe(step_value)
    assert _read_on(SAMPLER_THREAD, figure).allocated == step_value  # a tick: the step's reading
    assert _read_on("another", figure).allocated != step_value  # any other thread: the heap now
    assert figure.read(torch.device("cpu")).allocated != step_value  # the end's read, a forecast's
    monkeypatch.setattr(sampler, "_FRESH_S", 0.0)  # the step's reading is too old now
    assert _read_on(SAMPLER_THREAD, figure).allocated != step_value
