"""Errors raised by torchmem.

Every error torchmem raises on purpose is a :class:`TorchmemError`. Each carries a ``hint`` that says
what to do about it; ``str(err)`` contains both. torch and NVML errors are translated into these at the
device-layer boundary, so callers never see a traceback from deep inside torch for bad input.
"""

from __future__ import annotations


class TorchmemError(Exception):
    """Base class of every error torchmem raises on purpose.

    Attributes:
        message: What went wrong.
        hint: What to do about it (may be empty).
    """

    exit_code: int = 1

    def __init__(self, message: str, hint: str = "") -> None:
        self.message = message
        self.hint = hint
        super().__init__(f"{message} Hint: {hint}" if hint else message)


class DeviceError(TorchmemError):
    """A device specification cannot be used (base of the device errors)."""

    exit_code = 2


class UnknownDeviceError(DeviceError):
    """The device string or object does not name a device torch knows (``"cuda:x"``, ``"gpu"``)."""


class DeviceUnavailableError(DeviceError):
    """The device kind exists in torch but not on this machine or build (CUDA on a CPU-only build)."""


class DeviceIndexError(DeviceError):
    """The device index is past the number of visible devices."""


class UnsupportedDeviceError(DeviceError):
    """The device kind has no memory to measure (``meta``) or no torchmem backend yet."""


class TrackingError(TorchmemError):
    """A tracker is used the wrong way (exited twice, crossed threads, or read before it started)."""


__all__ = [
    "DeviceError",
    "DeviceIndexError",
    "DeviceUnavailableError",
    "TorchmemError",
    "TrackingError",
    "UnknownDeviceError",
    "UnsupportedDeviceError",
]
