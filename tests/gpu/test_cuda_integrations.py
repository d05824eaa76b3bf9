"""CUDA: exact block and step peaks that leave the program's own peak counters alone, and the framework
integrations on a GPU — Lightning, the transformers Trainer, the pytest plugin, Prometheus (issue 14)."""

from __future__ import annotations

import csv
import gc
import os
import urllib.request
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import torchmem

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

MiB = 1 << 20
pytest_plugins = ["pytester"]


def _alloc(mib: int) -> torch.Tensor:
    return torch.empty(mib * MiB, dtype=torch.uint8, device="cuda")


def test_track_peaks_are_exact_and_the_programs_own_peak_counters_keep_their_meaning() -> None:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()  # the program's own reset
    base = torch.cuda.memory_allocated()
    big = _alloc(64)
    del big  # the program's peak: base + 64 MiB
    with torchmem.track("cuda", survivors=False) as outer:
        a = _alloc(8)
        with torchmem.track("cuda", survivors=False) as inner:
            b = _alloc(16)
            del b
        c = _alloc(4)
        del a, c
    assert inner.peak == base + 8 * MiB + 16 * MiB, (inner.peak, base)
    assert outer.peak == base + 24 * MiB, (outer.peak, base)
    # what the program reads is what it would read without torchmem
    assert torch.cuda.max_memory_allocated() == base + 64 * MiB
    assert torch.cuda.memory_stats()["allocated_bytes.all.peak"] == base + 64 * MiB
    assert torchmem.stats("cuda").peak_allocated == base + 64 * MiB
    # the program's reset inside a block: the program sees its new peak, the block keeps its own
    with torchmem.track("cuda", survivors=False) as t:
        x = _alloc(32)
        del x
        torch.cuda.reset_peak_memory_stats()
        y = _alloc(2)
        assert torch.cuda.max_memory_allocated() == base + 2 * MiB
        del y
    assert t.peak == base + 32 * MiB
    assert torch.cuda.max_memory_allocated() == base + 2 * MiB


def test_lightning_callback_logs_true_step_peaks_on_cuda(tmp_path: Path) -> None:
    L = pytest.importorskip("lightning")
    from lightning.pytorch.loggers import CSVLogger

    from torchmem.integrations.lightning import TorchmemCallback

    class Net(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(
                torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1)
            )
            self.kept: list[torch.Tensor] = []

        def training_step(self, batch: Any, i: int) -> torch.Tensor:
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def validation_step(self, batch: Any, i: int) -> None:
            self.kept.append(self.net[0](batch[0]))  # VAL LEAK on the GPU: 8 MiB per batch, with its graph

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters())

    def loader(n: int) -> Any:
        ds = torch.utils.data.TensorDataset(torch.randn(n * 512, 1024), torch.randn(n * 512, 1))
        return torch.utils.data.DataLoader(ds, batch_size=512)

    cb = TorchmemCallback()
    trainer = L.Trainer(
        max_epochs=2,
        accelerator="gpu",
        devices=1,
        logger=CSVLogger(str(tmp_path)),
        callbacks=[cb],
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        log_every_n_steps=1,
        num_sanity_val_steps=0,
    )
    # Earlier tests' garbage (reference cycles holding CUDA tensors) collected now, not by a collection in
    # the middle of validation: freeing hundreds of MiB there reads as noise on a 24-step loop.
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(Net(), loader(6), loader(12))
    assert cb.error is None
    assert cb.reports["validation"].leaking, str(cb.reports["validation"])
    assert not cb.reports["train"].leaking, str(cb.reports["train"])
    with (Path(trainer.logger.log_dir) / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    steps = [float(r["torchmem/step_peak"]) for r in rows if r.get("torchmem/step_peak")]
    alloc = [float(r["torchmem/allocated"]) for r in rows if r.get("torchmem/allocated")]
    assert len(steps) >= 10, rows[:3]
    # a step's peak holds the activations (512 x 4096 float32 = 8 MiB) above what stays allocated
    assert all(s >= a + 8 * MiB for s, a in zip(steps, alloc)), (steps, alloc)
    # the program's own peak counter was never taken away: it is at least every step peak
    assert torch.cuda.max_memory_allocated() >= max(steps)
    print(f"lightning cuda: {len(steps)} step peaks, {min(steps) / MiB:.1f}..{max(steps) / MiB:.1f} MiB")


def test_transformers_callback_on_cuda_adds_step_peaks_to_the_logs(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    from torchmem.integrations.transformers import TorchmemTrainerCallback

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(
                torch.nn.Linear(256, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 1)
            )

        def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
            out = self.net(x)
            return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}

    class Data(torch.utils.data.Dataset):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return 2048

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            return {"x": torch.randn(256), "labels": torch.randn(1)}

    logs: list[dict[str, Any]] = []

    class Reporter(transformers.TrainerCallback):  # type: ignore[misc]
        def on_log(self, args: Any, state: Any, control: Any, logs_: Any = None, **kw: Any) -> None:
            logs.append(dict(kw.get("logs") or logs_ or {}))

    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=16,
        per_device_train_batch_size=128,
        logging_steps=4,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
    )
    cb = TorchmemTrainerCallback()
    trainer = transformers.Trainer(model=Model(), args=args, train_dataset=Data(), callbacks=[Reporter()])
    cb.attach(trainer)
    trainer.train()
    assert cb.error is None
    got = [d for d in logs if "torchmem/step_peak" in d]
    assert got, logs
    assert all(d["torchmem/step_peak"] > d["torchmem/allocated"] for d in got), got
    print(f"transformers cuda: {len(got)} logs with a step peak")


def test_pytest_plugin_fails_a_cuda_test_that_leaves_memory(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The inner pytest runs in its own folder: where torchmem is not installed (the GPU machine runs the
    # suite with PYTHONPATH=src, a relative path), it finds torchmem through this absolute one.
    src = str(Path(__file__).resolve().parents[2] / "src")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p))
    pytester.makepyfile(
        """
        import pytest, torch
        KEPT = []

        @pytest.mark.torchmem(max_leak="1MiB", device="cuda")
        def test_leaks():
            KEPT.append(torch.empty(8 << 20, dtype=torch.uint8, device="cuda"))

        @pytest.mark.torchmem(max_peak="4MiB", device="cuda")
        def test_peaks():
            x = torch.empty(16 << 20, dtype=torch.uint8, device="cuda")
            del x

        @pytest.mark.torchmem(device="cuda")
        def test_clean():
            x = torch.ones(1024, device="cuda") * 2
            assert float(x.sum()) == 2048
        """
    )
    r = pytester.runpytest_subprocess("-p", "torchmem.integrations.pytest_plugin", "-q")
    r.assert_outcomes(passed=1, failed=2)
    out = r.stdout.str()
    assert "KEPT" in out and "peaked at" in out, out


def test_prometheus_endpoint_serves_cuda_figures() -> None:
    pytest.importorskip("prometheus_client")
    from torchmem.integrations.prometheus import serve

    keep = _alloc(8)
    server, _thread = serve(0, addr="127.0.0.1", devices=["cuda:0"])
    try:
        port = server.server_port
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    finally:
        server.shutdown()
        server.server_close()
    line = next(x for x in body.splitlines() if x.startswith("torchmem_allocated_bytes{"))
    assert "cuda:0" in line and float(line.rsplit(" ", 1)[1]) >= 8 * MiB, line
    del keep
