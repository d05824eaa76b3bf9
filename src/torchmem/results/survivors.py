"""What was allocated inside the program's loop and is still alive: :class:`SurvivorReport`.

:class:`~torchmem.capture.survivors.LoopSurvivors` records the tensor storages born in a few steps of the
loop (from the second step on) and, at the end of the run or on demand, groups those still alive by
allocation site: a :class:`SurvivorGroup` per site, with the steps its survivors were born in, the holder
paths of a few of them and a verdict. A group *accumulates* when storages from (nearly) every recorded step
but the last are still alive: a leak, named even in a loop too short for the growth detector.

Plain frozen data: the rules live in :mod:`torchmem.analysis.loop_survivors`; nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from torchmem._format import count, fmt_bytes
from torchmem.results._dicts import from_mapping
from torchmem.results.holders import HolderPath

# Verdicts of a group (SurvivorGroup.verdict).
ACCUMULATES = "accumulates"
LAST_STEP = "last_step"
RECENT = "recent"
ONCE = "once"
SOME_STEPS = "some_steps"
SMALL = "small"

VERDICTS = (ACCUMULATES, LAST_STEP, RECENT, ONCE, SOME_STEPS, SMALL)


def step_ranges(steps: Sequence[int]) -> str:
    """Steps as short ranges: ``(2, 3, 4, 6)`` -> ``"2-4, 6"``; ``()`` -> ``"none"``.

    Example:
        >>> step_ranges((2, 3, 4, 6)), step_ranges((5,))
        ('2-4, 6', '5')
    """
    if not steps:
        return "none"
    ordered = sorted(set(steps))
    parts: list[str] = []
    start = prev = ordered[0]
    for s in [*ordered[1:], None]:
        if s is not None and s == prev + 1:
            prev = s
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if s is not None:
            start = prev = s
    return ", ".join(parts)


@dataclass(frozen=True)
class SurvivorGroup:
    """The storages born at one allocation site inside the loop that are still alive.

    Attributes:
        site: ``"train.py:12"``; ``None`` where no frame outside torch was found.
        function: The function the site is in (``"main"``, ``"<module>"``); ``""`` where unknown.
        file: The site's full file name; ``""`` where unknown.
        count: Storages still alive.
        live_bytes: Their bytes.
        steps: The distinct recorded steps they were born in, ascending.
        holders: Holder paths of a few sampled storages (oldest steps first); empty when none was named.
        verdict: ``"accumulates"`` (alive from (nearly) every recorded step but the last: a leak),
            ``"last_step"`` (only the last recorded step's: a loop variable), ``"recent"`` (only the latest
            steps', the earliest were freed: a bounded cache or window), ``"once"`` (one earlier step's:
            state created once), ``"some_steps"`` (a few scattered steps'), ``"small"`` (it would
            accumulate, with too few bytes per step to call a leak: a list of scalar losses).
        reason: The verdict in words.
        holder: The readable path of the main holder (the one most samples share), or ``None``.
        kind: When it accumulates: the culprit kind (see :class:`torchmem.results.leaks.Culprit`), else
            ``""``.
        fix: When it accumulates: the one-line fix naming the holder, else ``""``.

    Example:
        >>> g = SurvivorGroup("train.py:12", "main", "/src/train.py", 5, 5 * 2**20, (2, 3, 4, 5, 6), (),
        ...                   "accumulates", "every step")
        >>> print(g)
        train.py:12 in main(): 5 storages, 5.00 MiB, born in steps 2-6: accumulates (every step)
    """

    site: str | None
    function: str
    file: str
    count: int
    live_bytes: int
    steps: tuple[int, ...]
    holders: tuple[HolderPath, ...]
    verdict: str
    reason: str
    holder: str | None = None
    kind: str = ""
    fix: str = ""

    @property
    def accumulates(self) -> bool:
        """Storages from (nearly) every recorded step but the last are still alive."""
        return self.verdict == ACCUMULATES

    @property
    def where(self) -> str:
        """``"train.py:12 in main()"``, or ``"an unknown site"``."""
        if not self.site:
            return "an unknown site"
        return f"{self.site} in {self.function}()" if self.function else self.site

    def lines(self) -> list[str]:
        """Its lines: the head, then (indented by two) the holders and the fix."""
        word = "step" if len(self.steps) == 1 else "steps"
        out = [
            f"{self.where}: {count(self.count, 'storage')}, {fmt_bytes(self.live_bytes)}, born in {word} "
            f"{step_ranges(self.steps)}: {self.verdict}" + (f" ({self.reason})" if self.reason else "")
        ]
        shown = [str(p) for p in self.holders[:3]]
        if self.holder and self.holder not in shown:
            shown.insert(0, self.holder)
        out += [f"  held by {p}" for p in shown[:3]]
        if self.fix:
            out.append(f"  fix: {self.fix}")
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["steps"] = list(self.steps)
        d["holders"] = [p.to_dict() for p in self.holders]
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SurvivorGroup:
        return from_mapping(cls, d)


@dataclass(frozen=True)
class SurvivorReport:
    """What was allocated inside the loop and is still alive, grouped by allocation site.

    Attributes:
        device: The device recorded (``"cuda:0"``, ``"cpu"``), ``None`` for every device.
        steps: Steps the run had when the report was made (as far as known).
        covered: The steps whose births were recorded (the step after the first boundary, and on).
        leaking: A group accumulates.
        count: Storages born in the recorded steps that are still alive.
        live_bytes: Their bytes.
        groups: One per allocation site: accumulating groups first, then by live bytes.
        notes: What the reader should know (the holder search stopped, sites left out, recording cost).
        window: Steps the recorder was asked to cover.
        boundary: What one step was (``"optimizer step"``, ...); ``""`` when the caller did not say.
        window_step_s: Mean seconds of a recorded step (the ledger on), ``None`` when unknown.
        after_step_s: Mean seconds of the steps right after the window (the ledger off), ``None`` when
            unknown: their ratio is the recording's cost.

    Example:
        >>> r = SurvivorReport("cpu", 6, (2, 3, 4, 5, 6), False, 0, 0, ())
        >>> print(r)
        allocated in the loop and still alive: nothing (births recorded in steps 2-6 of 6)
    """

    device: str | None
    steps: int
    covered: tuple[int, ...]
    leaking: bool
    count: int
    live_bytes: int
    groups: tuple[SurvivorGroup, ...]
    notes: tuple[str, ...] = field(default=())
    window: int = 0
    boundary: str = ""
    window_step_s: float | None = None
    after_step_s: float | None = None

    @property
    def accumulating(self) -> tuple[SurvivorGroup, ...]:
        """The groups that accumulate (the leaks)."""
        return tuple(g for g in self.groups if g.accumulates)

    def __str__(self) -> str:
        """The plain text: the total, each group with its holders and fix, then the notes."""
        of = f" of {self.steps}" if self.steps else ""
        recorded = f"births recorded in {'step' if len(self.covered) == 1 else 'steps'} "
        recorded += f"{step_ranges(self.covered)}{of}"
        if not self.covered:
            head = "allocated in the loop and still alive: not recorded (no step of the loop was recorded)"
        elif not self.count:
            head = f"allocated in the loop and still alive: nothing ({recorded})"
        else:
            leaks = self.accumulating
            verdict = f"LEAK: {count(len(leaks), 'site')} accumulating" if leaks else "no accumulation"
            head = (
                f"allocated in the loop and still alive: {fmt_bytes(self.live_bytes)} in "
                f"{count(self.count, 'storage')} ({recorded}); {verdict}"
            )
        lines = [head]
        if self.boundary:
            lines.append(f"  one step = one {self.boundary}")
        for i, g in enumerate(self.groups, 1):
            first, *rest = g.lines()
            lines.append(f"  [{i}] {first}")
            lines.extend(f"    {line}" for line in rest)
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["covered"] = list(self.covered)
        d["groups"] = [g.to_dict() for g in self.groups]
        d["notes"] = list(self.notes)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SurvivorReport:
        return from_mapping(cls, d)


__all__ = [
    "ACCUMULATES",
    "LAST_STEP",
    "ONCE",
    "RECENT",
    "SMALL",
    "SOME_STEPS",
    "VERDICTS",
    "SurvivorGroup",
    "SurvivorReport",
    "step_ranges",
]
