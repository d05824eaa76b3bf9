"""``torchmem run`` over real CUDA scripts (a leak, an OOM): capture, reports, figures vs memory_stats."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

SRC = str(Path(__file__).resolve().parents[2] / "src")

LEAK = textwrap.dedent(
    """
    import json, sys, torch; nn = torch.nn
    dev = torch.device("cuda", 0)
    model = nn.Sequential(nn.Linear(1024, 2048), nn.GELU(), nn.Linear(2048, 1)).to(dev)
    opt = torch.optim.AdamW(model.parameters())
    x_val = torch.randn(1024, 1024, device=dev)
    val_losses = []
    for step in range(30):
        loss = model(torch.randn(512, 1024, device=dev)).square().mean()
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
        val_losses.append(model(x_val).square().mean())   # keeps the validation graph
    torch.cuda.synchronize()
    s = torch.cuda.memory_stats(dev)
    json.dump({"peak": s["allocated_bytes.all.peak"], "current": s["allocated_bytes.all.current"]},
              open(sys.argv[1], "w"))
    """
)

OOM = textwrap.dedent(
    """
    import torch, torchmem
    dev = torch.device("cuda", 0)
    torchmem.limit(2 << 30, dev)
    model = torch.nn.Linear(4096, 4096).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    acts = []
    for step in range(100):
        out = model(torch.randn(8192, 4096, device=dev))
        out.square().mean().backward(retain_graph=True); opt.step(); opt.zero_grad()
        acts.append(out)   # grows until the 2 GiB limit
    """
)


def _run(tmp: Path, name: str, code: str, *extra: str) -> subprocess.CompletedProcess[str]:
    script = tmp / name
    script.write_text(code)
    env = dict(os.environ, PYTHONPATH=SRC)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "torchmem",
            "run",
            "--no-status",
            "-o",
            str(tmp / f"{name}.jsonl"),
            "--html",
            str(tmp / f"{name}.html"),
            *extra,
            str(script),
            str(tmp / f"{name}.json"),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp,
        check=False,
    )


def test_run_over_a_leaking_cuda_script(tmp_path: Path) -> None:
    out = _run(tmp_path, "leak.py", LEAK, "--memory-viz", str(tmp_path / "snap.pickle"), "--modules")
    print(out.stderr[-4000:])
    assert out.returncode == 0, out.stderr
    from torchmem.capture.file import read_capture

    cap = read_capture(tmp_path / "leak.py.jsonl")
    assert cap.header["device"] == "cuda:0" and cap.header["source"] == "allocator"
    assert cap.end is not None and cap.end.steps == 30
    leak = cap.leaks[-1].report
    assert leak["leaking"] and leak["culprits"][0]["site"] == "leak.py:11", leak
    assert "val_losses" in leak["culprits"][0]["holder"]
    script = json.loads((tmp_path / "leak.py.json").read_text())
    end = [s for s in cap.stats if s.when == "end"][-1].stats
    assert end["peak_allocated"] == script["peak"]  # the end reading agrees with memory_stats to the byte
    assert max(s.peak_allocated or 0 for s in cap.samples) <= script["peak"]
    assert cap.modules, "--modules recorded a per-module table"
    assert (tmp_path / "leak.py.html").stat().st_size > 10_000
    snap = pickle.loads((tmp_path / "snap.pickle").read_bytes())
    assert "segments" in snap and "device_traces" in snap
    rep = subprocess.run(
        [
            sys.executable,
            "-m",
            "torchmem",
            "report",
            str(tmp_path / "leak.py.jsonl"),
            "--plot",
            str(tmp_path / "t.png"),
        ],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=SRC),
        check=False,
    )
    assert rep.returncode == 0, rep.stderr
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_run_over_a_cuda_script_that_ooms(tmp_path: Path) -> None:
    out = _run(tmp_path, "oom.py", OOM)
    print(out.stderr[-4000:])
    assert out.returncode == 1
    assert "OutOfMemoryError" in out.stderr
    from torchmem.capture.file import read_capture

    cap = read_capture(tmp_path / "oom.py.jsonl")
    assert cap.end is not None and cap.end.reason == "oom"
    assert cap.ooms and cap.ooms[-1].diagnosis["causes"], cap.ooms
    kinds = [c["kind"] for c in cap.ooms[-1].diagnosis["causes"]]
    assert "leak" in kinds or "working_set" in kinds, kinds
    assert (tmp_path / "oom.py.html").exists()


CPU_ONLY = """
import sys
import torch
w = torch.randn(64, 1, requires_grad=True)
for _ in range(40):
    x = torch.randn(32, 64)
    loss = (x @ w).square().mean()
    loss.backward()
    with torch.no_grad():
        w -= 0.01 * w.grad
        w.grad = None
open(sys.argv[1], "w").write("{}")
"""


def test_a_cpu_program_on_a_gpu_machine_is_told_it_allocated_nothing_there(tmp_path: Path) -> None:
    """A newcomer runs a CPU-only script on a GPU machine: the GPU watched stays at 0 B, and the summary says
    the program allocated nothing there (not only "no leak on cuda:0 ... 0 B"); a CUDA program never gets
    it."""
    out = _run(tmp_path, "cpu_only.py", CPU_ONLY)
    assert out.returncode == 0, out.stderr
    said = "note: the program allocated nothing on cuda:0 (its tensors are on the CPU)"
    assert said in out.stderr, out.stderr
    leak = _run(tmp_path, "leak.py", LEAK)
    assert leak.returncode == 0, leak.stderr
    assert "allocated nothing on" not in leak.stderr, leak.stderr


SLOW_GROWTH = textwrap.dedent(
    """
    import torch; nn = torch.nn
    dev = torch.device("cuda", 0)
    body = nn.Sequential(nn.Linear(256, 128), nn.ReLU()).to(dev)
    head = nn.Linear(128, 10).to(dev)
    opt = torch.optim.AdamW([*body.parameters(), *head.parameters()])
    feats = []
    for step in range(200):
        h = body(torch.randn(64, 256, device=dev))
        loss = nn.functional.cross_entropy(head(h), torch.randint(0, 10, (64,), device=dev))
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
        feats.append(h.detach())   # 32 KiB of device memory a step, under the 256 KiB/step default
    """
)


def test_min_growth_turns_slow_device_growth_into_a_named_leak(tmp_path: Path) -> None:
    """32 KiB a step on the GPU: without a flag the verdict is growth below the threshold and names the
    option; with ``--min-growth 16KiB`` it is a leak on cuda:0 with its holder and line."""
    plain = _run(tmp_path, "slow.py", SLOW_GROWTH)
    print(plain.stderr[-3000:])
    assert plain.returncode == 0, plain.stderr
    assert "below the leak threshold" in plain.stderr and "LEAK" not in plain.stderr, plain.stderr
    assert "`torchmem run --min-growth" in plain.stderr, plain.stderr
    flagged = _run(tmp_path, "slow2.py", SLOW_GROWTH, "--min-growth", "16KiB")
    print(flagged.stderr[-3000:])
    assert flagged.returncode == 0, flagged.stderr
    assert "LEAK on cuda:0" in flagged.stderr and "__main__.feats[" in flagged.stderr, flagged.stderr
    from torchmem.capture.file import read_capture

    leak = read_capture(tmp_path / "slow2.py.jsonl").leaks[-1].report
    assert leak["leaking"] and leak["min_bytes_per_step"] == 16384, leak
    assert abs(leak["bytes_per_step"] - 32768) <= 4096, leak
    assert leak["culprits"][0]["site"] == "slow2.py:9", leak
