"""The leak scenario suite on CUDA: allocator counters for detection, ledger windows for attribution."""

from __future__ import annotations

import os
import sys

import pytest
import torch

import torchmem

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from scenarios.catalog import CONTROLS, LEAKS, Scenario, site_of

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

STEPS = 20
WARMUP = 3


def _watch(s: Scenario) -> torchmem.LeakReport:
    torch.cuda.synchronize()
    w = torchmem.watch(range(STEPS), device="cuda:0", warmup=WARMUP, warn=False)
    s.run(w, torch.device("cuda:0"))
    torch.cuda.synchronize()
    return w.report()


@pytest.mark.parametrize("s", LEAKS, ids=[s.name for s in LEAKS])
def test_leak_on_cuda_is_detected_and_attributed(s: Scenario) -> None:
    r = _watch(s)
    assert r.source == "allocator"
    assert r.detected_at is not None, str(r)
    assert r.detected_at - WARMUP <= 10, str(r)
    assert r.culprits, str(r)
    top = r.culprits[0]
    assert top.kind == s.kind, str(r)
    assert s.holder is not None and top.holder is not None and s.holder in top.holder, str(r)
    assert site_of(s) in [top.site] + [site for site, _ in top.sites], str(r)


@pytest.mark.parametrize("s", CONTROLS, ids=[s.name for s in CONTROLS])
def test_control_on_cuda_is_never_reported(s: Scenario) -> None:
    r = _watch(s)
    assert r.detected_at is None, str(r)
    assert r.culprits == ()


def test_light_mode_reads_agree_with_memory_allocated() -> None:
    dev = torch.device("cuda:0")
    keep = []
    with torchmem.watch(device=dev, warn=False, stride=1) as w:
        for _ in range(6):
            keep.append(torch.empty(1 << 20, device=dev))
            w.step()
            assert w.report().series[-1][1] == torch.cuda.memory_allocated(dev)
