"""A leak of ``.grad`` cycles (create_graph=True gradients whose graphs keep their tensors) is named as a
cycle with its fix, not as a graph chain; an OOM's holders reach the HTML page."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import torchmem
from torchmem.capture.file import read_capture
from torchmem.report.html import render_html
from torchmem.run.session import Session


def test_a_loop_leaking_grad_cycles_names_the_cycle_and_its_fix() -> None:
    w = torchmem.watch(range(16), warn=False)
    for _ in w:
        x = torch.randn(256, 1024, requires_grad=True)  # 1 MiB
        (g,) = torch.autograd.grad((x * x).sum(), x, create_graph=True)
        x.grad = g  # x -> grad -> graph -> x: a cycle the gc cannot see
    rep = w.report()
    assert rep.leaking, str(rep)
    c = rep.culprits[0]
    assert c.kind == "cycle", str(rep)
    assert "create_graph=False" in c.fix and "g.detach()" in c.fix


def test_a_plain_backward_loop_has_no_cycle() -> None:
    kept = []
    w = torchmem.watch(range(16), warn=False)
    for _ in w:
        x = torch.randn(256, 1024, requires_grad=True)
        (x * x).sum().backward()
        kept.append(x)  # a real leak, but of plain tensors and their .grad
    rep = w.report()
    assert rep.leaking and all(c.kind != "cycle" for c in rep.culprits), str(rep)


@pytest.mark.usefixtures("unhurried_oom_holders")
def test_an_oom_s_holders_are_on_the_html_page(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    s = Session(str(path), device="cpu", status=False).start()
    kept = []
    try:
        with torchmem.limit("64MiB", device="cpu"), pytest.raises(torch.OutOfMemoryError):
            for _ in range(100):
                kept.append(torch.ones(4 << 20))  # 16 MiB each
    finally:
        s.finish(0, "exit")
    cap = read_capture(str(path))
    assert cap.ooms, "the capped OOM was not recorded"
    page = render_html(cap)
    assert 'class="holders"' in page and "kept" in page
