"""The host side of a reading: the process's RSS on every device kind and the CUDA host allocator's pinned
memory (held, in use, cached) in stats(), the breakdown and the capture (issue 13)."""

from __future__ import annotations

import torch

import torchmem
from stats_data import cuda_stats
from torchmem.results.stats import Breakdown, MemoryStats

MiB = 1 << 20


def test_the_cpu_reading_has_the_rss_as_host_memory() -> None:
    s = torchmem.stats("cpu")
    assert s.host_rss is not None and s.host_rss > 0
    assert s.host_rss == s.process_used or abs(s.host_rss - (s.process_used or 0)) < 64 * MiB
    assert "this process (RSS)" in str(s)  # on the CPU the process row is the RSS
    assert MemoryStats.from_dict(s.to_dict()).host_rss == s.host_rss


def test_a_cuda_breakdown_shows_pinned_memory_held_in_use_and_cached() -> None:
    # A reading as the CUDA path builds it (plain data): 96 MiB page-locked, 32 MiB of it in use.
    s = cuda_stats(pinned_host=96 * MiB, pinned_host_active=32 * MiB, host_rss=2048 * MiB)
    assert "96.00 MiB (in use 32.00 MiB, cached 64.00 MiB)" in str(s)
    b = s.breakdown()
    assert (b.host_rss, b.pinned_host, b.pinned_host_active) == (2048 * MiB, 96 * MiB, 32 * MiB)
    text = str(b)
    for label, value in (
        ("host: this process resident (RSS)", "2.00 GiB"),
        ("of which pinned (CUDA host allocator)", "96.00 MiB"),
        ("in use", "32.00 MiB"),
        ("cached for reuse", "64.00 MiB"),
    ):
        line = next(x for x in text.splitlines() if label in x)
        assert value in line, text
    assert "host_empty_cache" in text
    again = Breakdown.from_dict(b.to_dict())
    assert again == b


def test_pinned_figures_are_zero_before_cuda_is_initialised_and_none_without_cuda() -> None:
    s = torchmem.stats("cpu")
    assert s.pinned_host is None and s.pinned_host_active is None  # the CPU has no host allocator
    assert not torch.cuda.is_initialized()


def test_the_unexplained_row_names_nccls_estimated_buffers() -> None:
    # 2 communicators x 2 channels x 2 buffers x 4 MiB = 32 MiB estimated; 300 MiB unexplained
    s = cuda_stats(nccl_buffers=32 * MiB, nccl_communicators=2, unexplained=300 * MiB)
    text = str(s.breakdown())
    row = next(x for x in text.splitlines() if "unexplained" in x)
    assert "NCCL buffers ~32.00 MiB (2 communicator(s)" in row, text
    plain = str(cuda_stats(unexplained=300 * MiB).breakdown())
    assert "NCCL buffers ~" not in plain


def test_the_unexplained_row_says_how_nccl_s_share_was_found() -> None:
    """Measured around the calls that created the communicators, the growth since the first process group
    (an upper bound), or the environment's estimate (a lower bound): each says which it is."""
    for method, words in (
        ("measured", "NCCL ~844.00 MiB (1 communicator(s); measured through NVML around the calls"),
        ("growth", "NCCL at most ~844.00 MiB (1 communicator(s); the growth outside the allocator since"),
        ("estimate", "NCCL buffers ~844.00 MiB (1 communicator(s), estimated from NCCL_BUFFSIZE"),
    ):
        s = cuda_stats(
            nccl_buffers=844 * MiB, nccl_communicators=1, nccl_method=method, unexplained=900 * MiB
        )
        row = next(x for x in str(s.breakdown()).splitlines() if "unexplained" in x)
        assert words in row, row
        assert MemoryStats.from_dict(s.to_dict()).nccl_method == method
