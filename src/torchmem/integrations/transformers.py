"""Hugging Face Transformers: :class:`TorchmemTrainerCallback`, the leak watch on the Trainer's training and
evaluation steps and the memory figures in the Trainer's own logs.

Example::

    from transformers import Trainer
    from torchmem.integrations.transformers import TorchmemTrainerCallback

    mem = TorchmemTrainerCallback()
    trainer = Trainer(model=model, args=args, train_dataset=train, eval_dataset=val)
    mem.attach(trainer)       # first among the callbacks: the figures reach TensorBoard/W&B/... in each log
    trainer.train()
    mem.reports["train"], mem.reports["eval"]   # the leak verdicts, with site, holder and fix

The figures (``torchmem/allocated``, ``torchmem/reserved``, ``torchmem/peak_allocated``,
``torchmem/host_rss``; on the CPU ``torchmem/heap``) are added to every ``logs`` dict the Trainer hands its
reporting callbacks. ``Trainer(callbacks=[mem])`` works too, but the reporting callbacks then see each log
before this one adds to it.

Needs ``transformers`` >= 4.40: ``pip install 'torchmem[transformers]'``. Tested with transformers 5.23 on the
CPU.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from torchmem.integrations._loops import Guard, LoopWatch, StepPeaks, figures, print_summary, stop_all

try:
    from transformers import TrainerCallback as _TrainerCallback
except ImportError as exc:  # pragma: no cover - needs the extra
    raise ImportError(
        "torchmem's Trainer callback needs transformers: pip install 'torchmem[transformers]' "
        "(or pip install transformers)"
    ) from exc


class TorchmemTrainerCallback(_TrainerCallback):  # type: ignore[misc]
    """Watch the Trainer's training steps and evaluation steps for leaks; add memory figures to its logs.

    Args:
        warmup: Steps of each loop the leak detector ignores.
        min_bytes_per_step: The smallest growth per step reported as a leak.
        summary: Print the verdicts on stderr at the end of training (main process only).

    Attributes:
        reports: ``{"train": LeakReport, "eval": LeakReport}`` once training ended (``"eval"`` when an
            evaluation ran).
        error: The integration's own error, if it switched itself off.
    """

    def __init__(
        self, *, warmup: int = 3, min_bytes_per_step: int = 256 * 1024, summary: bool = True
    ) -> None:
        self.warmup = warmup
        self.min_bytes_per_step = min_bytes_per_step
        self.summary = summary
        self.reports: dict[str, Any] = {}
        self._guard = Guard("the Trainer callback")
        self._loops: dict[str, LoopWatch] = {}
        self._device: torch.device | None = None
        self._peaks: StepPeaks | None = None

    @property
    def error(self) -> str | None:
        return self._guard.error

    def attach(self, trainer: Any) -> TorchmemTrainerCallback:
        """Put this callback first among ``trainer``'s callbacks (so the figures it adds to each log reach
        the reporting callbacks); returns ``self``."""
        handler = trainer.callback_handler
        handler.callbacks = [self, *(c for c in handler.callbacks if c is not self)]
        return self

    def _loop(self, name: str) -> LoopWatch | None:
        if self._device is None:
            return None
        w = self._loops.get(name)
        if w is None:
            w = self._loops[name] = LoopWatch(name, self._device, self.warmup, self.min_bytes_per_step)
        return w

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        def work() -> None:
            p = next(model.parameters(), None) if model is not None else None
            self._device = p.device if p is not None else torch.device(getattr(args, "device", "cpu"))

        self._guard.run("on_train_begin", work)

    def _step(self, name: str) -> None:
        w = self._loop(name)
        if w is not None:
            w.step()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        def work() -> None:
            self._step("train")
            if self._device is not None:
                if self._peaks is None:
                    self._peaks = StepPeaks(self._device)
                self._peaks.lap()

        self._guard.run("on_step_end", work)

    def on_prediction_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._guard.run("on_prediction_step", lambda: self._step("eval"))

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        def work() -> None:
            if isinstance(logs, dict) and self._device is not None:
                logs.update({f"torchmem/{k}": v for k, v in figures(self._device, self._peaks).items()})

        self._guard.run("on_log", work)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        loops, self._loops = self._loops, {}
        peaks, self._peaks = self._peaks, None
        if peaks is not None:
            self._guard.run("closing the step peaks", peaks.close)
        stop_all(loops, self.reports, self._guard)
        if self.summary and getattr(state, "is_world_process_zero", True) and not self._guard.off:
            self._guard.run("the summary", lambda: print_summary(self.reports))
        sys.stderr.flush()


__all__ = ["TorchmemTrainerCallback"]
