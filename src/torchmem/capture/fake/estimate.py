"""The device-free estimate: a plan from the arguments, its fake runs, the rank's figures, the verdict.

:func:`estimate_fake` (and :func:`torchmem.estimate` on its device-free path, through
:func:`device_free_estimate`) checks the arguments into a :class:`~torchmem.capture.fake.plan._Plan`, runs
it (:mod:`.run`; under FSDP2 on a fake process group for ``sharding="fsdp"``, :mod:`.sharding`), reads the
figures for one rank, adds what the target's device holds besides tensors
(:mod:`torchmem.analysis.targets`) and, when it does not fit, the changes that would make it fit
(:mod:`.suggest`).
"""

from __future__ import annotations

import inspect
from contextlib import ExitStack
from dataclasses import replace
from typing import Any

import torch

from torchmem.analysis.estimate import FitArgumentError
from torchmem.analysis.targets import FRAGMENTATION, Target, reserved_for, resolve_target
from torchmem.capture.fake import sharding
from torchmem.capture.fake.kernels import _STAND_IN_ERRORS
from torchmem.capture.fake.ledger import FakeTensorError, _fake_mode
from torchmem.capture.fake.options import DEFAULT_TARGET, EstimateArgs, Inputs, ModelArg, takes_estimate_args
from torchmem.capture.fake.plan import _Plan
from torchmem.capture.fake.run import _opened, _run_guarded
from torchmem.capture.fake.sharding import _device_peak, _estimate_of, _Sharding, _state_dict_note
from torchmem.capture.fake.step import _batch_of, default_loss
from torchmem.capture.fake.suggest import _largest_batch, _suggest, _Tries
from torchmem.results.fit import Change, MemoryEstimate, TargetEstimate

_STRATEGIES = ("none", "ddp", "fsdp", "zero1", "zero2", "zero3")


@takes_estimate_args
def estimate_fake(model: ModelArg, example_inputs: Inputs, **options: Any) -> TargetEstimate:
    """Estimate a step's peak memory on ``target`` without any device: the model runs on fake tensors.

    ``torchmem.estimate(..., target=...)`` calls this. The answer is per rank, for the largest of
    ``batch_sizes`` (``.fits``, ``.device_peak`` against ``.target_total``, ``.largest_batch_size``), with
    one row per batch size and mode, and — when it does not fit — the changes that would make it fit,
    ranked by the bytes they save (``.changes``). ``target`` defaults to ``"H100-80GB"`` here.

    Args:

    Returns:
        A :class:`TargetEstimate` (a :class:`MemoryEstimate` with the verdict); ``str()`` prints it.

    Raises:
        FakeTensorError: an op of the model cannot run under fake tensors (named in the message).
        FitArgumentError: bad arguments (unknown target, optimizer, module names, sizes).

    Example:
        >>> import torch
        >>> from torchmem.capture.fake import estimate_fake
        >>> est = estimate_fake(lambda: torch.nn.Linear(1024, 1024), lambda bs: torch.randn(bs, 1024),
        ...                     optimizer="adamw", batch_sizes=[64], target="T4")
        >>> est.fits, est.parameters == 1024 * 1025 * 4
        (True, True)
    """
    return device_free_estimate(EstimateArgs.bind("estimate_fake", model, example_inputs, options))


def device_free_estimate(a: EstimateArgs) -> TargetEstimate:
    """:func:`estimate_fake` of one call's arguments (``device`` and ``probe_sizes`` are not used)."""
    tgt = resolve_target(a.target if a.target is not None else DEFAULT_TARGET)
    plan, sizes, strategy = _plan_of(a, tgt)
    frag = FRAGMENTATION if a.fragmentation is None else float(a.fragmentation)
    training, world_size = a.training, int(a.world_size)
    sh = _Sharding(strategy, world_size)
    model = a.model
    name = type(model).__name__ if isinstance(model, torch.nn.Module) else getattr(model, "__name__", "model")
    notes = _notes_before(tgt, training, a.optimizer is None)
    errors_before = set(_STAND_IN_ERRORS)
    # The run of the estimate's own sizes stays open for the largest-batch search (a run per size built and
    # warmed up the model again), and is closed before the changes' runs start.
    with ExitStack() as kept:
        opened: Any = None
        fsdp = strategy == "fsdp" and world_size > 1 and sharding._FSDP_ON_FAKE_GROUP
        if fsdp:
            runs = _run_guarded(plan, sizes)
        else:
            runs, opened = kept.enter_context(_opened(plan, sizes))
        per_rank = runs
        if fsdp:
            fsdp_plan = replace(plan, fsdp_world=world_size)
            try:
                per_rank, opened = kept.enter_context(_opened(fsdp_plan, sizes))
                plan = fsdp_plan
                notes.append(
                    f"FSDP2 ran: fully_shard per repeated block and the root on a fake process group of "
                    f"{world_size} ranks (its all-gather buffers and resharding are in the figures)"
                )
            except Exception as exc:  # no fake process group here, or FSDP2 failed on this model
                reason = str(exc.__cause__ or exc) if isinstance(exc, FakeTensorError) else str(exc)
                notes.append(f"FSDP per rank by arithmetic on one unsharded run ({reason[:200]})")
        if strategy == "fsdp" and world_size > 1 and runs[-1].full_parameters:
            notes.append(_state_dict_note(runs[-1].full_parameters, runs[-1].largest_parameter))
        for err in sorted(_STAND_IN_ERRORS - errors_before)[:1]:
            notes.append(f"kept the CPU's kernel where the GPU's could not run on fake tensors ({err})")
        est, nccl = _estimate_of(per_rank, sh, training, name, tuple(notes))
        mode = "training" if training else "inference"
        bs = sizes[-1]
        last = per_rank[-1]
        alloc = est.peak(bs, mode) or 0
        if not training and plan.generate_tokens and last.generate_peak is not None:
            alloc = max(alloc, last.generate_peak)
        dpeak = _device_peak(alloc, tgt, nccl, frag)
        fits = dpeak <= tgt.total

        failed: list[str] = []
        tries = _Tries(tgt, training, name, frag, failed)
        known = {r.batch_size: tries.of_run(r, sh, r.batch_size) for r in per_rank}
        what = "batch size {} (the largest that fits)".format
        with tries.sizes(plan, sh, what, opened) as peak_at:
            largest, exact = _largest_batch(known, tgt.total, peak_at)
    changes: tuple[Change, ...] = ()
    closest: Change | None = None
    if a.suggest and not fits:
        changes, closest = _suggest(tries, plan, sh, runs[-1], bs, dpeak, largest)
    if failed:
        est = replace(est, notes=(*est.notes, *dict.fromkeys(failed)))
    return TargetEstimate(
        **{f: getattr(est, f) for f in MemoryEstimate.__dataclass_fields__},
        target=tgt.name,
        target_total=tgt.total,
        overhead=tgt.overhead + nccl,
        workspace=tgt.workspaces(training),
        fragmentation=frag,
        batch_size=bs,
        mode=mode,
        allocated_peak=alloc,
        reserved_peak=reserved_for(alloc, frag),
        device_peak=dpeak,
        fits=fits,
        largest_batch_size=largest,
        largest_batch_exact=exact,
        strategy=strategy,
        world_size=world_size,
        grad_accum=a.grad_accum,
        checkpointed=plan.checkpoint,
        kv_cache=last.kv_cache,
        generate_tokens=plan.generate_tokens,
        changes=changes,
        closest=closest,
        method="fake-tensor" if _fake_mode()[0] is not None else "meta-device",
    )


