"""``torchmem.cpu_tracking()``: exact accounting of CPU tensor memory, opt-in."""

from __future__ import annotations

from contextlib import ExitStack
from types import TracebackType

from torchmem.devices import ledger


class CpuTracking:
    """Handle returned by :func:`cpu_tracking`.

    While the block runs, :attr:`allocated` and :attr:`peak` are live figures (the same ones
    ``torchmem.stats("cpu")`` reports); after it ends they keep their values at exit.
    """

    def __init__(self) -> None:
        self._stack: ExitStack | None = None
        self._final: tuple[int, int, int] | None = None

    @property
    def active(self) -> bool:
        return self._stack is not None

    @property
    def allocated(self) -> int:
        """Bytes of CPU tensor storages created since tracking began that are still alive."""
        if self._final is not None and self._stack is None:
            return self._final[0]
        return ledger().current("cpu")

    @property
    def peak(self) -> int:
        """Highest :attr:`allocated` since tracking began (or since ``torchmem.reset_peak("cpu")``)."""
        if self._final is not None and self._stack is None:
            return self._final[1]
        return ledger().peak("cpu")

    @property
    def tensors(self) -> int:
        """Number of live CPU storages counted."""
        if self._final is not None and self._stack is None:
            return self._final[2]
        return ledger().live_storages("cpu")

    def __enter__(self) -> CpuTracking:
        if self._stack is not None:
            from torchmem._errors import TrackingError

            raise TrackingError("This cpu_tracking() block is already open.", "Call cpu_tracking() again.")
        self._stack = ExitStack()
        self._stack.enter_context(ledger().enabled())
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._final = (self.allocated, self.peak, self.tensors)
        stack, self._stack = self._stack, None
        if stack is not None:
            stack.close()

    def __repr__(self) -> str:
        state = "on" if self.active else "off"
        return f"<torchmem.cpu_tracking {state}: allocated={self.allocated} peak={self.peak}>"


def cpu_tracking() -> CpuTracking:
    """Count CPU tensor memory exactly while the block runs.

    CPU tensors have no allocator statistics. Inside this block every aten op is seen by a dispatch mode
    that records each new output storage's ``nbytes()`` and subtracts it when the storage dies, so the
    figure includes tensors that only autograd keeps (saved for backward), follows ``resize_`` and
    ignores views and in-place results. It counts storages created on this thread (and in autograd's
    backward) while the block is open. Blocks nest; the figures are shared. Cost: ~15 µs per op.

    Example:
        >>> import torch, torchmem
        >>> with torchmem.cpu_tracking() as cpu:
        ...     w = torch.randn(1000, requires_grad=True)
        ...     y = (w * 2).sin().sum()           # (w * 2) is saved for backward
        ...     torchmem.stats("cpu").allocated   # w, the saved product and y
        8004
    """
    return CpuTracking()
