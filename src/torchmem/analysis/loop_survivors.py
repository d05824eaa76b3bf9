"""Survivors of the loop: which allocation sites keep what each step makes, and the fix.

Pure functions over captured facts (the steps a site's live storages were born in, their bytes, the typed
holder paths of a few of them), used by :class:`torchmem.capture.survivors.LoopSurvivors`:

- :func:`judge` gives a site its verdict from the steps its survivors were born in. It *accumulates* when
  storages from at least two recorded steps are alive and they come from (nearly) every recorded step but
  the last, the first one included: a loop variable alive at the end is one storage of the last step, and a
  bounded cache has freed the earliest steps' entries, so neither is a leak.
- :func:`main_holder` picks the holder most sampled paths share (a container beats a loop variable).
- :func:`survivor_fix` writes the one-line fix; the kind of holder (a retained graph, a graph carried from
  step to step, stored exceptions, a hook, a cache, a list) is decided by the same rules as the growth
  detector's (:func:`torchmem.analysis.leaks.attribute`, from the step kinds of the typed paths).
- :func:`build_group` and :func:`build_report` assemble the results.

Example:
    >>> judge((2, 3, 4, 5, 6), (2, 3, 4, 5, 6))[0], judge((6,), (2, 3, 4, 5, 6))[0]
    ('accumulates', 'last_step')
    >>> judge((7, 8), (2, 3, 4, 5, 6, 7, 8))[0]
    'recent'
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from torchmem._format import count
from torchmem.analysis.leaks import (
    ACCUMULATION,
    CACHE,
    CYCLE,
    EXCEPTION,
    GLOBAL,
    GRAPH_CHAIN,
    HOOK,
    KEPT_OPTIMIZER,
    RETAINED_GRAPH,
    UNKNOWN,
    attribute,
    holder_name,
    holder_pattern,
)
from torchmem.results.holders import HolderPath
from torchmem.results.leaks import SiteGrowth
from torchmem.results.survivors import (
    ACCUMULATES,
    LAST_STEP,
    ONCE,
    RECENT,
    SMALL,
    SOME_STEPS,
    SurvivorGroup,
    SurvivorReport,
    step_ranges,
)


def _size(b: float) -> str:
    if b >= 1 << 20:
        return f"{b / (1 << 20):.1f} MiB"
    if b >= 1 << 10:
        return f"{b / (1 << 10):.1f} KiB"
    return f"{b:.0f} B"


def judge(
    alive_steps: Sequence[int],
    covered: Sequence[int],
    bytes_per_step: float | None = None,
    min_bytes_per_step: float = 0,
) -> tuple[str, str]:
    """``(verdict, reason)`` of a site whose live storages were born in ``alive_steps``.

    ``covered`` are the steps whose births were recorded. "Nearly every" step allows one missing step in four
    (a leak that skips a step now and then), never the first: a container that evicts its oldest entries
    has lost the first step's. A site that would accumulate with fewer than ``min_bytes_per_step`` live
    bytes per step (``bytes_per_step``) is ``"small"`` (a list of scalar losses), not a leak.

    Example:
        >>> judge((2, 3, 5, 6, 7, 8), range(2, 10))
        ('accumulates', 'alive from 6 of the 7 recorded steps before the last (2-3, 5-8)')
        >>> judge((2,), (2, 3, 4))[0], judge((3, 5), (2, 3, 4, 5, 6, 7, 8, 9))[0]
        ('once', 'some_steps')
    """
    cov = sorted(set(covered))
    alive = sorted(set(alive_steps))
    if not alive or not cov:
        return SOME_STEPS, "no recorded step"
    last = cov[-1]
    if alive == [last]:
        return LAST_STEP, "only the last recorded step's: a loop variable, not a leak"
    if len(alive) == 1:
        return ONCE, f"only step {alive[0]}'s: made once and kept, not a leak"
    required = cov[:-1]
    present = [s for s in required if s in alive]
    missing = len(required) - len(present)
    if required and required[0] in alive and missing <= len(required) // 4:
        if bytes_per_step is not None and bytes_per_step < min_bytes_per_step:
            return SMALL, (
                f"alive from {'every recorded step' if missing == 0 else 'nearly every recorded step'} but "
                f"only {_size(bytes_per_step)} per step, below {_size(min_bytes_per_step)}: not reported as "
                "a leak"
            )
        if missing == 0:
            return ACCUMULATES, f"alive from every recorded step ({step_ranges(alive)})"
        return ACCUMULATES, (
            f"alive from {len(present)} of the {len(required)} recorded steps before the last "
            f"({step_ranges(alive)})"
        )
    if required and alive[0] > required[0] and alive[-1] >= cov[-2 if len(cov) > 1 else -1]:
        return RECENT, (
            f"only the latest steps' ({step_ranges(alive)}); the earlier ones were freed (a bounded cache or "
            "window): not a leak"
        )
    return SOME_STEPS, (
        f"from {count(len(present), 'step')} of the {len(required)} recorded steps before the last "
        f"({step_ranges(alive)}): not every step keeps one"
    )


def main_holder(paths: Sequence[HolderPath]) -> HolderPath | None:
    """The path whose holder most sampled paths share; a container (``losses[*]``) wins a tie.

    Example:
        >>> from torchmem.results.holders import HolderStep as S, StepKind as K
        >>> def p(*steps): return HolderPath.of("module", steps, len(steps) - 1)
        >>> root, out = S(K.ROOT, "__main__", "__main__"), S(K.MODULE_GLOBAL, ".out", "out")
        >>> lst = S(K.MODULE_GLOBAL, ".losses", "losses")
        >>> str(main_holder([p(root, out), p(root, lst, S(K.ITEM, "[0]", "0", "list", "int"))]))
        '__main__.losses[0]'
    """
    if not paths:
        return None
    counts: dict[str, int] = {}
    for p in paths:
        k = holder_pattern(p)
        counts[k] = counts.get(k, 0) + 1
    best = max(counts, key=lambda k: (counts[k], "[*]" in k))
    return next(p for p in paths if holder_pattern(p) == best)


def survivor_kind(paths: Sequence[HolderPath], live_bytes: int, storages: int, steps: int) -> str:
    """The culprit kind of an accumulating site (the growth detector's rules, on the typed holder paths)."""
    n = max(steps, 1)
    facts = SiteGrowth(None, live_bytes / n, live_bytes, storages, storages / n, tuple(paths))
    found = attribute([facts])
    return found[0].kind if found else UNKNOWN


def survivor_fix(kind: str, name: str | None, per_step: float, per_step_storages: float) -> str:
    """The one-line fix for an accumulating site, naming the holder (``name``; ``None`` when none was found).

    Example:
        >>> survivor_fix("device_accumulation", "outs", 4096, 1.0)
        '`outs` keeps one tensor per iteration (4.0 KiB each): store `.item()`/`.detach()` or clear it'
    """
    size = _size(per_step)
    what = "one tensor" if round(per_step_storages) <= 1 else f"{round(per_step_storages)} storages"
    if name is None or kind in (UNKNOWN, CYCLE):
        return (
            f"{what} per iteration born here stays alive ({size} per iteration) and no holder was named: "
            "find who keeps it with `torchmem.holders()` (or a reference cycle `gc.collect()` would free)"
        )
    if kind == RETAINED_GRAPH:
        return (
            f"`{name}` keeps each iteration's tensors with their autograd graph ({size} per iteration): "
            "store `.item()` for logging or `.detach()` what you keep, or clear it"
        )
    if kind == GRAPH_CHAIN:
        return (
            f"`{name}` carries its autograd graph from iteration to iteration (+{size} per iteration): "
            f"`.detach()` the state you carry over (`{name} = {name}.detach()`) or accumulate `.item()`"
        )
    if kind == EXCEPTION:
        return (
            f"`{name}` keeps exceptions whose tracebacks hold each iteration's tensors ({size} per "
            "iteration): store `repr(e)` / `traceback.format_exc()`, or call "
            "`traceback.clear_frames(e.__traceback__)`"
        )
    if kind == HOOK:
        return (
            f"a hook's closure `{name}` keeps tensors from every iteration ({size} per iteration): keep "
            "`.detach().cpu()` copies or a bounded number, and call `handle.remove()` when done"
        )
    if kind == CACHE:
        return (
            f"the cache `{name}` gains an entry every iteration and never evicts ({size} per iteration): "
            "bound it (LRU with a maximum size) or clear it"
        )
    if kind == GLOBAL:
        return (
            f"the module-level `{name}` keeps {what} per iteration ({size} each): evict entries, store "
            "`.item()`/`.cpu()` copies, or clear it"
        )
    if kind == ACCUMULATION:
        return f"`{name}` keeps {what} per iteration ({size} each): store `.item()`/`.detach()` or clear it"
    if kind == KEPT_OPTIMIZER:
        return (
            f"`{name}` keeps an optimizer per iteration, each with the state its `step()` made ({size} "
            "each): keep the numbers you need (`scheduler.get_last_lr()`), not the optimizer, or reuse one"
        )
    return f"`{name}` keeps {what} per iteration ({size} each): store `.item()`/`.detach()` or clear it"


def build_group(
    site: str | None,
    function: str,
    file: str,
    per_step: Mapping[int, tuple[int, int]],
    covered: Sequence[int],
    paths: Sequence[HolderPath] = (),
    min_bytes_per_step: float = 0,
) -> SurvivorGroup:
    """One site's group from ``per_step`` (step -> (live storages, live bytes) born in it) and the holder
    paths of its samples; an accumulating group gets its kind, main holder and fix."""
    steps = tuple(sorted(per_step))
    n = sum(c for c, _ in per_step.values())
    live = sum(b for _, b in per_step.values())
    verdict, reason = judge(steps, covered, live / max(len(steps), 1), min_bytes_per_step)
    # A tensor object only C++ holds says nothing a person can act on when a readable path exists.
    readable = tuple(p for p in paths if p.root != "gc-orphan")
    paths = readable or tuple(paths)
    holder = main_holder(paths)
    kind = fix = ""
    if verdict == ACCUMULATES:
        kind = survivor_kind(paths, live, n, len(steps))
        name = holder_name(holder) if holder is not None else None
        fix = survivor_fix(kind, name, live / len(steps), n / len(steps))
    return SurvivorGroup(
        site=site,
        function=function,
        file=file,
        count=n,
        live_bytes=live,
        steps=steps,
        holders=tuple(paths),
        verdict=verdict,
        reason=reason,
        holder=str(holder) if holder is not None else None,
        kind=kind,
        fix=fix,
    )


def order_groups(groups: Sequence[SurvivorGroup]) -> tuple[SurvivorGroup, ...]:
    """Accumulating groups first, then by live bytes, largest first."""
    return tuple(sorted(groups, key=lambda g: (not g.accumulates, -g.live_bytes, g.site or "")))


def build_report(
    device: str | None,
    steps: int,
    covered: Sequence[int],
    groups: Sequence[SurvivorGroup],
    *,
    count_alive: int | None = None,
    live_bytes: int | None = None,
    notes: Sequence[str] = (),
    window: int = 0,
    boundary: str = "",
    window_step_s: float | None = None,
    after_step_s: float | None = None,
) -> SurvivorReport:
    """The report over ``groups`` (ordered by :func:`order_groups`); the totals default to the groups'."""
    ordered = order_groups(groups)
    return SurvivorReport(
        device=device,
        steps=steps,
        covered=tuple(sorted(set(covered))),
        leaking=any(g.accumulates for g in ordered),
        count=sum(g.count for g in ordered) if count_alive is None else count_alive,
        live_bytes=sum(g.live_bytes for g in ordered) if live_bytes is None else live_bytes,
        groups=ordered,
        notes=tuple(notes),
        window=window,
        boundary=boundary,
        window_step_s=window_step_s,
        after_step_s=after_step_s,
    )


__all__ = [
    "build_group",
    "build_report",
    "judge",
    "main_holder",
    "order_groups",
    "survivor_fix",
    "survivor_kind",
]
