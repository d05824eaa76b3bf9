"""The torch.distributed wrappers that measure NCCL's memory (``capture/ranks.watch_process_groups``): on
the CPU with gloo they must leave the program's calls exactly as they were — results, the process group,
DDP — measure nothing (no NCCL, no GPU), and be gone after the undo. The measurement itself runs on two
GPUs (tests/gpu/test_multi_gpu.py)."""

from __future__ import annotations

import socket

import torch
import torch.distributed as dist
import torch.nn.parallel.distributed as ddp_module
from torch.distributed import distributed_c10d as c10d
from torch.nn.parallel import DistributedDataParallel as DDP

from torchmem.capture.ranks import watch_process_groups
from torchmem.devices import _nccl


def _port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = int(s.getsockname()[1])
    s.close()
    return port


def test_the_wrappers_leave_the_program_s_calls_as_they_were_and_go_away() -> None:
    originals = {n: getattr(dist, n) for n in ("init_process_group", "all_reduce", "new_group", "barrier")}
    check = ddp_module._verify_param_shape_across_processes
    seen: list[str] = []
    undo = watch_process_groups(lambda: seen.append("before destroy"))
    try:
        assert dist.all_reduce is not originals["all_reduce"] and c10d.all_reduce is dist.all_reduce
        assert ddp_module._verify_param_shape_across_processes is not check  # DDP's first collective
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{_port()}", rank=0, world_size=1
        )  # through the wrapper: the baseline is taken (no CUDA here: nothing to note)
        assert _nccl.baseline(0) == (True, None)
        t = torch.ones(4)
        dist.all_reduce(t)
        assert t.tolist() == [1.0, 1.0, 1.0, 1.0]
        g = dist.new_group([0])
        dist.all_reduce(t, group=g)
        model = DDP(torch.nn.Linear(4, 4))
        model(torch.randn(2, 4)).sum().backward()
        dist.barrier()
        assert _nccl.measured(0) is None and not _nccl._state["pending"]  # gloo: no NCCL group
        dist.destroy_process_group()
        assert seen == ["before destroy"] and not dist.is_initialized()
    finally:
        undo()
        if dist.is_initialized():
            dist.destroy_process_group()
    for name, fn in originals.items():
        assert getattr(dist, name) is fn and getattr(c10d, name) is fn
    assert ddp_module._verify_param_shape_across_processes is check


def test_a_window_measures_nothing_without_a_gpu_and_counts_itself() -> None:
    _nccl.reset()
    try:
        _nccl.group_created()
        assert _nccl.watching()
        with _nccl.window(), _nccl.window():  # nested: measured once
            pass
        assert _nccl._state["windows"] == 1 and _nccl.measured(0) is None
        assert _nccl._state["pending"] == 1  # no growth seen: the group still waits for its communicator
        for _ in range(_nccl.MAX_WINDOWS):
            with _nccl.window():
                pass
        assert not _nccl.watching()  # the calls stop costing after MAX_WINDOWS windows
    finally:
        _nccl.reset()


def test_a_launched_rank_watches_its_local_rank_s_gpu() -> None:
    """``torchmem run`` under torchrun/SLURM/MPI with several visible GPUs reads the local rank's GPU (all
    ranks reading cuda:0 read the wrong GPU and put a context on GPU 0 in every rank: seen on 2 H100s)."""
    from torchmem.capture.ranks import RankInfo, rank_device_index

    assert rank_device_index(RankInfo(rank=3, world_size=4, local_rank=1, launcher="torchrun"), 2) == 1
    assert rank_device_index(RankInfo(rank=3, world_size=4, local_rank=3, launcher="slurm"), 2) == 1
    assert rank_device_index(RankInfo(rank=1, world_size=2, local_rank=1), 1) is None  # one GPU per rank
    assert rank_device_index(RankInfo(rank=1, world_size=2, local_rank=None), 8) is None
    assert rank_device_index(RankInfo(rank=2, world_size=0, local_rank=2, launcher="spawn"), 8) is None
    assert rank_device_index(None, 8) is None
