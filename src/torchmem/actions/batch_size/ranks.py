"""Agreement across ``torch.distributed`` ranks for the batch-size search: ``all_reduce(MIN)``.

Every trial's outcome and every next size are reduced to their minimum over the default process group, so
all ranks run the same sizes and return the same answer. Outside torch.distributed (or with
``distributed=False``) :meth:`RankAgreement.min` is the identity. Each agreement is one collective call of
a few int64 values (on the CUDA device under NCCL, else on the CPU).

Under DDP a trial must not run DDP's own gradient all-reduce: a rank that runs out of memory mid-step never
joins it, and the other ranks would wait in it for ever (and their next agreement would meet the wrong
collective). :meth:`RankAgreement.local_trials` runs each trial with every ``DistributedDataParallel``
module of the process in ``no_sync()``: the backward accumulates gradients locally, in the same memory (the
reducer's buckets exist from DDP's construction), and the agreement stays the only collective of a trial.
A trial that steps the optimizer then steps each rank's replica with its own gradients, so after the
search :meth:`RankAgreement.resync` gives every rank rank 0's parameters, buffers and optimizer state (one
broadcast per tensor), as DDP's constructor does for the parameters.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
from collections.abc import Iterator
from typing import Any

import torch

from torchmem.analysis.estimate import FitArgumentError


class RankAgreement:
    """``all_reduce(MIN)`` over the default process group, or the identity outside torch.distributed."""

    def __init__(self, enabled: bool | None, device: torch.device) -> None:
        self.world = 1
        self.rank = 0
        self.device = torch.device("cpu")  # where the agreement tensor lives
        self._ddp: list[Any] | None = None  # the DDP modules, found at the first trial
        dist = getattr(torch, "distributed", None)
        initialised = dist is not None and dist.is_available() and dist.is_initialized()
        if enabled and not initialised:
            raise FitArgumentError(
                "distributed=True but torch.distributed has no initialised process group.",
                "Call torch.distributed.init_process_group() first, or leave distributed=None.",
            )
        self.active = bool(initialised) if enabled is None else bool(enabled and initialised)
        if self.active and dist is not None:
            self.world = int(dist.get_world_size())
            self.rank = int(dist.get_rank())
            if str(dist.get_backend()).lower() == "nccl":
                self.device = device if device.type == "cuda" else torch.device("cuda", 0)

    @contextlib.contextmanager
    def local_trials(self) -> Iterator[int]:
        """Run a trial with DDP's gradient all-reduce off (``no_sync()`` on every DDP module of the
        process, found once per search); yields how many were switched. The identity outside
        torch.distributed or with one rank."""
        if not self.active or self.world <= 1:
            yield 0
            return
        if self._ddp is None:
            self._ddp = _ddp_modules()
        with contextlib.ExitStack() as stack:
            for m in self._ddp:
                stack.enter_context(m.no_sync())
            yield len(self._ddp)

    def resync(self) -> str | None:
        """After trials run in ``no_sync()``: every rank takes rank 0's parameters and buffers of the DDP
        modules, and the state of the optimizers that hold their parameters. Every rank calls it (it is
        collective). The modules and optimizers are put in an order that does not depend on the process
        (their shapes), and nothing is sent unless every rank has the same layout: otherwise a tensor
        could go to another one of the same shape. Returns a note for the result (``None`` outside DDP)."""
        if not self.active or self.world <= 1 or not self._ddp:
            return None
        import torch.distributed as dist

        def layout(ts: list[torch.Tensor]) -> tuple[tuple[tuple[int, ...], str], ...]:
            return tuple((tuple(t.shape), str(t.dtype)) for t in ts)

        modules = sorted(
            ([*m.module.parameters(), *m.module.buffers()] for m in self._ddp),
            key=lambda ts: repr(layout(ts)),
        )
        keys = [repr(layout(ts)) for ts in modules]
        if len(set(keys)) != len(keys):  # two DDP modules of one architecture: no order tells them apart
            return (
                "the trials ran without DDP's gradient sync; the replicas were not made equal again (two DDP "
                "modules of the same shapes)"
            )
        tensors = [t for ts in modules for t in ts]
        position = {id(t): n for n, t in enumerate(tensors)}
        optimizers = sorted(
            (
                o
                for o in gc.get_objects()
                if isinstance(o, torch.optim.Optimizer)
                and any(id(p) in position for g in o.param_groups for p in g["params"])
            ),
            key=lambda o: min(position.get(id(p), 1 << 62) for g in o.param_groups for p in g["params"]),
        )
        states = [t for o in optimizers for _, t in _state_tensors(o)]
        everything = tensors + states
        shape = hashlib.sha1(repr((keys, layout(states), len(optimizers))).encode())
        h = int(shape.hexdigest()[:15], 16)
        low, neg_high = self.min(h, -h)
        if low != -neg_high:  # a trial stepped an optimizer on some ranks only, or the ranks differ
            return (
                "the trials ran without DDP's gradient sync; the replicas were not made equal again (their "
                "parameters or optimizer state differ in layout across ranks)"
            )
        with torch.no_grad():
            for t in (x.detach() for x in everything):  # a parameter's storage, written in place
                if self.device.type == "cuda" and t.device.type != "cuda":  # NCCL moves CUDA tensors only
                    moved = t.to(self.device)
                    dist.broadcast(moved, src=0)
                    t.copy_(moved)
                else:
                    dist.broadcast(t, src=0)
        return (
            "the trials ran without DDP's gradient sync: every rank took rank 0's parameters and buffers"
            + (" and optimizer state" if optimizers else "")
        )

    def min(self, *values: int) -> list[int]:
        """Each value's minimum over all ranks (the values themselves outside torch.distributed)."""
        if not self.active:
            return list(values)
        import torch.distributed as dist

        t = torch.tensor(list(values), dtype=torch.int64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        out = [int(v) for v in t.tolist()]
        del t
        return out


def _state_tensors(opt: torch.optim.Optimizer) -> list[tuple[tuple[int, str], torch.Tensor]]:
    """An optimizer's state tensors in a fixed order: (parameter's position, key) and the tensor."""
    out: list[tuple[tuple[int, str], torch.Tensor]] = []
    params = [p for g in opt.param_groups for p in g["params"]]
    for i, p in enumerate(params):
        for k, v in sorted(opt.state.get(p, {}).items(), key=lambda kv: str(kv[0])):
            if isinstance(v, torch.Tensor):
                out.append(((i, str(k)), v))
    return out


def _ddp_modules() -> list[Any]:
    """Every live ``DistributedDataParallel`` module (one scan of the collector's objects: ~0.15 s at a
    million objects, once per search)."""
    try:
        from torch.nn.parallel import DistributedDataParallel
    except ImportError:  # pragma: no cover - present in every supported torch
        return []
    return [o for o in gc.get_objects() if isinstance(o, DistributedDataParallel)]


__all__ = ["RankAgreement"]
