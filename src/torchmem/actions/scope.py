"""``torchmem.scope()``: everything a block allocated is freed at its end, except what you keep."""

from __future__ import annotations

import gc
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from types import TracebackType
from typing import Any

from torchmem._errors import TrackingError
from torchmem.actions._survivors import holders_of_storages
from torchmem.actions.release import Remaining
from torchmem.analysis.release_plan import plan_release
from torchmem.devices import _ops as ops
from torchmem.devices import ledger
from torchmem.devices._ledger import Cohort


@dataclass(frozen=True)
class ScopeReport:
    """What a :func:`scope` block allocated, what was freed at its end, and who holds the rest.

    Attributes:
        born_bytes: Bytes of tensor storages created inside the block.
        kept_bytes: Bytes still alive that belong to objects passed to :meth:`Scope.keep`.
        survived_bytes: Bytes still alive that were *not* kept — each listed in ``survivors`` with holders.
        collected: Objects ``gc.collect()`` found unreachable at the end of the block.
        survivors: The storages that outlived the block without being kept.
        seconds: Time spent in the end-of-block work.
    """

    born_bytes: int
    kept_bytes: int
    survived_bytes: int
    collected: int
    survivors: tuple[Remaining, ...]
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        from torchmem._format import fmt_bytes

        lines = [
            f"scope: {fmt_bytes(self.born_bytes)} allocated inside, {fmt_bytes(self.kept_bytes)} kept, "
            f"{fmt_bytes(self.survived_bytes)} still alive without being kept"
        ]
        for r in self.survivors:
            lines.append(f"  {r.name} ({fmt_bytes(r.bytes)} on {r.device})")
            lines += [f"    held by {p}" for p in r.paths] or ["    held by no path torchmem can name"]
        return "\n".join(lines)


class Scope:
    """Context manager returned by :func:`scope`; ``report`` is set when the block ends."""

    def __init__(self, max_paths: int) -> None:
        self._stack: ExitStack | None = None
        self._cohort: Cohort | None = None
        self._kept: list[Any] = []
        self._max_paths = max_paths
        self.report: ScopeReport | None = None

    def keep(self, *objs: Any) -> Any:
        """Mark objects as the block's results: their tensors are expected to outlive it.

        Returns the single object passed (or the tuple), so ``out = sc.keep(model(x))`` reads naturally.
        """
        self._kept.extend(objs)
        return objs[0] if len(objs) == 1 else objs

    def __enter__(self) -> Scope:
        if self._stack is not None:
            raise TrackingError("This scope() is already open.", "Use a new torchmem.scope() for each block.")
        self._stack = ExitStack()
        led = self._stack.enter_context(ledger().enabled())
        self._cohort = led.open_cohort(None)
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        t0 = time.perf_counter()
        led = ledger()
        cohort = self._cohort
        assert cohort is not None and self._stack is not None
        collected = gc.collect()
        led.close_cohort(cohort)
        devices = {s.device for s in led.cohort_storages(cohort)}
        kept_keys: set[int] = set()
        if self._kept:
            plan = plan_release(self._kept)
            for pt in plan.tensors.values():
                try:
                    kept_keys.add(pt.tensor.untyped_storage()._cdata)
                except (RuntimeError, NotImplementedError):
                    continue
        alive = led.cohort_storages(cohort)
        kept = [s for s in alive if s._cdata in kept_keys]
        loose = [s for s in alive if s._cdata not in kept_keys]
        survivors: list[Remaining] = []
        paths = holders_of_storages(loose, max_paths=self._max_paths)
        for s, p in zip(loose, paths):
            survivors.append(Remaining(_describe(s), str(s.device), int(s.nbytes()), "not kept", p))
        for d in devices:
            ops.synchronize(d)
            ops.empty_cache(d)
        self.report = ScopeReport(
            born_bytes=cohort.born_bytes,
            kept_bytes=sum(int(s.nbytes()) for s in kept),
            survived_bytes=sum(r.bytes for r in survivors),
            collected=collected,
            survivors=tuple(survivors),
            seconds=time.perf_counter() - t0,
        )
        alive.clear()
        kept.clear()
        loose.clear()
        self._kept.clear()
        stack, self._stack = self._stack, None
        stack.close()


def _describe(storage: Any) -> str:
    return f"storage of {int(storage.nbytes())} bytes"


def scope(*, max_paths: int = 4) -> Scope:
    """Run a block whose allocations are freed at its end, and be told about anything that was not.

    At the end of the block torchmem collects garbage once (cycles included) and empties the cache of every
    device the block allocated on; every tensor storage created inside that is still alive and does not
    belong to an object passed to :meth:`Scope.keep` is listed in ``report.survivors`` with the paths of
    whoever holds it — the list you append losses to, a cache, a global. Counting uses the exact storage
    ledger (~15 µs per op inside the block, see docs/release.md).

    Example:
        >>> import torch, torchmem
        >>> history = []
        >>> with torchmem.scope() as sc:
        ...     w = torch.randn(256, 256, requires_grad=True)
        ...     out = sc.keep((w @ w).sum())
        ...     history.append(w * 2)          # outlives the block without being kept
        >>> sc.report.survived_bytes > 0
        True
    """
    return Scope(max_paths)
