"""TensorBoard: the per-step memory figures as scalars of a ``SummaryWriter`` you already have.

Example::

    from torch.utils.tensorboard import SummaryWriter
    from torchmem.integrations.tensorboard import log_figures

    writer = SummaryWriter("runs/exp1")
    for step, batch in enumerate(loader):
        train_step(batch)
        log_figures(writer, step)        # torchmem/allocated, /reserved, /peak_allocated, /host_rss

The figures are those the framework callbacks log (allocated, reserved and the allocator's running peak on
CUDA, never resetting torch's peak counters; the C heap in use on the CPU; the process's RSS). Any object
with ``add_scalar(tag, value, step)`` works (``torch.utils.tensorboard``, ``tensorboardX``). Nothing here
imports TensorBoard.
"""

from __future__ import annotations

from typing import Any

from torchmem.devices import DeviceLike, resolve
from torchmem.integrations._loops import figures


def log_figures(
    writer: Any, step: int, device: DeviceLike = None, prefix: str = "torchmem/"
) -> dict[str, float]:
    """Write this step's figures as scalars (``writer.add_scalar(prefix + name, bytes, step)``) and return
    them. A figure that cannot be read here is left out, never written as 0.

    Raises:
        TypeError: ``writer`` has no ``add_scalar``.
    """
    add = getattr(writer, "add_scalar", None)
    if not callable(add):
        raise TypeError(
            f"log_figures needs a SummaryWriter (an object with add_scalar), not {type(writer).__name__}"
        )
    values = figures(resolve(device))
    for name, value in values.items():
        add(f"{prefix}{name}", value, step)
    return values


__all__ = ["log_figures"]
