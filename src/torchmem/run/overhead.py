"""What torchmem's own work costs the program: the step bookkeeping (timed inside each step), the sampler
thread's work, and the exact ledger's per-op cost in the steps it was on (those steps' time beyond the
median step without it); written as the ``overhead`` record, and said in a note when the run took
:data:`OVERHEAD_NOTE_RATIO` times as long as it would without torchmem."""

from __future__ import annotations

import collections
import statistics
from typing import Any

# The estimated slowdown from which the end summary says what torchmem cost (issue 12's target for the usual
# program; op-heavy programs may reach 2x).
OVERHEAD_NOTE_RATIO = 1.2
OVERHEAD_NOTE_MIN_S = 0.5  # ... on a run of at least this long (a shorter one is mostly start-up)


class Overhead:
    """The step timings of a session: call :meth:`step_began` and :meth:`step_ended` around each step's
    bookkeeping, :meth:`add_parts` with its parts, :meth:`bank` when the boundary kind changes."""

    def __init__(self) -> None:
        self._own_step_s = 0.0  # time inside step(): readings, scans, holder searches, records
        self._step_end_t: float | None = None
        self._instrumented = False  # the exact ledger or a site window is on for the step under way
        self._plain_steps: collections.deque[float] = collections.deque(maxlen=512)
        self._instr_sum = 0.0
        self._instr_n = 0
        # The exact accounting's cost in steps of an earlier boundary kind (steps of one kind are compared
        # with steps of the same kind only): (seconds, steps, whether it could be estimated).
        self._ledger_banked = (0.0, 0, True)
        self._parts = [0.0, 0.0, 0.0]  # the steps' readings, loop survivors, host watcher (seconds)

    def step_began(self, t0: float, steps: int = 1) -> None:
        """A step's bookkeeping begins at ``t0``: the program's own ``steps`` steps ran since the last one
        ended (more than one where the session counted quiet steps in between, untimed)."""
        if self._step_end_t is not None:
            d = (t0 - self._step_end_t) / steps  # the program's own step (without this bookkeeping)
            if self._instrumented:
                self._instr_sum += d
                self._instr_n += 1
            else:
                self._plain_steps.append(d)

    def step_ended(self, t0: float, t1: float, instrumented: bool) -> None:
        """The bookkeeping begun at ``t0`` ended at ``t1``; ``instrumented``: the next step runs with the
        exact ledger or a site window on."""
        self._own_step_s += t1 - t0
        self._step_end_t = t1
        self._instrumented = instrumented

    def add_parts(self, reading: float, survivors: float, host: float) -> None:
        """Seconds of one step's bookkeeping: the watcher's reading, the loop survivors, the host watcher."""
        parts = self._parts
        parts[0] += reading
        parts[1] += survivors
        parts[2] += host

    def median_step(self) -> float | None:
        """The median step of the program without instrumentation (seconds), ``None`` before one."""
        return _median(self._plain_steps)

    def bank(self) -> None:
        """The boundary kind changes: the exact ledger's cost so far is kept, its step timings start over."""
        s, n, known = self._ledger_estimate()
        b = self._ledger_banked
        self._ledger_banked = (b[0] + s, b[1] + n, b[2] and known)
        self._plain_steps.clear()
        self._instr_sum, self._instr_n = 0.0, 0
        self._step_end_t = None  # the step under way spans the switch: not timed

    def _ledger_estimate(self) -> tuple[float, int, bool]:
        """The exact accounting's extra time in this boundary kind's instrumented steps: their time beyond
        the median step of the same kind without it (``known`` False when every step was instrumented)."""
        if self._instr_n == 0:
            return 0.0, 0, True
        base = _median(self._plain_steps)
        if base is None:
            return 0.0, self._instr_n, False
        return max(0.0, self._instr_sum - self._instr_n * base), self._instr_n, True

    def finish(self, records: Any, wall: float, steps: int, sampler: Any) -> str | None:
        """Estimate what torchmem's own work added to the program's run of ``wall`` seconds (up to its end),
        write it as the ``overhead`` record, and say so in a note when the run took 1.2x as long as it would
        without it (the note's text is returned). ``sampler``: the session's
        :class:`~torchmem.run.sampler.Sampler`.

        The module hooks that find the steps are not timed (about a microsecond per top-level call).
        """
        cur_s, cur_n, cur_known = self._ledger_estimate()
        bank_s, bank_n, bank_known = self._ledger_banked
        ledger_s, ledger_n, known = cur_s + bank_s, cur_n + bank_n, cur_known and bank_known
        parts = {"steps": self._own_step_s, "sampler": sampler.cpu_s, "ledger": ledger_s}
        own = min(sum(parts.values()), 0.95 * wall)
        ratio = wall / (wall - own) if wall > 0 else 1.0
        sp = self._parts
        detail = {
            "steps.reading": sp[0],
            "steps.survivors": sp[1],
            "steps.host": sp[2],
            "steps.other": max(0.0, self._own_step_s - sum(sp)),
            "sampler.workers": sampler.workers_s,
            "sampler.other": max(0.0, sampler.cpu_s - sampler.workers_s),
        }
        records.record(
            "overhead",
            wall_s=round(wall, 6),
            own_s=round(own, 6),
            ratio=round(ratio, 4),
            parts={k: round(v, 6) for k, v in parts.items()},
            detail={k: round(v, 6) for k, v in detail.items()},
            sampler_ticks=sampler.ticks,
            steps=steps,
            ledger_steps=ledger_n,
            ledger_known=known,
        )
        if ratio < OVERHEAD_NOTE_RATIO or wall < OVERHEAD_NOTE_MIN_S:
            return None
        words = {
            "steps": f"step bookkeeping {parts['steps']:.1f} s over {steps} steps (readings, scans, "
            "holder searches)",
            "sampler": f"the background sampler {parts['sampler']:.1f} s",
            "ledger": f"exact tensor accounting {parts['ledger']:.1f} s in the {ledger_n} steps it was on "
            "(recording the loop's first steps, naming growth; steps of every kind counted)",
        }
        top = [words[k] for k, v in sorted(parts.items(), key=lambda kv: -kv[1]) if v >= 0.05 * own]
        text = (
            f"torchmem's own work took about {own:.1f} s of this {wall:.1f} s run: the program ran about "
            f"{ratio:.2f}x as long as it would without it ({'; '.join(top)})"
        )
        records.note(text)
        return text


def _median(values: collections.deque[float]) -> float | None:
    """The median (:func:`statistics.median`, as everywhere in torchmem), ``None`` for no values."""
    return statistics.median(values) if values else None
