"""Issue 12's scenario suite on CUDA: every program in ``tests/scenarios/programs`` run with ``torchmem run
prog.py`` (no option but the capture's path) on the GPU machine, checked as on the CPU (``run_catalog``)."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from scenarios.run_catalog import (
    Expected,
    check,
    for_device,
    run_all,
    safety_failures,
)

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

CUDA = for_device("cuda")


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
