"""TorchmemTrainerCallback on a real transformers Trainer (CPU, tiny model): a training leak is named, the
figures land in the Trainer's logs, a clean run stays quiet, an error inside the callback never stops it."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import torch

if TYPE_CHECKING:
    from torchmem.integrations.transformers import TorchmemTrainerCallback

# transformers is imported when this module's first test runs, not when the suite is collected: its objects
# would weigh on every garbage collection of every later test. tests/conftest.py runs this module last.
transformers: Any = None
Reporter: Any = None


@pytest.fixture(scope="module", autouse=True)
def _transformers() -> None:
    global transformers, Reporter, TorchmemTrainerCallback
    transformers = pytest.importorskip("transformers")
    from torchmem.integrations.transformers import TorchmemTrainerCallback

    Reporter = _reporter_class()


class TinyModel(torch.nn.Module):
    def __init__(self, keep: bool) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1))
        self.keep = keep
        self.kept: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        h = self.net[1](self.net[0](x))
        if self.keep and self.training:
            self.kept.append(h.repeat(4, 1))  # TRAIN LEAK: 1 MiB per step with its graph
        out = self.net[2](h)
        loss = torch.nn.functional.mse_loss(out, labels) if labels is not None else out.sum()
        return {"loss": loss, "logits": out}


class Data(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(n, 64, generator=g), torch.randn(n, 1, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i], "labels": self.y[i]}


def _reporter_class() -> Any:
    class Reporter(transformers.TrainerCallback):  # type: ignore[misc]
        """What a reporting callback (TensorBoard, W&B) receives in each log."""

        def __init__(self) -> None:
            self.logs: list[dict[str, Any]] = []

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
            self.logs.append(dict(logs or {}))

    return Reporter


def _train(tmp_path: Path, keep: bool, cb: TorchmemTrainerCallback, reporter: Any = None) -> Any:
    torch.manual_seed(0)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path),
        # 72 steps: a heap reading late in a long suite (a big, fragmented heap) can cost 0.3-0.7 ms, read
        # every 8-11 steps then, and the verdict needs 5 readings after the warm-up.
        max_steps=72,
        per_device_train_batch_size=128,
        logging_steps=4,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = transformers.Trainer(
            model=TinyModel(keep),
            args=args,
            train_dataset=Data(4096),
            callbacks=[reporter] if reporter else None,
        )
        cb.attach(trainer)
        trainer.train()
    return trainer


def test_a_training_leak_is_named_and_figures_are_in_the_logs(tmp_path: Path, capsys: Any) -> None:
    cb, reporter = TorchmemTrainerCallback(), Reporter()
    trainer = _train(tmp_path, keep=True, cb=cb, reporter=reporter)
    rep = cb.reports["train"]
    assert rep.leaking and rep.culprits, str(rep)
    assert "kept" in str(rep.culprits[0].holder), str(rep)
    assert trainer.callback_handler.callbacks[0] is cb
    logged = [h for h in reporter.logs if "torchmem/heap" in h]
    assert len(logged) >= 6 and all(h["torchmem/host_rss"] > 0 for h in logged)
    assert "torchmem [train loop]: LEAK" in capsys.readouterr().err
    assert cb.error is None


def test_a_clean_run_stays_quiet(tmp_path: Path) -> None:
    cb = TorchmemTrainerCallback()
    _train(tmp_path, keep=False, cb=cb)
    assert not cb.reports["train"].leaking, str(cb.reports["train"])


def test_an_error_inside_the_callback_switches_it_off_and_training_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torchmem.integrations.transformers as mod

    def broken(device: torch.device, peaks: Any = None) -> dict[str, float]:
        raise RuntimeError("figures broke")

    monkeypatch.setattr(mod, "figures", broken)
    cb = TorchmemTrainerCallback()
    trainer = _train(tmp_path, keep=False, cb=cb)
    assert trainer.state.global_step == 72
    assert cb.error is not None and "figures broke" in cb.error


def test_release_of_a_trained_trainer_frees_model_and_optimizer(tmp_path: Path) -> None:
    import torchmem

    with torchmem.cpu_tracking() as cpu:
        start = cpu.allocated
        trainer = _train(tmp_path, keep=False, cb=TorchmemTrainerCallback(summary=False))
        assert cpu.allocated - start > 64 * 512 * 4
        report = torchmem.release(trainer)
        assert not any(a.startswith("error") for a in report.actions), str(report)
        # everything the trainer holds on the released device goes: on the CPU its dataset's tensors too
        assert cpu.allocated - start < 64 * 1024, str(report)
