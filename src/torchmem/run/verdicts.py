"""The end-of-run verdicts of a session, from what its parts recorded: the leak named when the watcher
could not name it, the loop's survivors beside a growth verdict, the host-memory verdict's policy, and when
the memory runs out at the leak's rate."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Iterable
from typing import Any

import torch

from torchmem._format import fmt_bytes
from torchmem.results.leaks import LeakReport
from torchmem.run.timeline import timeline_culprits

# Host growth that names no culprit (no growing autograd chain, no accumulating Python objects) is data the
# program keeps on purpose (predicted labels, a history of numbers) unless it is as large as a device leak.
_HOST_UNEXPLAINED_MIN = 256 * 1024


def labelled(rep: LeakReport, label: str, switches: tuple[str, ...] | None = None) -> LeakReport:
    """A report with the step boundary it was fed (``label``) and the switches between boundaries (notes
    put first; ``None``: the notes are left as they are)."""
    if switches is None:
        return dataclasses.replace(rep, boundary=label)
    return dataclasses.replace(rep, boundary=label, notes=tuple(switches) + tuple(rep.notes))


def named(
    leak: LeakReport,
    survivors: Any,
    device: torch.device,
    born_before: set[int],
    carried: frozenset[str] = frozenset(),
    backward: bool | None = None,
) -> LeakReport:
    """A leak the watcher found with no culprit (it was found in the last steps, or in a short run, before
    the exact ledger could attribute it): name it from what the loop's recorded steps allocated and still
    hold (allocation site and holder), else from the tensors born during the run that are still alive
    (holder only; ``born_before``: the storages alive when the program started). The note says what the
    naming rests on."""
    if not leak.leaking or leak.culprits:
        return leak
    from torchmem.analysis.leaks import attribute
    from torchmem.results.leaks import SiteGrowth

    unit = "s" if leak.boundary == "second" else "step"
    rate = leak.bytes_per_step
    facts: list[SiteGrowth] = []
    note = ""
    groups = [g for g in getattr(survivors, "groups", ()) if g.live_bytes > 0 and g.holders]
    if groups:
        big = max(g.live_bytes for g in groups)
        # the groups that matter at this rate: the largest, and any within 1/8 of it
        chosen = [g for g in groups if g.live_bytes >= big / 8]
        total = sum(g.live_bytes for g in chosen) or 1
        for g in chosen:
            share = rate * g.live_bytes / total
            facts.append(SiteGrowth(g.site, share, g.live_bytes, g.count, 1.0, tuple(g.holders)))
        from torchmem.results.survivors import step_ranges

        covered = step_ranges(tuple(getattr(survivors, "covered", ()) or ()))
        note = (
            f"named from what the loop's recorded steps ({covered}) allocated and still hold: the growth "
            "was found from the readings, after the exact ledger's window"
        )
    else:
        try:
            grown = rate * max(1, leak.steps - leak.warmup) if unit == "step" else None
            culprits, _ = timeline_culprits(device, born_before, rate, unit, backward, grown)
        except Exception:
            culprits = ()
        if culprits:
            return dataclasses.replace(
                leak,
                culprits=culprits,
                notes=(
                    *leak.notes,
                    "named from the tensors born during the run that are still alive "
                    "(no allocation site: the exact ledger did not record these steps)",
                ),
            )
        return leak
    culprits = attribute(
        facts, min_bytes_per_step=0.0, unit=unit, device=str(device), carried=carried, backward=backward
    )
    if not culprits:
        return leak
    return dataclasses.replace(leak, culprits=culprits, notes=(*leak.notes, note))


# torch.optim.LBFGS's curvature history: per parameter group, ``history_size`` pairs at most (it drops the
# oldest), kept in the state of the group's first parameter under these keys.
_LBFGS_HISTORY = ("['old_dirs']", "['old_stps']", "['ro']", "['al']")


def bounded_history(leak: LeakReport, optimizers: Callable[[], Iterable[Any]]) -> LeakReport:
    """A leak whose every culprit is held in a ``torch.optim.LBFGS``'s curvature history (its state's
    ``old_dirs``/``old_stps``, bounded by ``history_size``) is not a leak: a run that ends before the history
    is full sees it grow at each step. ``optimizers``: gives the program's live optimizers (only ``LBFGS``
    ones count; called only when every culprit is held in such a history). The verdict becomes
    ``bounded``, with how full the history is and what it holds at most. The leak stays where a culprit is
    held anywhere else, no live LBFGS has a history, a history is full already, or the growth is more than
    a step's iterations (``max_iter`` pairs) can add by the leak threshold."""
    if not leak.leaking or not leak.culprits:
        return leak
    if not all(_in_lbfgs_history(c.holder) for c in leak.culprits):
        return leak
    found = []
    for opt in optimizers():
        if not isinstance(opt, torch.optim.LBFGS):
            continue
        for group in opt.param_groups:
            params = group.get("params") or []
            size = group.get("history_size")
            state = opt.state.get(params[0]) if params else None
            if not isinstance(size, int) or not isinstance(state, dict):
                continue
            dirs, stps = state.get("old_dirs"), state.get("old_stps")
            if not isinstance(dirs, list) or not dirs or not isinstance(stps, list) or not stps:
                continue
            pair = sum(t.numel() * t.element_size() for t in (dirs[-1], stps[-1]))
            found.append((len(dirs), size, pair, int(group.get("max_iter") or 1)))
    if not found or any(n >= size for n, size, _, _ in found):
        return leak  # (a full history grows no more: the growth is something else's)
    rate = max(leak.bytes_per_step, leak.trend_per_step)
    # One step adds a pair per iteration at most (max_iter): growth beyond that is something else's,
    # which the culprits, the largest holders only, may leave out.
    if rate - sum(it * b for _, _, b, it in found) >= leak.min_bytes_per_step:
        return leak
    kept = sum(n * b for n, _, b, _ in found)
    most = sum(size * b for _, size, b, _ in found)
    n, size, _, _ = found[0]
    fix = (
        f"torch.optim.LBFGS keeps its last history_size={size} pairs of update directions: bounded; a "
        "smaller history_size= holds less"
    )
    return _not_a_leak(
        leak,
        "bounded",
        rate,
        f"memory grew by {fmt_bytes(int(rate))}/step in torch.optim.LBFGS's curvature history ({n} of "
        f"history_size={size} pairs kept, {fmt_bytes(kept)}): it stops growing at history_size pairs, "
        f"{fmt_bytes(most)} in all, so this is not a leak; pass a smaller history_size= to hold less",
        culprits=tuple(dataclasses.replace(c, fix=fix) for c in leak.culprits),
    )


