"""Issue 12's scenario suite on CUDA: every program in ``tests/scenarios/programs`` run with ``torchmem run
prog.py`` (no option but the capture's path) on the GPU machine, checked as on the CPU (``run_catalog``)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from scenarios.run_catalog import (
    Expected,
    check,
    for_device,
    paired_runs,
    run_all,
    safety_failures,
)

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

CUDA = [s for s in for_device("cuda") if not s.timed]
TIMED = [s for s in for_device("cuda") if s.timed]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every program run once, four at a time (the GPU machine has 16 cores; each run is mostly start-up)."""
    return run_all(CUDA, tmp_path_factory, workers=4, env=None)


@pytest.mark.parametrize("s", CUDA, ids=[s.name for s in CUDA])
def test_program_is_reported_as_expected_on_cuda(s: Expected, runs: dict[str, Any]) -> None:
    r = runs[s.name]
    failures = safety_failures(s, r)
    assert r.capture is not None and r.capture.exists(), f"no capture written\n{r.stderr[-3000:]}"
    with open(r.capture, encoding="utf-8") as f:
        header = json.loads(f.readline())
    if not str(header.get("device", "")).startswith("cuda"):
        failures.append(f"the run did not monitor the GPU: header device {header.get('device')!r}")
    failures += check(r.capture, s)
    assert not failures, (
        f"{s.name} ({s.about}):\n- " + "\n- ".join(failures) + f"\nsummary:\n{r.stderr[-2500:]}"
    )


@pytest.mark.parametrize("s", TIMED, ids=[s.name for s in TIMED])
def test_cost_against_plain_python_on_cuda(s: Expected, tmp_path: Path) -> None:
    """Paired runs (plain, torchmem, plain, torchmem): the best wall time under ``torchmem run`` is within 3x
    of plain ``python`` (the issue's bound on a GPU is far lower; 3x catches a step detector gone wrong), and
    the monitored run is reported as expected."""
    figures, ratio, last = paired_runs(s, tmp_path, env=None)
    print(f"{figures} on {torch.cuda.get_device_name()}")
    failures = safety_failures(s, last)
    if last.capture is not None and last.capture.exists():
        failures += check(last.capture, s)
    else:
        failures.append("no capture written")
    if ratio > 3:
        failures.append(f"too slow: {figures}")
    assert not failures, (
        f"{s.name} ({s.about}):\n- " + "\n- ".join(failures) + f"\nsummary:\n{last.stderr[-2500:]}"
    )
