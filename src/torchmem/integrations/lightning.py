"""Lightning: :class:`TorchmemCallback`, the leak watch, per-step memory figures and the OOM diagnosis through
Lightning's own extension point.

Example::

    import lightning as L
    from torchmem.integrations.lightning import TorchmemCallback

    mem = TorchmemCallback()
    trainer = L.Trainer(max_epochs=3, callbacks=[mem])
    trainer.fit(model, train_loader, val_loader)
    mem.reports["validation"].leaking      # the validation loop's leak verdict (validation_step keeps
                                           # tensors?), with site, holder and fix
    # metrics torchmem/allocated, torchmem/reserved, torchmem/peak_allocated, torchmem/host_rss (CUDA),
    # torchmem/heap and torchmem/host_rss (CPU) land in the trainer's logger (TensorBoard, CSV, W&B...)

Needs ``lightning`` (or ``pytorch_lightning``) >= 2.0: ``pip install 'torchmem[lightning]'``. Tested with
lightning 2.6 on the CPU.
"""

from __future__ import annotations

import sys
from typing import Any

from torchmem.integrations._loops import (
    Guard,
    LoopWatch,
    StepPeaks,
    figures,
    oom_text,
    print_summary,
    stop_all,
)

try:
    from lightning.pytorch.callbacks import Callback as _Callback
except ImportError:  # pragma: no cover - the standalone package
    try:
        from pytorch_lightning.callbacks import Callback as _Callback  # type: ignore[no-redef,assignment]
    except ImportError as exc:
        raise ImportError(
            "torchmem's Lightning callback needs Lightning: pip install 'torchmem[lightning]' "
            "(or pip install lightning)"
        ) from exc


class TorchmemCallback(_Callback):  # type: ignore[misc]
    """Watch the training and validation loops for leaks, log memory figures, diagnose an OOM.

    Args:
        log_every_n_steps: Log the figures every this many training batches (0: never).
        watch_validation: Also watch the validation batches (a ``validation_step`` that keeps tensors is
            where many leaks live).
        warmup: Batches of each loop the leak detector ignores.
        min_bytes_per_step: The smallest growth per batch reported as a leak.
        summary: Print the verdicts on stderr at the end of ``fit`` (rank zero only).

    Attributes:
        reports: ``{"train": LeakReport, "validation": LeakReport}`` once ``fit`` ended.
        oom: The diagnosis text of an out-of-memory error that ended the run, if any.
        error: The integration's own error, if it switched itself off.
    """

    def __init__(
        self,
        *,
        log_every_n_steps: int = 1,
        watch_validation: bool = True,
        warmup: int = 3,
        min_bytes_per_step: int = 256 * 1024,
        summary: bool = True,
    ) -> None:
        super().__init__()
        self.log_every_n_steps = log_every_n_steps
        self.watch_validation = watch_validation
        self.warmup = warmup
        self.min_bytes_per_step = min_bytes_per_step
        self.summary = summary
        self.reports: dict[str, Any] = {}
        self.oom: str | None = None
        self._guard = Guard("the Lightning callback")
        self._loops: dict[str, LoopWatch] = {}
        self._batches = 0
        self._peaks: StepPeaks | None = None

    @property
    def error(self) -> str | None:
        return self._guard.error

    def _loop(self, name: str, pl_module: Any) -> LoopWatch:
        w = self._loops.get(name)
        if w is None:
            w = self._loops[name] = LoopWatch(name, pl_module.device, self.warmup, self.min_bytes_per_step)
        return w

    # -- training ---------------------------------------------------------------------------------
    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        def work() -> None:
            self._loop("train", pl_module).step()
            if self._peaks is None:
                self._peaks = StepPeaks(pl_module.device)
            self._peaks.lap()
            self._batches += 1
            n = self.log_every_n_steps
            if n and self._batches % n == 0:
                values = {f"torchmem/{k}": v for k, v in figures(pl_module.device, self._peaks).items()}
                pl_module.log_dict(values, on_step=True, on_epoch=False, logger=True, prog_bar=False)

        self._guard.run("on_train_batch_end", work)

    # -- validation -------------------------------------------------------------------------------
    def on_validation_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        if not self.watch_validation or getattr(trainer, "sanity_checking", False):
            return
        self._guard.run("on_validation_batch_end", lambda: self._loop("validation", pl_module).step())

    # -- the end ----------------------------------------------------------------------------------
    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        def work() -> None:
            text = oom_text(exception)
            if text is not None:
                self.oom = text
                if trainer.is_global_zero:
                    print(f"torchmem: the run ran out of memory:\n{text}", file=sys.stderr)

        self._guard.run("on_exception", work)
        self._finish(trainer)

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self._finish(trainer)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._finish(trainer, quiet=True)

    def _finish(self, trainer: Any, quiet: bool = False) -> None:
        if not self._loops:
            return
        loops, self._loops = self._loops, {}
        peaks, self._peaks = self._peaks, None
        if peaks is not None:
            self._guard.run("closing the step peaks", peaks.close)
        stop_all(loops, self.reports, self._guard)
        if self.summary and not quiet and trainer.is_global_zero and not self._guard.off:
            self._guard.run("the summary", lambda: print_summary(self.reports))


__all__ = ["TorchmemCallback"]
