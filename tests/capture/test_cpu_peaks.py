"""On the CPU the run's figure is the C heap: every reading counts towards the peak, the run's summary and
``torchmem report`` give the same peak, and the capture says where its figures come from."""

from __future__ import annotations

from pathlib import Path

import torch

from torchmem.capture.file import read_capture
from torchmem.results.capture import render_summary
from torchmem.run.session import Session


def test_the_summary_peak_is_the_report_peak_and_no_reading_is_above_it(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    s = Session(str(path), device="cpu", status=False, interval=0.01).start()
    kept = []
    try:
        m = torch.nn.Linear(128, 128)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for i in range(30):
            m(torch.randn(64, 128)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
            kept.append(torch.randn(64, 1024))  # 256 KiB a step: the heap grows every step
            if i == 15:
                spike = torch.ones(8 << 20)  # 32 MiB for one step
                spike.add_(1)
                del spike
    finally:
        res = s.finish(0, "exit")
    cap = read_capture(str(path))
    assert cap.source == "heap" and "glibc mallinfo2" in render_summary(cap)
    readings = [x.allocated for x in cap.steps if x.allocated is not None]
    readings += [x.allocated for x in cap.samples if x.allocated is not None]
    assert readings
    assert res.peak_allocated == cap.peak_allocated
    assert res.peak_allocated is not None and res.peak_allocated >= max(readings)
