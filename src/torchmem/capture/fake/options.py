"""``torchmem.estimate()``'s parameters, written once: names, types, defaults and what each one does.

:class:`EstimateArgs` is the parameter list of :func:`torchmem.estimate` (the measured path,
:mod:`torchmem.capture.measure`) and of :func:`~torchmem.capture.fake.estimate_fake` (the device-free
path). Both are declared with :func:`takes_estimate_args`, which gives them its signature (for
``help()``, ``inspect.signature`` and type checkers, through a ``ParamSpec``) and its parameters' text (their
``Args:`` section), and each call makes one :class:`EstimateArgs`: an unknown keyword is a ``TypeError`` as
before, and which path runs is :attr:`EstimateArgs.device_free`.

Example:
    >>> import torch
    >>> from torchmem.capture.fake.options import EstimateArgs
    >>> a = EstimateArgs(torch.nn.Linear(4, 4), torch.randn(2, 4), optimizer="adamw")
    >>> a.device_free, a.target, a.device_free_only()
    (False, None, [])
    >>> EstimateArgs(lambda: torch.nn.Linear(4, 4), torch.randn(2, 4), grad_accum=2).device_free_only()
    ['grad_accum']
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, fields
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import torch

from torchmem.analysis.targets import Target

if TYPE_CHECKING:
    from torchmem.devices import DeviceLike

OptimizerSpec = str | type | torch.optim.Optimizer | Callable[..., torch.optim.Optimizer] | None
Inputs = Any  # a tensor, a tuple/list, a dict, or a callable batch_size -> one of those
ModelArg = torch.nn.Module | Callable[[], torch.nn.Module]

# The GPU a device-free estimate is for when ``target`` is not given (a ``"fake"`` device, a model factory,
# a meta model, ``estimate_fake``); ``torchmem estimate``'s ``--target`` default too.
DEFAULT_TARGET = "H100-80GB"
# ``device=`` values that ask for the device-free estimate.
FAKE_DEVICES = ("fake", "meta")


@dataclass(frozen=True, eq=False)
class EstimateArgs:
    """One call's arguments to ``torchmem.estimate()`` or ``estimate_fake()``: the one parameter list.

    The attributes below are the ``Args:`` both functions show (:func:`takes_estimate_args`). Those marked
    "device-free" are used by the device-free path only: the measured path refuses them when set
    (:meth:`device_free_only`); the device-free path ignores ``device`` and ``probe_sizes``.

    Attributes:
        model: The model, or a factory ``() -> model``. Measured: a copy of it runs on ``device``.
            Device-free: a model (real, or on the ``meta`` device: only shapes and dtypes are read; it is not
            changed), or a factory called under fake tensors (nothing allocated).
        example_inputs: One batch: a tensor, a tuple/list (positional arguments) or a dict (keyword
            arguments); tensors whose first dimension is the batch size are resized (device-free: their
            values are not used). Device-free also takes a factory ``batch_size -> batch``, called under fake
            tensors.
        optimizer: ``None`` (no optimizer step), a ``torch.optim`` name (``"adamw"``), a class, a factory
            ``params -> optimizer``, or an optimizer instance (its kind and settings are copied).
        batch_sizes: The batch sizes to predict (default ``(1, 8, 32, 128)``; device-free: the example's).
            Device-free: per rank, and micro-batch sizes with ``grad_accum``.
        training: Predict training steps (else inference only).
        device: Measured: the device to estimate for (default: the model's device). ``"fake"`` or
            ``"meta"``: the device-free estimate (which ignores ``device`` otherwise).
        dtype: Cast the model (its copy) to this dtype first (``torch.bfloat16``: weights, gradients and
            Adam state too).
        amp: Run forward under ``torch.autocast`` with this dtype.
        loss_fn: ``output -> scalar loss`` (default: :func:`~torchmem.capture.fake.default_loss`: the
            output's ``loss``, else the mean of its outputs).
        probe_sizes: Measured: the two (or more) batch sizes to measure (default: probed upward from the
            example's). The device-free path ignores it.
        target: The GPU to estimate for without a device: a name from
            :data:`torchmem.analysis.targets.TARGETS` (``"H100-80GB"``, ``"A100-40GB"``, ``"L4"``, ``"T4"``,
            ``"RTX4090"``, ``"H200"``, ...), a size (``"24GiB"``) or a ``Target``. Given, the estimate is
            device-free; a device-free estimate without it is for ``"H100-80GB"`` (:data:`DEFAULT_TARGET`).
        checkpoint: Device-free: activation checkpointing of these modules: qualified names, patterns
            (``"layers.*"``), class names, ``"blocks"`` or ``True`` (every repeated block).
        grad_accum: Device-free: micro-batches per optimizer step (from the second one on, gradients are
            live during forward).
        sharding: Device-free: ``None``/``"none"``, ``"ddp"``, ``"fsdp"`` (FSDP2 ``fully_shard`` per repeated
            block and the root), ``"zero1"``, ``"zero2"``, ``"zero3"``: the figures are per rank.
        world_size: Device-free: ranks sharing the model.
        generate_tokens: Device-free, with ``training=False``: a generate call of this many new tokens after
            the prompt (the example's sequence): its KV cache is estimated (models whose forward takes
            ``use_cache``).
        fragmentation: Device-free: reserved bytes above the allocated peak, as a fraction (default
            :data:`torchmem.analysis.targets.FRAGMENTATION`).
        suggest: Device-free: when it does not fit, estimate the changes that would make it fit (a few more
            fake runs).
    """

    model: ModelArg
    example_inputs: Inputs
    _: KW_ONLY
    optimizer: OptimizerSpec = None
    batch_sizes: Sequence[int] | None = None
    training: bool = True
    device: DeviceLike = None
    dtype: torch.dtype | None = None
    amp: torch.dtype | None = None
    loss_fn: Callable[[Any], torch.Tensor] | None = None
    probe_sizes: Sequence[int] | None = None
    target: str | Target | None = None
    checkpoint: Sequence[str] | str | bool | None = None
    grad_accum: int = 1
    sharding: str | None = None
    world_size: int = 1
    generate_tokens: int = 0
    fragmentation: float | None = None
    suggest: bool = True

    @classmethod
    def bind(cls, name: str, model: Any, example_inputs: Any, options: Mapping[str, Any]) -> EstimateArgs:
        """The arguments of a call to the function ``name``; a keyword it does not take is the
        ``TypeError`` Python raises for the function itself."""
        try:
            return cls(model, example_inputs, **options)
        except TypeError as exc:
            raise TypeError(re.sub(r"^[\w.]*__init__\(\)", f"{name}()", str(exc))) from None

    @property
    def device_free(self) -> bool:
        """Whether this call takes the device-free path: a ``target``, a ``"fake"``/``"meta"`` device, a
        model factory, or a model whose parameters are on the meta device."""
        model = self.model
        if self.target is not None or (isinstance(self.device, str) and self.device in FAKE_DEVICES):
            return True
        if not isinstance(model, torch.nn.Module):
            return True
        t = next(iter([*model.parameters(), *model.buffers()]), None)
        return t is not None and t.device.type == "meta"

    def device_free_only(self) -> list[str]:
        """The parameters only the device-free path takes that this call sets, in the list's order."""
        given = {
            "checkpoint": bool(self.checkpoint),
            "grad_accum": self.grad_accum != 1,
            "sharding": self.sharding not in (None, "none"),
            "world_size": self.world_size != 1,
            "generate_tokens": bool(self.generate_tokens),
            "fragmentation": self.fragmentation is not None,
            "suggest": not self.suggest,
        }
        return [name for name, set_ in given.items() if set_]


P = ParamSpec("P")
R = TypeVar("R")


def _args_section() -> list[str]:
    """The ``Attributes:`` of :class:`EstimateArgs`' docstring, one entry per field in the fields' order."""
    doc = inspect.cleandoc(EstimateArgs.__doc__ or "")
    lines = doc.split("\nAttributes:\n", 1)[1].splitlines()
    names = [re.match(r" {4}(\w+):", line) for line in lines]
    documented = [m.group(1) for m in names if m is not None]
    if documented != [f.name for f in fields(EstimateArgs)]:
        raise TypeError(f"EstimateArgs documents {documented}, not its fields")
    return lines


def _signature_of(args: Callable[P, Any]) -> Callable[[Callable[..., R]], Callable[P, R]]:
    params = list(inspect.signature(args).parameters.values())
    entries = _args_section()

    def takes(fn: Callable[..., R]) -> Callable[P, R]:
        doc = inspect.cleandoc(fn.__doc__ or "")
        if "\nArgs:\n" not in doc:
            raise TypeError(
                f"{fn.__name__}'s docstring has no 'Args:' line for the parameters of EstimateArgs"
            )
        head, tail = doc.split("\nArgs:\n", 1)
        fn.__doc__ = "\n".join([head, "Args:", *entries, tail])
        ret = inspect.signature(fn).return_annotation
        fn.__signature__ = inspect.Signature(params, return_annotation=ret)  # type: ignore[attr-defined]
        return fn

    return takes


takes_estimate_args = _signature_of(EstimateArgs)
"""Declares a function ``(model, example_inputs, **options)`` as taking :class:`EstimateArgs`: its
signature (type checkers read it through the ``ParamSpec``) and, after its docstring's ``Args:`` line, the
fields' text."""


__all__ = [
    "DEFAULT_TARGET",
    "FAKE_DEVICES",
    "EstimateArgs",
    "Inputs",
    "ModelArg",
    "OptimizerSpec",
    "takes_estimate_args",
]
