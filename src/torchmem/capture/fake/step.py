"""What the measured and the device-free estimate share: a model called on a batch, its loss, its optimizer.

:func:`default_loss` is the loss both paths backpropagate when none is given.

Example:
    >>> import torch
    >>> from torchmem.capture.fake.step import default_loss
    >>> out = torch.nn.Linear(4, 2)(torch.randn(3, 4))
    >>> torch.equal(default_loss(out), out.float().mean())
    True
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from torchmem.analysis.estimate import FitArgumentError
from torchmem.capture.fake.options import OptimizerSpec


def _batch_of(inputs: Any) -> int | None:
    if isinstance(inputs, torch.Tensor):
        return int(inputs.shape[0]) if inputs.dim() > 0 else None
    if isinstance(inputs, Mapping):
        for v in inputs.values():
            b = _batch_of(v)
            if b is not None:
                return b
    if isinstance(inputs, (list, tuple)):
        for v in inputs:
            b = _batch_of(v)
            if b is not None:
                return b
    return None


def _call(model: Callable[..., Any], inputs: Any, **extra: Any) -> Any:
    if isinstance(inputs, Mapping):
        return model(**inputs, **extra)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs, **extra)
    return model(inputs, **extra)


def _tensors(out: Any) -> Iterator[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        yield out
    elif isinstance(out, Mapping):
        for v in out.values():
            yield from _tensors(v)
    elif isinstance(out, (list, tuple)):
        for v in out:
            yield from _tensors(v)
    else:
        loss = getattr(out, "loss", None)
        if isinstance(loss, torch.Tensor):
            yield loss
        logits = getattr(out, "logits", None)
        if loss is None and isinstance(logits, torch.Tensor):
            yield logits


def default_loss(out: Any) -> torch.Tensor:
    """The loss ``estimate()`` backpropagates when none is given: the output's ``loss`` if it has one (a
    Hugging Face-style output), else the sum of the means of its floating tensors that need a gradient."""
    loss = out.get("loss") if isinstance(out, Mapping) else getattr(out, "loss", None)
    if isinstance(loss, torch.Tensor) and loss.requires_grad:
        return loss
    parts = [t.float().mean() for t in _tensors(out) if t.is_floating_point() and t.requires_grad]
    if not parts:
        raise FitArgumentError(
            "The model's output has no floating tensor that needs a gradient: nothing to backward.",
            "Pass loss_fn=..., or training=False for an inference estimate.",
        )
    total = parts[0]
    for p in parts[1:]:
        total = total + p
    return total


def _make_optimizer(spec: OptimizerSpec, user: torch.nn.Module | None, model: torch.nn.Module) -> Any:
    if spec is None:
        return None
    params = [p for p in model.parameters() if p.requires_grad]
    if isinstance(spec, str):
        names = {n.lower(): n for n in dir(torch.optim) if isinstance(getattr(torch.optim, n), type)}
        name = names.get(spec.lower())
        cls = None if name is None else getattr(torch.optim, name)
        if cls is None or not issubclass(cls, torch.optim.Optimizer):
            raise FitArgumentError(
                f"{spec!r} is not a torch.optim optimizer.", "Use e.g. 'adamw', 'adam', 'sgd' or a class."
            )
        return cls(params)
    if isinstance(spec, torch.optim.Optimizer):
        # A fresh optimizer of the same kind and settings on the copy's parameters (the user's keeps its
        # state): groups are mapped by parameter position.
        pos = {id(p): i for i, p in enumerate(user.parameters())} if user is not None else {}
        copies = list(model.parameters())
        groups = []
        for g in spec.param_groups:
            mapped = [copies[pos[id(p)]] for p in g["params"] if id(p) in pos]
            if mapped:
                groups.append({**{k: v for k, v in g.items() if k != "params"}, "params": mapped})
        if not groups:
            raise FitArgumentError(
                "The optimizer given holds none of the model's parameters.", "Pass the model's optimizer."
            )
        try:
            accepted = set(inspect.signature(type(spec).__init__).parameters)
        except (TypeError, ValueError):
            accepted = set()
        kwargs = {k: v for k, v in spec.defaults.items() if k in accepted and k != "params"}
        return type(spec)(groups, **kwargs)
    if callable(spec):
        return spec(params)
    raise FitArgumentError(
        f"optimizer must be None, a name, a class or an optimizer, not {type(spec).__name__}.", ""
    )


def _accepts(fn: Callable[..., Any], name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


__all__ = ["default_loss"]
