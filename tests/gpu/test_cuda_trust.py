"""Issue 10 on a real GPU: ``torchmem run`` of a CUDA script prints the traceback python prints and never
clobbers files; an impossible CUDA request is "too_large" alone; estimate()'s activations are the bytes saved
for backward; a LeakWarning points at the user's line."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch

import torchmem

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

SRC = str(Path(__file__).resolve().parents[2] / "src")
ENV = dict(os.environ, PYTHONPATH=SRC)


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, env=ENV, cwd=cwd, check=False)


def test_cuda_error_traceback_is_pythons_and_outputs_are_safe(tmp_path: Path) -> None:
    script = tmp_path / "cu.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys, torch
            m = torch.nn.Linear(64, 64).cuda(); o = torch.optim.SGD(m.parameters(), lr=0.1)
            for _ in range(3):
                m(torch.ones(8, 64, device="cuda")).sum().backward(); o.step(); o.zero_grad()
            print("args", sys.argv[1:])
            a = torch.ones(3, 4, device="cuda")
            def f():
                return a @ torch.ones(5, 6, device="cuda")
            f()
            """
        )
    )
    want = _run([sys.executable, "cu.py", "--lr", "1"], tmp_path)
    got = _run([sys.executable, "-m", "torchmem", "run", "-q", "cu.py", "--lr", "1"], tmp_path)
    assert got.returncode == want.returncode == 1
    assert got.stdout == want.stdout == "args ['--lr', '1']\n"
    assert got.stderr == want.stderr
    caps = list(tmp_path.glob("torchmem-cu-*.jsonl"))
    assert len(caps) == 1
    clobber = _run([sys.executable, "-m", "torchmem", "run", "-q", "-o", "cu.py", "cu.py"], tmp_path)
    assert clobber.returncode == 3 and "is the program being run" in clobber.stderr
    assert "def f()" in script.read_text()


def test_impossible_cuda_request_is_too_large_alone() -> None:
    try:
        torch.empty(10**13, device="cuda")
    except torch.OutOfMemoryError as e:
        d = torchmem.explain_oom(e)
        e = None  # type: ignore[assignment]
    else:  # pragma: no cover
        pytest.fail("a 40 TB request did not run out of memory")
    assert [c.kind for c in d.causes] == ["too_large"]


def test_estimate_activations_are_the_bytes_saved_for_backward() -> None:
    dev = torch.device("cuda", 0)
    model = torch.nn.Sequential(
        torch.nn.Linear(512, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 512), torch.nn.GELU()
    ).to(dev)

    def make(bs: int) -> torch.Tensor:
        return torch.randn(bs, 512, device=dev)

    est = torchmem.estimate(
        model, make(32), optimizer="adamw", batch_sizes=[32, 64], loss_fn=lambda y: y.square().mean()
    )
    rows = {r.batch_size: r for r in est.rows if r.mode == "training"}
    saved = {}
    for bs in (32, 64):
        x = make(bs)
        seen: dict[int, int] = {}

        def pack(t: torch.Tensor, seen: dict[int, int] = seen) -> torch.Tensor:
            st = t.untyped_storage()
            if not any(st.data_ptr() == p.untyped_storage().data_ptr() for p in model.parameters()):
                seen[st.data_ptr()] = st.nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            y = model(x).square().mean()
        saved[bs] = sum(seen.values())
        del y
    print("estimate activations", {b: rows[b].activations for b in rows}, "saved", saved)
    for bs in (32, 64):
        assert rows[bs].activations == saved[bs]
    assert rows[64].activations > rows[32].activations


def test_leak_warning_points_at_the_users_line() -> None:
    dev = torch.device("cuda", 0)
    kept = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in torchmem.watch(range(20), device=dev):
            kept.append(torch.ones(1 << 20, device=dev))  # 4 MiB/step
    leaks = [w for w in caught if issubclass(w.category, torchmem.LeakWarning)]
    assert leaks, [str(w.message) for w in caught]
    assert leaks[0].filename == __file__
    del kept
