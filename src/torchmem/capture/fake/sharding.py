"""Sharding: FSDP2 itself on a fake process group, and a fake run's figures for one rank of any sharding.

``sharding="fsdp"`` runs FSDP2's ``fully_shard`` on the fake model, per repeated block and the root, over
torch's ``"fake"`` process group (:func:`_fake_group`: collectives do nothing, this process is rank 0), so
its all-gather buffers and resharding are in the figures (FSDP2 frees and refills unsharded parameters by
resizing storages: :func:`_storage_resizes` follows that). Where that cannot run, and for DDP and ZeRO, the
rank's figures come from one unsharded run by :func:`torchmem.analysis.targets.shard`'s arithmetic
(:func:`_per_rank`). :func:`_estimate_of` turns runs into a rank's estimate rows.

Example:
    >>> from torchmem.capture.fake.sharding import _Sharding, _state_dict_note
    >>> _Sharding("fsdp", 8).world_size
    8
    >>> _state_dict_note(1 << 30, 1 << 20)[:60]
    'a full state dict (get_model_state_dict(full_state_dict=True'
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import torch

from torchmem._format import fmt_bytes
from torchmem.analysis.estimate import build_estimate
from torchmem.analysis.targets import Target, reserved_for, shard
from torchmem.capture.fake.ledger import _Ledger
from torchmem.capture.fake.plan import _Run
from torchmem.results.fit import EstimateRow, MemoryEstimate, StepMeasurement


class _NoFakeGroup(Exception):
    """FSDP2 cannot run on a fake process group here (the reason is the message): sharding arithmetic."""


def _fully_shard() -> Any:
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        try:
            from torch.distributed._composable.fsdp import (  # type: ignore[attr-defined]  # torch 2.4, 2.5
                fully_shard,
            )
        except ImportError:
            return None
    return fully_shard


@contextmanager
def _fake_group(world: int) -> Iterator[Any]:
    """A device mesh of ``world`` ranks over a fake process group (torch's ``"fake"`` backend: collectives
    do nothing), this process being rank 0; destroyed on the way out. Raises :class:`_NoFakeGroup` where
    torch lacks the pieces or a process group already exists (the user's: never touched)."""
    try:
        import torch.distributed as dist

        if not dist.is_available():
            raise _NoFakeGroup("torch.distributed is not available")
        if _fully_shard() is None:
            raise _NoFakeGroup("this torch has no FSDP2 fully_shard")
        from torch.distributed.device_mesh import init_device_mesh
        from torch.testing._internal.distributed.fake_pg import FakeStore  # registers the "fake" backend
    except _NoFakeGroup:
        raise
    except Exception as exc:  # private module moved or missing
        raise _NoFakeGroup(f"no fake process group in this torch ({type(exc).__name__})") from exc
    with _FAKE_GROUP_LOCK:
        if dist.is_initialized():
            raise _NoFakeGroup("a process group is already initialised in this process (left untouched)")
        try:
            dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
        except Exception as exc:
            raise _NoFakeGroup(f"the fake process group did not start ({type(exc).__name__}: {exc})") from exc
        try:
            try:
                mesh = init_device_mesh("cpu", (world,))  # outside the fake mode: it reads tensor values
            except Exception as exc:
                raise _NoFakeGroup(f"no device mesh ({type(exc).__name__}: {exc})") from exc
            yield mesh
        finally:
            dist.destroy_process_group()


# On: ``sharding="fsdp"`` runs FSDP2 itself on a fake process group (the arithmetic of ``_per_rank`` is the
# fallback where that cannot run: no fake backend or FSDP2 in this torch, a process group already in this
# process, a model fully_shard refuses). Its per-rank peak equals the allocator's on real 2- and 4-rank
# gloo runs, less gloo's own buffers inside the collectives (tests/capture/test_fake_estimate.py). A
# DTensor (FSDP2's sharded parameters, gradients, optimizer state) is counted by its local shard: its
# wrapper's storage reports the global size but holds no memory.
_FSDP_ON_FAKE_GROUP = True
_FAKE_GROUP_LOCK = threading.Lock()
_RESIZE_LEDGERS: dict[int, _Ledger] = {}  # thread id -> the ledger that storage resizes on it update
_RESIZE_LOCK = threading.Lock()
_RESIZE_ORIGINAL: list[Any] = []


def _resize_counted(self: Any, *args: Any, **kwargs: Any) -> Any:
    out = _RESIZE_ORIGINAL[0](self, *args, **kwargs)
    led = _RESIZE_LEDGERS.get(threading.get_ident())
    if led is not None:
        try:
            led.recount(self)
        except Exception:  # the count is best effort; the resize itself happened
            pass
    return out


@contextmanager
def _storage_resizes(led: _Ledger) -> Iterator[None]:
    """While on (this thread only): ``UntypedStorage.resize_`` updates ``led``. FSDP2 frees an unsharded
    parameter after forward and refills it before backward by resizing its storage, which is no aten op
    the counting mode would see."""
    me = threading.get_ident()
    with _RESIZE_LOCK:
        if not _RESIZE_LEDGERS:
            _RESIZE_ORIGINAL[:] = [torch.UntypedStorage.resize_]
            torch.UntypedStorage.resize_ = _resize_counted  # type: ignore[method-assign]
        _RESIZE_LEDGERS[me] = led
    try:
        yield
    finally:
        with _RESIZE_LOCK:
            _RESIZE_LEDGERS.pop(me, None)
            if not _RESIZE_LEDGERS and _RESIZE_ORIGINAL:
                torch.UntypedStorage.resize_ = _RESIZE_ORIGINAL[0]  # type: ignore[method-assign]
                _RESIZE_ORIGINAL.clear()


def _shard_twin(twin: torch.nn.Module, blocks: dict[str, torch.nn.Module], mesh: Any) -> None:
    """FSDP2 as ``sharding="fsdp"`` documents it: ``fully_shard`` per repeated block, then the root."""
    fully_shard = _fully_shard()
    for b in blocks.values():
        fully_shard(b, mesh=mesh)
    fully_shard(twin, mesh=mesh)


@dataclass(frozen=True)
class _Sharding:
    strategy: str
    world_size: int


def _per_rank(run: _Run, sh: _Sharding) -> tuple[StepMeasurement, int, int, int, int]:
    """The run's figures for one rank: ``(measurement, parameters, gradients, optimizer_state, nccl)``."""
    if sh.strategy == "none" or (sh.world_size <= 1 and sh.strategy == "ddp"):
        return run.m, run.parameters, run.gradients, run.optimizer_state, 0
    if run.sharded:  # FSDP2 ran on a fake process group: the figures are the rank's; NCCL is outside
        nccl = shard(sh.strategy, sh.world_size, parameters=0, gradients=0, optimizer_state=0).nccl
        return run.m, run.parameters, run.gradients, run.optimizer_state, nccl
    blocks = run.block_params
    largest = max(blocks.values(), default=0)
    root = max(run.parameters - sum(blocks.values()), 0)
    s = shard(
        sh.strategy,
        sh.world_size,
        parameters=run.parameters,
        gradients=run.gradients,
        optimizer_state=run.optimizer_state,
        largest_unit=largest,
        root_unit=root,
    )
    m = run.m
    gshare = s.gradients / run.gradients if run.gradients else 1.0
    base = -run.parameters - run.optimizer_state + s.parameters + s.optimizer_state
    sharded_params = sh.strategy in ("zero3", "fsdp")
    gather = s.gather if sharded_params else 0
    ddp = s.reduce if sh.strategy == "ddp" else 0
    unit_reduce = s.reduce if sh.strategy != "ddp" else 0

    def at(v: int | None, grads_live: int, extra: int) -> int | None:
        if v is None:
            return None
        return int(v + base - grads_live + grads_live * gshare + extra)

    fwd = at(m.forward_peak, run.forward_grads, gather + ddp)
    bwd = at(m.backward_peak, run.backward_grads, gather + unit_reduce + ddp)
    # the step's foreach temporaries are as large as the state it updates: the rank's share of it
    step_share = s.optimizer_state / run.optimizer_state if run.optimizer_state else 1.0
    step = at(m.step_peak, run.gradients, ddp - int(run.step_temporaries * (1 - step_share)))
    after = at(m.after_forward, run.forward_grads, ddp)
    before = at(m.before_forward, run.forward_grads, ddp)
    inf = None if m.inference_peak is None else int(m.inference_peak - run.parameters + s.parameters + gather)
    binf = None if m.before_inference is None else int(m.before_inference - run.parameters + s.parameters)
    out = replace(
        m,
        forward_peak=fwd,
        backward_peak=bwd,
        step_peak=step,
        after_forward=after,
        before_forward=before,
        inference_peak=inf,
        before_inference=binf,
    )
    return out, s.parameters, s.gradients, s.optimizer_state, s.nccl


def _estimate_of(
    runs: list[_Run], sh: _Sharding, training: bool, model_name: str, notes: tuple[str, ...]
) -> tuple[MemoryEstimate, int]:
    """Exact rows (one fake run per size): one ``build_estimate`` per size, merged."""
    rows: list[EstimateRow] = []
    ms: list[StepMeasurement] = []
    nccl = 0
    last: MemoryEstimate | None = None
    for r in runs:
        m, p, g, o, nccl = _per_rank(r, sh)
        ms.append(m)
        e = build_estimate(
            [m],
            batch_sizes=[r.batch_size],
            parameters=p,
            gradients=g if training else 0,
            optimizer_state=o,
            weights_only=r.weights_only,
            training=training,
            model=model_name,
            device="fake",
            measured_on="fake tensors (no device)",
            notes=notes,
        )
        rows.extend(e.rows)
        last = e
    assert last is not None
    rows.sort(key=lambda row: (row.mode != "training", row.batch_size))
    per_sample = 0.0
    if len(runs) >= 2 and runs[-1].batch_size != runs[0].batch_size and training:
        a, b = runs[0], runs[-1]
        sa, sb = a.m.saved_for_backward or 0, b.m.saved_for_backward or 0
        per_sample = max((sb - sa) / (b.batch_size - a.batch_size), 0.0)
    elif training and runs and runs[0].m.saved_for_backward:
        per_sample = (runs[0].m.saved_for_backward or 0) / runs[0].batch_size
    est = replace(
        last,
        measured_at=tuple(r.batch_size for r in runs),
        rows=tuple(rows),
        measurements=tuple(ms),
        activations_per_sample=per_sample,
    )
    return est, nccl


def _device_peak(allocated: int, target: Target, nccl: int, fragmentation: float) -> int:
    return reserved_for(allocated, fragmentation) + target.overhead + nccl


def _state_dict_note(full: int, largest: int) -> str:
    """What a full state dict of an FSDP2 model adds: measured on 2 H100s (docs/benchmarks.md), +the whole
    unsharded model on every rank on the GPU, +the largest parameter with ``cpu_offload=True``."""
    return (
        f"a full state dict (get_model_state_dict(full_state_dict=True)) adds {fmt_bytes(full)} on every "
        f"rank (every parameter unsharded on the GPU); with cpu_offload=True {fmt_bytes(largest)} (one "
        f"parameter at a time; rank 0 keeps {fmt_bytes(full)} in host memory)"
    )
