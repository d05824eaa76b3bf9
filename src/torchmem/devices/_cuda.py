"""CUDA (and ROCm, which torch also calls ``cuda``) backend.

The hot read goes straight to the caching allocator's nested statistics
(``torch._C._cuda_memoryStats``), skipping the flatten-and-sort that makes
``torch.cuda.memory_allocated()`` cost ~159 µs a call. Where that private entry point is missing it
falls back to the public ``torch.cuda.memory_stats_as_nested_dict`` (the same dict, one wrapper more).
Nothing here initialises CUDA: before the process has used the GPU, the allocator figures are exactly 0
and device-wide figures come from NVML instead.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from torchmem.devices import _allocator, _peaks
from torchmem.devices._base import Backend, HotReading, flatten


def _nested_stats_reader() -> Callable[[int], dict[str, Any]]:
    raw = getattr(torch._C, "_cuda_memoryStats", None)
    if callable(raw):
        return raw  # type: ignore[no-any-return]

    def public(index: int) -> dict[str, Any]:
        return torch.cuda.memory_stats_as_nested_dict(index)

    return public


_ZERO = HotReading(0, 0, 0, 0, 0)


class CudaBackend(Backend):
    kind = "cuda"

    def __init__(self, device: torch.device) -> None:
        super().__init__(device)
        self._read: Callable[[int], dict[str, Any]] = _nested_stats_reader()
        self._idx: int = device.index if device.index is not None else 0

    @property
    def platform(self) -> str:
        return "rocm" if getattr(torch.version, "hip", None) else "cuda"

    def is_initialized(self) -> bool:
        return bool(torch.cuda.is_initialized())

    def name(self) -> str | None:
        if not self.is_initialized():
            return None
        return str(torch.cuda.get_device_name(self._idx))

    def hot(self) -> HotReading:
        if not torch.cuda.is_initialized():
            return _ZERO
        d = self._read(self._idx)
        a = d["allocated_bytes"]["all"]
        r = d["reserved_bytes"]["all"]
        pa, pr = a["peak"], r["peak"]
        if _peaks._muxes:  # a torchmem reader reset torch's counters: the program's view of its peaks
            pa, pr = _peaks.user_peaks(self._idx, pa, pr)
        return HotReading(a["current"], r["current"], d["active_bytes"]["all"]["current"], pa, pr)

    def allocator_stats(self) -> Mapping[str, int] | None:
        if not torch.cuda.is_initialized():
            return {}
        flat = flatten(self._read(self._idx))
        return _peaks.user_view_flat(self._idx, flat) if _peaks._muxes else flat

    def mem_info(self) -> tuple[int, int] | None:
        # cudaMemGetInfo needs a context on the device; creating one would add ~500 MiB to what we measure
        # (and, for a device the program never used, a context it never asked for: a rank reading GPU 0).
        return _allocator.mem_info(self._idx)

    def pinned_host(self) -> int | None:
        return self.pinned_host_figures()[0]

    def pinned_host_figures(self) -> tuple[int | None, int | None]:
        stats = _host_stats()
        if stats is None:
            return None, None
        return _first(stats, ("allocated_bytes.current", "reserved_bytes.current")), _first(
            stats, ("active_bytes.current",)
        )

    def reset_peak(self) -> None:
        if torch.cuda.is_initialized():
            torch.cuda.reset_peak_memory_stats(self._idx)  # the program's reset (wrapped while readers run)

    def open_peak(self) -> int | None:
        if not torch.cuda.is_initialized():
            return None
        return _peaks.open_reader(self._idx)

    def close_peak(self, token: int) -> tuple[int, int] | None:
        return _peaks.close_reader(self._idx, token)

    def restart_peak(self, token: int) -> tuple[int, int] | None:
        return _peaks.restart_reader(self._idx, token)

    def peak_since(self, token: int) -> tuple[int, int] | None:
        return _peaks.reader_peak(self._idx, token)

    def uuid(self) -> str | None:
        """The device UUID (``GPU-…``) once CUDA is initialised, for an exact NVML match."""
        if not self.is_initialized():
            return None
        props = torch.cuda.get_device_properties(self._idx)
        uuid = getattr(props, "uuid", None)
        if uuid is None:
            return None
        text = str(uuid)
        return text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"


def _host_stats() -> dict[str, int] | None:
    """torch's pinned host allocator statistics, read once: all 0 before CUDA is initialised (nothing can
    be held), ``None`` where torch has none (torch < 2.5)."""
    if not torch.cuda.is_initialized():
        return {"allocated_bytes.current": 0, "active_bytes.current": 0}
    reader = getattr(torch.cuda, "host_memory_stats", None)
    return None if reader is None else dict(reader())


def _first(stats: dict[str, int], keys: tuple[str, ...]) -> int | None:
    return next((int(stats[k]) for k in keys if k in stats), None)
