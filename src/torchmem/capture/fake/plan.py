"""The model and the plan of a fake run: its settings, what it measured, and the model under fake tensors.

A :class:`_Plan` is one fake run's settings (the model or its factory, the inputs, the optimizer, dtype,
checkpointing, the target's workspaces and kernels, FSDP2's ranks); a :class:`_Run` what one fake run
measured at one batch size. The model runs as its fake twin (:func:`_fake_twin`): a real or meta model
mirrored with fake parameters and buffers of the same shapes and dtypes (nothing copied). Its repeated
blocks (:func:`_blocks`) are the units FSDP wraps and checkpointing targets.

Example:
    >>> import torch
    >>> from torchmem.capture.fake.plan import _blocks
    >>> twice = torch.nn.ModuleList(torch.nn.Linear(4, 4) for _ in range(2))
    >>> net = torch.nn.Sequential(torch.nn.Linear(4, 4), twice)
    >>> list(_blocks(net))
    ['1.0', '1.1']
"""

from __future__ import annotations

import copy
import fnmatch
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch

from torchmem.analysis.estimate import FitArgumentError
from torchmem.capture.fake.ledger import _Ledger
from torchmem.capture.fake.options import Inputs, OptimizerSpec
from torchmem.results.fit import StepMeasurement


@dataclass
class _Plan:
    """One fake run's settings."""

    model: Any  # nn.Module (real or meta) or a factory
    inputs: Inputs
    b0: int
    optimizer: OptimizerSpec
    training: bool
    dtype: torch.dtype | None
    amp: torch.dtype | None
    loss_fn: Callable[[Any], torch.Tensor]
    checkpoint: tuple[str, ...]
    grad_accum: int
    generate_tokens: int
    rounding: bool
    workspace: int  # cuBLAS workspace bytes in an inference row
    workspace_training: int = 0  # in a training row (the forward and the backward thread's)
    sm: tuple[int, int] | None = None  # the target GPU's compute capability: reproduce its kernel choices
    fsdp_world: int = 0  # > 1: the twin is sharded by FSDP2 on a fake process group of this many ranks


@dataclass
class _Run:
    """What one fake run measured, for one batch size."""

    batch_size: int
    m: StepMeasurement
    parameters: int
    gradients: int
    optimizer_state: int
    weights_only: int
    forward_grads: int = 0  # gradients live at the forward peak (gradient accumulation)
    backward_grads: int = 0  # gradients live at the backward peak
    kv_cache: int = 0
    generate_peak: int | None = None
    block_saved: dict[str, int] = field(default_factory=dict)  # saved-for-backward bytes per block
    block_input: dict[str, int] = field(default_factory=dict)
    block_params: dict[str, int] = field(default_factory=dict)
    sharded: bool = False  # measured under FSDP2 on a fake process group: the figures are per rank
    largest_parameter: int = 0  # the largest unsharded parameter, bytes (a full state dict gathers it)
    full_parameters: int = 0  # every parameter unsharded, bytes
    step_temporaries: int = 0  # the optimizer step's own (foreach) temporaries: they scale with the state


