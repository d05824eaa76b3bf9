"""When will it run out: the forecast from a leak's rate, said where growth is a leak and never otherwise."""

from __future__ import annotations

from pathlib import Path

import torch

from torchmem.analysis.forecast import forecast
from torchmem.capture.file import read_capture
from torchmem.results.capture import render_summary
from torchmem.results.forecast import Forecast, duration
from torchmem.run.session import Session

MiB = 1 << 20
GiB = 1 << 30


def test_steps_and_time_to_exhaustion_per_step_and_per_second() -> None:
    f = forecast(10 * MiB, "step", 2 * GiB, 4 * GiB, "cuda:0", step_seconds=0.5)
    assert f is not None and f.steps == 204 and f.seconds == 102.0
    assert f.short() == "cuda:0 full in ~204 steps (~1 min 42 s)"
    assert "runs out in ~204 steps, ~1 min 42 s (2.00 GiB left of 4.00 GiB)" in str(f)
    g = forecast(1 * MiB, "s", 0, 60 * MiB, "the RAM")
    assert (
        g is not None and g.seconds == 60.0 and g.steps is None and g.short() == "the RAM full in ~1 min 00 s"
    )
    assert Forecast.from_dict(f.to_dict()) == f


def test_no_forecast_without_growth_a_capacity_or_a_near_end() -> None:
    assert forecast(0.0, "step", 1, 2, "cuda:0") is None
    assert forecast(-5.0, "step", 1, 2, "cuda:0") is None
    assert forecast(1.0, "step", None, 2, "cuda:0") is None
    assert forecast(1.0, "step", 10, None, "cuda:0") is None
    assert forecast(1.0, "step", 10, 5, "cuda:0") is None  # already past
    assert forecast(1.0, "s", 0, GiB, "cuda:0") is None  # 34 years away: not worth a line
    assert duration(3780) == "1 h 03 min"


def _run(path: Path, keep: bool) -> str:
    s = Session(str(path), device="cpu", status=False).start()
    kept = []
    try:
        m = torch.nn.Linear(64, 64)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for _ in range(40):
            m(torch.randn(32, 64)).sum().backward()
            opt.step()
            opt.zero_grad()
            if keep:
                kept.append(torch.randn(256, 1024))  # 1 MiB a step
    finally:
        s.finish(0, "exit")
    return render_summary(read_capture(str(path)))


def test_a_leaking_run_forecasts_when_the_ram_runs_out_and_a_flat_one_does_not(tmp_path: Path) -> None:
    leaky = _run(tmp_path / "a.jsonl", keep=True)
    assert "forecast: at +1.00 MiB/step the RAM" in leaky or "forecast: at +1.00 MiB/step the cgroup" in leaky
    assert "forecast:" not in _run(tmp_path / "b.jsonl", keep=False)