def _in_lbfgs_history(holder: str | None) -> bool:
    return holder is not None and ".state[" in holder and any(k in holder for k in _LBFGS_HISTORY)


def survivors_beside(survivors: Any, leak: LeakReport | None, steps: int) -> Any:
    """The loop's survivors report, for information only when the loop ran long enough for the growth
    detector: its verdict stands, and what the first steps left alive (a cache, a history) is listed."""
    if survivors.leaking and leak is not None and leak.verdict not in ("too_few", "no_steps"):
        return dataclasses.replace(
            survivors,
            leaking=False,
            notes=(
                *survivors.notes,
                f"the loop ran {steps} steps, enough for the growth detector's verdict "
                f"({leak.verdict}): these survivors are listed for information",
            ),
        )
    return survivors


def host_verdict(
    host: LeakReport,
    leak: LeakReport | None,
    device: torch.device,
    *,
    backward: bool | None = None,
    graphs: bool = False,
    data: Collection[str] = (),
) -> LeakReport:
    """The host watcher's report as the run's host verdict, beside the device's ``leak`` (``backward``:
    whether the program ran a backward, ``None``: not known; ``graphs``: whether the live autograd nodes
    rose; ``data``: the holder paths of the growing containers of plain data the host scans found)."""
    host = _host_policy(host)
    if device.type != "cpu" and backward is False and not graphs:
        host = _gathered_results(host, data)
    inner = leak is not None and leak.verdict == "inner_growth"
    if (
        host.leaking
        and device.type == "cpu"
        and leak is not None
        and (leak.leaking or inner)
        and not (host.culprits and not leak.culprits)  # the host names what the device cannot
    ):
        # On the CPU the device figure is the C heap: the device report already is this growth.
        host = dataclasses.replace(
            host,
            leaking=False,
            verdict="flat" if not host.culprits else host.verdict,
            notes=(*host.notes, "on the CPU the device report covers this growth"),
        )
    if host.leaking and leak is not None and leak.verdict == "inner_growth":
        host = _host_inner(host)  # the device saw growth inside each call: the host's is the same
    if host.leaking and device.type != "cpu" and leak is not None and leak.leaking:
        host = _held_by_device_graphs(host, leak)
    return host


