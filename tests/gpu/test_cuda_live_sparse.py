"""live_tensors() on CUDA counts sparse tensors by their parts, so they reconcile with the allocator."""

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


def test_sparse_gradients_are_counted_on_cuda() -> None:
    torch.cuda.synchronize()
    gc.collect()  # earlier tests' garbage, which a collection during this test would take out of ``base``
    base = torchmem.live_tensors("cuda:0", holders=False).unexplained or 0  # what earlier tests left
    emb = torch.nn.Embedding(100_000, 256, sparse=True).cuda()
    emb(torch.randint(0, 100_000, (4096,), device="cuda")).sum().backward()
    grad = emb.weight.grad
    assert grad is not None and grad.layout == torch.sparse_coo
    torch.cuda.synchronize()
    r = torchmem.live_tensors("cuda:0", holders=False)
    parts = [t for t in r.tensors if t.layout == "sparse_coo" and t.category == "gradient"]
    grad_bytes = grad._values().untyped_storage().nbytes() + grad._indices().untyped_storage().nbytes()
    assert sum(t.bytes for t in parts) == grad_bytes >= 4096 * 256 * 4
    assert r.unexplained is not None and r.unexplained - base < 64 * MiB  # the gradient is not "unexplained"
