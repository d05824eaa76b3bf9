"""The module profiler's level and peaks (:mod:`~torchmem.capture.profile`): every hook event reads the
device's allocated bytes and the peak since the previous event, then starts a new interval. On CUDA the
interval is read on torch's peak counter shared as ``track()`` shares it (enclosing ``track()`` blocks and
the program's own ``max_memory_allocated()`` keep their peaks; XPU resets torch's counters), on the CPU on a
ledger watermark torchmem owns. A phase window (a module's forward or backward, the optimizer step) keeps the
highest interval peak while it is open: the phase's peak is its rise above the level it opened at.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

from torchmem.analysis.profile import RawModule
from torchmem.capture.profile_storages import Alive
from torchmem.capture.track import _Frame as _TrackFrame
from torchmem.capture.track import _open, _open_lock
from torchmem.devices import Backend, CpuBackend, Ledger, ledger

# The parts alive at a moment: (level, gradients, optimizer state, activations, where the program was).
Snapshot = tuple[int, int, int, int, str]


@dataclass
class PhaseWindow:
    """One module phase (forward, backward) or the optimizer step being measured: where it started and the
    highest allocated bytes seen inside it."""

    row: int
    kind: str  # "forward", "backward", "step"
    start: int
    peak: int
    task: int = -1


class PeakMeter:
    """The device's level and peaks for one profiled block, and the phase windows open now.

    ``rows``: the profile's rows, whose forward and backward peaks closing windows set. ``level``: the
    allocated bytes at the last event; ``best``: the block's highest peak so far (-1 before the first
    reading), ``best_snap`` the parts alive when it happened; ``snap``: those parts at the last event.
    """

    def __init__(self, dev: str, be: Backend, rows: list[RawModule]) -> None:
        self.dev = dev
        self._be = be
        self._rows = rows
        self.cpu = isinstance(be, CpuBackend)
        self._measure = True
        self._tframe: _TrackFrame | None = None
        self._ptoken: int | None = None  # the shared peak counter's reader (CUDA)
        self._ptoken_used: bool | None = None
        self._led: Ledger = ledger()
        self._mark: Any = None
        self.pre = Alive()  # CPU: storages the ledger does not count (born before it was on)
        self.entry_other = 0  # bytes allocated at entry that are not the model's (CUDA)
        self.open_w: list[PhaseWindow] = []
        self.level = 0
        self.best = -1
        self.snap: Snapshot = (0, 0, 0, 0, "at the start of the block")
        self.best_snap: Snapshot = self.snap
        self._started = False

    def open(
        self, stack: ExitStack, peaks: bool, model_bytes: Callable[[], int], note: Callable[[str], None]
    ) -> None:
        """Start reading: on the CPU the ledger (on for the block, through ``stack``) and a watermark; on a
        device with allocator statistics, the shared peak counter (``peaks``) or torch's counters reset.
        ``model_bytes()``: what the model already holds (the rest at entry is the program's)."""
        if self.cpu:
            stack.enter_context(self._led.enabled())
            self._mark = self._led.open_watermark(self.dev)
            return
        h = self._be.hot()
        if h.allocated is not None:
            self.entry_other = max(int(h.allocated) - model_bytes(), 0)
        if h.allocated is None:
            self._measure = False
            note(f"{self.dev} has no allocator statistics: peaks are not measured")
        elif peaks:
            self._tframe = _TrackFrame()
            self._ptoken = self._be.open_peak()  # CUDA: the shared counter, the program's peaks stay
            self._ptoken_used = self._ptoken is not None
            if self._ptoken is None:
                with _open_lock:
                    prior = h.peak_allocated or 0
                    for other in _open.get(self.dev, ()):
                        other.carried = max(other.carried, prior)
                    self._be.reset_peak()
                    _open.setdefault(self.dev, []).append(self._tframe)
        else:
            note("peaks=False: forward/backward peaks and the measured peak are not read")

    def begin(self, grads: int, ostate: int, act: int) -> None:
        """The block's first reading (the hooks are in place); the parts alive now are the first snapshot."""
        self.level = 0
        self.best = -1
        self.snap = (0, 0, 0, 0, "at the start of the block")
        self.tick()
        self.best = self.level
        self.set_snap(grads, ostate, act)
        self.best_snap = self.snap
        self._started = True

    @property
    def measured(self) -> int | None:
        """The block's measured peak (``None`` where peaks are not read)."""
        return self.best if self.best >= 0 and (self.cpu or self._tframe is not None) else None

    @property
    def counters_reset(self) -> bool:
        """Whether torch's own peak counters were reset at every event (no shared counter here: XPU)."""
        return self._tframe is not None and self._ptoken_used is False

    def note_pre(self, storage: Any) -> None:
        """CPU: count a storage the ledger does not (born before it was on) in the absolute level.

        Found mid-block, it was alive all along: the level, the best peak and every open window move up
        together, so no window sees a rise that is only a discovery.
        """
        if not self.cpu or self._led.counts(storage._cdata) or storage.device.type != "cpu":
            return
        before = self.pre.bytes
        self.pre.add(storage)
        nb = self.pre.bytes - before
        if nb and self._started:
            self.level += nb
            self.best += nb
            lv, g, o, a, where = self.best_snap
            self.best_snap = (lv + nb, g, o, a, where)
            lv, g, o, a, where = self.snap
            self.snap = (lv + nb, g, o, a, where)
            for w in self.open_w:
                w.start += nb
                w.peak += nb

    def _read(self) -> tuple[int, int] | None:
        if self.cpu:
            led = self._led
            cur = led.current(self.dev) + self.pre.bytes
            pk = self._mark.peak + self.pre.bytes
            self._mark.peak = led.current(self.dev)
            return cur, max(pk, cur)
        if not self._measure:
            return None
        h = self._be.hot()
        if h.allocated is None:
            return None
        cur = h.allocated
        if self._tframe is None:
            return cur, cur
        if self._ptoken is not None:  # the interval's peak, then a new interval
            got = self._be.restart_peak(self._ptoken)
            return cur, max(got[0] if got else cur, cur)
        pk = max(h.peak_allocated or cur, self._tframe.carried, cur)
        with _open_lock:
            self._tframe.carried = 0
            for other in _open.get(self.dev, ()):
                if other is not self._tframe:
                    other.carried = max(other.carried, pk)
            self._be.reset_peak()
        return cur, pk

    def tick(self) -> None:
        """A hook event: the interval's peak goes to the block and the open windows; a new interval starts."""
        r = self._read()
        if r is None:
            return
        cur, pk = r
        if pk > self.best:
            self.best = pk
            self.best_snap = self.snap
        for w in self.open_w:
            if pk > w.peak:
                w.peak = pk
        self.level = cur

    def _where(self) -> str:
        if not self.open_w:
            return "outside the model's modules"
        w = self.open_w[-1]
        if w.kind == "step":
            return "optimizer step"
        name = self._rows[w.row].name
        label = f"'{name}'" if name else f"the model ({self._rows[w.row].type})"
        return f"{w.kind} of {label}"

    def set_snap(self, grads: int, ostate: int, act: int) -> None:
        """The parts alive now: the level, the gradients', optimizer state's and activations' bytes."""
        self.snap = (self.level, grads, ostate, act, self._where())

    def open_window(self, row: int, kind: str, task: int = -1) -> PhaseWindow:
        w = PhaseWindow(row, kind, self.level, self.level, task)
        self.open_w.append(w)
        return w

    def close_window(self, w: PhaseWindow) -> None:
        """Close ``w``: its rise above the level it opened at is its row's forward or backward peak."""
        if w in self.open_w:
            self.open_w.remove(w)
        if not self._measure or (self._tframe is None and not self.cpu):
            return
        rise = max(w.peak - w.start, 0)
        r = self._rows[w.row] if w.kind != "step" else None
        if r is None:
            return
        if w.kind == "forward":
            r.forward_peak = rise if r.forward_peak is None else max(r.forward_peak, rise)
        else:
            r.backward_peak = rise if r.backward_peak is None else max(r.backward_peak, rise)

    def close_windows(self, kind: str, task: int | None = None) -> None:
        """Close the open windows of ``kind`` (of the backward pass ``task`` only, when given)."""
        for w in [w for w in self.open_w if w.kind == kind and (task is None or w.task == task)]:
            self.close_window(w)

    def close_all(self) -> None:
        while self.open_w:
            self.close_window(self.open_w[-1])

    def close(self) -> None:
        """Stop reading: the shared counter's reader, the track frame (its peak carried to enclosing
        ``track()`` blocks), the CPU watermark."""
        token = self._ptoken
        if token is not None:
            self._ptoken = None
            self._be.close_peak(token)
        if self._tframe is not None:
            with _open_lock:
                frames = _open.get(self.dev, [])
                if self._tframe in frames:
                    frames.remove(self._tframe)
                for other in frames:
                    other.carried = max(other.carried, max(self.best, 0))
        if self._mark is not None:
            self._led.close_watermark(self._mark)

    def clear(self) -> None:
        """Drop the storages counted beside the ledger (weak references)."""
        self.pre.clear()


__all__ = ["PeakMeter", "PhaseWindow", "Snapshot"]
