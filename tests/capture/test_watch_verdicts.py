"""watch() never reports silence that reads as "all clear": every verdict without a leak says why, with real
loops on the CPU, and the figures it prints agree with the bytes the loop really keeps."""

from __future__ import annotations

import json
from collections.abc import Callable

import torch

import torchmem
from torchmem.capture.watch import STEADY_READINGS, Watcher

NB = Callable[..., int]


def test_readme_loop_with_a_leak_below_the_threshold_says_so(nbytes: NB) -> None:
    """The README's loop, leaking 64 KiB/step (metrics kept on the device), under the 256 KiB/step default."""
    torch.manual_seed(0)
    model = torch.nn.Linear(512, 512)
    loader = [torch.randn(32, 512) for _ in range(20)]
    metrics: list[torch.Tensor] = []
    w = torchmem.watch(loader, device="cpu")  # defaults, as in the README: it must not warn here
    for batch in w:
        metrics.append(model(batch).detach())  # 32 x 512 float32 = 64 KiB, kept every step
    per_step = nbytes(*metrics) / len(metrics)  # what the loop really adds per step, measured directly
    assert per_step == 64 * 1024
    r = w.report()
    assert (
        r.source == "heap"
    )  # the CPU's default figure: the C heap (the tensors, malloc's headers, the list)
    assert not r.leaking and r.bytes_per_step == 0 and r.detected_at is None
    assert r.verdict == "below_threshold"
    assert abs(r.trend_per_step - per_step) <= 0.02 * per_step, r.trend_per_step
    assert r.min_bytes_per_step == 256 * 1024
    assert r.reason.startswith("memory grows by 64."), r.reason
    assert (
        "KiB/step, below the reporting threshold of 256.00 KiB/step (min_bytes_per_step=262144): pass "
        "min_bytes_per_step=32768 (`torchmem run --min-growth 32768`) to report it"
    ) in r.reason
    text = str(r)
    assert text.startswith("growth below the leak threshold on cpu over 20 steps: memory grows by 64.")
    assert "no leak" not in text and "LEAK" not in text
    d = json.loads(json.dumps(r.to_dict()))
    assert d["verdict"] == "below_threshold" and d["trend_per_step"] == r.trend_per_step
    assert "below the reporting threshold" in d["reason"]

    # The exact accounting (source="ledger") says the README's figure to the byte.
    metrics.clear()
    we = torchmem.watch(loader, device="cpu", source="ledger")
    for batch in we:
        metrics.append(model(batch).detach())
    re = we.report()
    assert re.verdict == "below_threshold" and re.trend_per_step == per_step
    assert re.reason.startswith(
        "memory grows by 64.00 KiB/step, below the reporting threshold of 256.00 KiB/step "
        "(min_bytes_per_step=262144): pass min_bytes_per_step=32768 (`torchmem run --min-growth 32768`) "
        "to report it"
    )

    # The value it suggests does report the leak, with the same figure, and names it.
    metrics.clear()
    w2 = torchmem.watch(loader, device="cpu", min_bytes_per_step=32768, warn=False)
    for batch in w2:
        metrics.append(model(batch).detach())  # SITE
    r2 = w2.report()
    assert r2.leaking and r2.verdict == "leak" and abs(r2.bytes_per_step - per_step) <= 0.02 * per_step
    assert r2.culprits and "metrics" in (r2.culprits[0].holder or "")


def test_too_few_steps_says_how_many_are_needed_and_how_many_there_were() -> None:
    needed = 3 + STEADY_READINGS  # warm-up + readings for the first verdict
    kept: list[torch.Tensor] = []

    def run(steps: int) -> torchmem.LeakReport:
        w = torchmem.watch(range(steps), device="cpu", warn=False)
        for _ in w:
            # 896 KiB per step: a leak once there are enough steps (3.5 MiB over the 5 readings, more than the
            # steady test's 3 MiB of evidence), too small for the short-run verdict, which needs 1 MiB a step
            # (tests/capture/test_short_verdicts.py)
            kept.append(torch.ones(224 * 1024))
        return w.report()

    r = run(2)
    assert r.verdict == "too_few" and "all within the 3-step warm-up" in r.reason
    assert f"needs {needed} steps" in r.reason
    assert str(r).startswith("not enough steps to judge on cpu: 2 step(s)")
    r = run(needed - 1)
    assert r.verdict == "too_few" and not r.leaking
    readings = STEADY_READINGS - 1
    assert r.reason.startswith(f"{needed - 1} steps, {readings} reading(s) after the 3-step warm-up")
    assert f"the first verdict needs {needed} steps" in r.reason and "run more steps" in r.reason
    r = run(needed)  # ... and that many steps are enough, as it says
    assert r.leaking and r.detected_at == needed


def test_zero_steps_says_what_to_do() -> None:
    w: Watcher[object] = torchmem.watch(device="cpu")
    with w:
        pass
    r = w.report()
    assert r.verdict == "no_steps" and "w.step()" in r.reason and "optimizer_steps" in r.reason


def test_a_flat_loop_says_flat() -> None:
    model = torch.nn.Linear(64, 64)
    w = torchmem.watch(range(20), device="cpu")
    for _ in w:
        model(torch.randn(8, 64)).sum().backward()  # temporaries and gradients: the same every step
    r = w.report()
    assert r.verdict == "flat" and r.reason.startswith("flat: the figure stayed within")
    assert str(r).startswith("no leak on cpu over 20 steps: flat")


def test_a_one_time_rise_after_the_warm_up_says_flat_since_then() -> None:
    kept: list[torch.Tensor] = []
    w = torchmem.watch(range(16), device="cpu")
    for i in w:
        if i == 5:
            kept.append(torch.ones(1024 * 1024))  # 4 MiB once (a lazily built buffer)
    r = w.report()
    assert r.verdict == "flat" and "after a one-time rise of 4.00 MiB" in r.reason


def test_a_noisy_loop_says_noisy_and_how_many_readings_the_robust_test_needs() -> None:
    sizes_mib = [3, 1, 4, 1, 5, 2, 6, 2, 5, 3, 4, 1]  # a buffer of varying size lives across each boundary
    buf = torch.empty(0)
    w = torchmem.watch(sizes_mib, device="cpu")
    for mib in w:
        buf = torch.ones(mib * 256 * 1024)
    del buf
    r = w.report()
    assert r.verdict == "noisy" and not r.leaking
    assert "the noise-robust test needs 16 readings, there were 9" in r.reason
    assert str(r).startswith("no steady growth on cpu over 12 steps: noisy")


def test_a_shrinking_loop_says_shrinking() -> None:
    pool: list[torch.Tensor] = []
    w = torchmem.watch(range(14), device="cpu")
    for i in w:
        if i == 0:  # built in the warm-up ...
            pool = [torch.ones(256 * 1024) for _ in range(16)]
        else:
            pool.pop()  # ... then 1 MiB freed per step
    r = w.report()
    assert r.verdict == "shrinking" and "1.00 MiB/step" in r.reason, str(r)
    # (the heap figure: each 1 MiB tensor and what malloc and the tensor's objects add to it)
    assert abs(r.trend_per_step + (1 << 20)) <= 0.01 * (1 << 20), r.trend_per_step


def test_growth_that_stops_keeps_its_verdict_and_says_what_it_is_now() -> None:
    kept: list[torch.Tensor] = []
    w = torchmem.watch(range(24), device="cpu", warn=False)
    for i in w:
        if i < 12:
            kept.append(torch.ones(256 * 1024))
    r = w.report()
    assert r.verdict == "stopped" and r.stopped_at is not None
    assert "now: flat" in str(r)
