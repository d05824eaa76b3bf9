"""Issue 26's corpus on CUDA: every program in ``tests/scenarios/corpus`` run with ``torchmem run prog.py``
(no option but the capture's path) on the GPU machine, checked against ``corpus_catalog`` as on the CPU
(entries with a ``_cuda`` name are the GPU's reading of a program whose CPU tensors are host memory there)."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from scenarios.corpus_catalog import FLAKY, KNOWN_WRONG, for_device
from scenarios.run_catalog import Expected, check, run_all, safety_failures

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

CUDA = for_device("cuda")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every program run once, four at a time (the GPU machine has 16 cores; each run is mostly start-up)."""
    out = run_all(CUDA, tmp_path_factory, workers=4, env=None, timeout=300)
    keep = os.environ.get("OUT")  # the device machine's folder of results: each run's summary, for the docs
    if keep:
        os.makedirs(os.path.join(keep, "corpus"), exist_ok=True)
        for name, r in out.items():
            with open(os.path.join(keep, "corpus", f"{name}.txt"), "w", encoding="utf-8") as f:
                f.write(r.stderr[-6000:])
    return out


def _param(s: Expected) -> Any:
    reason = KNOWN_WRONG.get((s.name, "cuda"))
    if reason:
        return pytest.param(s, marks=pytest.mark.xfail(strict=True, reason=reason))
    flaky = FLAKY.get((s.name, "cuda"))
    return pytest.param(s, marks=pytest.mark.xfail(strict=False, reason=flaky)) if flaky else s


@pytest.mark.parametrize("s", [_param(s) for s in CUDA], ids=[s.name for s in CUDA])
def test_corpus_program_is_reported_as_expected_on_cuda(s: Expected, runs: dict[str, Any]) -> None:
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
