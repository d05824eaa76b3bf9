"""Growth inside a call is its own finding (issue 26): a peak that grows with an inner loop and falls back at
each call's end is reported as that, with the fix — never as a leak, never as 'growth stopped'."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from torchmem.analysis.leaks import inner_growth
from torchmem.run.session import Session

MiB = 1 << 20


def test_a_sawtooth_is_growth_inside_each_call() -> None:
    saw = [(i, 100 * MiB + (i % 10) * 3 * MiB) for i in range(1, 61)]
    found = inner_growth(saw)
    assert found is not None
    rate, length, height, ramps = found
    assert rate == 3 * MiB and length == 10 and height == 27 * MiB and ramps >= 4


def test_a_leak_a_staircase_a_single_ramp_or_flat_is_not() -> None:
    assert inner_growth([(i, i * MiB) for i in range(1, 61)]) is None  # a leak
    # each call keeps half of what it built: memory kept across calls, not a sawtooth
    stair = [(i, (i // 10) * 15 * MiB + (i % 10) * 3 * MiB) for i in range(1, 61)]
    assert inner_growth(stair) is None
    one = [(i, min(i, 20) * MiB) for i in range(1, 41)] + [(41, 0)]
    assert inner_growth(one) is None
    assert inner_growth([(i, 100 * MiB) for i in range(1, 61)]) is None
    tiny = [(i, (i % 10) * 1024) for i in range(1, 61)]  # 1 KiB/step: below the threshold
    assert inner_growth(tiny) is None


def test_ramps_read_too_sparsely_are_left_out_not_fatal() -> None:
    # 12-step calls growing 512 KiB a step, read every step for 64 steps, then every 5 (a reading got dearer):
    # the later ramps have 2-3 readings; the dense ones still show the sawtooth
    def fig(i: int) -> int:
        return 200 * MiB + ((i - 1) % 12) * 512 * 1024

    pts = [(i, fig(i)) for i in range(1, 65)] + [(i, fig(i)) for i in range(65, 145, 5)]
    found = inner_growth(pts)
    assert found is not None and found[1] == 12 and abs(found[0] - 512 * 1024) < 1024, found
    # the same sparse reading of a steady leak is still no sawtooth
    assert inner_growth([(i, 200 * MiB + i * MiB) for i in [*range(1, 65), *range(65, 145, 5)]]) is None


def test_a_decode_loop_carrying_its_graph_is_reported_as_a_growing_peak(tmp_path: Path) -> None:
    cell = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.Tanh())

    def decode(tokens: int) -> float:
        h = torch.zeros(256, 512)
        for _ in range(tokens):
            h = cell(h)  # no no_grad: h carries the graph of every earlier token (~1 MiB a token)
        return float(h.detach().mean())

    s = Session(str(tmp_path / "run.jsonl"), device="cpu", status=False).start()
    try:
        # 144 steps: a loaded machine reads the heap every 6 steps (a reading's cost in a process of many
        # tests), and the noise-robust test needs 16 readings
        for _ in range(12):
            decode(12)
    finally:
        res = s.finish(0, "exit")
    leak = res.leak
    assert leak is not None and not leak.leaking and leak.verdict == "inner_growth", str(leak)
    text = str(leak)
    assert "the peak grows inside each call" in text and "torch.no_grad()" in text
    assert "LEAK" not in text and "stopped at step" not in text
    host = res.host_leak
    assert host is None or not host.leaking, str(host)


def test_a_plain_training_loop_has_no_inner_growth(tmp_path: Path) -> None:
    m = torch.nn.Linear(256, 256)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    s = Session(str(tmp_path / "run.jsonl"), device="cpu", status=False).start()
    try:
        for _ in range(24):
            m(torch.randn(128, 256)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    finally:
        res = s.finish(0, "exit")
    assert res.leak is not None and res.leak.verdict not in ("inner_growth", "leak"), str(res.leak)


def _track(series: list[tuple[int, int]], warmup: int = 3) -> Any:
    from torchmem.capture.watch_verdict import GrowthTrack

    t = GrowthTrack(256 * 1024, warmup)
    for n, v in series:
        t.keep(n, v)
        if n > warmup:
            t.add(n, v)
    return t


def test_a_run_that_ends_inside_a_call_is_still_growth_inside_each_call() -> None:
    # 6 decode calls of 40 tokens, +1 MiB a token, freed at each call's end; the run ends on the last token
    # of the last call, so the last readings rise steadily (the steady test says leak there)
    saw = [(i, 300 * MiB + ((i - 1) % 40) * MiB) for i in range(1, 241)]
    t = _track(saw)
    assert t.growth.leaking  # the live detector sees the last call's ramp
    verdict, reason, rate, _ = t.verdict(240, 1)
    assert verdict == "inner_growth" and "falls back at the end (5 times)" in reason, reason
    assert rate == MiB


def test_a_leak_under_the_sawtooth_is_a_leak() -> None:
    # the same calls, each keeping 3 MiB of its 39 MiB rise (75 KiB a token, under the threshold): the
    # floors climb at every call, so "nothing is kept across calls" would be false
    stair = [(i, 300 * MiB + ((i - 1) // 40) * 3 * MiB + ((i - 1) % 40) * MiB) for i in range(1, 241)]
    assert inner_growth(stair) is None
    t = _track(stair)
    assert t.verdict(240, 1)[0] == "leak"
    # floors that move but do not climb (the heap's noise) are still growth inside each call
    jitter = [0, 2, -1, 1, 0, 2]
    saw = [(i, 300 * MiB + jitter[(i - 1) // 40] * MiB + ((i - 1) % 40) * MiB) for i in range(1, 241)]
    assert inner_growth(saw) is not None
    # and a plain leak stays one
    t = _track([(i, 300 * MiB + i * MiB) for i in range(1, 241)])
    assert t.verdict(240, 1)[0] == "leak"
