"""MPS (Apple) and XPU (Intel) backends, for the torch builds that have them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from torchmem.devices._base import Backend, HotReading, flatten


class MpsBackend(Backend):
    """Apple GPUs. The MPS allocator exposes current and driver totals only, no peaks."""

    kind = "mps"

    def hot(self) -> HotReading:
        mps: Any = torch.mps
        allocated = int(mps.current_allocated_memory())
        driver = int(mps.driver_allocated_memory())
        return HotReading(allocated, driver, None, None, None)

    def allocator_stats(self) -> Mapping[str, int] | None:
        hot = self.hot()
        return {
            "allocated_bytes.all.current": hot.allocated or 0,
            "reserved_bytes.all.current": hot.reserved or 0,
        }

    def mem_info(self) -> tuple[int, int] | None:
        mps: Any = torch.mps
        recommended = getattr(mps, "recommended_max_memory", None)
        if recommended is None:
            return None
        total = int(recommended())
        return max(total - int(mps.driver_allocated_memory()), 0), total

    def name(self) -> str | None:
        return "Apple MPS"


class XpuBackend(Backend):
    """Intel GPUs: the XPU caching allocator reports the same keys as CUDA's."""

    kind = "xpu"

    def _idx(self) -> int:
        return self.device.index if self.device.index is not None else 0

    def is_initialized(self) -> bool:
        xpu: Any = torch.xpu
        return bool(xpu.is_initialized())

    def hot(self) -> HotReading:
        if not self.is_initialized():
            return HotReading(0, 0, 0, 0, 0)
        s = self.allocator_stats() or {}
        return HotReading(
            s.get("allocated_bytes.all.current", 0),
            s.get("reserved_bytes.all.current", 0),
            s.get("active_bytes.all.current", 0),
            s.get("allocated_bytes.all.peak", 0),
            s.get("reserved_bytes.all.peak", 0),
        )

    def allocator_stats(self) -> Mapping[str, int] | None:
        if not self.is_initialized():
            return {}
        xpu: Any = torch.xpu
        return flatten(dict(xpu.memory_stats(self._idx())))

    def mem_info(self) -> tuple[int, int] | None:
        xpu: Any = torch.xpu
        if not self.is_initialized() or not hasattr(xpu, "mem_get_info"):
            return None
        free, total = xpu.mem_get_info(self._idx())
        return int(free), int(total)

    def name(self) -> str | None:
        if not self.is_initialized():
            return None
        xpu: Any = torch.xpu
        return str(xpu.get_device_name(self._idx()))

    def reset_peak(self) -> None:
        if self.is_initialized():
            xpu: Any = torch.xpu
            xpu.reset_peak_memory_stats(self._idx())
