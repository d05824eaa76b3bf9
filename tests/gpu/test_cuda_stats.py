"""CUDA figures checked against torch.cuda.memory_stats(), mem_get_info() and NVML (run on the device).

PYTHONPATH=src python3 -m pytest -m cuda tests/gpu -v
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import torchmem
from torchmem.devices import ledger

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

MiB = 1 << 20
SRC = os.path.join(os.path.dirname(__file__), "..", "..", "src")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.abspath(SRC) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _nvml_self() -> int | None:
    import pynvml as nv

    nv.nvmlInit()
    uuid = str(torch.cuda.get_device_properties(0).uuid)
    h = nv.nvmlDeviceGetHandleByUUID(("GPU-" + uuid if not uuid.startswith("GPU-") else uuid).encode())
    for p in nv.nvmlDeviceGetComputeRunningProcesses(h):
        if p.pid == os.getpid():
            return int(p.usedGpuMemory)
    return None


def _check_against_torch(s: torchmem.MemoryStats) -> None:
    ms = torch.cuda.memory_stats(0)
    assert s.allocated == ms["allocated_bytes.all.current"]
    assert s.reserved == ms["reserved_bytes.all.current"]
    assert s.active == ms["active_bytes.all.current"]
    assert s.requested == ms["requested_bytes.all.current"]
    assert s.fragmented == ms["inactive_split_bytes.all.current"]
    assert s.peak_allocated == ms["allocated_bytes.all.peak"]
    assert s.peak_reserved == ms["reserved_bytes.all.peak"]
    assert s.num_ooms == ms["num_ooms"]
    assert s.alloc_retries == ms["num_alloc_retries"]
    assert s.cached == ms["reserved_bytes.all.current"] - ms["allocated_bytes.all.current"]
    free, total = torch.cuda.mem_get_info(0)
    assert s.device_total == total
    assert s.device_free == free
    assert s.device_used == total - free


def test_import_and_stats_before_cuda_init_do_not_create_a_context() -> None:
    code = textwrap.dedent(
        """
        import json, torch, torchmem
        s = torchmem.stats()
        print(json.dumps({"init": torch.cuda.is_initialized(), "allocated": s.allocated,
                          "process": s.process_used, "total": s.device_total}))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), check=True)
    data = json.loads(out.stdout.strip().splitlines()[-1])
    assert data["init"] is False
    assert data["allocated"] == 0
    assert data["process"] == 0  # no context in that process, and NVML agrees
    assert data["total"] and data["total"] > 0  # from NVML, without creating a context


def test_scripted_sequence_every_figure_matches() -> None:
    torch.cuda.init()
    torch.cuda.synchronize()
    torchmem.stats()  # first call may run the context probe; later reads are steady
    torch.cuda.reset_peak_memory_stats(0)

    a = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda")
    _check_against_torch(torchmem.stats())

    b = torch.empty(100 * MiB + 123, dtype=torch.uint8, device="cuda")
    del a
    _check_against_torch(torchmem.stats())

    x = torch.randn(2048, 2048, device="cuda")
    before_ws = torch.cuda.memory_allocated(0)
    y = x @ x  # creates the cuBLAS workspace, which lives inside the caching allocator
    torch.cuda.synchronize()
    s = torchmem.stats()
    _check_against_torch(s)
    assert s.allocated is not None
    assert s.allocated >= before_ws + y.untyped_storage().nbytes()

    del b, x, y
    torch.cuda.empty_cache()
    s = torchmem.stats()
    _check_against_torch(s)

    nvml_self = _nvml_self()
    assert nvml_self is not None, "NVML should list this process on the device machine"
    assert s.process_used == nvml_self
    assert s.non_torch == nvml_self - (s.reserved or 0)


