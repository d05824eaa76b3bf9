"""What the program's loop allocated and never freed: :class:`LoopSurvivors`.

The growth detector needs a warm-up and several readings before it can call growth a leak, so a loop of a few
iterations that keeps every output (with its autograd graph) in a list goes unnamed. ``LoopSurvivors`` records
the tensor storages born in a few steps of the loop instead: from the first step boundary on it turns the
exact storage ledger on (for the thread that calls :meth:`~LoopSurvivors.boundary`) with one cohort per step
and birth sites, and at each boundary keeps a weak reference, the bytes and the allocation site of every
storage born in the step that just ended and still alive. After ``steps`` recorded steps the ledger goes off
again, so the cost is confined to those steps. :meth:`~LoopSurvivors.report`, at the end of the run or on
demand, groups the storages still alive by allocation site, names what holds a few of them, and says which
sites *accumulate* (alive from (nearly) every recorded step but the last): a leak, even in a 3-step loop.

Cost budget: a recorded step is slower (the ledger costs ~6-20 µs per aten op, so a step of thousands of
small ops is several times slower), and a program of a few long op-heavy steps would spend most of its run
recorded. So the recording keeps a budget: its estimated extra time (the median recorded step less the median
step without the ledger, times the recorded steps) must stay within ``budget`` (10 %) of the time since the
first boundary, or under a small absolute allowance (0.25 s, and 0.5 s for the first 2 recorded steps: a loop
of a few ms per step is always covered fully). When the next recorded step would exceed it, the ledger goes
off (the recording *pauses*); the unrecorded steps then give the step time without the ledger, and the
recording resumes once the run has grown long enough to afford another step. The covered steps may then have
gaps (``2-3, 9, 40``); the verdicts only need the steps that were recorded, and the report says why steps
were left out and what a recorded step cost.

Example:
    >>> import torch
    >>> from torchmem.capture.survivors import LoopSurvivors
    >>> model, kept = torch.nn.Linear(256, 256), []
    >>> rec = LoopSurvivors("cpu", steps=4)
    >>> for step in range(1, 6):
    ...     kept.append(model(torch.randn(64, 256)))  # keeps each output and its graph
    ...     rec.boundary(step)
    >>> rec.stop()
    >>> rec.report(total_steps=5).leaking
    True

Cost: while recording, every aten op on the recording thread pays the ledger plus the birth site of each new
storage; each boundary reads the step's live births once. Paused or after the window, a boundary is a clock
read and a comparison (or one attribute test once the window is complete).
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
import weakref
from contextlib import ExitStack
from typing import Any

import torch

from torchmem._format import fmt_bytes
from torchmem._warn import ReportedOnce
from torchmem.analysis.holders.survivors import holder_paths_of_storages
from torchmem.analysis.loop_survivors import build_group, build_report, judge
from torchmem.devices import ledger, resolve
from torchmem.devices._ledger import Cohort, Site
from torchmem.results.holders import HolderPath
from torchmem.results.survivors import ACCUMULATES, LAST_STEP, SurvivorReport, step_ranges

_log = logging.getLogger("torchmem")

_IDLE, _RECORDING, _PAUSED, _DONE = 0, 1, 2, 3
# Groups listed in a report, groups whose holders are searched, samples per searched group.
_MAX_GROUPS = 20
_SEARCHED_GROUPS = 10
_SAMPLES = 3
# Steps timed after the window (the same steps without the ledger: the recording's cost).
_AFTER_STEPS = 3
# Recorded steps this much slower than the steps after them get a note in the report.
_COST_NOTE_RATIO = 2.0
# The budget: extra seconds always allowed (a loop of a few ms per step is covered fully)...
_FLOOR_S = 0.25
_CHEAP_STEP_S = 0.02  # ... when a recorded step costs at most this much more than one without the ledger
# ... and allowed for the first _MIN_STEPS recorded steps (2 recorded steps can show accumulation).
_MIN_STEPS = 2
_MIN_STEPS_S = 0.5
# Unrecorded steps timed for the step time without the ledger (the first ones; their median is used).
_BASE_SAMPLES = 15

# (storage, bytes at the boundary, site, step born in)
_Born = tuple[weakref.ref[Any], int, Site | None, int]


class LoopSurvivors:
    """Records what a few steps of the loop allocate and keep; reports it by allocation site.

    Args:
        device: The device whose storages are recorded (``"cuda:0"``, ``"cpu"``); ``None``: every device.
        steps: How many steps to record after the first boundary (the first step is left out: it builds
            what lives for the whole run, such as optimizer state).
        min_bytes_per_step: A site that keeps fewer live bytes per step than this (a list of scalar losses)
            is reported as ``"small"``, not as a leak.
        budget: The share of the run's time (since the first boundary) the recording may add; beyond it
            the recording pauses until the run is long enough (see the module's "Cost budget").
            ``float("inf")``: record ``steps`` steps in a row whatever they cost.
        spent_s: Extra time earlier recorders of the same run already spent (a recorder that replaces one
            when the program's step boundary changes shares its budget, instead of starting a fresh one;
            its own first two steps are recorded in any case).
        since: ``time.perf_counter()`` of the run's first boundary, when earlier recorders saw it (the budget
            is a share of the time since then).

    Call :meth:`boundary` at the end of each step on the thread that runs the loop, :meth:`stop` when the
    program ends (also in the middle of the window), and :meth:`report` whenever a report is wanted. Nothing
    here raises into the program: an error is reported once in the report's notes and recording stops.

    Example:
        >>> import torch
        >>> rec, kept = LoopSurvivors("cpu", steps=3, budget=0.1), []
        >>> for step in range(1, 5):
        ...     kept.append(torch.ones(4096))
        ...     rec.boundary(step)
        >>> rec.stop()
        >>> rec.covered, rec.report().leaking
        ((2, 3, 4), True)
    """

    def __init__(
        self,
        device: str | None = None,
        steps: int = 8,
        *,
        min_bytes_per_step: int = 4096,
        budget: float = 0.10,
        spent_s: float = 0.0,
        since: float | None = None,
    ) -> None:
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
            raise ValueError(f"steps must be a positive integer, not {steps!r}")
        if not isinstance(budget, (int, float)) or isinstance(budget, bool) or not budget >= 0:
            raise ValueError(f"budget must be a share of the run's time (>= 0), not {budget!r}")
        self.min_bytes_per_step = min_bytes_per_step
        self.budget = float(budget)
        self._device_spec = device
        self.device: str | None = device
        self.window = steps
        self._state = _IDLE
        self._stack: ExitStack | None = None
        self._cohort: Cohort | None = None
        self._thread: int | None = None
        self._lock = threading.Lock()
        self._born: list[_Born] = []
        self._covered: list[int] = []
        self._last_step = 0
        self._seen = 0  # the last boundary's step, also after the window
        self._notes: list[str] = []
        self._noted: set[str] = set()  # the notes said once (not errors)
        self._error = ReportedOnce(
            self._say_error,
            "internal error in {where} ({error}); the program went on",
        )
        self._t_first = 0.0  # the first boundary
        self._t_last = 0.0  # the last boundary (after its own work)
        self._window_s: list[float] = []  # recorded steps
        self._base_s: list[
            float
        ] = []  # steps without the ledger (paused or after the window), the first ones
        self._estimate: tuple[float, float, float | None] | None = None  # cache of _cost()
        self._after_left = 0
        self._harvest_s = 0.0  # the boundaries' own work while recording (part of the recording's cost)
        self._pauses = 0  # times the budget paused the recording
        self._warm_s = 0.0  # the ledger's one-off first-use cost, paid at the first boundary
        self._spent_before = float(spent_s)
        self._since = since

    # -- recording ---------------------------------------------------------------------------------
    @property
    def recording(self) -> bool:
        """Whether the ledger is on for the loop's steps now."""
        return self._state == _RECORDING

    @property
    def paused(self) -> bool:
        """Whether the cost budget has paused the recording (it resumes when the run can afford it)."""
        return self._state == _PAUSED

    @property
    def covered(self) -> tuple[int, ...]:
        """The steps whose births were recorded so far."""
        return tuple(self._covered)

    @property
    def quiet(self) -> bool:
        """Whether a boundary has nothing left to do (the window is complete and its after-steps timed):
        a caller may skip :meth:`boundary` from now on (the last boundary's step is then not kept)."""
        return self._state == _DONE and not self._after_left and self._stack is None

    def boundary(self, step: int) -> None:
        """A step ended (``step``: its number; the first call is the end of step 1). Never raises."""
        self._seen = step
        if self._state == _DONE:
            if self._after_left or self._stack is not None:
                self._after_window()
            return
        try:
            if self._state == _IDLE:
                self._start(step)
            elif self._state == _RECORDING:
                self._harvest(step)
            else:
                self._paused_step(step)
        except Exception as exc:
            self._error("a step boundary", exc)
            self._shutdown()

    def stop(self) -> None:
        """Stop recording (idempotent); the births of a step that had not ended are not kept.

        Called on another thread than the loop's, it stops recording at once and turns the ledger off for
        the loop's thread at its next boundary (a dispatch mode belongs to the thread that pushed it).
        """
        try:
            self._state = _DONE
            self._after_left = 0
            if self._stack is None:
                return
            if threading.get_ident() == self._thread:
                self._close_ledger()
            else:
                self._close_cohort()
                if "stop" not in self._noted:
                    self._noted.add("stop")
                    self._notes.append(
                        "recording was stopped from another thread than the loop's: the ledger stays on for "
                        "the loop's thread until its next step boundary"
                    )
        except Exception as exc:
            self._error("stop", exc)

    def _resolve(self) -> str | None:
        spec = self._device_spec
        if spec is None:
            return None
        try:
            return str(resolve(spec))
        except Exception as exc:
            self._notes.append(f"device {spec!r} could not be resolved ({exc}); recording it as given")
            return str(spec)

    def _start(self, step: int) -> None:
        self.device = self._resolve()
        self._thread = threading.get_ident()
        self._open_ledger(warm=True)
        self._last_step = step
        self._state = _RECORDING
        self._t_first = self._t_last = time.perf_counter()  # the one-off warm-up is not the run's time
        if self._since is not None:
            self._t_first = min(self._t_first, self._since)

    def _open_ledger(self, warm: bool = False) -> None:
        led = ledger()
        stack = ExitStack()
        stack.enter_context(led.enabled())
        self._stack = stack
        if warm:
            # The first op under a dispatch mode pays one-off costs (torch imports torch._dynamo: ~1-2 s on a
            # CPU); paid here, before the first recorded step, they are not taken for a per-step cost.
            t0 = time.perf_counter()
            torch.empty(0)
            self._warm_s = time.perf_counter() - t0
        self._cohort = led.open_cohort(self.device, sites=True)

    def _on_loop_thread(self) -> bool:
        if threading.get_ident() == self._thread:
            return True
        if "thread" not in self._noted:
            self._noted.add("thread")
            self._notes.append("step boundaries on another thread than the first one's were ignored")
        return False

    def _harvest(self, step: int) -> None:
        if not self._on_loop_thread():
            return
        t0 = time.perf_counter()
        self._window_s.append(t0 - self._t_last)
        self._estimate = None
        born_step = step if step > self._last_step else self._last_step + 1
        led = ledger()
        cohort = self._cohort
        self._cohort = None
        if cohort is not None:
            entries = led.cohort_entries(cohort)
            led.close_cohort(cohort)
            born = [(weakref.ref(s), nbytes, site, born_step) for s, nbytes, site in entries]
            entries.clear()
            with self._lock:
                self._born.extend(born)
        self._covered.append(born_step)
        self._last_step = born_step
        if len(self._covered) >= self.window:
            self._close_ledger()
            self._state = _DONE
            self._after_left = _AFTER_STEPS
        elif self._affords_a_step(t0):
            self._cohort = led.open_cohort(self.device, sites=True)
        else:
            self._close_ledger()
            self._state = _PAUSED
            self._pauses += 1
        now = time.perf_counter()
        self._harvest_s += now - t0
        self._t_last = now

    def _paused_step(self, step: int) -> None:
        """A step ended with the recording paused: time it (the step without the ledger); resume if the run
        can now afford another recorded step."""
        if not self._on_loop_thread():
            return
        now = time.perf_counter()
        if len(self._base_s) < _BASE_SAMPLES:
            self._base_s.append(now - self._t_last)
            self._estimate = None
        self._t_last = now
        self._last_step = step if step > self._last_step else self._last_step + 1
        if self._affords_a_step(now):
            self._open_ledger()
            self._state = _RECORDING
            after = time.perf_counter()
            self._harvest_s += after - now
            self._t_last = after

    @property
    def spent(self) -> float:
        """The recording's estimated extra time so far, with what earlier recorders of the run spent."""
        per, _, _ = self._cost()
        return per * len(self._covered) + self._harvest_s + self._spent_before

    @property
    def first_boundary(self) -> float | None:
        """``time.perf_counter()`` of the run's first boundary (``None`` before it)."""
        if self._state == _IDLE and self._since is None:
            return None
        return self._since if self._since is not None else self._t_first

    def _cost(self) -> tuple[float, float, float | None]:
        """``(extra seconds per recorded step, median recorded step, median step without the ledger)``.

        Medians, so that one slow step (a checkpoint, an evaluation) is not taken for the ledger's cost. With
        no step timed without the ledger yet, the whole recorded step counts as extra (an upper bound).
        """
        est = self._estimate
        if est is None:
            rec = statistics.median(self._window_s) if self._window_s else 0.0
            base = statistics.median(self._base_s) if self._base_s else None
            est = self._estimate = (max(rec - (base or 0.0), 0.0), rec, base)
        return est

    def _affords_a_step(self, now: float) -> bool:
        """Whether one more recorded step keeps the recording's extra time within the budget."""
        per, rec, _ = self._cost()
        n = len(self._covered)
        own = per * n + self._harvest_s
        if n < _MIN_STEPS and own < _MIN_STEPS_S:
            return True  # two steps of this boundary kind are always recorded: they can show accumulation
        extra = own + self._spent_before  # beyond them, one budget for the run's recorders together
        # The floor is for loops of cheap recorded steps (a few ms each: covered fully); a step that the
        # ledger makes 20 ms longer or more (thousands of ops on a GPU) gets the share of the run only.
        floor = _FLOOR_S if per <= _CHEAP_STEP_S else 0.0
        allowed = max(self.budget * (now - self._t_first + rec), floor)
        return extra + per <= allowed

    def _after_window(self) -> None:
        try:
            if self._stack is not None and threading.get_ident() == self._thread:
                self._close_ledger()  # stop() came from another thread: the ledger goes off here
                self._after_left = 0
                return
            if self._after_left and threading.get_ident() == self._thread:
                now = time.perf_counter()
                if len(self._base_s) < _BASE_SAMPLES:
                    self._base_s.append(now - self._t_last)
                    self._estimate = None
                self._t_last = now
                self._after_left -= 1
        except Exception as exc:
            self._error("a step boundary", exc)

    def _close_cohort(self) -> None:
        cohort, self._cohort = self._cohort, None
        if cohort is not None:
            ledger().close_cohort(cohort)

    def _close_ledger(self) -> None:
        self._close_cohort()
        stack, self._stack = self._stack, None
        if stack is not None:
            stack.close()

    def _shutdown(self) -> None:
        self._state = _DONE
        self._after_left = 0
        try:
            if threading.get_ident() == self._thread:
                self._close_ledger()
            else:
                self._close_cohort()
        except Exception as exc:
            self._error("stopping the recording", exc)

    def _say_error(self, note: str) -> None:
        self._notes.append(note)
        _log.warning("torchmem survivors: %s", note)

    # -- reporting ---------------------------------------------------------------------------------
    def report(
        self, total_steps: int | None = None, time_limit: float = 2.0, *, boundary: str = ""
    ) -> SurvivorReport:
        """What was born in the recorded steps and is still alive, by allocation site. Never raises.

        Args:
            total_steps: The run's number of steps (default: the step of the last boundary).
            time_limit: Seconds the holder search may take (0: no search).
            boundary: What one step was, for the text (``"optimizer step"``).
        """
        steps = total_steps if total_steps is not None else self._seen
        try:
            return self._report(steps, time_limit, boundary)
        except Exception as exc:
            self._error("the survivor report", exc)
            return build_report(
                self.device,
                steps,
                self._covered,
                (),
                notes=self._notes,
                window=self.window,
                boundary=boundary,
            )

    def _report(self, steps: int, time_limit: float, boundary: str) -> SurvivorReport:
        covered = tuple(self._covered)
        notes = list(self._notes)
        if self._state == _RECORDING:
            notes.append(
                f"made while recording: {len(covered)} of {self.window} steps recorded so far; the births of "
                "the step under way are not counted yet"
            )
        # Strong references to the live storages until the end of the report (storages hold no tensor).
        by_site: dict[Site | None, dict[int, list[tuple[Any, int]]]] = {}
        with self._lock:
            kept: list[_Born] = []
            for rec in self._born:
                s = rec[0]()
                if s is None:
                    continue
                kept.append(rec)
                by_site.setdefault(rec[2], {}).setdefault(rec[3], []).append((s, _nbytes(s, rec[1])))
            self._born = kept  # the dead ones are gone for good
        total_count = sum(len(v) for per in by_site.values() for v in per.values())
        total_bytes = sum(nb for per in by_site.values() for v in per.values() for _, nb in v)
        site_bytes = {site: sum(nb for v in per.values() for _, nb in v) for site, per in by_site.items()}
        verdicts = {
            site: judge(tuple(per), covered, site_bytes[site] / len(per), self.min_bytes_per_step)[0]
            for site, per in by_site.items()
        }
        order = sorted(by_site, key=lambda site: (verdicts[site] != ACCUMULATES, -site_bytes[site]))
        shown = order[:_MAX_GROUPS]
        if len(order) > len(shown):
            rest = order[len(shown) :]
            rest_bytes = sum(site_bytes[site] for site in rest)
            notes.append(f"{len(rest)} more sites with {fmt_bytes(rest_bytes)} alive are not listed")
        paths = self._holders(by_site, shown[:_SEARCHED_GROUPS], verdicts, covered, time_limit, notes)
        groups = []
        for site in shown:
            per = by_site[site]
            groups.append(
                build_group(
                    str(site) if site else None,
                    site.function if site else "",
                    site.filename if site else "",
                    {step: (len(v), sum(nb for _, nb in v)) for step, v in per.items()},
                    covered,
                    paths.get(site, ()),
                    self.min_bytes_per_step,
                )
            )
        by_site.clear()
        window_s = _mean(self._window_s)
        after_s = _mean(self._base_s)
        if self._pauses:
            notes.append(self._budget_note(covered))
        elif window_s and after_s and window_s > _COST_NOTE_RATIO * after_s:
            notes.append(
                f"recording the births made steps {step_ranges(covered)} {window_s / after_s:.1f}x slower "
                f"({_fmt_s(window_s)} against {_fmt_s(after_s)} after them); the other steps were not slowed"
            )
        return build_report(
            self.device,
            steps,
            covered,
            groups,
            count_alive=total_count,
            live_bytes=total_bytes,
            notes=notes,
            window=self.window,
            boundary=boundary,
            window_step_s=window_s,
            after_step_s=after_s,
        )

    def _holders(
        self,
        by_site: dict[Site | None, dict[int, list[tuple[Any, int]]]],
        sites: list[Site | None],
        verdicts: dict[Site | None, str],
        covered: tuple[int, ...],
        time_limit: float,
        notes: list[str],
    ) -> dict[Site | None, tuple[HolderPath, ...]]:
        """Holder paths of a few storages per site (oldest steps first), in one bounded search."""
        samples: list[Any] = []
        owners: list[Site | None] = []
        last = covered[-1] if covered else None
        for site in sites:
            per = by_site[site]
            steps = sorted(per)
            if verdicts[site] == ACCUMULATES:
                # One storage of each of the oldest steps: the last step's may be a loop variable.
                picks = [per[s][0][0] for s in steps if s != last][:_SAMPLES] or [per[steps[0]][0][0]]
            elif verdicts[site] == LAST_STEP:
                picks = [per[steps[0]][0][0]]
            else:
                picks = [per[s][0][0] for s in steps][:_SAMPLES]
            samples.extend(picks)
            owners.extend([site] * len(picks))
        if not samples:
            return {}
        if time_limit <= 0:
            notes.append("the holder search was skipped (time_limit=0): holders are not named")
            return {}
        info: dict[str, Any] = {}
        try:
            found = holder_paths_of_storages(samples, max_paths=4, time_limit=time_limit, info=info)
        except Exception as exc:
            notes.append(f"the holder search failed ({type(exc).__name__}: {exc}): holders are not named")
            return {}
        finally:
            samples.clear()
        if info.get("truncated"):
            notes.append(
                f"the holder search stopped ({info.get('reason') or 'limit'}) after "
                f"{float(info.get('seconds') or 0):.1f} s and {info.get('visited')} objects: some holders "
                "may be missing"
            )
        out: dict[Site | None, dict[str, HolderPath]] = {}
        for site, ps in zip(owners, found):
            merged = out.setdefault(site, {})
            for p in ps:
                merged.setdefault(str(p), p)
        return {site: tuple(m.values()) for site, m in out.items()}

    def _budget_note(self, covered: tuple[int, ...]) -> str:
        """Why steps were left out of the recording, and what a recorded step cost."""
        per, rec, base = self._cost()
        n = len(covered)
        if base is None:
            cost = (
                f"a recorded step took {_fmt_s(rec)} (no step ran without the ledger before the end: its "
                "cost could not be measured)"
            )
        else:
            cost = (
                f"the exact ledger costs {_fmt_s(per)} per step here ({_fmt_s(rec)} against {_fmt_s(base)} "
                "without it)"
            )
        limit = f"{self.budget:.0%} of the run's time"
        if n >= self.window:
            return (
                f"the {n} recorded steps were spread over the run ({step_ranges(covered)}): {cost}, and "
                f"recording was paused to keep its cost within {limit}"
            )
        note = f"recorded {n} of {self.window} steps ({step_ranges(covered)}): {cost}; "
        if self._state == _PAUSED:
            note += f"recording is paused until the run is long enough to afford another step within {limit}"
        else:
            note += f"recording more would have cost more than {limit}"
        if n < _MIN_STEPS:
            note += (
                "; one recorded step cannot show what accumulates: a leak here is left to the growth detector"
            )
        return note


def _fmt_s(seconds: float | None) -> str:
    """``2.5 s``, ``40 ms``, ``3.2 ms``, ``850 µs``."""
    if seconds is None:
        return "n/a"
    if seconds >= 1:
        return f"{seconds:.1f} s"
    if seconds >= 0.01:
        return f"{seconds * 1e3:.0f} ms"
    if seconds >= 0.001:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.0f} µs"


def _nbytes(storage: Any, recorded: int) -> int:
    try:
        return int(storage.nbytes())
    except Exception:
        return recorded


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


__all__ = ["LoopSurvivors"]
