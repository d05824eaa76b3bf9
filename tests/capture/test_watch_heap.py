"""watch(source="heap"): the C heap in use as the per-step figure on the CPU (what ``torchmem run`` reads
there), with the exact ledger on only in attribution windows. The scenario catalog must give the same
verdicts, culprits, holders and sites as with the exact ledger, with a figure that also counts non-tensor
memory."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import torchmem
import torchmem.analysis.growth as leaks_mod
import torchmem.capture.watch as watch_mod
from scenarios.catalog import CONTROLS, LEAKS, Scenario, site_of
from torchmem.devices import ledger

STEPS = 20
WARMUP = 3
MiB = 1 << 20


def _watch(s: Scenario) -> torchmem.LeakReport:
    # Every step read (stride 1): what is tested here is the verdict from the heap figure; on a loaded
    # machine a heap reading is slow enough for the automatic stride to read only every third step.
    w = torchmem.watch(range(STEPS), device="cpu", warmup=WARMUP, warn=False, source="heap", stride=1)
    s.run(w, torch.device("cpu"))
    return w.report()


@pytest.mark.parametrize("s", LEAKS, ids=[s.name for s in LEAKS])
def test_leak_is_detected_and_attributed_from_the_heap_figure(s: Scenario) -> None:
    r = _watch(s)
    assert r.source in ("heap", "rss"), str(r)
    assert r.detected_at is not None, str(r)
    assert r.detected_at - WARMUP <= 10, str(r)
    assert r.culprits, str(r)
    top = r.culprits[0]
    assert top.kind == s.kind, str(r)
    assert s.holder is not None and top.holder is not None and s.holder in top.holder, str(r)
    sites = [top.site] + [site for site, _ in top.sites]
    assert site_of(s) in sites, str(r)
    assert top.bytes_per_step >= 512 * 1024, str(r)
    assert top.fix, str(r)


@pytest.mark.parametrize("s", CONTROLS, ids=[s.name for s in CONTROLS])
def test_control_is_never_reported_from_the_heap_figure(s: Scenario) -> None:
    r = _watch(s)
    assert r.detected_at is None, str(r)
    assert not r.leaking
    assert r.culprits == ()


def test_the_ledger_is_on_only_while_growth_is_attributed() -> None:
    model = torch.nn.Linear(512, 512)
    kept: list[torch.Tensor] = []
    on: list[bool] = []
    # A reading at every step: in a long test process a heap reading costs more and the stride policy would
    # leave fewer than the 5 readings in the 17 growing steps (what this test checks is the ledger's window)
    w = torchmem.watch(range(60), device="cpu", warn=False, source="heap", stride=1)
    for i in w:
        on.append(ledger().active)
        if i < 20:
            with torch.no_grad():
                kept.append(model(torch.randn(512, 512)))  # 1 MiB per step for 20 steps
    r = w.report()
    assert r.detected_at is not None and r.culprits  # found and named ...
    assert r.stopped_at is not None and not r.leaking  # ... and then it stopped
    assert "kept" in (r.culprits[0].holder or "")
    assert any(on), "an attribution window should have turned the ledger on"
    assert sum(on) <= 8, on  # one window of window+1 boundaries (and the step that opened it)
    assert not any(on[20:]), on  # closed once it had served
    assert any("the C heap in use" in n or "resident set size" in n for n in r.notes)


def test_a_flat_loop_never_turns_the_ledger_on_and_never_runs_the_slow_tests(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = {"robust": 0}
    real = leaks_mod._robust_rate

    def counting(*args: object, **kwargs: object) -> object:
        calls["robust"] += 1
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(leaks_mod, "_robust_rate", counting)
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    on = False
    w = torchmem.watch(range(600), device="cpu", warn=False, source="heap", stride=1)
    for _ in w:
        model(torch.randn(16, 64)).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        on = on or ledger().active
    assert calls["robust"] == 0  # the O(n²) test never ran: its O(1) pre-check was enough each step
    assert not on
    r = w.report()  # (explaining the verdict may run it, once)
    assert r.verdict == "flat", str(r)
    assert len(r.series) == 600


def test_without_the_c_heap_the_figure_is_the_resident_set_size(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(watch_mod, "heap_in_use", lambda: None)  # a C library without mallinfo2
    gc.collect()  # earlier tests' garbage, freed now rather than in the middle of the watch
    kept: list[torch.Tensor] = []
    w = torchmem.watch(range(12), device="cpu", warn=False, warmup=1, source="heap")
    for _ in w:
        # 36 MiB per step, written: above glibc's largest mmap threshold (32 MiB), so each is fresh resident
        # memory whatever the heap already holds
        kept.append(torch.ones(9 * MiB))
    r = w.report()
    assert r.source == "rss"
    assert r.detected_at is not None and r.culprits and "kept" in (r.culprits[0].holder or ""), str(r)
    assert any("resident set size" in n for n in r.notes)


def test_heap_is_a_cpu_figure() -> None:
    with pytest.raises(torchmem.WatchError, match="no allocator statistics") as err:
        torchmem.watch(device="cpu", source="allocator").__enter__()
    assert "source='heap'" in err.value.hint
    with pytest.raises(torchmem.WatchError, match="'heap'"):
        torchmem.watch(device="cpu", source="heap ")


def test_the_first_window_of_a_fresh_process_does_not_hide_a_leak(tmp_path: Path) -> None:
    """Turning the ledger on for the first time loads parts of torch into the heap (tens of MiB): that is
    torchmem's own change, left out of the readings, so the steady test still finds the leak at once."""
    prog = tmp_path / "prog.py"
    prog.write_text(
        textwrap.dedent(
            """
            import torch, torchmem
            model = torch.nn.Linear(512, 512)
            losses = []
            w = torchmem.watch(range(20), device="cpu", warn=False, source="heap", stride=1)
            for _ in w:
                losses.append(model(torch.randn(512, 512)).square().mean())  # a graph kept per step
            r = w.report()
            print("DETECTED", r.detected_at, r.leaking, bool(r.culprits), r.source)
            """
        )
    )
    out = subprocess.run(
        [sys.executable, str(prog)], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr[-2000:]
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("DETECTED"))
    _, detected, leaking, named, source = line.split()
    assert source in ("heap", "rss")
    assert leaking == "True" and named == "True", out.stdout
    assert int(detected) <= 3 + 5 + 1, out.stdout  # warm-up + the steady test's 5 readings (+1)


def test_a_costly_heap_reading_is_taken_rarely(monkeypatch: pytest.MonkeyPatch) -> None:
    """glibc's mallinfo2 walks the heap's free lists: on a fragmented heap a reading takes tens of µs. The
    watcher then reads rarely enough to stay near 2 % of the run, beyond max_stride."""
    import time

    calls = [0]
    real = watch_mod._heap_reading

    def slow() -> int:
        calls[0] += 1
        time.sleep(0.002)  # a 2 ms reading (a 1 ms one is taken at every step for its first 32 readings)
        return real()

    monkeypatch.setattr(watch_mod, "_heap_reading", slow)
    w = torchmem.watch(range(400), device="cpu", warn=False, source="heap")
    for _ in w:
        time.sleep(0.001)  # a 1 ms step
    r = w.report()
    assert w._stride > 2
    assert calls[0] <= 5 + 3 + 400 // 20, calls[0]  # setup, warm-up, then at most one reading per 20 steps
    assert any("reading every" in n for n in r.notes), r.notes
    assert r.verdict in ("flat", "noisy", "too_few"), str(r)