def _held_by_device_graphs(host: LeakReport, leak: LeakReport) -> LeakReport:
    """Host growth that the autograd graphs of the device's leak hold (a GPU loop that keeps its outputs
    with their graphs: the graphs keep the Python objects of the tensors they saved, and their nodes) is
    that leak, said once: when the device names a kept graph and every host culprit is reached through a
    graph (a ``.grad_fn`` hop) or is itself a kept graph. Host growth with any other holder stays a leak."""
    from torchmem.analysis.leak_fixes import GRAPH_CHAIN, RETAINED_GRAPH

    kinds = (RETAINED_GRAPH, GRAPH_CHAIN)
    graphs = [c for c in leak.culprits if c.kind in kinds]
    if not graphs or not host.culprits:
        return host
    if not all(c.kind in kinds or ".grad_fn" in (c.holder or "") for c in host.culprits):
        return host
    rate = max(host.bytes_per_step, host.trend_per_step)
    holders = sorted({c.holder.split(".grad_fn")[0] for c in graphs if c.holder})
    by = f" (held by `{holders[0]}`)" if len(holders) == 1 else ""
    return _not_a_leak(
        host,
        "device_graphs",
        rate,
        f"host memory grew by {fmt_bytes(int(rate))}/step through the autograd graphs that the device's "
        f"leak report names{by}: their nodes and the Python objects of the tensors they saved stay on the "
        "host with them; the device report's fix frees both",
        culprits=(),  # (named from the host's side: the loop's variable, a fix for other objects)
    )


def _host_inner(host: LeakReport) -> LeakReport:
    """Host growth that climbs inside each call and falls back at its end (autograd nodes of a graph
    carried across an inner loop) is not a leak: the same verdict as the device's."""
    from torchmem.analysis.leaks import inner_growth

    found = inner_growth(host.series, max(host.min_bytes_per_step, 1.0))
    if found is None:
        return host
    rate, length, height, ramps = found
    return dataclasses.replace(
        host,
        leaking=False,
        bytes_per_step=0.0,
        verdict="inner_growth",
        trend_per_step=rate,
        reason=(
            f"host memory climbs by {fmt_bytes(int(rate))}/step for about {length} steps and falls back at "
            f"the end ({ramps} times, {fmt_bytes(height)} at its peak): growth inside each call, nothing "
            "kept across calls"
        ),
    )


def _gathered_results(host: LeakReport, data: Collection[str]) -> LeakReport:
    """Host growth of a GPU program that ran no backward (inference) whose every culprit is a container of
    plain data (``data``: tensors with no autograd graph, arrays, numbers, strings) while no autograd graph
    grew: what the loop gathers on the host is its results (`preds.append(out.cpu())`, concatenated at the
    end), not a leak: verdict ``gathered``, with the holders and the rate (and its culprits, for the
    report). Growth nothing names, a retained graph, an autograd chain, a hook or a state of the process
    keeps the leak."""
    from torchmem.analysis.host import PYTHON_OBJECTS

    named = host.culprits
    if not host.leaking or not named:
        return host
    if any(c.kind != PYTHON_OBJECTS or c.holder is None or c.holder not in data for c in named):
        return host
    rate = max(host.bytes_per_step, host.trend_per_step)
    holders = [str(c.holder) for c in named]
    what = f"`{'`, `'.join(holders[:2])}` keep{'s' if len(holders) == 1 else ''} it"
    return _not_a_leak(
        host,
        "gathered",
        rate,
        f"host memory grew by {fmt_bytes(int(rate))}/step in a loop that ran no backward ({what}: "
        "tensors with no autograd graph, arrays or numbers): the results an inference loop gathers on "
        "the host, not called a leak; write them out as they come if the loop has no end",
    )


