"""Peaks of a block of code on CUDA without taking torch's peak counters away from the program.

The caching allocator has one set of peak counters per device, reset by
``torch.cuda.reset_peak_memory_stats``.
A per-step peak needs a reset at each step, which would make the program's own ``max_memory_allocated()`` (or
Lightning's, or a logger's) report the peak since torchmem's last reset instead of since the program's.

:class:`_Mux` shares the one hardware counter between any number of *observers*: the program (its view is what
``torch.cuda.memory_stats()``, ``max_memory_allocated()``, ``max_memory_reserved()`` and torchmem's own
readings return) and each open torchmem reader (a ``track()`` block, a callback's step). Every observer keeps
the highest value it has seen *before the last hardware reset* ("folded"); its peak is
``max(folded, torch's peak now)``. A reset asked by one observer first folds the current counters into every
other observer, then clears its own folded value and resets the hardware. So every observer's peak is exact —
the same figure it would read if it owned the counters.

While a reader is open (and afterwards, as long as the program's view differs from torch's raw counters)
torch's public ``memory_stats_as_nested_dict`` and ``reset_peak_memory_stats`` are wrapped in ``torch.cuda``
and ``torch.cuda.memory`` (``memory_stats``, ``max_memory_*``, ``reset_max_memory_*`` and
``memory_summary`` go through them). The wrappers are removed again once the program's view equals torch's
counters. Code that reads ``torch._C._cuda_memoryStats`` directly sees torch's raw counters.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from typing import Any

import torch

from torchmem.devices._base import flatten

_lock = threading.RLock()
_ALLOC = "allocated_bytes.all.peak"
_RESERVED = "reserved_bytes.all.peak"
_ids = itertools.count(1)


def _index(device: Any) -> int:
    if device is None:
        return int(torch.cuda.current_device())
    if isinstance(device, int):
        return device
    d = torch.device(device) if isinstance(device, str) else device
    if isinstance(d, torch.device):
        return int(d.index) if d.index is not None else int(torch.cuda.current_device())
    return int(device)


class _Mux:
    """The shared peak counters of one device."""

    def __init__(
        self, index: int, raw: Callable[[int], dict[str, Any]], reset: Callable[[int], None]
    ) -> None:
        self.index = index
        self._raw = raw
        self._reset = reset
        self.user: dict[
            str, int
        ] = {}  # the program's folded peaks, by flat key (``allocated_bytes.all.peak``)
        self.readers: dict[int, list[int]] = {}  # reader id -> folded [allocated, reserved] peaks

    def _peaks(self) -> dict[str, int]:
        return {k: v for k, v in flatten(self._raw(self.index)).items() if k.endswith(".peak")}

    def _fold(self, peaks: dict[str, int], skip_user: bool = False, skip: int | None = None) -> None:
        """Fold one reading of the counters into the program's view (unless ``skip_user``) and every reader
        but ``skip``."""
        if not skip_user:
            for k, v in peaks.items():
                if v > self.user.get(k, 0):
                    self.user[k] = v
        now_a = peaks.get(_ALLOC, 0)
        now_r = peaks.get(_RESERVED, 0)
        for rid, folded in self.readers.items():
            if rid != skip:
                folded[0] = max(folded[0], now_a)
                folded[1] = max(folded[1], now_r)

    def open(self) -> int:
        rid = next(_ids)
        self._fold(self._peaks())
        self.readers[rid] = [0, 0]
        self._reset(self.index)
        return rid

    def peaks(self, rid: int) -> tuple[int, int]:
        now = self._peaks()
        folded = self.readers.get(rid, [0, 0])
        return max(folded[0], now.get(_ALLOC, 0)), max(folded[1], now.get(_RESERVED, 0))

    def restart(self, rid: int) -> tuple[int, int]:
        """Reader ``rid``'s peaks, and a new interval for it from now (close and open again, from one
        reading of the counters)."""
        now = self._peaks()
        folded = self.readers.get(rid, [0, 0])
        out = max(folded[0], now.get(_ALLOC, 0)), max(folded[1], now.get(_RESERVED, 0))
        self._fold(now, skip=rid)
        self.readers[rid] = [0, 0]
        self._reset(self.index)
        return out

    def close(self, rid: int) -> tuple[int, int]:
        p = self.peaks(rid)
        self.readers.pop(rid, None)
        return p

    def user_reset(self) -> None:
        self._fold(self._peaks(), skip_user=True)
        self.user.clear()
        self._reset(self.index)

    def user_view_nested(self, nested: dict[str, Any]) -> dict[str, Any]:
        if not self.user:
            return nested

        def walk(d: dict[str, Any], prefix: str) -> None:
            for k, v in d.items():
                name = f"{prefix}.{k}" if prefix else k
                if isinstance(v, dict):
                    walk(v, name)
                elif k == "peak" and isinstance(v, int):
                    d[k] = max(v, self.user.get(name, 0))

        walk(nested, "")
        return nested

    def user_peak(self, key: str, raw: int) -> int:
        return max(raw, self.user.get(key, 0))

    def idle(self) -> bool:
        """No reader open and the program's view is torch's raw counters."""
        if self.readers:
            return False
        peaks = self._peaks()
        return all(v <= peaks.get(k, 0) for k, v in self.user.items())


_muxes: dict[int, _Mux] = {}
_saved: dict[tuple[Any, str], Any] = {}


def _raw_nested(index: int) -> dict[str, Any]:
    raw = getattr(torch._C, "_cuda_memoryStats", None)
    if callable(raw):
        return dict(raw(index))
    orig = _saved.get(
        (torch.cuda.memory, "memory_stats_as_nested_dict"), torch.cuda.memory_stats_as_nested_dict
    )
    return dict(orig(index))


def _raw_reset(index: int) -> None:
    orig = _saved.get((torch.cuda.memory, "reset_peak_memory_stats"), torch.cuda.reset_peak_memory_stats)
    orig(index)


def _wrapped_nested(device: Any = None) -> dict[str, Any]:
    orig = _saved[(torch.cuda.memory, "memory_stats_as_nested_dict")]
    nested: dict[str, Any] = orig(device)
    try:
        with _lock:
            mux = _muxes.get(_index(device))
            return mux.user_view_nested(nested) if mux is not None and nested else nested
    except Exception:
        return nested


def _wrapped_reset(device: Any = None) -> None:
    try:
        with _lock:
            mux = _muxes.get(_index(device))
            if mux is not None and torch.cuda.is_initialized():
                mux.user_reset()
                return
    except Exception:
        pass
    _saved[(torch.cuda.memory, "reset_peak_memory_stats")](device)


_WRAPPERS = {"memory_stats_as_nested_dict": _wrapped_nested, "reset_peak_memory_stats": _wrapped_reset}


def _patch() -> None:
    if _saved:
        return
    for mod in (torch.cuda.memory, torch.cuda):
        for name, fn in _WRAPPERS.items():
            current = getattr(mod, name, None)
            if current is None:
                continue
            _saved[(mod, name)] = current
            setattr(mod, name, fn)


def _unpatch_if_idle() -> None:
    if any(not m.idle() for m in _muxes.values()):
        return
    for (mod, name), orig in list(_saved.items()):
        if getattr(mod, name, None) is _WRAPPERS[name]:  # not replaced again by someone else since
            setattr(mod, name, orig)
    _saved.clear()
    _muxes.clear()


def open_reader(index: int) -> int:
    """Start measuring a peak on CUDA device ``index`` (CUDA must be initialised); returns a reader id."""
    with _lock:
        _patch()
        mux = _muxes.get(index)
        if mux is None:
            mux = _muxes[index] = _Mux(index, _raw_nested, _raw_reset)
        return mux.open()


def reader_peak(index: int, rid: int) -> tuple[int, int]:
    """The highest allocated and reserved bytes on the device since reader ``rid`` opened (exact)."""
    with _lock:
        mux = _muxes.get(index)
        return (0, 0) if mux is None else mux.peaks(rid)


def restart_reader(index: int, rid: int) -> tuple[int, int]:
    """Reader ``rid``'s peaks since it opened or last restarted, and a new interval from now."""
    with _lock:
        mux = _muxes.get(index)
        return (0, 0) if mux is None else mux.restart(rid)


def close_reader(index: int, rid: int) -> tuple[int, int]:
    """Stop reader ``rid`` and return its peak; torch's functions go back to their own once nothing
    differs."""
    with _lock:
        mux = _muxes.get(index)
        if mux is None:
            return 0, 0
        p = mux.close(rid)
        try:
            _unpatch_if_idle()
        except Exception:
            pass
        return p


def user_peaks(index: int, allocated_peak: int, reserved_peak: int) -> tuple[int, int]:
    """The program's view of the two peaks given torch's raw ones (unchanged when no reader ever ran)."""
    mux = _muxes.get(index)
    if mux is None or not mux.user:
        return allocated_peak, reserved_peak
    return (
        mux.user_peak(_ALLOC, allocated_peak),
        mux.user_peak(_RESERVED, reserved_peak),
    )


def user_view_flat(index: int, flat: dict[str, int]) -> dict[str, int]:
    """The program's view of a flat ``memory_stats()``-style dict."""
    mux = _muxes.get(index)
    if mux is None or not mux.user:
        return flat
    for k, v in mux.user.items():
        if k in flat and v > flat[k]:
            flat[k] = v
    return flat


__all__ = ["close_reader", "open_reader", "reader_peak", "restart_reader", "user_peaks", "user_view_flat"]
