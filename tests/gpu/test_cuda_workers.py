"""CUDA: DataLoader workers that create CUDA contexts, a Dataset holding CUDA tensors, and a growing pinned
host cache are each warned about once, with the fix — by the checks directly and under `torchmem run`
(issues 13 and 15)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from torchmem.capture import workers as wk
from torchmem.capture.workers import WorkerChecks

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

MiB = 1 << 20
SRC = str(Path(__file__).resolve().parents[2] / "src")


class OnGpu(Dataset[torch.Tensor]):
    def __init__(self) -> None:
        self.data = torch.randn(64, 1024, device="cuda")

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.data[i].cpu()


def test_a_dataset_with_cuda_tensors_and_the_workers_contexts_are_named() -> None:
    said: list[tuple[str, str]] = []
    checks = WorkerChecks(torch.device("cuda:0"), lambda code, text: said.append((code, text)))
    checks.install()
    try:
        loader = DataLoader(OnGpu(), batch_size=8, num_workers=2, multiprocessing_context="spawn")
        it = iter(loader)
        next(it)  # the workers have opened the dataset's CUDA tensors: each has a context now
        checks.poll(now=10.0)
        del it
    finally:
        checks.uninstall()
    codes = [c for c, _ in said]
    assert "dataset-cuda" in codes and "worker-context" in codes, said
    text = dict(said)
    assert "dataset.data" in text["dataset-cuda"] and "own CUDA context" in text["dataset-cuda"]
    assert "created a CUDA context" in text["worker-context"] and "DataLoader" in text["worker-context"]
    print(text["worker-context"])


def test_a_growing_pinned_cache_is_named() -> None:
    said: list[tuple[str, str]] = []
    checks = WorkerChecks(torch.device("cuda:0"), lambda code, text: said.append((code, text)))
    torch.cuda.init()
    # Earlier tests of the session leave pinned blocks cached (60 MiB seen): the small sizes below would
    # reuse them and the series would start flat. torch's host cache is emptied first.
    empty = getattr(torch._C, "_host_emptyCache", None)
    if empty is not None:
        empty()
    for i in range(7):  # pinned buffers of growing sizes (4 MiB .. 256 MiB), each freed after use
        buf = torch.empty((4 << i) * MiB, dtype=torch.uint8).pin_memory()
        del buf
        checks.poll(now=100.0 + i * wk.POLL_S)
    codes = [c for c, _ in said]
    from torchmem.devices import backend

    assert codes == ["pinned-growth"], (said, checks._pinned, backend("cuda:0").pinned_host_figures())


def test_torchmem_run_warns_once_when_a_worker_creates_a_cuda_context(tmp_path: Path) -> None:
    prog = tmp_path / "prog.py"
    prog.write_text(
        textwrap.dedent(
            """
            import time, torch
            from torch.utils.data import DataLoader, Dataset

            class Moves(Dataset):
                def __len__(self):
                    return 400
                def __getitem__(self, i):
                    return torch.ones(4, device="cuda").sum().item()  # CUDA in a worker

            if __name__ == "__main__":
                model = torch.nn.Linear(4, 4).cuda()
                opt = torch.optim.SGD(model.parameters(), lr=0.1)
                for x in DataLoader(Moves(), batch_size=4, num_workers=2, multiprocessing_context="spawn"):
                    model(torch.ones(4, 4, device="cuda")).sum().backward()
                    opt.step()
                    time.sleep(0.05)
            """
        )
    )
    env = dict(os.environ, PYTHONPATH=SRC)
    r = subprocess.run(
        [sys.executable, "-m", "torchmem", "run", "--no-status", "-o", str(tmp_path / "c.jsonl"), str(prog)],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stderr.count("created a CUDA context") == 1, r.stderr[-3000:]
    print(r.stderr[-2000:])
