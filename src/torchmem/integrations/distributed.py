"""``torchmem.distributed``: memory figures per rank of a ``torch.distributed`` job.

* :func:`local_stats` — this rank's figures with its identity (rank, local rank, world size, host, pid,
  the processes with a context on its GPU, NCCL's estimated buffers). No collective.
* :func:`gather_stats` — every rank's :func:`local_stats` on rank 0 (``dst``), over the job's existing
  process group: one small ``all_gather`` of a few hundred bytes per rank, on the rank's own GPU under NCCL
  (the device NCCL needs; never GPU 0 by default), on the CPU otherwise. Every rank must call it, like any
  collective; call it outside the training step.

Nothing here runs at import; torch.distributed is used only when a function is called.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch

from torchmem._errors import TorchmemError
from torchmem.capture.ranks import process_group_facts, rank_info
from torchmem.capture.read import stats
from torchmem.devices import DeviceLike, current_cuda_index, resolve
from torchmem.results.ranks import DistributedStats, RankStats, estimate_nccl


class DistributedError(TorchmemError):
    """``gather_stats()`` needs an initialised ``torch.distributed`` process group."""

    exit_code = 2


def local_stats(device: DeviceLike = None) -> RankStats:
    """This rank's memory figures and its place in the job (no collective: safe anywhere).

    Args:
        device: The device to read (default: the current accelerator, else the CPU).

    Returns:
        A :class:`~torchmem.results.ranks.RankStats`. Outside a distributed job, rank 0 of a world of 1.

    Example:
        >>> import torchmem.integrations.distributed as tmd
        >>> s = tmd.local_stats("cpu")
        >>> (s.rank, s.world_size, s.device)
        (0, 1, 'cpu')
    """
    s = stats(device)
    facts = process_group_facts()
    info = rank_info()
    if facts is not None:
        rank, world = int(facts["rank"]), int(facts["world_size"])
        comms = int(facts.get("nccl_communicators") or 0)
    else:
        rank = info.rank if info is not None else 0
        world = info.world_size if info is not None and info.world_size > 0 else 1
        comms = 0
    return RankStats(
        rank=rank,
        world_size=world,
        device=s.device,
        local_rank=info.local_rank if info is not None else None,
        host=info.host if info is not None else _host(),
        pid=os.getpid(),
        allocated=s.allocated,
        reserved=s.reserved,
        peak_allocated=s.peak_allocated,
        peak_reserved=s.peak_reserved,
        process_used=s.process_used,
        device_used=s.device_used,
        device_total=s.device_total,
        other_pids=tuple(p.pid for p in s.other_processes or ()),
        nccl=estimate_nccl(os.environ, comms),
    )


def _host() -> str:
    import socket

    try:
        return socket.gethostname()
    except Exception:
        return ""


def _collective_device(backend: str, device: torch.device) -> torch.device:
    """Where the exchanged bytes live: the rank's own GPU under NCCL, the CPU otherwise."""
    if "nccl" not in backend.lower():
        return torch.device("cpu")
    if device.type == "cuda" and device.index is not None:
        return device
    index = current_cuda_index()
    if index is None:
        info = rank_info()
        index = info.local_rank if info is not None and info.local_rank is not None else 0
    return torch.device("cuda", index)


def gather_stats(device: DeviceLike = None, *, dst: int = 0, group: Any = None) -> DistributedStats | None:
    """Every rank's :func:`local_stats`, gathered on rank ``dst`` (a collective: every rank calls it).

    Args:
        device: The device each rank reads (default: its current accelerator, else the CPU).
        dst: The rank that receives the result; the others get ``None``.
        group: The process group (default: the default group).

    Returns:
        On ``dst``, a :class:`~torchmem.results.ranks.DistributedStats` (``print()`` it for the per-rank
        table and the spread); ``None`` on the other ranks.

    Raises:
        DistributedError: no initialised process group.

    Example:
        >>> import torch.distributed as dist, torchmem  # doctest: +SKIP
        >>> dist.init_process_group("nccl")  # doctest: +SKIP
        >>> everyone = torchmem.distributed.gather_stats()  # doctest: +SKIP
        >>> if everyone is not None:  # rank 0  # doctest: +SKIP
        ...     print(everyone)
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise DistributedError(
            "gather_stats() needs an initialised torch.distributed process group.",
            "call torch.distributed.init_process_group() first, or use torchmem.distributed.local_stats().",
        )
    mine = local_stats(device)
    dev = _collective_device(str(dist.get_backend(group)), resolve(device))
    data = json.dumps(mine.to_dict(), separators=(",", ":"), default=str).encode()
    world = int(dist.get_world_size(group))
    size = torch.tensor([len(data)], dtype=torch.int64, device=dev)
    sizes = [torch.zeros(1, dtype=torch.int64, device=dev) for _ in range(world)]
    dist.all_gather(sizes, size, group=group)
    longest = max(int(s.item()) for s in sizes)
    buf = torch.zeros(longest, dtype=torch.uint8, device=dev)
    buf[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(dev)
    bufs = [torch.zeros(longest, dtype=torch.uint8, device=dev) for _ in range(world)]
    dist.all_gather(bufs, buf, group=group)
    if int(dist.get_rank(group)) != dst:
        return None
    ranks = []
    for n, b in zip(sizes, bufs):
        raw = bytes(b[: int(n.item())].cpu().tolist())
        ranks.append(RankStats.from_dict(json.loads(raw.decode())))
    return DistributedStats(tuple(sorted(ranks, key=lambda r: r.rank)))


__all__ = ["DistributedError", "gather_stats", "local_stats"]
