"""When will it run out? From a growth rate and what is left, the step and the wall-clock time at which the
device (or the RAM, or a ``torchmem.limit()``) is exhausted at this rate (pure).

The figures come from the leak verdict (bytes per step, or per second on a timeline verdict), the run's
step time, the current figure and the capacity (device total, the process's cgroup or RAM limit, a cap).
Nothing is forecast from a rate that is not a leak verdict's, nor where the capacity is unknown.
"""

from __future__ import annotations

from torchmem.results.forecast import Forecast

# Forecasts beyond this are not worth a line ("in 40 years"): the run ends long before.
_MAX_SECONDS = 30 * 24 * 3600.0


def forecast(
    rate: float,
    unit: str,
    used: int | None,
    capacity: int | None,
    what: str,
    step_seconds: float | None = None,
) -> Forecast | None:
    """When ``capacity`` is reached from ``used`` growing by ``rate`` bytes per ``unit`` (``"step"`` or
    ``"s"``); ``None`` when nothing grows, a figure is unknown, the capacity is already passed, or the
    answer is past 30 days.

    Example:
        >>> f = forecast(10.7 * 2**20, "step", 2 * 2**30, 80 * 2**30, "cuda:0", step_seconds=0.52)
        >>> f.steps, f.short()
        (7464, 'cuda:0 full in ~7,464 steps (~1 h 04 min)')
        >>> forecast(0.0, "step", 1, 2, "cuda:0") is None
        True
    """
    if rate <= 0 or used is None or capacity is None or capacity <= used or unit not in ("step", "s"):
        return None
    left = capacity - used
    if unit == "step":
        n = int(left // rate)
        steps: int | None = n
        seconds = n * step_seconds if step_seconds and step_seconds > 0 else None
    else:
        seconds = left / rate
        steps = int(seconds / step_seconds) if step_seconds and step_seconds > 0 else None
    if seconds is not None and seconds > _MAX_SECONDS:
        return None
    return Forecast(what, int(capacity), int(used), float(rate), unit, steps, seconds)


__all__ = ["forecast"]
