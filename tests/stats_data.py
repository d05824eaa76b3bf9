"""A CUDA reading as plain data (what the CUDA path of ``stats()`` builds), for tests of the breakdown."""

from __future__ import annotations

from typing import Any

from torchmem.results.stats import MemoryStats

MiB = 1 << 20


def cuda_stats(**overrides: Any) -> MemoryStats:
    """512 MiB allocated of 600 reserved, a 500 MiB context, 1100 MiB for the process, an 80 GB device."""
    fields: dict[str, Any] = {
        "allocated": 512 * MiB,
        "reserved": 600 * MiB,
        "cached": 88 * MiB,
        "device_total": 80_000 * MiB,
        "device_used": 1600 * MiB,
        "process_used": 1100 * MiB,
        "context": 500 * MiB,
        "unexplained": 0,
        "other_processes": (),
    }
    fields.update(overrides)
    return MemoryStats("cuda:0", "cuda", "H100", 0.0, **fields)
