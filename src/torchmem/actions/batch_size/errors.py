"""The errors the batch-size search raises: no size fits (:class:`BatchSizeError`), or another rank failed
(:class:`DistributedTrialError`). Plain exception classes; raising one costs nothing beyond its fields."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchmem._errors import TorchmemError
from torchmem.results.fit import Trial

if TYPE_CHECKING:
    from torchmem.analysis.oom import OOMDiagnosis


class BatchSizeError(TorchmemError):
    """No batch size fits: even the smallest one tried ran out of memory.

    Attributes:
        batch_size: The smallest size tried (1 unless ``min_size`` says otherwise).
        diagnosis: The :class:`~torchmem.OOMDiagnosis` of that out-of-memory error
            (:func:`torchmem.explain_oom`), or ``None`` where torchmem could not build one.
        trials: The trials that were run.
    """

    def __init__(
        self,
        message: str,
        hint: str,
        *,
        batch_size: int,
        diagnosis: OOMDiagnosis | None,
        trials: tuple[Trial, ...],
    ) -> None:
        super().__init__(message, hint)
        self.batch_size = batch_size
        self.diagnosis = diagnosis
        self.trials = trials


class DistributedTrialError(TorchmemError):
    """Another rank's trial raised an error that is not an out-of-memory error (that rank re-raises it)."""


__all__ = ["BatchSizeError", "DistributedTrialError"]
