"""The device-layer interface: one :class:`Backend` per device kind.

A backend reads what its allocator and driver know and returns plain numbers. It never decides what the
numbers mean: that is the job of :mod:`torchmem.analysis`. A figure a backend cannot know is ``None``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import NamedTuple

import torch


class HotReading(NamedTuple):
    """The cheap per-step read: current and peak allocator figures, in bytes.

    On a backend with no allocator statistics (CPU without :func:`torchmem.cpu_tracking`) the fields
    are ``None``: a zero from such a backend would be a lie.
    """

    allocated: int | None
    reserved: int | None
    active: int | None
    peak_allocated: int | None
    peak_reserved: int | None


class Backend(ABC):
    """Reads the memory figures of one device.

    Attributes:
        kind: ``"cuda"``, ``"mps"``, ``"xpu"`` or ``"cpu"`` (ROCm builds are ``"cuda"``).
        device: The ``torch.device`` this backend reads, always with an index where the kind has one.
    """

    kind: str

    def __init__(self, device: torch.device) -> None:
        self.device = device

    @property
    def index(self) -> int | None:
        return self.device.index

    @property
    def label(self) -> str:
        """``"cuda:0"``-style name of the device."""
        return str(self.device)

    @property
    def platform(self) -> str:
        """Name of the software stack (``"cuda"``, ``"rocm"``, ``"mps"``, ``"xpu"``, ``"cpu"``)."""
        return self.kind

    def is_initialized(self) -> bool:
        """Whether this process has started using the device (a context exists)."""
        return True

    def name(self) -> str | None:
        """Product name of the device, when it can be read without initialising it."""
        return None

    @abstractmethod
    def hot(self) -> HotReading:
        """The cheap read: allocated, reserved, active, peaks."""

    @abstractmethod
    def allocator_stats(self) -> Mapping[str, int] | None:
        """The allocator's full statistics, flat keys as ``torch.cuda.memory_stats()`` names them.

        ``None`` where the backend has no allocator statistics.
        """

    def mem_info(self) -> tuple[int, int] | None:
        """``(free, total)`` bytes of the device, or ``None`` when it cannot be read without disturbing."""
        return None

    def pinned_host(self) -> int | None:
        """Bytes of page-locked host memory held by this device kind's host allocator, if known."""
        return None

    def pinned_host_figures(self) -> tuple[int | None, int | None]:
        """``(held, in use)``: :meth:`pinned_host` and, of it, the bytes of blocks in use now (the rest is
        cached), from one reading; ``None`` where unknown."""
        return self.pinned_host(), None

    def reset_peak(self) -> None:  # noqa: B027 - a no-op is the correct default for kinds without peaks
        """Reset the allocator's peak counters (only called where the caller documents it)."""

    def open_peak(self) -> int | None:
        """Start an exact peak reading that leaves the program's own peak counters as they are; returns a
        token for :meth:`close_peak`, or ``None`` where this device kind cannot (the caller resets
        instead)."""
        return None

    def close_peak(self, token: int) -> tuple[int, int] | None:
        """End the reading :meth:`open_peak` started: the highest ``(allocated, reserved)`` bytes since."""
        return None

    def restart_peak(self, token: int) -> tuple[int, int] | None:
        """:meth:`close_peak` then :meth:`open_peak` in one: the interval's ``(allocated, reserved)`` peaks,
        and ``token`` measures from now."""
        return None

    def peak_since(self, token: int) -> tuple[int, int] | None:
        """The highest ``(allocated, reserved)`` bytes since :meth:`open_peak` gave ``token`` (it stays
        open)."""
        return None


def flatten(nested: Mapping[str, object], prefix: str = "") -> dict[str, int]:
    """Flatten torch's nested stats dict into ``memory_stats()``-style dotted keys (unsorted)."""
    out: dict[str, int] = {}
    for key, value in nested.items():
        name = f"{prefix}.{key}" if prefix else key
        if isinstance(value, Mapping):
            out.update(flatten(value, name))
        elif isinstance(value, (int, float)):
            out[name] = int(value)
    return out
