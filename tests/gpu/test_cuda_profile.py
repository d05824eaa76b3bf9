"""``torchmem.profile()`` on CUDA: figures against the caching allocator's own counters."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import torchmem
from torchmem.capture.profile import profile

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

MiB = 1 << 20
DEV = torch.device("cuda", 0)


def _mlp(width: int = 1024, depth: int = 4) -> nn.Sequential:
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers).to(DEV)


def _bytes(*ts: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in ts)


def test_mlp_figures_and_reconciliation_on_cuda() -> None:
    torch.cuda.synchronize()
    model = _mlp()
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(512, 1024, device=DEV)
    for _ in range(2):  # warm up: optimizer state, cuBLAS workspaces
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
    with torchmem.track(survivors=False) as t, profile(model, optimizer=opt) as prof:
        model(x).square().mean().backward()
        opt.step()
    r = prof.report()
    assert r.device == "cuda:0"
    assert r.totals.params == sum(_bytes(p) for p in model.parameters())
    assert r.totals.grads == r.totals.params
    assert r.totals.optimizer_state is not None and r.totals.optimizer_state >= 2 * r.totals.params
    assert r.row("0").activations == _bytes(x)  # a Linear saves its input
    assert r.row("1").activations == _bytes(x)  # a ReLU its output (same shape here)
    for row in r.rows:
        assert row.forward_peak is not None and row.backward_peak is not None
    # a Linear's forward makes its output; the allocator rounds to 512 bytes
    assert abs((r.row("0").forward_peak or 0) - _bytes(x)) < MiB
    rec = r.reconciliation
    assert rec.measured_peak is not None and rec.sum_of_parts is not None and rec.unexplained is not None
    assert rec.sum_of_parts + rec.unexplained == rec.measured_peak
    # the enclosing track() kept the block's peak although profile() reset the counters at every event
    assert t.peak is not None and t.peak >= rec.measured_peak
    assert t.peak - rec.measured_peak < 4 * MiB
    # x (8 MiB), the output and the loss's tensors stay unexplained; nothing large is missing
    assert 0 <= rec.unexplained < rec.measured_peak * 0.2 + 16 * MiB, str(r)


def test_peaks_false_leaves_the_users_peak_alone() -> None:
    model = _mlp(512, 2)
    x = torch.randn(64, 512, device=DEV)
    big = torch.empty(256 * MiB, dtype=torch.uint8, device=DEV)
    del big
    peak0 = torch.cuda.max_memory_allocated(DEV)
    with profile(model, peaks=False) as prof:
        model(x).sum().backward()
    assert torch.cuda.max_memory_allocated(DEV) == peak0
    r = prof.report()
    assert r.totals.forward_peak is None and r.reconciliation.measured_peak is None
    assert r.row("0").activations == _bytes(x)


def test_hooks_removed_and_checkpoint_on_cuda() -> None:
    class Ck(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blk = _mlp(512, 2)
            self.head = nn.Linear(512, 1).to(DEV)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(checkpoint(self.blk, x, use_reentrant=False))

    model = Ck()
    before = [(n, dict(m._forward_hooks), dict(m._forward_pre_hooks)) for n, m in model.named_modules()]
    x = torch.randn(256, 512, device=DEV)
    with profile(model) as prof:
        model(x).sum().backward()
    after = [(n, dict(m._forward_hooks), dict(m._forward_pre_hooks)) for n, m in model.named_modules()]
    assert after == before
    r = prof.report()
    assert r.row("blk").activations == 0
    assert (r.row("blk").backward_peak or 0) > 0  # includes the recomputation
    assert any("recomputed" in n for n in r.row("blk").notes)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch 2.11's dynamo on Python 3.12, not torchmem
@pytest.mark.filterwarnings("ignore::UserWarning")  # inductor's TF32 advice, raised inside torch.compile
def test_torch_compile_on_cuda() -> None:
    model = _mlp(512, 2)
    compiled = torch.compile(model)
    x = torch.randn(256, 512, device=DEV)
    compiled(x).sum().backward()
    with profile(compiled) as prof:
        compiled(x).sum().backward()
    r = prof.report()
    assert r.totals.params == sum(_bytes(p) for p in model.parameters())
    assert r.totals.forward_peak is not None and r.totals.forward_peak > 0
    assert r.row("0").forward_peak is None  # inside the compiled code
    assert r.reconciliation.measured_peak is not None
