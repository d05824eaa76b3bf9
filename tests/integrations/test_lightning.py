"""TorchmemCallback on a real Lightning Trainer (CPU, tiny model): the validation loop's leak is named,
memory figures reach the logger, a clean run stays quiet, an error inside the callback never stops fit."""

from __future__ import annotations

import csv
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import torch

if TYPE_CHECKING:
    from torchmem.integrations.lightning import TorchmemCallback

# Lightning is imported when this module's first test runs, not when the suite is collected: it adds ~110k
# objects to the session, which every garbage collection of every later test walks (the suite's holder
# searches and trial clean-ups collect often). tests/conftest.py runs this module last.
L: Any = None
CSVLogger: Any = None
Tiny: Any = None


@pytest.fixture(scope="module", autouse=True)
def _lightning() -> None:
    global L, CSVLogger, Tiny, TorchmemCallback
    L = pytest.importorskip("lightning")
    from lightning.pytorch.loggers import CSVLogger

    from torchmem.integrations.lightning import TorchmemCallback

    Tiny = _tiny_class()


def _tiny_class() -> Any:
    class Tiny(L.LightningModule):  # type: ignore[misc]
        def __init__(self, keep_val: bool) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
            self.keep_val = keep_val
            self.val_outputs: list[torch.Tensor] = []

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            x, _ = batch
            out = self.net(x).repeat(1, 512)  # 1 MiB per batch (512 x 512 float32)
            if self.keep_val:
                self.val_outputs.append(out)  # VAL LEAK: never cleared

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    return Tiny


def _loader(n: int) -> torch.utils.data.DataLoader[Any]:
    g = torch.Generator().manual_seed(0)
    ds = torch.utils.data.TensorDataset(
        torch.randn(n * 512, 64, generator=g), torch.randn(n * 512, 1, generator=g)
    )
    return torch.utils.data.DataLoader(ds, batch_size=512)


def _fit(tmp_path: Path, keep_val: bool, cb: TorchmemCallback) -> Any:
    torch.manual_seed(0)
    trainer = L.Trainer(
        max_epochs=2,
        accelerator="cpu",
        logger=CSVLogger(str(tmp_path)),
        callbacks=[cb],
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        log_every_n_steps=1,
        num_sanity_val_steps=0,
    )
    model = Tiny(keep_val)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's advice (num_workers, ...), not ours
        # 48 validation batches an epoch: a heap reading late in a long suite (a big, fragmented heap) can
        # cost 0.3-0.7 ms, read every 8-11 steps then, and the verdict needs 5 readings after the warm-up.
        trainer.fit(model, _loader(6), _loader(48))
    return trainer


def test_a_validation_leak_is_named_and_figures_reach_the_logger(tmp_path: Path, capsys: Any) -> None:
    cb = TorchmemCallback()
    trainer = _fit(tmp_path, keep_val=True, cb=cb)
    val = cb.reports["validation"]
    assert val.leaking, str(val)
    assert val.culprits and "val_outputs" in str(val.culprits[0].holder), str(val)
    assert not cb.reports["train"].leaking, str(cb.reports["train"])
    err = capsys.readouterr().err
    assert "torchmem [validation loop]: LEAK" in err and "val_outputs" in err
    metrics = Path(trainer.logger.log_dir) / "metrics.csv"
    with metrics.open() as f:
        rows = list(csv.DictReader(f))
    heap = [float(r["torchmem/heap"]) for r in rows if r.get("torchmem/heap")]
    rss = [float(r["torchmem/host_rss"]) for r in rows if r.get("torchmem/host_rss")]
    assert len(heap) == 12 and len(rss) == 12 and min(heap) > 0 and min(rss) > 0  # one per training batch
    assert cb.error is None


def test_a_clean_run_stays_quiet(tmp_path: Path, capsys: Any) -> None:
    cb = TorchmemCallback()
    _fit(tmp_path, keep_val=False, cb=cb)
    assert not cb.reports["validation"].leaking and not cb.reports["train"].leaking
    assert "LEAK" not in capsys.readouterr().err


def test_an_error_inside_the_callback_is_reported_once_and_fit_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    import torchmem.integrations.lightning as mod

    calls = [0]

    def broken(device: torch.device, peaks: Any = None) -> dict[str, float]:
        calls[0] += 1
        raise RuntimeError("figures broke")

    monkeypatch.setattr(mod, "figures", broken)
    cb = TorchmemCallback()
    with caplog.at_level("WARNING", logger="torchmem"):
        trainer = _fit(tmp_path, keep_val=False, cb=cb)
    assert trainer.state.finished and trainer.current_epoch == 2
    assert calls[0] == 1  # off after the first error
    assert cb.error is not None and "figures broke" in cb.error
    assert sum("figures broke" in r.getMessage() for r in caplog.records) == 1


def test_release_of_a_fitted_trainer_frees_model_optimizer_and_state(tmp_path: Path) -> None:
    import torchmem

    with torchmem.cpu_tracking() as cpu:
        start = cpu.allocated
        trainer = _fit(tmp_path, keep_val=False, cb=TorchmemCallback(summary=False))
        assert cpu.allocated - start > 2 * 64 * 256 * 4  # parameters, gradients, optimizer state
        report = torchmem.release(
            trainer
        )  # the trainer holds its strategy, module, optimizers (some via weak proxies)
        assert not any(a.startswith("error") for a in report.actions), str(report)
        assert cpu.allocated == start, str(report)
