"""``torchmem run --modules``: one step profiled per module, from the end of step 1 to the end of step 2,
written as the ``modules`` record."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


class ModuleProfile:
    """The ``--modules`` profile of a session writing to ``records`` (its
    :class:`~torchmem.run.records.Records`): call :meth:`step` at each step until :attr:`done`."""

    def __init__(self, records: Any) -> None:
        self._records = records
        self._profiler: Any = None
        self._done = False

    @property
    def done(self) -> bool:
        return self._done

    def step(self, steps: int, device: torch.device, last_optimizer: Callable[[], Any]) -> None:
        """A step ended (``steps`` so far): the profile starts after the first and ends after the second."""
        try:
            from torchmem.capture.profile import profile
        except ImportError:  # pragma: no cover - the profile module ships with torchmem
            self._done = True
            return
        if self._profiler is None:
            if steps < 1:
                return
            model = _largest_module()
            if model is None:
                self._records.note("--modules: no nn.Module with parameters was found to profile")
                self._done = True
                return
            last = last_optimizer()
            opt = last if isinstance(last, torch.optim.Optimizer) else None
            self._profiler = profile(model, device=device, optimizer=opt)
            self._profiler.__enter__()
            return
        prof, self._profiler = self._profiler, None
        self._done = True
        prof.__exit__(None, None, None)
        rep = prof.report()
        # The capture's "modules" record keeps its documented columns (ROW_KEYS), one row per module.
        self._records.record("modules", rows=[r.to_row() for r in rep.rows], notes=list(rep.notes))

    def finish(self) -> None:
        """The program ended inside the profiled step: the profiler's hooks are removed."""
        if self._profiler is not None:
            try:
                self._profiler.__exit__(None, None, None)
            except Exception as e:
                self._records.note(f"--modules: the profile could not be finished ({type(e).__name__}: {e})")
            self._profiler = None


def _largest_module() -> torch.nn.Module | None:
    """The top-level nn.Module with the most parameters among live objects (the model being trained)."""
    import gc

    module_t = torch.nn.Module
    # type() rather than isinstance(): some objects warn or raise when __class__ is read.
    mods = [o for o in gc.get_objects() if issubclass(type(o), module_t)]
    children = {id(c) for m in mods for c in m.children()}
    tops = [m for m in mods if id(m) not in children]
    best: tuple[int, torch.nn.Module] | None = None
    for m in tops:
        n = sum(p.numel() for p in m.parameters())
        if n and (best is None or n > best[0]):
            best = (n, m)
    return best[1] if best else None
