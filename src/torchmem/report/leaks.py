"""Rendering of :class:`~torchmem.analysis.leaks.LeakReport` for people."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torchmem._format import fmt_bytes

if TYPE_CHECKING:
    from torchmem.analysis.leaks import LeakReport


def _rate(b: float) -> str:
    sign = "+" if b >= 0 else "-"
    return f"{sign}{fmt_bytes(int(abs(b)))}/step"


def render_leak_report(r: LeakReport) -> str:
    """The terminal text of a leak report: verdict, figures, then each culprit with site, holder and fix."""
    if r.leaking:
        head = (
            f"LEAK on {r.device}: {_rate(r.bytes_per_step)} over {r.steps} steps "
            f"(confidence {r.confidence:.2f}, detected at step {r.detected_at})"
        )
    elif r.stopped_at is not None:
        head = (
            f"no leak now on {r.device}: growth seen at step {r.detected_at} stopped at step {r.stopped_at} "
            f"({r.steps} steps)"
        )
    elif r.verdict == "below_threshold":
        head = f"growth below the leak threshold on {r.device} over {r.steps} steps: {r.reason}"
    elif r.verdict in ("no_steps", "too_few"):
        head = f"not enough steps to judge on {r.device}: {r.reason}"
    elif r.verdict == "noisy":
        head = f"no steady growth on {r.device} over {r.steps} steps: {r.reason}"
    else:
        head = f"no leak on {r.device} over {r.steps} steps: {r.reason}"
    lines = [head]
    if r.series:
        first, last = r.series[0][1], r.series[-1][1]
        lines.append(
            f"  {r.source} figure: {fmt_bytes(first)} at step {r.series[0][0]} -> {fmt_bytes(last)} at step "
            f"{r.series[-1][0]} (warm-up {r.warmup} steps, {r.mode} mode)"
        )
    if r.leaking:
        lines.append(f"  {r.reason}")
    elif r.stopped_at is not None and r.reason:
        lines.append(f"  now: {r.reason}")
    for i, c in enumerate(r.culprits, 1):
        lines.append(f"  [{i}] {c.kind}: {_rate(c.bytes_per_step)} born at {c.site or 'an unknown site'}")
        if c.holder:
            lines.append(f"      held by {c.holder}")
        if c.graph_bytes:
            lines.append(f"      of which autograd-saved tensors: {_rate(c.graph_bytes)}")
        for site, per in c.sites[1:4]:
            lines.append(f"      also born at {site}: {_rate(per)}")
        lines.append(f"      fix: {c.fix}")
    if r.leaking and not r.culprits:
        lines.append("  no allocation site was attributed (memory outside tensor storages, or other threads)")
    lines += [f"  note: {n}" for n in r.notes]
    return "\n".join(lines)
