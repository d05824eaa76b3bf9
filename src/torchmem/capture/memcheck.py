"""Check one callable's memory: what it leaves allocated, whether it grows across repeated calls, its peak.

What the pytest plugin (:mod:`torchmem.integrations.pytest_plugin`) runs around a test, and what its fixture
offers: the callable runs ``repeat`` times under :class:`~torchmem.capture.survivors.LoopSurvivors` (the
exact tensor accounting with birth sites, every call recorded) and, when a peak limit is given, under
:func:`~torchmem.track`. After the calls (and a ``gc.collect()``), the tensor storages born in the calls and
still alive are grouped by allocation site and holder:

- one call: more than ``max_leak`` bytes left alive fails (``"left"``);
- several calls: what the calls after the first keep, per call, over ``max_leak`` fails (``"grows"``): a
  first call that builds a cache is not a leak, every call adding to it is;
- ``max_peak``: the peak above the memory at the start, over the limit, fails (``"peak"``).

Works on any device: the CPU through the exact accounting (no allocator needed), CUDA the same way, plus the
allocator's figures for the peak.

Example:
    >>> import torch
    >>> from torchmem.capture.memcheck import check_calls
    >>> kept = []
    >>> r = check_calls(lambda: kept.append(torch.ones(1024, 1024)), device="cpu", repeat=3, max_leak=1024)
    >>> r.failed, r.kind, r.per_call
    (True, 'grows', 4194304)
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torchmem._format import fmt_bytes
from torchmem.devices import DeviceLike, resolve
from torchmem.results.survivors import SurvivorReport


@dataclass(frozen=True)
class MemCheck:
    """The outcome of :func:`check_calls`.

    Attributes:
        device: The device checked.
        calls: How many calls ran.
        failed: Whether a limit was exceeded.
        kind: ``"left"``, ``"grows"``, ``"peak"`` or ``""`` (passed).
        left: Bytes born in the calls and alive after them.
        per_call: Of those, the bytes per call the calls after the first keep (0 for a single call).
        peak: The peak above the start while the calls ran (``None`` without ``max_peak``).
        survivors: What is alive, by allocation site and holder, with the fix.
        message: The failure message (``""`` when it passed).
    """

    device: str
    calls: int
    failed: bool
    kind: str
    left: int
    per_call: int
    peak: int | None
    survivors: SurvivorReport | None
    message: str


def check_calls(
    fn: Callable[[], Any],
    *,
    device: DeviceLike = None,
    repeat: int = 1,
    max_leak: int = 0,
    max_peak: int | None = None,
    name: str = "the call",
) -> MemCheck:
    """Run ``fn`` ``repeat`` times and check what it leaves allocated, its growth per call and its peak.

    An exception from ``fn`` propagates (after the accounting is turned off): the test fails as it would.

    Args:
        fn: What to run (no arguments).
        device: The device whose tensors are counted (default: the current accelerator, else the CPU).
        repeat: How many times to call it (>= 1).
        max_leak: Bytes a single call may leave alive, or, with ``repeat > 1``, the bytes per call the calls
            after the first may keep.
        max_peak: Bytes above the starting figure the calls may reach at their peak (``None``: unchecked).
        name: How the message names ``fn``.
    """
    from torchmem.capture.survivors import LoopSurvivors

    if not isinstance(repeat, int) or isinstance(repeat, bool) or repeat < 1:
        raise ValueError(f"repeat must be a positive integer, not {repeat!r}")
    if max_leak < 0 or (max_peak is not None and max_peak < 0):
        raise ValueError("max_leak and max_peak must be >= 0")
    dev = resolve(device)
    label = str(dev)
    gc.collect()
    rec = LoopSurvivors(label, steps=repeat, min_bytes_per_step=max(1, max_leak), budget=float("inf"))
    tracker: Any = None
    if max_peak is not None:
        from torchmem.capture.track import track

        tracker = track(dev, survivors=False, peak=True)
        tracker.__enter__()
    try:
        rec.boundary(1)  # the recording starts here: each call is one recorded step
        for i in range(repeat):
            fn()
            gc.collect()
            rec.boundary(i + 2)
    finally:
        rec.stop()
        if tracker is not None:
            tracker.__exit__(None, None, None)
    report: SurvivorReport = rec.report(total_steps=repeat + 1, boundary="call")
    left = report.live_bytes
    # Growth: the sites whose storages from every call (after the first) stay alive; a bounded cache
    # ("recent"), state built once ("once") and the last call's result are not growth.
    growing = [g for g in report.groups if g.accumulates]
    later = sum(g.live_bytes * sum(1 for s in g.steps if s > 2) / max(len(g.steps), 1) for g in growing)
    per_call = int(later / (repeat - 1)) if repeat > 1 else 0
    peak = None
    if tracker is not None:
        result = tracker.result
        peak = None if result is None else result.peak_delta
    kind, message = "", ""
    calls = f"{repeat} calls" if repeat > 1 else "one call"
    if repeat > 1 and per_call > max_leak:
        kind = "grows"
        message = (
            f"torchmem: {name} grows memory on {label} by {fmt_bytes(per_call)} per call over {calls} "
            f"(max_leak {fmt_bytes(max_leak)} per call):\n{report}"
        )
    elif repeat == 1 and left > max_leak:
        kind = "left"
        limit = fmt_bytes(max_leak)
        message = f"torchmem: {name} left {fmt_bytes(left)} allocated on {label} (max_leak {limit}):\n"
        message += "\n".join(left_lines(report))
    elif max_peak is not None and peak is not None and peak > max_peak:
        kind = "peak"
        message = (
            f"torchmem: {name} peaked at {fmt_bytes(peak)} above its start on {label} over {calls} "
            f"(max_peak {fmt_bytes(max_peak)})"
        )
    return MemCheck(label, repeat, bool(kind), kind, left, per_call, peak, report, message)


def left_lines(report: SurvivorReport, fix: bool = True) -> list[str]:
    """What one call left alive, by allocation site, with the holders (the loop verdicts do not apply)."""
    out = []
    for i, g in enumerate(report.groups, 1):
        word = "storage" if g.count == 1 else "storages"
        out.append(f"  [{i}] {g.where}: {g.count} {word}, {fmt_bytes(g.live_bytes)} still alive")
        out += [f"      held by {h}" for h in g.holders[:3]]
    if fix:
        out.append(
            "  fix: free what the call made before it returns (`del`, or keep `.item()`/`.detach().cpu()` "
            "copies), clear caches it fills, or raise max_leak for state it must keep"
        )
    out += [f"  note: {n}" for n in report.notes if "holder search" in n]
    return out


__all__ = ["MemCheck", "check_calls", "left_lines"]
