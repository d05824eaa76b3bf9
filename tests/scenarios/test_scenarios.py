"""The leak scenario suite on the CPU: every leak found within 10 steps after warm-up, with its allocation
site, holder and kind; no control ever reported."""

from __future__ import annotations

import pytest
import torch

import torchmem
from scenarios.catalog import CONTROLS, LEAKS, Scenario, site_of

STEPS = 20
WARMUP = 3


def _watch(s: Scenario, device: str = "cpu") -> torchmem.LeakReport:
    w = torchmem.watch(range(STEPS), device=device, warmup=WARMUP, warn=False)
    s.run(w, torch.device(device))
    return w.report()


@pytest.mark.parametrize("s", LEAKS, ids=[s.name for s in LEAKS])
def test_leak_is_detected_and_attributed(s: Scenario) -> None:
    r = _watch(s)
    assert r.detected_at is not None, str(r)
    assert r.detected_at - WARMUP <= 10, str(r)
    assert r.culprits, str(r)
    top = r.culprits[0]
    assert top.kind == s.kind, str(r)
    assert s.holder is not None and top.holder is not None and s.holder in top.holder, str(r)
    sites = [top.site] + [site for site, _ in top.sites]
    assert site_of(s) in sites, str(r)
    assert top.bytes_per_step >= 512 * 1024, str(r)
    assert top.fix, str(r)


@pytest.mark.parametrize("s", CONTROLS, ids=[s.name for s in CONTROLS])
def test_control_is_never_reported(s: Scenario) -> None:
    r = _watch(s)
    assert r.detected_at is None, str(r)
    assert not r.leaking
    assert r.culprits == ()
