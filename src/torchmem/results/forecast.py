"""When the memory runs out at the current rate: :class:`Forecast` (computed by
:func:`torchmem.analysis.forecast.forecast`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from torchmem._format import fmt_bytes
from torchmem.results._dicts import from_mapping


@dataclass(frozen=True)
class Forecast:
    """When the memory runs out at the current rate.

    Attributes:
        what: What runs out (``"cuda:0"``, ``"the RAM"``, ``"the torchmem.limit() cap"``).
        capacity: Its size in bytes.
        used: The figure now.
        rate: Bytes per unit of growth.
        unit: ``"step"`` or ``"s"``.
        steps: Steps until the capacity is reached (``None`` for a per-second rate without a step time).
        seconds: Wall-clock seconds until then (``None`` without a step time for a per-step rate).
    """

    what: str
    capacity: int
    used: int
    rate: float
    unit: str
    steps: int | None
    seconds: float | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Forecast:
        return from_mapping(cls, d)

    def short(self) -> str:
        """``"cuda:0 full in ~7,300 steps (~1 h 03 min)"`` (the status line)."""
        parts = []
        if self.steps is not None:
            parts.append(f"~{self.steps:,} steps")
        if self.seconds is not None:
            parts.append(f"~{duration(self.seconds)}")
        when = parts[0] + (f" ({parts[1]})" if len(parts) > 1 else "") if parts else "?"
        return f"{self.what} full in {when}"

    def __str__(self) -> str:
        per = "step" if self.unit == "step" else "s"
        left = max(self.capacity - self.used, 0)
        return (
            f"at +{fmt_bytes(int(self.rate))}/{per} {self.what} runs out in "
            + (f"~{self.steps:,} steps" if self.steps is not None else "")
            + (", " if self.steps is not None and self.seconds is not None else "")
            + (f"~{duration(self.seconds)}" if self.seconds is not None else "")
            + f" ({fmt_bytes(left)} left of {fmt_bytes(self.capacity)})"
        )


def duration(seconds: float) -> str:
    """``3780`` -> ``"1 h 03 min"``; ``95`` -> ``"1 min 35 s"``; ``12`` -> ``"12 s"``; days past 48 h.

    Example:
        >>> duration(3780), duration(95), duration(12.4), duration(200000)
        ('1 h 03 min', '1 min 35 s', '12 s', '2 d 7 h')
    """
    s = round(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    if s < 48 * 3600:
        return f"{s // 3600} h {(s % 3600) // 60:02d} min"
    return f"{s // 86400} d {(s % 86400) // 3600} h"


__all__ = ["Forecast", "duration"]
