"""Verdicts from the strength of the evidence (issue 26): a run too short for the growth tests is called a
leak when every step kept about the same large amount, and named (site, holder, fix); runs whose growth
stops, rises once, or is small stay quiet."""

from __future__ import annotations

from pathlib import Path

import torch

import torchmem
from torchmem.analysis.leaks import short_run_growth
from torchmem.capture.file import read_capture
from torchmem.capture.session import Session

MiB = 1 << 20


def test_overwhelming_regular_growth_is_a_leak_in_a_few_readings() -> None:
    g = short_run_growth([(1, 100 * MiB), (2, 164 * MiB), (3, 228 * MiB), (4, 292 * MiB), (5, 356 * MiB)])
    assert g is not None and g.leaking and g.bytes_per_step == 64 * MiB and g.method == "short"
    assert "3 of 3 steps each kept about 64.00 MiB" in g.reason and g.confidence == 0.875
    # a stride: rises per step
    g2 = short_run_growth([(2, 0), (4, 128 * MiB), (6, 256 * MiB), (8, 384 * MiB)])
    assert g2 is not None and g2.bytes_per_step == 64 * MiB


def test_growth_that_stops_rises_once_wobbles_or_is_small_is_not() -> None:
    assert short_run_growth([(1, 0), (2, 64 * MiB), (3, 128 * MiB), (4, 128 * MiB)]) is None  # stopped
    assert short_run_growth([(1, 0), (2, 512 * MiB), (3, 512 * MiB), (4, 513 * MiB)]) is None  # once
    assert short_run_growth([(1, 0), (2, 10 * MiB), (3, 40 * MiB), (4, 45 * MiB)]) is None  # irregular
    assert short_run_growth([(1, 0), (2, MiB // 2), (3, MiB), (4, 3 * MiB // 2)]) is None  # 512 KiB/step
    assert short_run_growth([(1, 0), (2, 64 * MiB)]) is None  # one rise proves nothing
    assert short_run_growth([(1, 0), (2, 64 * MiB), (3, 128 * MiB)], min_bytes_per_step=32 * MiB) is None


def _loop(steps: int, keep_mib: int, once: bool = False) -> torchmem.LeakReport:
    kept = []
    w = torchmem.watch(range(steps), warn=False)
    for i in w:
        if not once or i == 0:
            kept.append(torch.ones(keep_mib * MiB // 4))
    return w.report()


def test_a_six_step_loop_keeping_8_mib_a_step_is_a_leak_and_its_controls_are_not() -> None:
    rep = _loop(6, 8)
    assert rep.leaking and rep.verdict == "leak" and abs(rep.bytes_per_step - 8 * MiB) < MiB
    assert "steps each kept about 8.00 MiB" in rep.reason
    quiet = _loop(6, 8, once=True)  # one allocation kept from the first step only
    assert not quiet.leaking and quiet.verdict != "leak"
    small = _loop(6, 0)
    assert not small.leaking


def test_a_short_run_s_leak_is_named_with_site_holder_and_fix(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    acts: dict[int, torch.Tensor] = {}
    m = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256))
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    step = 0

    def keep(_mod: object, _inp: object, out: torch.Tensor) -> None:
        acts[step] = out.detach()

    m[0].register_forward_hook(keep)
    s = Session(str(path), device="cpu", status=False).start()
    try:
        for step in range(7):  # noqa: B007 (the hook reads it)
            m(torch.randn(2048, 256)).pow(2).mean().backward()  # 8 MiB kept by the hook per step
            opt.step()
            opt.zero_grad()
    finally:
        res = s.finish(0, "exit")
    leak = res.leak
    assert leak is not None and leak.leaking, leak
    assert leak.culprits, str(leak)
    c = leak.culprits[0]
    assert c.site is not None and c.site.startswith("test_short_verdicts.py:")
    assert c.holder is not None and "'acts'[" in c.holder and "`acts`" in c.fix
    assert read_capture(str(path)).leaks[-1].report["culprits"]