def test_reconciliation_sums_to_nvml_process_usage_and_context_matches_a_fresh_process() -> None:
    x = torch.randn(1024, 1024, device="cuda")
    _ = x @ x
    keep = torch.empty(300 * MiB, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    s = torchmem.stats()
    nvml_self = _nvml_self()
    b = s.breakdown()
    assert s.context is not None and s.context_method == "nvml-process"
    assert s.unexplained is not None
    total = sum(r.bytes or 0 for r in b.process)
    assert nvml_self is not None
    assert abs(total - nvml_self) <= 2 * MiB
    assert total == s.process_used
    # The allocator part is exact.
    torch_row = next(r for r in b.process if r.label == "PyTorch reserved")
    assert torch_row.bytes == torch.cuda.memory_reserved(0)
    assert sum(c.bytes or 0 for c in torch_row.children) == torch_row.bytes

    # The context estimate agrees with what a fresh process uses after creating its context.
    code = textwrap.dedent(
        """
        import os, torch, pynvml as nv
        torch.cuda.init(); torch.cuda.synchronize()
        nv.nvmlInit()
        h = nv.nvmlDeviceGetHandleByIndex(0)
        procs = nv.nvmlDeviceGetComputeRunningProcesses(h)
        print([p.usedGpuMemory for p in procs if p.pid == os.getpid()][0])
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    fresh = int(out.stdout.strip().splitlines()[-1])
    assert abs(fresh - s.context) <= 2 * MiB
    # After one matmul, what no reading explains is cuBLAS/cuRAND handles and kernels: small, not negative.
    assert 0 <= s.unexplained < 512 * MiB
    del keep


def test_counters_agree_with_torch() -> None:
    keep = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
    c = torchmem.counters(0)
    assert c.allocated == torch.cuda.memory_allocated(0)
    assert c.reserved == torch.cuda.memory_reserved(0)
    assert c.peak_allocated == torch.cuda.max_memory_allocated(0)
    assert c.peak_reserved == torch.cuda.max_memory_reserved(0)
    assert c.active == torch.cuda.memory_stats(0)["active_bytes.all.current"]
    assert torchmem.counters("cuda:0") == c
    assert torchmem.counters() == c
    del keep


def test_track_delta_peak_survivors_and_nesting() -> None:
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated(0)
    with torchmem.track("cuda:0") as outer:
        kept = torch.empty(32 * MiB, dtype=torch.uint8, device="cuda")
        with torchmem.track("cuda:0") as inner:
            tmp = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
            del tmp
        tmp2 = torch.empty(16 * MiB, dtype=torch.uint8, device="cuda")
        del tmp2
    assert outer.delta == torch.cuda.memory_allocated(0) - base == 32 * MiB
    assert inner.delta == 0
    assert inner.peak_delta == 64 * MiB
    assert inner.peak == base + 32 * MiB + 64 * MiB
    assert outer.peak == base + 32 * MiB + 64 * MiB
    assert outer.survived == 32 * MiB and outer.result is not None and outer.result.survived_tensors == 1
    assert inner.survived == 0
    del kept


def test_track_sees_a_peak_below_the_earlier_process_peak() -> None:
    big = torch.empty(512 * MiB, dtype=torch.uint8, device="cuda")
    del big  # the process-wide peak is now far above what the block will reach
    base = torch.cuda.memory_allocated(0)
    with torchmem.track(0, survivors=False) as t:
        tmp = torch.empty(8 * MiB, dtype=torch.uint8, device="cuda")
        del tmp
    assert t.peak == base + 8 * MiB
    assert t.result is not None and t.result.survived is None


def test_ledger_counts_cuda_storages_saved_for_backward_on_the_device_thread() -> None:
    torch.cuda.synchronize()
    with ledger().enabled() as led:
        start = led.current("cuda:0")
        w = torch.randn(1024, 1024, device="cuda", requires_grad=True)
        h = w * 2  # saved by sin's backward
        y = h.sin().sum()
        del h
        assert led.current("cuda:0") - start == w.nbytes * 2 + y.nbytes
        y.backward()  # runs on autograd's CUDA device thread: frees the saved tensor, makes w.grad
        del y
        assert w.grad is not None
        assert led.current("cuda:0") - start == w.nbytes + w.grad.nbytes
        del w
        assert led.current("cuda:0") == start


def test_pinned_host_memory_matches_host_memory_stats() -> None:
    if not hasattr(torch.cuda, "host_memory_stats"):
        pytest.skip("torch has no host_memory_stats")
    pinned = torch.empty(8 * MiB, dtype=torch.uint8, pin_memory=True)
    s = torchmem.stats()
    hs = torch.cuda.host_memory_stats()
    key = "allocated_bytes.current" if "allocated_bytes.current" in hs else "reserved_bytes.current"
    assert s.pinned_host == hs[key]
    assert s.pinned_host is not None and s.pinned_host >= 8 * MiB
    del pinned


def test_other_processes_are_listed_with_their_usage() -> None:
    code = (
        "import torch, sys; x = torch.empty(256 << 20, dtype=torch.uint8, device='cuda');"
        "torch.cuda.synchronize(); print('ready', flush=True); sys.stdin.readline()"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        s = torchmem.stats()
        assert s.other_processes is not None
        mine = [p for p in s.other_processes if p.pid == child.pid]
        assert mine and mine[0].used is not None and mine[0].used >= 256 * MiB
        b = s.breakdown()
        assert b.unattributed is not None and 0 <= b.unattributed < 64 * MiB
        assert b.device_used == (s.process_used or 0) + (s.other_processes_used or 0) + b.unattributed
    finally:
        assert child.stdin is not None
        child.stdin.write("\n")
        child.stdin.close()
        child.wait(timeout=60)
        if child.stdout is not None:
            child.stdout.close()


def test_cupy_pool_is_counted_as_another_allocator() -> None:
    cp = pytest.importorskip("cupy")
    arr = cp.empty(64 * MiB, dtype=cp.uint8)
    s = torchmem.stats(0)
    assert s.other_allocators.get("cupy") == cp.get_default_memory_pool().total_bytes() >= 64 * MiB
    assert s.unexplained is not None and s.context is not None and s.process_used is not None
    assert s.unexplained == s.process_used - s.context - (s.reserved or 0) - s.other_allocators["cupy"]
    del arr
    cp.get_default_memory_pool().free_all_blocks()


def test_nvml_missing_degrades_to_none_with_a_hint() -> None:
    code = textwrap.dedent(
        """
        import json, torch, torchmem
        torch.cuda.init(); x = torch.ones(10, device="cuda")
        s = torchmem.stats()
        print(json.dumps({"process": s.process_used, "context": s.context, "alloc": s.allocated,
                          "total": s.device_total, "notes": list(s.notes)}))
        print(s.breakdown())
        """
    )
    env = _env()
    env["TORCHMEM_NO_NVML"] = "1"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    data = json.loads(out.stdout.strip().splitlines()[0])
    assert data["process"] is None and data["context"] is None
    assert data["alloc"] == 512
    assert data["total"] > 0  # from cudaMemGetInfo
    assert any("NVML" in n for n in data["notes"])
    assert "n/a" in out.stdout


def test_index_past_device_count_is_a_clear_error() -> None:
    n = torch.cuda.device_count()
    with pytest.raises(torchmem.DeviceIndexError, match=f"cuda:{n} does not exist"):
        torchmem.stats(f"cuda:{n}")


def test_cli_stats_json_on_the_gpu() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "torchmem", "stats", "--json"],
        capture_output=True,
        text=True,
        env=_env(),
        check=True,
    )
    data = json.loads(out.stdout)
    devices = [d["device"] for d in data["devices"]]
    assert devices[0] == "cuda:0" and devices[-1] == "cpu"
    cuda0 = data["devices"][0]
    assert cuda0["device_total"] > 0 and cuda0["name"]
    table = subprocess.run(
        [sys.executable, "-m", "torchmem", "stats", "-d", "cuda:0"],
        capture_output=True,
        text=True,
        env=_env(),
        check=True,
    )
    assert "reconciliation" in table.stdout and "PyTorch reserved" in table.stdout
