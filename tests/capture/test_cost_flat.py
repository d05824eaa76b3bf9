"""The per-step work of ``torchmem.watch()`` does not grow with the number of steps (issue 29): counted, not
timed.

Two counts over a real loop on the CPU (a tiny training step that also keeps 2,560 bytes per step: growth
under ``min_bytes_per_step``, so the growth tests' pre-checks keep passing and the detector's fits run,
which a flat loop would skip):

- **lines of torchmem's code executed per step** (``sys.settrace``, line events in torchmem's frames only):
  a list re-scanned, a series re-fitted from scratch or a pairwise fit over every reading so far runs its
  Python loop once per element, so the lines per step would rise with the run. The mean over the last
  500 steps of a 6,000-step run must stay within the mean over 500 steps near its start (after the warm-up).
- **readings kept**: the elements of every list, deque, dict and set reachable from the watcher through
  torchmem's own objects. They must stay bounded (the report's series is thinned past 4,096 readings, the
  detector keeps its last 32), far below the number of steps.

The same counts cover ``torchmem run``'s per-step work (a session's watcher, loop survivors, host watcher and
step records). Both can fail, and two tests show it on the same loop: a watcher that judges its whole series
again at each step (a series re-fitted from scratch at every reading, the shape issue 29 suspected) fails
the first check, a detector whose window keeps every reading fails the second. C-level work over a
container (``min()``, ``list(deque)``) is not a line event; it is bounded because every container the
watcher keeps is bounded (the second count).
"""

from __future__ import annotations

import collections
import statistics
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import torchmem
from torchmem.capture import watch_verdict
from torchmem.capture.watch import Watcher
from torchmem.run.session import Session

# Long enough that a series kept whole (never thinned past 4,096 readings) breaks the bound on the readings
# kept (4,096 + 1,024; the session's 4,096 + 2,048), and that the last 500 steps come 4,800 or more after
# the first 500 compared (a per-step cost that rose with the run would be several times higher there)
STEPS = 6_000
SESSION_STEPS = 7_000
KEEP_FLOATS = 640  # 2,560 bytes kept per step: growth under the threshold below
MIN_BYTES = 4096


class LineCounter:
    """Counts the line events of torchmem's own code run inside :meth:`wrap`'s calls (the watcher's step
    work; the exact accounting's per-op work between steps is not in it) while :attr:`on`: the loops turn
    it on for the steps :func:`early_late` compares (tracing every line of every step costs ~5x the step;
    the steps between the two windows run as they would untraced)."""

    def __init__(self) -> None:
        self.lines = 0
        self.on = True

    def _global(self, frame: types.FrameType, event: str, arg: Any) -> Any:
        name = frame.f_code.co_filename
        if "torchmem" in name and "/tests/" not in name:
            return self._local
        return None

    def _local(self, frame: types.FrameType, event: str, arg: Any) -> Any:
        if event == "line":
            self.lines += 1
        return self._local

    def wrap(self, fn: Callable[[], None]) -> Callable[[], None]:
        def counted() -> None:
            if not self.on:
                fn()
                return
            old = sys.gettrace()
            sys.settrace(self._global)
            try:
                fn()
            finally:
                sys.settrace(old)

        return counted


def kept_elements(root: object) -> int:
    """Elements of the (mutable) containers reachable from ``root`` through torchmem's objects (their
    ``__dict__`` and slots) and plain containers; functions, modules, tensors and other libraries' objects
    are not entered (the ledger's table of the program's live storages is the program's memory)."""
    seen: set[int] = set()
    total = 0
    todo: list[object] = [root]
    containers = (list, tuple, dict, set, frozenset, collections.deque)
    while todo:
        o = todo.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        if isinstance(o, containers):
            if not isinstance(
                o, tuple
            ):  # a tuple is one record (a reading's (step, value)): its container counts it
                total += len(o)
            items: Any = list(o.items()) if isinstance(o, dict) else list(o)
            for x in items:
                todo.append(x)
            continue
        mod = type(o).__module__ or ""
        if not mod.startswith("torchmem.") or isinstance(o, type):
            continue
        d = getattr(o, "__dict__", None)
        if d is not None:
            todo.extend(d.values())
        for cls in type(o).__mro__:
            for slot in getattr(cls, "__slots__", ()):
                v = getattr(o, slot, None)
                if v is not None:
                    todo.append(v)
    return total


