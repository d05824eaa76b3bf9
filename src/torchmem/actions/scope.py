"""``torchmem.scope()``: everything a block allocated is freed at its end, except what you keep."""

from __future__ import annotations

import gc
import logging
import time
from contextlib import ExitStack
from dataclasses import replace
from types import TracebackType
from typing import Any

import torch

from torchmem._errors import TrackingError
from torchmem._format import count, fmt_bytes
from torchmem.analysis.holders.survivors import holders_of_storages
from torchmem.analysis.live import graph_tensors, tensor_parts
from torchmem.analysis.release_plan import plan_release
from torchmem.devices import _ops as ops
from torchmem.devices import ledger
from torchmem.devices._ledger import Cohort
from torchmem.results.release import Remaining, ScopeReport

_log = logging.getLogger("torchmem")


class Scope:
    """Context manager returned by :func:`scope`; ``report`` is set when the block ends."""

    def __init__(self, max_paths: int) -> None:
        self._stack: ExitStack | None = None
        self._cohort: Cohort | None = None
        self._kept: list[Any] = []
        self._kept_desc: list[str] = []  # what keep() was given, as text: outlives the objects
        self._max_paths = max_paths
        self.report: ScopeReport | None = None

    @property
    def state(self) -> str:
        """``"not entered"``, ``"active"`` (inside the block) or ``"finished"`` (``report`` is set)."""
        if self._stack is not None:
            return "active"
        return "finished" if self.report is not None else "not entered"

    def _summary(self) -> str:
        state = self.state
        parts: list[str] = []
        cohort = self._cohort
        if state == "active" and cohort is not None:
            devices = ", ".join(sorted(cohort.devices)) or "no device yet"
            parts.append(f"{fmt_bytes(cohort.born_bytes)} allocated inside so far")
        elif state == "finished" and self.report is not None:
            devices = ", ".join(self.report.devices) or "no device"
        else:
            devices = ""
        head = f"torchmem.scope {state}" + (f" ({devices})" if devices else "")
        n = len(self._kept_desc)
        if n:
            shown = ", ".join(self._kept_desc[:3]) + (", ..." if n > 3 else "")
            parts.append(f"kept {count(n, 'object')} ({shown})")
        else:
            parts.append("kept nothing")
        r = self.report
        if state == "finished" and r is not None:
            parts.append(
                f"{fmt_bytes(r.born_bytes)} allocated inside, {fmt_bytes(r.kept_bytes)} kept, "
                f"{fmt_bytes(r.survived_bytes)} still alive without being kept"
                + (f" in {count(len(r.survivors), 'storage')}" if r.survivors else "")
            )
            if r.errors:
                parts.append(count(len(r.errors), "error"))
        return f"{head}: " + "; ".join(parts)

    def __repr__(self) -> str:
        """One line: state, devices, what was kept and, once finished, the figures.

        Example:
            >>> import torchmem
            >>> torchmem.scope()
            <torchmem.scope not entered: kept nothing>
        """
        return f"<{self._summary()}>"

    def __str__(self) -> str:
        """The one-line summary; once finished, followed by what survived and who holds it."""
        if self.state == "finished" and self.report is not None:
            lines = str(self.report).splitlines()[1:]  # the report's first line repeats the figures
            return "\n".join([self._summary(), *lines])
        return self._summary()

    def keep(self, *objs: Any) -> Any:
        """Mark objects as the block's results: their tensors are expected to outlive it.

        What a kept tensor's autograd graph saved for backward (and the leaves it accumulates into) counts
        as kept too: ``sc.keep(loss)`` keeps the activations ``loss.backward()`` will need.

        Returns the single object passed (or the tuple), so ``out = sc.keep(model(x))`` reads naturally.
        """
        self._kept.extend(objs)
        self._kept_desc.extend(_describe_kept(o) for o in objs)
        return objs[0] if len(objs) == 1 else objs

    def __enter__(self) -> Scope:
        if self._stack is not None:
            raise TrackingError("This scope() is already open.", "Use a new torchmem.scope() for each block.")
        stack = ExitStack()
        led = stack.enter_context(ledger().enabled())
        self._cohort = led.open_cohort(None)
        self._stack = stack
        if self.report is not None:  # entered again: what the previous block kept is gone
            self._kept_desc = [_describe_kept(o) for o in self._kept]
        self.report = None
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        t0 = time.perf_counter()
        stack, self._stack = self._stack, None
        cohort, self._cohort = self._cohort, None
        if stack is None or cohort is None:
            raise TrackingError(
                "scope() exited without being entered.", "Use it as `with torchmem.scope():`."
            )
        errors: list[str] = []
        try:
            self.report = self._finish(cohort, errors, t0)
        except Exception as exc:  # a step without its own guard: the ledger still goes off below
            errors.append(_failed("the end-of-block work", exc))
            self.report = ScopeReport(
                cohort.born_bytes, 0, 0, 0, (), time.perf_counter() - t0, _names(cohort), tuple(errors)
            )
        finally:
            self._kept.clear()
            ledger().close_cohort(cohort)
            try:
                stack.close()
            except Exception as exc:
                errors.append(_failed("turning the ledger off", exc))
        if self.report is not None and len(errors) > len(self.report.errors):
            self.report = replace(self.report, errors=tuple(errors))
        # Returns None: the block's own exception, if any, propagates unchanged.

    def _finish(self, cohort: Cohort, errors: list[str], t0: float) -> ScopeReport:
        led = ledger()
        collected = 0
        try:
            collected = gc.collect()
        except Exception as exc:
            errors.append(_failed("gc.collect()", exc))
        led.close_cohort(cohort)
        kept_keys: set[int] = set()
        if self._kept:
            try:
                _kept_storages(self._kept, kept_keys)
            except Exception as exc:
                errors.append(_failed("finding the tensors of the kept objects", exc))
        alive = led.cohort_storages(cohort)
        kept = [s for s in alive if s._cdata in kept_keys]
        loose = [s for s in alive if s._cdata not in kept_keys]
        alive.clear()
        paths: list[tuple[str, ...]] = []
        try:
            paths = holders_of_storages(loose, max_paths=self._max_paths)
        except Exception as exc:
            errors.append(_failed("the holder search", exc))
        paths += [()] * (len(loose) - len(paths))
        survivors = [
            Remaining(_describe(s), str(s.device), int(s.nbytes()), "not kept", p)
            for s, p in zip(loose, paths)
        ]
        kept_bytes = sum(int(s.nbytes()) for s in kept)
        kept.clear()
        loose.clear()
        # Every device the block allocated on, including those where nothing survived.
        for label in _names(cohort):
            try:
                d = torch.device(label)
                ops.synchronize(d)
                ops.empty_cache(d)
            except Exception as exc:
                errors.append(_failed(f"emptying the cache of {label}", exc))
        return ScopeReport(
            born_bytes=cohort.born_bytes,
            kept_bytes=kept_bytes,
            survived_bytes=sum(r.bytes for r in survivors),
            collected=collected,
            survivors=tuple(survivors),
            seconds=time.perf_counter() - t0,
            devices=_names(cohort),
            errors=tuple(errors),
        )