def _not_a_leak(host: LeakReport, verdict: str, rate: float, reason: str, **more: Any) -> LeakReport:
    """``host`` as a report that does not call its growth (``rate`` per step) a leak, and why."""
    return dataclasses.replace(
        host,
        leaking=False,
        verdict=verdict,
        detected_at=None,
        stopped_at=None,
        trend_per_step=rate,
        bytes_per_step=0.0,
        reason=reason,
        **more,
    )


def _host_policy(host: LeakReport) -> LeakReport:
    """A host verdict is a leak when it names what keeps the growth (a holder, an autograd chain, a state of
    the process), or grows like a device leak (256 KiB/step). A line that tracemalloc saw allocate what stays,
    with no container or chain that keeps it, is where, not who: below 256 KiB/step it is a note (inference
    that keeps its predicted labels grows the heap by a few KiB a step, on purpose)."""
    from torchmem.analysis.host import PYTHON_OBJECTS
    from torchmem.analysis.leaks import large_total

    seen = host.leaking or host.detected_at is not None
    rate = max(host.bytes_per_step, host.trend_per_step)
    large = host.leaking and len(host.series) > 1 and large_total(host.series[0][1], host.series[-1][1])
    held = [c for c in host.culprits if c.holder is not None or c.kind != PYTHON_OBJECTS]
    if not seen or held or rate >= _HOST_UNEXPLAINED_MIN or large:
        return host
    lines = [c.site for c in host.culprits if c.site]
    where = (
        f" tracemalloc saw {', '.join(f'`{x}`' for x in lines[:2])} allocate what stays, but no container or "
        "chain that keeps it was found;"
        if lines
        else ""
    )
    return _not_a_leak(
        host,
        "below_threshold",
        rate,
        f"host memory grew by {fmt_bytes(int(rate))}/step and nothing that keeps it was named (the "
        f"notes say what was looked at);{where} data the program keeps is reported as a leak from "
        f"{fmt_bytes(_HOST_UNEXPLAINED_MIN)}/step",
        culprits=(),
    )


def forecast(leak: LeakReport | None, device: torch.device, reading: Any, step_s: float | None) -> Any:
    """When ``device`` (or the RAM) runs out at the leak's rate (a
    :class:`~torchmem.results.forecast.Forecast`), ``None`` without a leak or a known capacity. ``reading``
    reads the session's figure now; ``step_s``: the program's median step."""
    if leak is None or not leak.leaking or leak.bytes_per_step <= 0:
        return None
    from torchmem.analysis.forecast import forecast as at_rate

    unit = "s" if leak.boundary == "second" else "step"
    r = reading()
    if device.type == "cpu":
        from torchmem.devices._host import host_memory, process_rss

        hm = host_memory()
        used = r.allocated
        if used is None or hm.available is None:
            return None
        room, what = hm.available, "the RAM"
        rss = process_rss()
        if hm.cgroup_limit is not None and rss is not None and hm.cgroup_limit - rss < room:
            room, what = max(hm.cgroup_limit - rss, 0), "the cgroup's memory limit"
        return at_rate(leak.bytes_per_step, unit, used, used + room, what, step_s)
    from torchmem.devices import backend

    info = backend(device).mem_info()
    if info is None or r.allocated is None:
        return None
    free, _total = info
    # growth fills the allocator's cached blocks first, then takes what the driver has free
    capacity = (r.reserved if r.reserved is not None else r.allocated) + free
    return at_rate(leak.bytes_per_step, unit, r.allocated, capacity, str(device), step_s)
