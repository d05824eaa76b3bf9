"""The end-of-run summary ``torchmem run`` prints on stderr: steps, peak, how the program ended, the leak
verdict and its forecast, the loop's survivors, host memory, child processes, OOMs, GPUs, torchmem's cost."""

from __future__ import annotations

import shlex
from typing import Any, TextIO


def _ended(reason: str, exit_code: int | None) -> str:
    if reason == "signal" and exit_code is not None and exit_code < 0:
        from torchmem.results.ranks import signal_name

        return signal_name(-exit_code)  # "ended by SIGTERM (exit code -15)"
    return reason


def _device_unused(result: Any) -> str | None:
    """The GPU watched when the program never allocated on it (a CPU program on a GPU machine), else
    ``None``."""
    leak = result.leak
    device = str(getattr(leak, "device", "") or "")
    if not device.startswith("cuda") or result.peak_allocated != 0 or result.peak_reserved not in (0, None):
        return None
    return device


def print_summary(result: Any, err: TextIO) -> None:
    """The summary of a session's result (a :class:`~torchmem.run.session.SessionResult`), on ``err``."""
    from torchmem._format import fmt_bytes

    lines = [
        f"torchmem: {result.steps} steps in {result.seconds:.1f} s, peak allocated "
        f"{fmt_bytes(result.peak_allocated)}"
        + (f", peak reserved {fmt_bytes(result.peak_reserved)}" if result.peak_reserved is not None else "")
        + f"; ended by {_ended(result.reason, result.exit_code)}"
        + (f" (exit code {result.exit_code})" if result.exit_code else "")
    ]
    leak = result.leak
    no_steps = getattr(result, "no_steps", None)
    children = getattr(result, "children", ())
    if leak is not None and (leak.leaking or leak.detected_at is not None or result.steps):
        lines.append(str(leak))
    forecast = getattr(result, "forecast", None)
    if forecast is not None:
        lines.append(f"  forecast: {forecast}")
    survivors = getattr(result, "survivors", None)
    if survivors is not None and survivors.leaking and not (leak is not None and leak.leaking):
        lines.append(str(survivors))  # a loop too short for a verdict, whose leak is still named
    host = getattr(result, "host_leak", None)
    if host is not None and (host.leaking or host.stopped_at is not None or host.verdict == "gathered"):
        lines.append(str(host))
    unused = _device_unused(result)
    if unused:
        quiet = host is not None and not (host.leaking or host.stopped_at is not None)
        lines.append(
            f"note: the program allocated nothing on {unused} (its tensors are on the CPU)"
            + (f"; host memory: {str(host).splitlines()[0]}" if quiet else "")
        )
    if no_steps:
        from torchmem.results.leaks import no_steps_text

        lines.append(no_steps_text(leak, no_steps))
    followed = tuple(getattr(result, "child_captures", ()) or ())
    if followed and not no_steps:
        lines.append(
            f"note: the program started {len(children)} process{'es' if len(children) > 1 else ''} "
            f"({', '.join(children[:3])}); {len(followed)} recorded their own capture: "
            f"{', '.join(followed[:4])}{', ...' if len(followed) > 4 else ''}; merged: "
            f"{shlex.join(['torchmem', 'report', *[result.capture, *followed][:6]])}"
        )
    elif children and not no_steps:
        lines.append(
            f"note: the program started {len(children)} process{'es' if len(children) > 1 else ''} "
            f"({', '.join(children[:3])}); "
            "their memory is not in this capture."
        )
    caught = list(getattr(result, "caught_ooms", ()))
    if caught:
        # The most telling one: a retry that ran out of memory while the failed attempt was still alive.
        shown = next((e for e in caught if e.kind == "pinned_by_exception"), caught[0])
        sites = sorted({e.site for e in caught if e.site})
        lines.append(
            f"{len(caught)} out-of-memory error{'s' if len(caught) > 1 else ''} caught by the program"
            + (f" (raised at {', '.join(sites[:3])})" if sites else "")
            + f"; OOM #{shown.index} at {shown.site or 'an unknown line'}:"
        )
        if shown.diagnosis is not None:
            lines.extend("  " + x for x in str(shown.diagnosis).splitlines())
        if len(caught) > 1:
            lines.append(
                f"  every one is in the capture: {shlex.join(['torchmem', 'report', result.capture])}"
            )
    if result.oom is not None:
        lines.append(str(result.oom))
    gpus = getattr(result, "gpus", None)
    if gpus is not None and (gpus.several or gpus.findings or gpus.children):
        lines.extend(gpus.lines())
    overhead = getattr(result, "overhead", None)
    if overhead:
        lines.append(f"note: {overhead}")
    again = shlex.join(["torchmem", "report", result.capture, "--html", "report.html"])
    lines.append(f"capture: {result.capture}  ({again})")
    print("\n".join(lines), file=err)
