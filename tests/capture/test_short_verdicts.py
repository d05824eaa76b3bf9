"""Verdicts from the strength of the evidence (issue 26): a run too short for the growth tests is called a
leak when every step kept about the same large amount, and named (site, holder, fix); runs whose growth
stops, rises once, or is small stay quiet."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import torchmem
from torchmem.analysis.leaks import short_run_growth
from torchmem.capture.file import read_capture
from torchmem.run.session import Session

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


def _serve(path: Path, calls: int) -> Any:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_embd=128, n_layer=2, n_head=4, vocab_size=256, n_positions=1024)
    cfg.attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    outputs = []
    s = Session(str(path), device="cpu", status=False).start()
    try:
        for _ in range(calls):
            prompt = torch.randint(1, 256, (16, 384))
            out = model.generate(
                prompt,
                max_new_tokens=4,
                min_new_tokens=4,
                do_sample=False,
                pad_token_id=0,
                return_dict_in_generate=True,
            )  # each output keeps its KV cache: 2 layers x K, V x 16 x 388 x 128 floats, 12 MiB
            outputs.append(out)
    finally:
        res = s.finish(0, "exit")
    return res


def test_three_generate_calls_are_three_steps_and_keeping_their_outputs_is_a_leak(tmp_path: Path) -> None:
    """A boundary is recognised at its second occurrence; its first occurrence ended the first step too: 3
    ``generate()`` calls are 3 steps (2 rises), enough for the short-run verdict when each kept 12 MiB."""
    res = _serve(tmp_path / "keep.jsonl", 3)
    leak = res.leak
    assert leak is not None and leak.steps == 3, leak
    assert leak.leaking and "2 of 2 steps each kept about" in leak.reason, str(leak)
    assert abs(leak.bytes_per_step - 12 * MiB) < 2 * MiB, str(leak)
