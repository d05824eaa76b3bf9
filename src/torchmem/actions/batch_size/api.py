"""The entry point of the batch-size search: :func:`find_batch_size`, in its function and decorator forms.

The function form checks its arguments and runs one search (:func:`~torchmem.actions.batch_size.search.
run_search`). The decorator form (accelerate's ``find_executable_batch_size`` spelling) runs the wrapped
function at ``starting_batch_size``, and only when that runs out of memory searches below it with probes:
calls stopped after a few optimizer steps. Costs what the search costs; a decorated function that fits at
once costs one call and one ``inspect.signature`` at decoration.
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, overload

from torchmem._exceptions import clear_exception_frames
from torchmem.actions.batch_size.errors import BatchSizeError
from torchmem.actions.batch_size.ranks import RankAgreement
from torchmem.actions.batch_size.search import run_search
from torchmem.actions.batch_size.trials import diagnose_oom, is_oom, release_memory, run_probe
from torchmem.analysis.estimate import FitArgumentError
from torchmem.devices import DeviceLike, resolve
from torchmem.results.fit import BatchSizeResult, Trial

if TYPE_CHECKING:
    from torchmem.analysis.oom import OOMDiagnosis

R = TypeVar("R")


def _check_size(name: str, v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise FitArgumentError(f"{name} must be a positive int, got {v!r}.", f"Pass e.g. {name}=8.")
    return v


@overload
def find_batch_size(
    fn: Callable[[int], Any],
    *,
    start: int = ...,
    max_size: int = ...,
    margin: float = ...,
    device: DeviceLike = ...,
    distributed: bool | None = ...,
    capacity: int | None = ...,
    max_trials: int = ...,
    tolerance: float = ...,
    min_size: int = ...,
) -> BatchSizeResult: ...


@overload
def find_batch_size(
    fn: None = ...,
    *,
    starting_batch_size: int,
    margin: float = ...,
    device: DeviceLike = ...,
    distributed: bool | None = ...,
    max_trials: int = ...,
    tolerance: float = ...,
    probe_steps: int | None = ...,
) -> Callable[[Callable[..., R]], Callable[..., R]]: ...


@overload
def find_batch_size(
    fn: Callable[..., R],
    *,
    starting_batch_size: int,
    margin: float = ...,
    device: DeviceLike = ...,
    distributed: bool | None = ...,
    max_trials: int = ...,
    tolerance: float = ...,
    probe_steps: int | None = ...,
) -> Callable[..., R]: ...


def find_batch_size(
    fn: Callable[..., Any] | None = None,
    *,
    start: int = 8,
    max_size: int = 1 << 16,
    margin: float = 0.1,
    device: DeviceLike = None,
    distributed: bool | None = None,
    capacity: int | None = None,
    max_trials: int = 12,
    tolerance: float = 0.02,
    min_size: int = 1,
    starting_batch_size: int | None = None,
    probe_steps: int | None = 2,
) -> Any:
    """Find the largest batch size whose step runs without running out of memory, with a safety margin.

    **Function form** — ``find_batch_size(step)`` calls ``step(batch_size)`` (one training step; search
    an evaluation step separately, it fits far more) a few times and returns a :class:`BatchSizeResult`:

    1. the first trial runs at ``start`` (halved on out-of-memory until one fits);
    2. the peak of each trial (CUDA: the caching allocator's reserved peak and its allocated peak,
       measured like :func:`torchmem.track`, exact and leaving the program's peak counters alone; CPU: the
       exact ledger's watermark) fits a line ``peak = a + b * batch_size`` through the measured points
       nearest the boundary (a trial that created state, e.g. optimizer state, counts it as fixed memory);
    3. the model predicts the largest size whose peak stays within the budget — ``capacity`` (the device's
       free memory plus what the process holds, or the :func:`torchmem.limit` in force) less ``margin`` of
       the headroom above what was in use before the search — and a real trial verifies it. On CUDA with
       ``margin=0`` the reserved and allocated lines bound the answer from below and above (under the cap
       the allocator frees cached segments before it gives up); the search aims just under the allocated
       bound and stops within ``tolerance`` of it. It never stops on a model that a size which ran
       contradicts;
    4. a failed prediction is refined (regula falsi from a known peak, a small step down or the careful end
       of the band after an out-of-memory error, then bisection between the largest size that fit and the
       smallest that did not) until the two are within ``tolerance``.

    Between trials, garbage is collected and the device cache emptied; a caught out-of-memory error has
    its traceback frames cleared so its tensors do not stay allocated. With ``margin=0`` the answer is the
    largest size that runs (within ``tolerance``); with a margin, the largest whose measured peak leaves
    that share of the headroom free.

    **Decorator form** (accelerate's ``find_executable_batch_size`` spelling, so code can switch)::

        @torchmem.find_batch_size(starting_batch_size=128)
        def train(batch_size, model, optimizer): ...

        train(model, optimizer)    # runs train at the largest size that fits, returns its result

    The wrapped function runs once at ``starting_batch_size``; if that runs out of memory, the search
    above runs below it with *probes*: calls stopped after ``probe_steps`` ``torch.optim`` optimizer
    steps (the peak of a training step is reached by then), then the function runs to the end at the
    size found (and the search goes on below it if that run still runs out of memory). As with
    accelerate, build the model, optimizer and data inside the function, or make it safe to restart.
    ``wrapper.result`` holds the last :class:`BatchSizeResult`.

    **torch.distributed** (``distributed=None``: whenever a process group is initialised): every trial's
    outcome and every next size are agreed with ``all_reduce(MIN)``, so all ranks run the same sizes and
    return the same answer — the largest that fits on every rank. A non-OOM error on one rank makes the
    others raise :class:`DistributedTrialError` instead of waiting. Under DDP each trial runs in
    ``no_sync()`` of every ``DistributedDataParallel`` module: an OOM on one rank mid-step cannot leave the
    others waiting in DDP's gradient all-reduce.

    Args:
        fn: The step: ``fn(batch_size)``. Function form only; the decorator form wraps it.
        start: First size tried (function form).
        max_size: Largest size tried; reaching it without failure returns it with a note.
        margin: Share of the headroom (capacity above the pre-search baseline) kept free, in ``[0, 1)``.
        device: The device the step uses (default: current accelerator, else CPU).
        distributed: ``None`` (auto), ``True`` (require a process group) or ``False`` (do not sync).
        capacity: Bytes the modelled figure may reach, instead of what the device and limit allow; a trial
            whose peak goes over the budget counts as not fitting even without an out-of-memory error.
        max_trials: Most calls of the step, plus at most one closing run: when the search ends on a call
            that ran out of memory and left tensors behind (gradients of a partial backward, since its
            ``zero_grad`` never ran), the largest size that fit runs once more so the step releases them.
        tolerance: Stop when the smallest failing size is within this share of the largest fitting one.
        min_size: The smallest size worth trying (usually 1).
        starting_batch_size: accelerate's argument: selects the decorator form.
        probe_steps: Decorator probes stop after this many optimizer steps (``None``: run to the end).

    Returns:
        A :class:`BatchSizeResult` (function form), or the decorated function (decorator form).

    Raises:
        BatchSizeError: even ``min_size`` runs out of memory (``.diagnosis`` explains the OOM where torchmem
            can build one).
        FitArgumentError: a size that is not a positive int, ``start > max_size``, a margin outside [0, 1).
        Exception: whatever ``fn`` raises that is not an out-of-memory error, untouched, at once.

    Example:
        >>> import torch, torchmem
        >>> model = torch.nn.Linear(256, 256)
        >>> def step(bs):
        ...     model(torch.randn(bs, 256)).square().mean().backward()
        >>> with torchmem.limit("64MiB", "cpu"):
        ...     r = torchmem.find_batch_size(step, device="cpu", margin=0.0)
        >>> r.batch_size > 1000
        True
    """
    if not isinstance(margin, (int, float)) or isinstance(margin, bool) or not 0.0 <= margin < 1.0:
        raise FitArgumentError(f"margin must be in [0, 1), got {margin!r}.", "Pass e.g. margin=0.1.")
    if not isinstance(tolerance, (int, float)) or not 0.0 <= tolerance < 0.5:
        raise FitArgumentError(f"tolerance must be in [0, 0.5), got {tolerance!r}.", "Pass e.g. 0.02.")
    _check_size("max_trials", max_trials)
    _check_size("min_size", min_size)
    if capacity is not None:
        _check_size("capacity", capacity)
    if starting_batch_size is not None:
        size = _check_size("starting_batch_size", starting_batch_size)
        if probe_steps is not None:
            _check_size("probe_steps", probe_steps)

        def decorate(function: Callable[..., Any]) -> Callable[..., Any]:
            return _decorate(
                function,
                size,
                margin=margin,
                device=device,
                distributed=distributed,
                max_trials=max_trials,
                tolerance=tolerance,
                min_size=min_size,
                probe_steps=probe_steps,
            )

        return decorate if fn is None else decorate(fn)
    if fn is None:
        raise FitArgumentError(
            "find_batch_size() needs the step function, or starting_batch_size= for the decorator form.",
            "Call find_batch_size(step) or decorate with @find_batch_size(starting_batch_size=128).",
        )
    if not callable(fn):
        raise FitArgumentError(f"fn must be callable, got {type(fn).__name__}.", "Pass the step function.")
    _check_size("start", start)
    _check_size("max_size", max_size)
    if start > max_size:
        raise FitArgumentError(
            f"start={start} is above max_size={max_size}.", "Lower start or raise max_size."
        )
    if min_size > start:
        raise FitArgumentError(f"min_size={min_size} is above start={start}.", "Lower min_size.")
    return run_search(
        fn,
        start=start,
        max_size=max_size,
        min_size=min_size,
        margin=float(margin),
        device=device,
        distributed=distributed,
        capacity=capacity,
        max_trials=max_trials,
        tolerance=float(tolerance),
    )


def _decorate(
    function: Callable[..., Any],
    starting: int,
    *,
    margin: float,
    device: DeviceLike,
    distributed: bool | None,
    max_trials: int,
    tolerance: float,
    min_size: int,
    probe_steps: int | None,
) -> Callable[..., Any]:
    try:
        sig: inspect.Signature | None = inspect.signature(function)
    except (TypeError, ValueError):
        sig = None

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if sig is not None:
            ps = list(sig.parameters.values())
            variadic = any(p.kind == p.VAR_POSITIONAL for p in ps)
            if not variadic and len(ps) < len(args) + 1:
                raise FitArgumentError(
                    f"{function.__name__}() got the batch size as an argument, but the decorator passes it.",
                    f"Call {function.__name__}(...) without the batch size.",
                )
        dev = resolve(device)

        def probe(bs: int) -> Any:
            if probe_steps is None:
                return function(bs, *args, **kwargs)
            return run_probe(lambda n: function(n, *args, **kwargs), bs, probe_steps)

        top = starting
        trials: list[Trial] = []
        diagnosis: OOMDiagnosis | None = None
        for _ in range(max_trials):
            group = RankAgreement(distributed, dev)
            t0 = time.perf_counter()
            status, value = 1, None
            try:
                value = function(top, *args, **kwargs)
            except Exception as e:
                if not is_oom(e):
                    raise
                if top <= min_size:  # the last size there is: explain this OOM before freeing it
                    diagnosis = diagnose_oom(e, dev, top)
                clear_exception_frames(e)
                del e
                status = 0
            if group.min(status)[0] == 1:
                return value
            value = None
            release_memory(dev)
            trials.append(Trial(top, False, True, None, time.perf_counter() - t0, "out of memory (full run)"))
            if top <= min_size:
                break
            result = run_search(
                probe,
                start=max(min_size, top // 2),
                max_size=top - 1,
                min_size=min_size,
                margin=margin,
                device=dev,
                distributed=distributed,
                capacity=None,
                max_trials=max_trials,
                tolerance=tolerance,
            )
            trials.extend(result.trials)
            wrapper.result = result  # type: ignore[attr-defined]
            top = result.batch_size
        raise BatchSizeError(
            f"No batch size from {starting} down to {min_size} ran {function.__name__}() to the end "
            f"on {dev}.",
            "Free memory held elsewhere, or use a smaller model, bf16/AMP or activation checkpointing.",
            batch_size=min_size,
            diagnosis=diagnosis,
            trials=tuple(trials),
        )

    wrapper.result = None  # type: ignore[attr-defined]
    return wrapper


__all__ = ["find_batch_size"]