def run_counted(
    source: str, steps: int = STEPS, keep: int = KEEP_FLOATS
) -> tuple[list[int], int, torchmem.Watcher[Any]]:
    """Lines of torchmem's code per step and the elements kept at the end, for ``steps`` steps of a tiny
    training loop that keeps ``keep`` floats per step (2,560 bytes), read at every step (``stride=1``: the
    most work per step; a chosen stride reads a loop this short rarely)."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(lin.parameters(), lr=1e-3)
    x = torch.randn(2, 8)
    kept: list[torch.Tensor] = []
    per_step: list[int] = []
    w = torchmem.watch(
        range(steps), device="cpu", warn=False, source=source, min_bytes_per_step=MIN_BYTES, stride=1
    )
    c = LineCounter()
    w.step = c.wrap(w.step)  # type: ignore[method-assign]  # the iterator calls self.step() at each boundary
    counted = compared(steps)
    c.on = counted(0)
    last = 0
    for i, _ in enumerate(w):
        opt.zero_grad(set_to_none=True)
        lin(x).sum().backward()
        opt.step()
        kept.append(torch.zeros(keep))
        per_step.append(c.lines - last)  # the watcher's work at the boundary before this step
        last = c.lines
        c.on = counted(i + 1)  # the boundary before the next step is in the iterator's next()
    elements = kept_elements(w)
    kept.clear()
    return per_step, elements, w


def _window(steps: int) -> int:
    # 500 steps: ~31 verdicts (one per 16 readings) in each window, traced (~5x a step's time)
    return min(500, steps // 4)


def compared(steps: int) -> Callable[[int], bool]:
    """Whether step ``i`` of a run of ``steps`` is in one of the two windows :func:`early_late` compares."""
    m = _window(steps)
    return lambda i: 200 <= i < 200 + m or steps - m <= i < steps


def early_late(per_step: list[int]) -> tuple[float, float]:
    """Mean lines per step over ``m`` steps from step 201 (after the warm-up and the start) and over the
    last ``m`` (``m``: 500, or a quarter of a shorter run)."""
    m = _window(len(per_step))
    return statistics.fmean(per_step[200 : 200 + m]), statistics.fmean(per_step[-m:])


@pytest.mark.parametrize(("source", "steps"), [("heap", STEPS), ("ledger", 3000)])
def test_per_step_work_and_kept_readings_do_not_grow_with_the_run(source: str, steps: int) -> None:
    """The C heap as the figure (``watch()``'s and ``torchmem run``'s on the CPU) over 6,000 steps; the
    exact accounting (``source="ledger"``) over 3,000 (its steps are several times slower)."""
    per_step, elements, w = run_counted(source, steps)
    assert w.steps == steps
    r = w.report()
    assert not r.leaking  # growth under the threshold: the detector's fits ran, nothing was reported
    early, late = early_late(per_step)
    assert early > 0
    assert late <= 1.2 * early + 2, (early, late)
    # bounded readings: the series (<= 4,096), the detector's windows (32 each), the schedule's timings
    assert elements <= 4096 + 1024, elements
    assert len(r.series) <= 4096


def test_the_counts_see_a_verdict_re_judged_over_the_series_at_each_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first check can fail: a watcher that judges its whole series again at every step (its verdict,
    with the inner-loop test over every reading kept, as :meth:`Watcher.report` does) makes the lines per
    step rise with the run."""
    step = Watcher._step

    def judged_each_step(self: Watcher[Any]) -> None:
        step(self)
        self.report()

    monkeypatch.setattr(Watcher, "_step", judged_each_step)
    per_step, _, _ = run_counted("heap", steps=1600)
    early, late = early_late(per_step)
    assert late > 1.2 * early + 2, (early, late)


def test_the_counts_see_a_detector_that_keeps_every_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    """The second check can fail: a detector whose window is the whole run (every reading kept and copied
    at each reading) keeps readings in proportion to the steps."""
    monkeypatch.setattr(watch_verdict, "WINDOW_READINGS", 10**9)
    _, elements, _ = run_counted("heap", steps=3000, keep=0)  # (no growth: the detector's fits do not run)
    assert elements > 2 * 2900, elements


def test_torchmem_runs_per_step_work_does_not_grow_with_the_run(tmp_path: Path) -> None:
    """``torchmem run``'s per-step work (a :class:`~torchmem.run.session.Session`: the device watcher on the
    C heap, the loop survivors, the host watcher, the step records), counted the same way over 7,000
    optimizer steps of the same loop; the sampler's thread is not counted (its ticks are spaced by their
    cost, ``benchmarks/sampler_cost.py``)."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(lin.parameters(), lr=1e-3)
    x = torch.randn(2, 8)
    kept: list[torch.Tensor] = []
    session = Session(str(tmp_path / "run.jsonl"), device="cpu", status=False, argv=["loop.py"])
    session.start()
    c = LineCounter()
    session._step_work = c.wrap(session._step_work)  # type: ignore[method-assign]  # Session.step calls it
    per_step: list[int] = []
    counted = compared(SESSION_STEPS)
    last = 0
    try:
        for i in range(SESSION_STEPS):
            c.on = counted(i)
            opt.zero_grad(set_to_none=True)
            lin(x).sum().backward()
            opt.step()  # the step boundary
            kept.append(torch.zeros(KEEP_FLOATS))
            per_step.append(c.lines - last)
            last = c.lines
        elements = kept_elements(session)
    finally:
        result = session.finish(0, "exit")
    kept.clear()
    assert result.steps == SESSION_STEPS
    early, late = early_late(per_step)
    assert early > 0
    assert late <= 1.2 * early + 2, (early, late)
    assert elements <= 4096 + 2048, elements
