"""On the CPU the device watcher and the host watcher of ``torchmem run`` read the same C heap: what the host
watcher's own work does to it (tracemalloc's tables while it traces, what its scans leave) is not the
program's, and the device watcher leaves it out as the host watcher does (py3.12's nonlocal_running_total
ended 'noisy' after traced steps). Real watchers on the real heap."""

from __future__ import annotations

import tracemalloc

import torch

from torchmem.run.records import Records
from torchmem.run.watchers import StepWatchers


def _watchers() -> StepWatchers:
    return StepWatchers(Records(), warmup=0, own_history=False)  # records unopened: written nowhere


def test_the_device_watcher_skips_the_steps_torchmem_traces_and_subtracts_its_leftovers() -> None:
    ws = _watchers()
    ws.start(torch.device("cpu"))
    w, host = ws.watcher, ws._host
    assert w is not None and host is not None
    try:
        assert w._others_work == host.own_work
        w._schedule.fixed = w._schedule.stride = 1  # a reading at every step (a loaded worker widens it)
        for _ in range(3):
            ws.step(None, None)
        read = [n for n, _ in w._series]
        tracer = host._tracer
        tracer.start()  # torchmem's tracemalloc on, as between two scans
        assert tracemalloc.is_tracing() and host.own_work() is None
        for _ in range(3):
            ws.step(None, None)
        assert [n for n, _ in w._series] == read  # no reading of a traced step
        tracer.stop()
        tracer.offset = 5 << 20  # what a scan left on the heap
        raw = w._reader()
        ws.step(None, None)
        n, value = w._series[-1]
        assert n == w.steps
        assert abs((raw - value) - (5 << 20)) < (1 << 20), (raw, value)  # the leftover is left out
    finally:
        ws.leak()
        ws.survivors_report(ws.watcher.steps if ws.watcher else 0, "step", None)
        ws.host_report(None, None, torch.device("cpu"))
        if tracemalloc.is_tracing():
            tracemalloc.stop()


def test_off_the_cpu_nothing_is_shared() -> None:
    ws = _watchers()
    ws.start(torch.device("cpu"))
    try:
        assert ws.watcher is not None and ws.watcher._others_work is not None
        ws._share_heap(torch.device("meta"))  # any device but the CPU: its own figures
        assert ws.watcher._others_work is None
    finally:
        ws.leak()
        ws.survivors_report(ws.watcher.steps if ws.watcher else 0, "step", None)
        ws.host_report(None, None, torch.device("cpu"))


def test_a_growth_the_device_report_names_costs_no_host_scan(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """On the CPU, once the device watcher names the holders of the heap's growth, the host watcher's scans
    (seconds in a short run) would name nothing more: its report is the device report's (host_verdict)."""
    from torchmem.run.session import Session

    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1))
    kept = []
    s = Session(str(tmp_path / "run.jsonl"), device="cpu", status=False).start()
    try:
        for _ in range(60):  # one step = one model call (the session's own boundaries)
            kept.append(model(torch.randn(512, 256)).mean())  # a graph kept per step: +1.5 MiB/step
        host = s._watchers._host
        assert host is not None and host.covered is not None and host.covered()
        scans = list(host._scan_steps)
    finally:
        res = s.finish(0, "exit")
    assert res.leak is not None and res.leak.leaking and res.leak.culprits
    assert all(c.holder and "'kept'[" in c.holder for c in res.leak.culprits), res.leak.culprits
    assert scans == [], scans
    # the survivors' end-of-run holder search was spared too: the culprits name the holders
    surv = res.survivors
    assert surv is None or any("holder search was skipped" in n for n in surv.notes), surv
