"""scope() on CUDA: the cache of every device the block allocated on is emptied, survivors or not."""

from __future__ import annotations

import gc

import pytest
import torch

import torchmem

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

MiB = 1 << 20


def test_scope_returns_the_cache_when_nothing_survived() -> None:
    dev = torch.device("cuda", 0)
    torch.cuda.synchronize(dev)
    gc.collect()  # garbage earlier tests left (scope() collects it too): not this test's memory
    torch.cuda.empty_cache()
    base = torch.cuda.memory_reserved(dev)
    with torchmem.scope() as sc:
        x = torch.empty(256 * MiB, dtype=torch.uint8, device=dev)
        x.fill_(1)
        del x
    r = sc.report
    assert r is not None
    assert r.survived_bytes == 0 and r.born_bytes >= 256 * MiB
    assert r.devices == ("cuda:0",)
    assert torch.cuda.memory_reserved(dev) == base


def test_scope_returns_the_cache_and_reports_what_survived() -> None:
    dev = torch.device("cuda", 0)
    torch.cuda.synchronize(dev)
    gc.collect()  # garbage earlier tests left (scope() collects it too): not this test's memory
    torch.cuda.empty_cache()
    base = torch.cuda.memory_reserved(dev)
    kept: list[torch.Tensor] = []
    with torchmem.scope() as sc:
        tmp = torch.empty(256 * MiB, dtype=torch.uint8, device=dev)
        kept.append(torch.ones(MiB, dtype=torch.uint8, device=dev))
        del tmp
    r = sc.report
    assert r is not None and r.survived_bytes == MiB
    assert torch.cuda.memory_reserved(dev) - base <= 2 * MiB  # only the survivor's block is left
