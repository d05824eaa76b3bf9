"""CPU backend: exact tensor bytes from the ledger (opt-in), process and machine figures from the OS.

There is no caching allocator on the CPU, so ``reserved``/``active`` have no meaning there and are
``None``. ``allocated`` is known only while :func:`torchmem.cpu_tracking` is on; otherwise it is ``None``
(not 0: a CPU-only build's ``torch.cuda.memory_allocated()`` returns 0 for everything, which is the trap
we refuse to fall into).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

import torch

from torchmem.devices._base import Backend, HotReading
from torchmem.devices._ledger import ledger


def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def process_rss() -> int | None:
    """Resident set size of this process in bytes (Linux ``/proc``; ``None`` elsewhere)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def physical_memory() -> int | None:
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


class CpuBackend(Backend):
    kind = "cpu"

    def __init__(self, device: torch.device) -> None:
        super().__init__(torch.device("cpu"))

    @property
    def label(self) -> str:
        return "cpu"

    def name(self) -> str | None:
        return f"CPU ({os.cpu_count()} cores, {sys.platform})"

    def tracking(self) -> bool:
        return ledger().active

    def hot(self) -> HotReading:
        led = ledger()
        if not led.active:
            return HotReading(None, None, None, None, None)
        return HotReading(led.current("cpu"), None, None, led.peak("cpu"), None)

    def allocator_stats(self) -> Mapping[str, int] | None:
        return None

    def mem_info(self) -> tuple[int, int] | None:
        total = physical_memory()
        free = _meminfo_available()
        if total is None or free is None:
            return None
        return free, total

    def reset_peak(self) -> None:
        ledger().reset_peak("cpu")