def _blocks(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """The repeated blocks (children of a ModuleList, or of a Sequential of two or more of one class, that
    hold parameters), by qualified name: the units FSDP wraps and checkpointing targets."""
    found: dict[str, torch.nn.Module] = {}
    for name, mod in model.named_modules():
        kids = list(mod.named_children())
        if len(kids) < 2:
            continue
        same = len({type(k) for _, k in kids}) == 1
        if isinstance(mod, torch.nn.ModuleList) or (isinstance(mod, torch.nn.Sequential) and same):
            for kn, k in kids:
                if any(True for _ in k.parameters()):
                    q = f"{name}.{kn}" if name else kn
                    if not any(q.startswith(f + ".") for f in found):
                        found[q] = k
    # drop blocks nested inside another block
    names = sorted(found, key=len)
    keep: dict[str, torch.nn.Module] = {}
    for n in names:
        if not any(n.startswith(k + ".") for k in keep):
            keep[n] = found[n]
    return keep


def _select(names: Sequence[str], model: torch.nn.Module, blocks: dict[str, torch.nn.Module]) -> list[str]:
    """Qualified module names for ``checkpoint=``: names, glob patterns (``layers.*``), class names, or
    ``"blocks"`` (every repeated block)."""
    mods = dict(model.named_modules())
    out: list[str] = []
    for spec in names:
        if spec in ("blocks", "*"):
            out.extend(blocks)
        elif spec in mods:
            out.append(spec)
        else:
            hit = [
                n for n, m in mods.items() if n and (fnmatch.fnmatchcase(n, spec) or type(m).__name__ == spec)
            ]
            if not hit:
                err = FitArgumentError(
                    f"checkpoint={spec!r} names no module of {type(model).__name__}.",
                    "Use qualified names (model.named_modules()), a pattern such as 'layers.*', a class "
                    "name, or 'blocks'.",
                )
                err.param = "checkpoint"  # type: ignore[attr-defined]  # the CLI names its option
                raise err
            out.extend(hit)
    return list(dict.fromkeys(n for n in out if not any(n.startswith(o + ".") for o in out if o != n)))


def _checkpointed(module: torch.nn.Module) -> None:
    """Run ``module``'s forward under non-reentrant activation checkpointing (on the fake copy only)."""
    from torch.utils.checkpoint import checkpoint

    inner = module.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        return checkpoint(inner, *args, use_reentrant=False, **kwargs)

    module.forward = forward  # type: ignore[method-assign]


def _fake_twin(plan: _Plan, dev: str, led: _Ledger) -> torch.nn.Module:
    """The model under the fake mode: a factory called, or a real/meta model mirrored with fake parameters
    and buffers (nothing copied). Called inside the fake and counting modes."""
    src = plan.model
    if isinstance(src, torch.nn.Module):
        memo: dict[int, Any] = {}
        for t in [*src.parameters(), *src.buffers()]:
            fake = torch.empty(t.shape, dtype=t.dtype, device=dev)
            if isinstance(t, torch.nn.Parameter):
                fake = torch.nn.Parameter(fake, requires_grad=t.requires_grad)
            memo[id(t)] = fake
            if t.grad is not None:
                memo[id(t.grad)] = None
        twin = copy.deepcopy(src, memo)
        for p in twin.parameters():
            p.grad = None
    else:  # pragma: no cover - _run_plan builds factories on the meta device first
        raise FitArgumentError("internal: the factory was not built", "")
    if plan.dtype is not None:
        _cast(twin, plan.dtype)
    for t in [*twin.parameters(), *twin.buffers()]:
        led.count(t)
    return twin


def _cast(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Floating parameters and buffers to ``dtype``, in place by re-registering (``Module.to`` swaps
    tensors, which fake tensors with weak references refuse)."""
    for mod in model.modules():
        for name, p in list(mod._parameters.items()):
            if p is not None and p.is_floating_point() and p.dtype != dtype:
                mod._parameters[name] = torch.nn.Parameter(
                    p.detach().to(dtype), requires_grad=p.requires_grad
                )
        for name, b in list(mod._buffers.items()):
            if b is not None and b.is_floating_point() and b.dtype != dtype:
                mod._buffers[name] = b.to(dtype)


def _fake_inputs(plan: _Plan, bs: int, dev: str) -> Any:
    if callable(plan.inputs) and not isinstance(plan.inputs, torch.Tensor):
        with torch.device(dev):
            return plan.inputs(bs)

    def conv(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            shape = list(x.shape)
            if shape and shape[0] == plan.b0:
                shape[0] = bs
            if x.is_floating_point():
                return torch.empty(shape, dtype=x.dtype, device=dev)
            return torch.zeros(shape, dtype=x.dtype, device=dev)
        if isinstance(x, Mapping):
            return {k: conv(v) for k, v in x.items()}
        if isinstance(x, tuple):
            return tuple(conv(v) for v in x)
        if isinstance(x, list):
            return [conv(v) for v in x]
        return x

    return conv(plan.inputs)


def _autocast(amp: torch.dtype | None, dev: str) -> Any:
    if amp is None or dev == "meta":
        return nullcontext()
    return torch.autocast(dev, dtype=amp)
