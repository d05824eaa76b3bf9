"""Host growth explained by CUDA state (issue 26), on the GPU machine: real programs under ``torchmem run``
with no flag, their ``host_leak`` record checked. Said: the allocator's memory history left recording, and
``cudnn.benchmark`` fed a new input shape every step, each with its fix. Not said: ``cudnn.benchmark`` with
one shape and a history bounded to 1,000 entries, while numpy rows are what grows (named instead)."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from scenarios.run_catalog import Expected, records, run_all, safety_failures
from torchmem.analysis.host_state import CUDNN_BENCHMARK, MEMORY_HISTORY
from torchmem.results.leaks import LeakReport

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

PROGRAMS = Path(__file__).resolve().parent / "host_kinds"


@dataclasses.dataclass(frozen=True)
class _Program(Expected):
    @property
    def path(self) -> Path:
        return PROGRAMS / self.file


RUNS = (
    _Program("history_recording", "history_recording.py", "host_leak", "backward", "history"),
    _Program("cudnn_new_shapes", "cudnn_new_shapes.py", "host_leak", "backward", "cudnn"),
    _Program("cudnn_fixed_shapes_rows", "cudnn_fixed_shapes_rows.py", "host_leak", "backward", "rows"),
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run_all(RUNS, tmp_path_factory, workers=3, env=None)


def _host(runs: dict[str, Any], name: str) -> LeakReport:
    r = runs[name]
    prog = next(p for p in RUNS if p.name == name)
    assert not safety_failures(prog, r), r.stderr[-3000:]
    reps = [rec for rec in records(r.capture) if rec.get("type") == "host_leak"]
    assert reps, f"no host_leak record\n{r.stderr[-3000:]}"
    print(reps[-1]["report"]["culprits"], reps[-1]["report"]["notes"])
    return LeakReport.from_dict(reps[-1]["report"])


def test_memory_history_left_recording_is_named_with_its_fix(runs: dict[str, Any]) -> None:
    r = _host(runs, "history_recording")
    assert r.leaking, str(r)
    c = r.culprits[0]
    assert c.kind == MEMORY_HISTORY, str(r)
    assert "_record_memory_history(enabled=None)" in c.fix and "max_entries" in c.fix, c.fix


def test_cudnn_benchmark_fed_new_shapes_is_named_with_its_fix(runs: dict[str, Any]) -> None:
    r = _host(runs, "cudnn_new_shapes")
    assert r.leaking, str(r)
    c = r.culprits[0]
    assert c.kind == CUDNN_BENCHMARK, str(r)
    assert "cudnn.benchmark = False" in c.fix and "ran a shape not seen before" in c.fix, c.fix


def test_cudnn_benchmark_with_one_shape_and_a_bounded_history_are_not_named(runs: dict[str, Any]) -> None:
    r = _host(runs, "cudnn_fixed_shapes_rows")
    kinds = [c.kind for c in r.culprits]
    assert CUDNN_BENCHMARK not in kinds and MEMORY_HISTORY not in kinds, str(r)
    assert r.verdict == "leak" and r.culprits and r.culprits[0].holder, str(r)
    assert r.culprits[0].holder.startswith("__main__.rows["), str(r)
