"""What the framework callbacks share: a leak watch per loop (training, validation), the per-step figures and
the rule that an integration's error never stops training (logged once, then the integration switches off).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

import torch

from torchmem._format import fmt_bytes

_log = logging.getLogger("torchmem")


class LoopWatch:
    """One loop's leak watch: a :func:`torchmem.watch` whose steps are the loop's batches. On the CPU the
    figure is the C heap (as under ``torchmem run``): cheap, and it counts autograd graphs too."""

    def __init__(self, name: str, device: torch.device, warmup: int, min_bytes_per_step: int) -> None:
        from torchmem.capture.watch import watch

        self.name = name
        source = "heap" if device.type == "cpu" else "auto"
        w: Any = watch(
            device=device, warn=False, warmup=warmup, min_bytes_per_step=min_bytes_per_step, source=source
        )
        w._exclusive = False  # a user's own torchmem.watch() on the device stays possible
        w.__enter__()
        self.watcher = w

    def step(self) -> None:
        self.watcher.step()

    def stop(self) -> Any:
        self.watcher.stop()
        return self.watcher.report()


class StepPeaks:
    """The true peak of each training step on CUDA, without taking torch's peak counters from the program:
    :meth:`lap` at each step's end returns the highest allocated bytes since the previous lap (exact; torch's
    ``max_memory_allocated()`` and the program's own ``reset_peak_memory_stats()`` keep their meaning), and
    :meth:`since_log` the highest step peak since the previous call. Nothing on other device kinds."""

    def __init__(self, device: torch.device) -> None:
        from torchmem.devices import backend

        self._be = backend(device) if device.type == "cuda" else None
        self._token: int | None = None
        self._max: int | None = None

    def lap(self) -> int | None:
        be = self._be
        if be is None:
            return None
        peak = None
        if self._token is None:
            self._token = be.open_peak()
        else:
            got = be.restart_peak(self._token)
            peak = None if got is None else got[0]
        if peak is not None:
            self._max = peak if self._max is None else max(self._max, peak)
        return peak

    def since_log(self) -> int | None:
        out, self._max = self._max, None
        return out

    def close(self) -> None:
        if self._be is not None and self._token is not None:
            self._be.close_peak(self._token)
            self._token = None


def figures(device: torch.device, peaks: StepPeaks | None = None) -> dict[str, float]:
    """The per-step figures, in bytes: allocated, reserved, the allocator's peak (the program's view:
    torchmem never takes it away), the highest true step peak since the previous log (``step_peak``, from
    ``peaks``) and the process's RSS; on the CPU the C heap in use stands for allocated."""
    from torchmem.capture.read import counters
    from torchmem.devices._host import heap_in_use, process_rss

    out: dict[str, float] = {}
    if device.type == "cpu":
        heap = heap_in_use()
        if heap is not None:
            out["heap"] = float(heap)
    else:
        r = counters(device)
        for key, v in (
            ("allocated", r.allocated),
            ("reserved", r.reserved),
            ("peak_allocated", r.peak_allocated),
        ):
            if v is not None:
                out[key] = float(v)
        step = None if peaks is None else peaks.since_log()
        if step is not None:
            out["step_peak"] = float(step)
    rss = process_rss()
    if rss is not None:
        out["host_rss"] = float(rss)
    return out


class Guard:
    """Runs a callback's work; the first error is logged once with what was switched off, and the
    integration does nothing after it (training goes on)."""

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.off = False
        self.error: str | None = None

    def run(self, what: str, fn: Callable[[], Any]) -> Any:
        if self.off:
            return None
        try:
            return fn()
        except Exception as exc:  # never stop the user's training
            self.off = True
            self.error = f"{what}: {type(exc).__name__}: {exc}"
            _log.warning(
                "torchmem: %s failed in %s (%s); it is off for the rest of the run", self.owner, what, exc
            )
            return None


def stop_all(loops: dict[str, LoopWatch], reports: dict[str, Any], guard: Guard) -> None:
    """Stop every loop's watch, keeping its report; stopped even after an error (no watcher outlives the
    run): a failure to stop is the guard's error, once."""
    for name, w in loops.items():
        try:
            reports[name] = w.stop()
        except Exception as exc:
            if not guard.off:
                guard.off = True
                guard.error = f"stopping the {name} watch: {type(exc).__name__}: {exc}"


def summary_lines(reports: dict[str, Any]) -> list[str]:
    """One block per loop: the leak verdict and, when it leaks, the culprits with their fixes."""
    lines = []
    for loop, rep in reports.items():
        if rep is None:
            continue
        head = str(rep).splitlines()
        lines.append(f"torchmem [{loop} loop]: {head[0] if head else ''}")
        if rep.leaking:
            lines += ["  " + x for x in head[1:]]
    return lines


def print_summary(reports: dict[str, Any], capture: str | None = None) -> None:
    lines = summary_lines(reports)
    if capture:
        lines.append(f"torchmem: capture {capture}")
    if lines:
        print("\n".join(lines), file=sys.stderr)


def oom_text(exc: BaseException) -> str | None:
    """The diagnosis of an out-of-memory error (``None`` for any other error)."""
    from torchmem.analysis.oom import is_oom
    from torchmem.capture.oom import explain_oom

    if not is_oom(exc):
        return None
    return str(explain_oom(exc))


def fmt_figures(f: dict[str, float]) -> str:
    return ", ".join(f"{k} {fmt_bytes(int(v))}" for k, v in f.items())


__all__ = [
    "Guard",
    "LoopWatch",
    "StepPeaks",
    "figures",
    "oom_text",
    "print_summary",
    "stop_all",
    "summary_lines",
]
