"""The DataLoader worker checks (capture/workers.py) on real DataLoaders with real worker processes (CPU):
copy-on-read growth of a worker's own memory, workers that outlive their iterator, the start method, and the
wrapper's life under torchmem.watch()."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import torchmem
from torchmem.capture import workers as wk
from torchmem.capture.workers import WorkerChecks, cuda_tensors_in, start_method

linux_fork = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the worker checks read /proc; fork is Linux's default"
)


class PyObjects(Dataset[int]):
    """The classic "DataLoader workers leak RAM" dataset: a big list of Python objects."""

    def __init__(self, n: int) -> None:
        self.items = [str(i) * 4 for i in range(n)]

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> int:
        # touching each object writes its reference count: the worker copies every page it reads
        step = len(self.items) // 64
        return sum(len(s) for s in self.items[i * step : (i + 1) * step])


class Stuck(Dataset[int]):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> int:
        if i > 0:
            time.sleep(60)  # a worker that never returns from the Dataset's code
        return i


def _ignore_term(_worker_id: int) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _checks() -> tuple[WorkerChecks, list[tuple[str, str]]]:
    said: list[tuple[str, str]] = []
    checks = WorkerChecks(torch.device("cpu"), lambda code, text: said.append((code, text)))
    checks.install()
    return checks, said


def test_the_start_method_and_a_dataset_without_cuda_tensors() -> None:
    ds = torch.utils.data.TensorDataset(torch.zeros(4, 2), torch.zeros(4))
    assert cuda_tensors_in(ds) == []  # CPU tensors are fine
    loader = DataLoader(ds, num_workers=2, multiprocessing_context="spawn")
    assert start_method(loader) == "spawn"
    import multiprocessing

    default = multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0]
    assert start_method(DataLoader(ds, num_workers=2)) == default


@linux_fork
def test_a_workers_copy_on_read_growth_is_named_once_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wk, "WORKER_GROWTH", 24 << 20)
    checks, said = _checks()
    try:
        loader = DataLoader(
            PyObjects(1_500_000), num_workers=1, multiprocessing_context="fork", prefetch_factor=1
        )
        t = 1000.0
        it = iter(loader)
        checks.poll(now=t)  # the first reading of the worker's own memory
        for n, _ in enumerate(it):
            if n % 8 == 7:
                t += wk.USS_POLL_S
                checks.poll(now=t)
        t += wk.USS_POLL_S
        del it
    finally:
        checks.uninstall()
    texts = [text for code, text in said if code == "worker-rss"]
    assert len(texts) == 1, said
    assert "copy-on-read" in texts[0] and "NumPy arrays or tensors" in texts[0] and "PyObjects" in texts[0]


@linux_fork
def test_a_clean_loader_gives_no_warning() -> None:
    checks, said = _checks()
    try:
        ds = torch.utils.data.TensorDataset(torch.randn(256, 8))
        t = 0.0
        for _ in range(2):
            for _b in DataLoader(ds, batch_size=16, num_workers=2, multiprocessing_context="fork"):
                t += wk.USS_POLL_S
                checks.poll(now=t)
    finally:
        checks.uninstall()
    assert said == []


@linux_fork
def test_workers_that_outlive_their_iterator_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.utils.data._utils as du

    monkeypatch.setattr(du, "MP_STATUS_CHECK_INTERVAL", 0.3)  # the iterator's join timeout at shutdown
    checks, said = _checks()
    pids: list[int] = []
    try:
        loader = DataLoader(
            Stuck(), num_workers=1, worker_init_fn=_ignore_term, multiprocessing_context="fork"
        )
        it = iter(loader)
        assert next(it) == torch.tensor([0])
        pids = [w.pid for w in it._workers]  # type: ignore[attr-defined]
        it._shutdown_workers()  # type: ignore[attr-defined]  # what `del it` does: join, then SIGTERM (ignored)
        checks.poll(now=100.0)
        checks.poll(now=100.0 + wk.OUTLIVE_S + 1)
        del it
    finally:
        checks.uninstall()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    texts = [text for code, text in said if code == "outlived"]
    assert len(texts) == 1 and str(pids[0]) in texts[0] and "Stuck" in texts[0], said


def test_a_user_watcher_wraps_dataloader_iteration_only_while_it_runs() -> None:
    original = DataLoader.__iter__
    ds = torch.utils.data.TensorDataset(torch.randn(8, 2))
    with torchmem.watch(device="cpu", warmup=0) as w:
        assert getattr(DataLoader.__iter__, "_torchmem", False)
        for _ in DataLoader(ds, batch_size=4):
            w.step()
    assert DataLoader.__iter__ is original