def _names(cohort: Cohort) -> tuple[str, ...]:
    return tuple(sorted(cohort.devices))


def _failed(step: str, exc: BaseException) -> str:
    msg = f"{step} failed: {type(exc).__name__}: {exc}"
    _log.warning("torchmem.scope(): %s", msg)
    return msg


def _kept_storages(kept: list[Any], keys: set[int]) -> None:
    """Storage keys of every tensor the kept objects hold, and of what their autograd graphs hold."""
    plan = plan_release(kept)
    roots: list[torch.Tensor] = []
    for pt in plan.tensors.values():
        for _, _, key in tensor_parts(pt.tensor) or ():
            keys.add(key)
        if pt.tensor.grad_fn is not None:
            roots.append(pt.tensor)
    plan.tensors.clear()
    for _, t in graph_tensors(roots):
        for _, _, key in tensor_parts(t) or ():
            keys.add(key)
    roots.clear()


def _describe_kept(obj: Any) -> str:
    """A short label of a kept object that holds no reference to it: ``"tensor float32[8, 4]"``."""
    if isinstance(obj, torch.Tensor):
        return f"tensor {str(obj.dtype).replace('torch.', '')}[{', '.join(str(d) for d in obj.shape)}]"
    if isinstance(obj, (list, tuple, dict, set)):
        n = len(obj)
        return f"{type(obj).__name__} of {count(n, 'item')}"
    return type(obj).__name__


def _describe(storage: Any) -> str:
    return f"storage of {int(storage.nbytes())} bytes"


def scope(*, max_paths: int = 4) -> Scope:
    """Run a block whose allocations are freed at its end, and be told about anything that was not.

    At the end of the block torchmem collects garbage once (cycles included) and empties the cache of every
    device the block allocated on; every tensor storage created inside that is still alive and does not
    belong to an object passed to :meth:`Scope.keep` (or to the autograd graph of a kept tensor) is listed in
    ``report.survivors`` with the paths of whoever holds it — the list you append losses to, a cache, a
    global. Counting uses the exact storage ledger (~15 µs per op inside the block, see docs/release.md).
    The end-of-block work never raises into the program: a step that fails is listed in ``report.errors``,
    the ledger is turned off regardless, and an exception raised by the block itself propagates unchanged.

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
