"""Distributed runs on one GPU: one rank under torchrun (gloo, so no NCCL is needed), the CUDA paths of the
merged report (contexts per GPU, reserved figures), gather_stats on the GPU, and a followed child process.

Run by the lead on a machine with a GPU: ``python -m pytest -q tests/gpu/test_distributed_gpu.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from multi_jobs import job_env  # tests/gpu is on sys.path: a launcher's variables out, src importable

from torchmem.analysis.ranks import merge_captures
from torchmem.capture.file import read_capture

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

ONE_RANK = textwrap.dedent(
    """
    import json, sys, torch, torch.distributed as dist
    from torchmem.integrations.distributed import gather_stats, local_stats
    dist.init_process_group("gloo")
    dev = torch.device("cuda", 0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(1024, 1024).to(dev))
    opt = torch.optim.Adam(model.parameters())
    keep = []
    for i in range(20):
        model(torch.randn(256, 1024, device=dev)).sum().backward()
        opt.step(); opt.zero_grad()
        keep.append(torch.randn(256 * 1024, device=dev))  # 1 MiB per step
    g = gather_stats(dev)
    json.dump({"gathered": g.to_dict(), "local": local_stats(dev).to_dict()}, open(sys.argv[1], "w"))
    dist.destroy_process_group()
    """
)

CHILD = textwrap.dedent(
    """
    import torch, torch.multiprocessing as mp
    def work(k):
        m = torch.nn.Linear(256, 256).cuda(); o = torch.optim.SGD(m.parameters(), lr=0.1)
        for _ in range(10):
            m(torch.randn(64, 256, device="cuda")).sum().backward(); o.step(); o.zero_grad()
    if __name__ == "__main__":
        mp.spawn(work, nprocs=1)
    """
)


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=job_env(), capture_output=True, text=True, timeout=300
    )


def test_one_rank_on_the_gpu_records_a_capture_the_merged_report_reads(tmp_path: Path) -> None:
    (tmp_path / "one.py").write_text(ONE_RANK)
    r = _run(["-m", "torchmem", "run", "--nproc", "1", "-o", "g.jsonl", "one.py", "out.json"], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    cap = read_capture(tmp_path / "g.rank0.jsonl")
    assert cap.finished and cap.device == "cuda:0" and cap.source == "allocator"
    assert cap.rank is not None and (cap.rank["rank"], cap.rank["world_size"]) == (0, 1)
    assert cap.ranks and cap.ranks[-1].backend == "gloo" and cap.ranks[-1].nccl is None  # NCCL-free
    merged = merge_captures([cap])
    row = merged.rows[0]
    assert row.label == "rank 0" and row.leaking and 0.9e6 < row.leak_per_step < 1.2e6
    assert row.peak_reserved is not None and row.peak_reserved >= (row.peak_allocated or 0)
    assert row.contexts in (None, 1)  # NVML may be missing; with it, only this rank's context on GPU 0
    assert "First OOM" not in str(merged)
    out = json.loads((tmp_path / "out.json").read_text())
    ranks = out["gathered"]["ranks"]
    assert len(ranks) == 1 and ranks[0]["device"] == "cuda:0" and ranks[0]["allocated"] > 20 << 20
    assert out["local"]["rank"] == 0 and out["local"]["reserved"] >= out["local"]["allocated"]


def test_a_spawned_child_on_the_gpu_records_its_own_capture(tmp_path: Path) -> None:
    (tmp_path / "child.py").write_text(CHILD)
    r = _run(["-m", "torchmem", "run", "--no-status", "-o", "c.jsonl", "child.py"], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    kid = read_capture(tmp_path / "c.proc0.jsonl")
    assert kid.finished and kid.step_count == 10
    assert kid.peak_allocated is not None and kid.peak_allocated > 0
    merged = merge_captures([read_capture(tmp_path / "c.jsonl"), kid])
    assert [x.label for x in merged.rows] == ["main", "proc 0"]
