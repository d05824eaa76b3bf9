"""``torchmem.find_batch_size()``: the largest batch size whose step fits, found by modelling its peak.

A step's peak memory is close to linear in the batch size: ``peak(bs) = a + b * bs`` (weights, gradients
and optimizer state are the constant, activations and temporaries the slope). The search measures the
peak of a few real trials, fits lines through the measured points nearest the boundary, predicts the
largest size whose peak stays within the device's capacity (its free memory, or the :func:`torchmem.limit`
in force) minus a safety margin, and verifies the prediction with a real trial. On CUDA two figures are
measured: the caching allocator's reserved peak (what the cap applies to) and the allocated peak (what
the step's tensors need, a hard lower bound: no size whose allocated peak passes the cap can run). With
``margin=0`` they give a band for the largest size that runs; the search aims just under its top and
stops when the largest size that ran is within the tolerance of it. A prediction that fails is refined
from the new point (regula falsi when the failed trial's peak is known, a small step down or the careful
end of the band after an out-of-memory error, then bisection between the largest size known to fit and
the smallest known not to). A trial is a warm-up when it leaves live tensors behind (optimizer state),
measured on allocated bytes — never on reserved ones, which keep the step's freed segments cached.
Memory is released between trials, and an out-of-memory error's frames are cleared so that its tensors
do not stay pinned.

Under ``torch.distributed`` every rank takes the same path: each trial's outcome and each next size are
agreed with ``all_reduce(MIN)``, so all ranks return the same batch size.

Modules, one idea each: ``model`` (the boundary model: sizes, peaks and outcomes in, next size out; pure),
``trials`` (runs and measures one trial, catches and frees its OOM), ``ranks`` (agreement across ranks),
``search`` (the loop tying them together), ``api`` (:func:`find_batch_size` and its decorator form),
``errors``. The result types (:class:`BatchSizeResult`, :class:`Trial`) live in
:mod:`torchmem.results.fit`. Importing this package imports torch but runs nothing.
"""

from __future__ import annotations

from torchmem.actions.batch_size.api import find_batch_size
from torchmem.actions.batch_size.errors import BatchSizeError, DistributedTrialError
from torchmem.actions.batch_size.trials import is_oom
from torchmem.analysis.estimate import FitArgumentError
from torchmem.results.fit import BatchSizeResult, Trial

__all__ = [
    "BatchSizeError",
    "BatchSizeResult",
    "DistributedTrialError",
    "FitArgumentError",
    "Trial",
    "find_batch_size",
    "is_oom",
]
