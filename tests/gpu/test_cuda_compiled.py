"""CUDA: torch.compile(mode="reduce-overhead") CUDA-graph pools are a named holder and a breakdown row, and no
figure of the report is negative (issue 13)."""

from __future__ import annotations

import re

import pytest
import torch

import torchmem

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

MiB = 1 << 20


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(2048, 2048)
        self.b = torch.nn.Linear(2048, 2048)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.compile's own (torch.jit.script_method)
@pytest.mark.filterwarnings("ignore::UserWarning")  # inductor's TF32 advice
def test_reduce_overhead_graph_pool_is_named_with_its_fix_and_is_a_breakdown_row() -> None:
    model = Net().cuda()
    f = torch.compile(model, mode="reduce-overhead")
    kept = []
    with torch.no_grad():
        for n in (1024, 2048, 4096):  # three shapes: three recordings in one pool
            x = torch.randn(n, 2048, device="cuda")
            for _ in range(3):
                y = f(x)
            kept.append(y.clone())
            kept.append(y)  # an output of the graph, in its private pool
    torch.cuda.synchronize()
    s = torchmem.stats("cuda:0")
    assert s.private_pools is not None and s.private_pools >= 8 * MiB, s
    text = str(s.breakdown())
    assert "of which in private pools" in text, text
    r = torchmem.live_tensors("cuda:0")
    report = str(r)
    print(report)
    assert "torch.compile (reduce-overhead) CUDA graphs of" in report, report
    assert "recorded graph" in report and "torch.compiler.reset()" in report, report
    assert "weakref.finalize._registry" not in report, report
    assert not re.search(r"(?<![\w.])[-\u2212]\d", report), report  # no negative figure ("-568.00 MiB")
    assert r.unexplained is None or r.unexplained >= 0
    assert r.excess >= 0
    owners = [g.owner for g in r.owners]
    assert any(o.startswith("torch.compile (reduce-overhead)") for o in owners), owners
    del kept, y, f
    torch.compiler.reset()