def _plan_of(a: EstimateArgs, tgt: Target) -> tuple[_Plan, list[int], str]:
    """The fake run's plan for the arguments, the batch sizes (sorted) and the sharding strategy; raises
    :class:`FitArgumentError` for an argument it cannot use."""
    model, example_inputs, batch_sizes = a.model, a.example_inputs, a.batch_sizes
    if not isinstance(model, torch.nn.Module):
        try:
            inspect.signature(model).bind()
            ok = True
        except TypeError:  # not callable, or it needs arguments
            ok = False
        except ValueError:  # no signature (a builtin): try it
            ok = callable(model)
        if not ok:
            raise FitArgumentError(
                f"model must be a torch.nn.Module or a factory () -> module, got {type(model).__name__}.", ""
            )
    if callable(example_inputs) and not isinstance(example_inputs, torch.Tensor):
        b0 = min(int(b) for b in batch_sizes) if batch_sizes else 1
    else:
        found = _batch_of(example_inputs)
        if found is None or found <= 0:
            raise FitArgumentError(
                "example_inputs has no tensor with a batch dimension.",
                "Pass one batch, e.g. torch.randn(4, 64), or a factory batch_size -> batch.",
            )
        b0 = found
    sizes = sorted({int(b) for b in (batch_sizes or (b0,))})
    if not sizes or any(isinstance(b, bool) or b <= 0 for b in sizes):
        raise FitArgumentError(f"batch_sizes must be positive ints, got {batch_sizes!r}.", "")
    if a.grad_accum < 1:
        raise FitArgumentError(f"grad_accum must be >= 1, got {a.grad_accum}.", "")
    if a.world_size < 1:
        raise FitArgumentError(f"world_size must be >= 1, got {a.world_size}.", "")
    strategy = (a.sharding or "none").lower()
    if strategy == "fsdp2":
        strategy = "fsdp"
    if strategy not in _STRATEGIES:
        raise FitArgumentError(f"Unknown sharding {a.sharding!r}.", "Use ddp, fsdp, zero1, zero2 or zero3.")
    checkpoint = a.checkpoint
    if checkpoint is True:
        ckpt: tuple[str, ...] = ("blocks",)
    elif not checkpoint:
        ckpt = ()
    elif isinstance(checkpoint, str):
        ckpt = (checkpoint,)
    else:
        ckpt = tuple(str(c) for c in checkpoint)
    plan = _Plan(
        model=model,
        inputs=example_inputs,
        b0=b0,
        optimizer=a.optimizer,
        training=a.training,
        dtype=a.dtype,
        amp=a.amp,
        loss_fn=a.loss_fn or default_loss,
        checkpoint=ckpt,
        grad_accum=a.grad_accum,
        generate_tokens=int(a.generate_tokens) if not a.training else 0,
        rounding=True,
        workspace=tgt.workspaces(False),
        workspace_training=tgt.workspaces(True),
        sm=tgt.sm,
    )
    return plan, sizes, strategy


def _notes_before(tgt: Target, training: bool, no_optimizer: bool) -> list[str]:
    """The notes every estimate for ``tgt`` carries: how it was made and what it leaves out."""
    notes = ["device-free: fake tensors, allocator block rounding, the target's cuBLAS workspace"]
    if tgt.sm is not None:
        notes.append(
            f"{tgt.name}'s kernels (sm {tgt.sm[0]}.{tgt.sm[1]}): fused attention as CUDA picks it, foreach "
            "optimizers, composite ops' temporaries"
        )
    if not tgt.measured:
        notes.append(f"{tgt.name}: context and library figures are typical, not measured by torchmem")
    if training and no_optimizer:
        notes.append("no optimizer: the training step is forward and backward only")
    return notes


__all__ = ["device_free_estimate", "estimate_fake"]
