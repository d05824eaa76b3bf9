"""torchmem.results.fit: the results of find_batch_size() and estimate() on small CPU models survive
to_dict() -> from_dict(), also through JSON, and print the same afterwards."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

import torchmem
from torchmem.actions.limit import limit
from torchmem.results._dicts import ResultFormatError
from torchmem.results.fit import BatchSizeResult, EstimateRow, MemoryEstimate, StepMeasurement, Trial


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))


def _search() -> BatchSizeResult:
    model = _mlp()
    opt = torch.optim.AdamW(model.parameters())

    def step(bs: int) -> None:
        model(torch.randn(bs, 64)).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    with limit(16 << 20, "cpu"):
        step(4)
        return torchmem.find_batch_size(step, device="cpu", margin=0.0, start=4096)


def _estimate() -> MemoryEstimate:
    return torchmem.estimate(
        _mlp(), torch.randn(4, 64), optimizer="adamw", batch_sizes=[1, 64, 4096], probe_sizes=(4, 8)
    )


def _through_json(d: dict[str, Any]) -> Any:
    return json.loads(json.dumps(d))


def test_a_batch_size_result_round_trips() -> None:
    r = _search()
    assert any(t.oom for t in r.trials) and r.fixed_bytes is not None  # a search with a model and an OOM
    assert "band" in r.extra
    for stored in (r.to_dict(), _through_json(r.to_dict())):
        back = BatchSizeResult.from_dict(stored)
        assert back == r
        assert back.extra == r.extra  # extra is not compared by ==: its pairs come back as tuples
        assert isinstance(back.trials[0], Trial)
        assert str(back) == str(r)
        assert back.to_dict() == r.to_dict()


def test_a_trial_round_trips() -> None:
    for t in _search().trials:
        assert Trial.from_dict(_through_json(t.to_dict())) == t


def test_an_estimate_round_trips() -> None:
    est = _estimate()
    assert {row.mode for row in est.rows} == {"training", "inference"} and len(est.measurements) == 2
    for stored in (est.to_dict(), _through_json(est.to_dict())):
        back = MemoryEstimate.from_dict(stored)
        assert back == est
        assert str(back) == str(est)
        assert back.peak(4096) == est.peak(4096)
    for row in est.rows:
        assert EstimateRow.from_dict(_through_json(row.to_dict())) == row  # activations_in_peak ignored
    for m in est.measurements:
        assert StepMeasurement.from_dict(_through_json(m.to_dict())) == m


def test_the_old_import_paths_give_the_same_types() -> None:
    from torchmem.actions.batch_size import BatchSizeResult as FromActions
    from torchmem.actions.batch_size import Trial as TrialFromActions
    from torchmem.analysis.estimate import EstimateRow as RowFromAnalysis
    from torchmem.analysis.estimate import MemoryEstimate as FromAnalysis
    from torchmem.analysis.estimate import StepMeasurement as MeasurementFromAnalysis

    assert FromActions is BatchSizeResult and TrialFromActions is Trial
    assert FromAnalysis is MemoryEstimate and RowFromAnalysis is EstimateRow
    assert MeasurementFromAnalysis is StepMeasurement


@pytest.mark.parametrize(
    ("cls", "stored"),
    [
        (Trial, {"batch_size": "eight", "ok": True, "oom": False, "peak": 1, "seconds": 0.1}),
        (BatchSizeResult, {"batch_size": 8, "trials": "none"}),
        (BatchSizeResult, {"batch_size": 8, "extra": ["band"]}),
        (MemoryEstimate, ["not", "an", "object"]),
    ],
)
def test_a_damaged_record_is_a_clear_error(cls: Any, stored: Any) -> None:
    with pytest.raises(ResultFormatError):
        cls.from_dict(stored)
