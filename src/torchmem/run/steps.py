"""What ends a step of the program under ``torchmem run``: the function named by ``--step-marker`` (its
returns, seen by a profile hook), else the boundaries torchmem recognises (capture/boundaries.py: optimizer
step, backward, model call, DataLoader batch, generate), else the program's repeating unit
(capture/units.py). A better boundary found later takes over: the session's watchers restart on it."""

from __future__ import annotations

import os
import sys
import threading
import types
from collections.abc import Callable
from typing import Any


class StepSource:
    """Calls ``step`` at each step's end on the thread that started it.

    ``restart(label)`` is called when a better boundary takes over a counted one: the session's watchers
    start again on it, and it returns the steps counted before (``0``: nothing was counted, nothing
    restarted). ``fresh`` says whether no step was counted yet; ``first_reading`` reads the figure (at a
    boundary's first event, while fresh); ``records`` is the session's :class:`~torchmem.run.records.Records`.
    """

    def __init__(
        self,
        step_marker: str | None,
        argv: list[str],
        records: Any,
        step: Callable[[], None],
        restart: Callable[[str], int],
        fresh: Callable[[], bool],
        first_reading: Callable[[], int],
    ) -> None:
        self.step_marker = step_marker
        self._argv = argv
        self._records = records
        self._step = step
        self._restart = restart
        self._fresh = fresh
        self._first_reading = first_reading
        self._main = threading.get_ident()
        self._boundaries: Any = None
        self._units: Any = None  # capture/units.UnitFinder: the repeating unit when no boundary is found
        self._profile_prev: Any = None
        self._marker_returns = 0
        self._kind: str | None = None
        self._label = ""
        self._switches: list[str] = []
        self._first_readings: dict[str, int] = {}  # boundary kind -> the figure at its first event
        self._replay: int | None = None  # the next step's figure, read earlier (StepBoundaries on_first)
        self._carried: set[str] = set()
        self._carried_looks = 0

    @property
    def carried(self) -> frozenset[str]:
        """The variables the program's loop hands from iteration to iteration (read before they are
        written: ``hidden`` in ``logits, hidden = model(tokens, hidden)``), from the loops the program was in
        at its first step boundaries: the holder to name among those that keep the same tensors."""
        return frozenset(self._carried)

    @property
    def backward_ran(self) -> bool | None:
        """Whether the program ran a backward (or an optimizer step) so far; ``None`` where the boundaries
        were not counted (``--step-marker`` counts only optimizer steps: not known)."""
        b = self._boundaries
        if b is None or self.step_marker:
            return None
        return bool(b.backward_ran)

    def _program(self) -> str | None:
        """The program's file (its frames are where its loops are), ``None`` for ``-c``/``-m``."""
        argv = self._argv
        return os.path.abspath(argv[0]) if argv and os.path.isfile(argv[0]) else None

    def _look_at_loop(self) -> None:
        """At the first three boundaries on the program's thread: the variables its loops carry."""
        if self._carried_looks >= 3 or threading.get_ident() != self._main:
            return
        self._carried_looks += 1
        try:
            from torchmem.capture.loop_calls import loop_carried

            self._carried |= loop_carried(sys._getframe(1), self._program())
        except Exception as exc:  # the holder is then chosen without it
            self._carried_looks = 3
            self._records.note(f"the loop's carried variables were not read ({type(exc).__name__}: {exc})")

    @property
    def kind(self) -> str | None:
        """The boundary chosen (``"optimizer"``, ..., ``"unit"``), ``None`` before one is."""
        return self._kind

    @property
    def label(self) -> str:
        """What one step is, in words (``""`` before a boundary is chosen)."""
        return self._label

    @property
    def switches(self) -> tuple[str, ...]:
        """The notes of the switches between boundaries."""
        return tuple(self._switches)

    @property
    def boundaries(self) -> Any:
        """The recognised boundaries (``capture/boundaries.StepBoundaries``), ``None`` before
        :meth:`install`."""
        return self._boundaries

    def install(self) -> None:
        """Start counting: the profile hook of ``--step-marker``, else the boundaries and the unit finder."""
        from torchmem.capture.boundaries import StepBoundaries

        note = self._records.note
        self._boundaries = StepBoundaries(
            self._on_boundary,
            self._on_switch,
            thread=self._main,
            on_error=note,
            on_first=self._on_first,
        )
        if self.step_marker:
            # The user said what a step is: only optimizer steps are counted (for the 0-step advice).
            self._boundaries._install_optimizer()
            self._profile_prev = sys.getprofile()
            sys.setprofile(self._profile)
        else:
            self._boundaries.start()
            try:
                from torchmem.capture.units import UnitFinder

                self._units = UnitFinder(self._unit_step, self._unit_found, note, self._main, self._program())
            except Exception as exc:
                note(f"the repeating unit will not be looked for ({type(exc).__name__}: {exc})")

    def remove(self) -> None:
        """Stop counting: every hook removed."""
        if self.step_marker:
            sys.setprofile(self._profile_prev)
        if self._boundaries is not None:
            self._boundaries.stop()
        if self._units is not None:
            self._units.remove()

    def poll(self, children: bool) -> None:
        """The sampler's look: modules imported since (their boundaries), and while no boundary is chosen
        (and no work runs in child processes: ``children``), the call the loop repeats."""
        if self._boundaries is not None:
            self._boundaries.check_imports()
        if self._units is not None and self._kind in (None, "unit") and not children:
            # no step yet (and no work in child processes): the loop's call; or a unit whose loop was left
            self._units.sample()

    def write_boundary(self, steps: int, timeline: bool) -> None:
        """The run's end: the boundary record with the ``steps`` counted (without a boundary: the timeline's
        seconds where ``timeline`` kept points, else none)."""
        if self._kind is not None:
            self._records.record("boundary", kind=self._kind, label=self._label, count=steps)
        elif not self.step_marker:
            self._records.record("boundary", kind="timeline" if timeline else "none", label="second", count=0)

    def why_no_steps(self, capture: str, followers: Any) -> str:
        """Why no step was counted and what to do (``followers``: the session's followed children)."""
        from torchmem.run.advice import why_no_steps

        return why_no_steps(
            capture,
            followers.followed,
            followers.children,
            self.step_marker,
            self.optimizer_steps(),
            self._boundaries,
        )

    def take_replay(self) -> int | None:
        """The figure of the step ending now when it was read at the boundary's first event, once."""
        replay, self._replay = self._replay, None
        return replay

    def optimizer_steps(self) -> int:
        """The optimizer steps that ran on the main thread."""
        b = self._boundaries
        return int(b.counts["optimizer"]) if b is not None else 0

    def last_optimizer(self) -> Any:
        b = self._boundaries
        return getattr(b, "last_optimizer", None) if b is not None else None

    # -- the quiet lane: steps the session needs no call for, counted by the boundary's hook ----------
    def quiet(self, n: int) -> bool:
        """Hand the next ``n`` steps to the quiet lane of the chosen boundary (its hook only counts them, no
        call reaches the session): ``False`` where the steps do not come from a recognised boundary (the
        step marker, the repeating unit: the session counts its quiet steps itself)."""
        b = self._boundaries
        if b is None or self.step_marker or self._kind in (None, "unit") or b.chosen != self._kind:
            return False
        b.quiet = n
        return True

    def take_quiet(self) -> int:
        """The steps the quiet lane counted since the last call (the session adds them to its count)."""
        b = self._boundaries
        return b.take_quiet() if b is not None else 0

    def quiet_counted(self) -> int:
        """The steps the quiet lane counted that the session has not taken yet (read from any thread)."""
        b = self._boundaries
        return b.quiet_counted if b is not None else 0

    def end_quiet(self) -> None:
        """The next step calls the session again (an OOM is pending)."""
        b = self._boundaries
        if b is not None:
            b.end_quiet()

    def _on_boundary(self) -> None:
        if not self._records.disabled and not self.step_marker:
            if self._carried_looks < 3:
                self._look_at_loop()
            self._step()

    def _on_first(self, kind: str) -> None:
        """The first event of a kind while none is chosen: its reading, for the step it ends if the kind is
        chosen at its next event (a boundary is recognised at its second occurrence)."""
        if self._records.disabled or self.step_marker or not self._fresh():
            return
        try:
            self._first_readings[kind] = self._first_reading()
        except Exception as exc:
            self._records.note(f"step detection: a first reading failed ({type(exc).__name__}: {exc})")

    def _unit_found(self, label: str) -> None:
        """The program's repeating unit was found (no other boundary): its calls are the steps from now. A
        new unit after one whose loop the program left (a set-up loop) takes over."""
        text = f"{label} (the function the program's loop calls)"
        if self._kind is None or (self._kind == "unit" and self._label != text):
            self._on_switch("unit", text)

    def _unit_step(self) -> None:
        if self._kind == "unit" and not self._records.disabled:
            self._look_at_loop()
            self._step()

    def _on_switch(self, kind: str, label: str) -> None:
        """A step boundary was chosen, or a better one took over: the watchers restart on it."""
        if self._records.disabled or self.step_marker:
            return
        if kind != "unit" and self._units is not None:
            # a boundary torchmem recognises counts the steps: the program's functions are its own again
            self._units.active = False
            self._units.remove()
        try:
            previous, old_label = self._kind, self._label
            self._kind, self._label = kind, label
            if previous is not None:
                # the unit's label now is the new unit's: the one left is the label it had
                before = old_label.split(" (", 1)[0] if previous == "unit" else self._label_of(previous)
                counted = self._restart(label)
                if counted >= 3:
                    self._switches.append(
                        f"steps were counted at each {before} until step {counted}, then at each {label} (a "
                        "better boundary was found): the leak detector restarted"
                    )
            self._records.record("boundary", kind=kind, label=label, count=0)
            first = self._first_readings.pop(kind, None) if previous is None else None
            self._first_readings.clear()
            if first is not None and self._fresh():
                self._replay = first
                self._step()  # the first event of the kind ended the first step, at the figure read then
        except Exception as exc:
            self._records.note(f"step detection: switching boundaries failed ({type(exc).__name__}: {exc})")

    def _label_of(self, kind: str) -> str:
        from torchmem.capture.boundaries import _default_label

        if kind == "unit":
            return self._units.label if self._units is not None and self._units.label else "call"
        return _default_label(kind)

    def _profile(self, frame: types.FrameType, event: str, _arg: Any) -> None:
        if event == "return" and frame.f_code.co_name == self.step_marker and not self._records.disabled:
            self._marker_returns += 1
            self._step()
