"""The watcher's attribution windows: when growth is found (or suspected, or in deep mode every ``every``
steps), the exact storage ledger records each new storage's allocation site for a few steps; the sites whose
live bytes keep rising are joined to the objects that hold them (:func:`torchmem.holders`), to the autograd
graphs they belong to and to reference cycles, and become the leak's culprits.

:class:`Attribution` decides when a window opens, serves and closes; :class:`AttributionWindow` is one window
(a ledger cohort with birth sites and its per-boundary live bytes per site); :func:`find_culprits` names what
a window saw grow.
"""

from __future__ import annotations

import collections
import gc
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import torch

from torchmem.analysis.holders.survivors import holder_paths_of_storages
from torchmem.analysis.leaks import attribute, site_growth
from torchmem.devices import ledger
from torchmem.devices._ledger import Cohort
from torchmem.devices._ledger_sites import Site
from torchmem.results.holders import HolderPath, StepKind
from torchmem.results.leaks import Culprit, Growth, SiteGrowth

# With the ledger as the figure, the attribution window that slides along is renewed after this many times
# its length while it has nothing to attribute: its cohort never accumulates a whole run's storages.
RENEW_AFTER = 8

# Whether a watcher on a host figure turned the ledger on once in this process (see Attribution.open).
_primed: list[bool] = []


class AttributionWindow:
    """An attribution window: a ledger cohort with birth sites, and per-boundary live bytes per site."""

    def __init__(self, device: str | None, opened_at: int, keep: int) -> None:
        self.stack = ExitStack()
        led = ledger()
        self.stack.enter_context(led.enabled())
        # Births on the program's other threads (a producer filling a queue) are counted too, at their sites.
        if led.follow_threads():
            self.stack.callback(led.unfollow_threads)
        self.cohort: Cohort = led.open_cohort(device, sites=True)
        self.opened_at = opened_at
        self.maps: collections.deque[dict[Site | None, tuple[int, int]]] = collections.deque(maxlen=keep)
        self.boundaries = 0

    def record(self) -> None:
        self.maps.append(ledger().cohort_site_bytes(self.cohort))
        self.boundaries += 1

    def close(self) -> None:
        ledger().close_cohort(self.cohort)
        self.stack.close()


class Attribution:
    """When one watcher's attribution windows open, serve and close, and the culprits they named.

    ``window``: the open window (``None`` between windows). ``attempted``: a window has attributed once
    (a suspicion then opens no window: it could not attribute again). ``culprits``: what it named. With a
    host figure (the C heap, RSS), what turning the ledger on and off changes in the figure is torchmem's:
    ``offset`` is left out of the readings from then on, ``excluded`` sums it for the report.
    """

    def __init__(
        self,
        *,
        window: int,
        every: int,
        mode: str,
        min_bytes_per_step: int,
        max_paths: int,
        note: Callable[[str], None],
        on_error: Callable[[str, BaseException], None],
    ) -> None:
        self._window_len = window
        self._every = every
        self._mode = mode
        self._min_bytes_per_step = min_bytes_per_step
        self._max_paths = max_paths
        self._note = note  # a note for the report
        self._on_error = on_error  # an internal error, reported once per place
        self._device = "None"
        self._source = "n/a"
        self._host_figure = False
        self._read: Callable[[], int] = _no_reading
        self.window: AttributionWindow | None = None
        self.culprits: tuple[Culprit, ...] = ()
        self.attempted = False
        self.offset = 0  # torchmem's own change of a host figure, left out of the readings (source="heap")
        self.excluded = 0
        self._attributing = False
        self._quiet_until = 0
        self._deep_window = False  # the open window was opened because deep mode was due
        self._next_deep = every  # the step from which deep mode is due next

    def start(self, device: str, source: str, read: Callable[[], int]) -> None:
        """The watch starts on ``device``, its figure ``source`` read by ``read`` (at call time: the watcher's
        current reader)."""
        self._device = device
        self._source = source
        self._host_figure = source in ("heap", "rss")
        self._read = read

    def warmup_ended(self, n: int) -> None:
        """The warm-up ended at step ``n``. With the ledger on anyway (the ledger is the figure), sites cost
        little more: they are recorded from here on."""
        if self._source == "ledger":
            self.open(n)

    def after_reading(
        self, n: int, growth: Growth, steps: collections.deque[int], values: collections.deque[int]
    ) -> None:
        """A reading at step ``n`` showed ``growth`` (the detector's readings: ``steps``, ``values``): open a
        window on growth, on a suspicion or when deep mode is due; attribute with one that has seen enough
        boundaries, then close it (or, with the ledger as the figure, renew it now and then)."""
        leaking = growth.leaking
        win = self.window
        # Deep mode is due at each multiple of `every` steps, or at the first reading after it (a stride need
        # not divide `every`).
        deep_due = self._mode == "deep" and n >= self._next_deep
        if deep_due and (win is None or win.boundaries >= self._window_len + 1):
            self._next_deep = (n // self._every + 1) * self._every
        if win is None:
            # (Once attributed, a suspicion opens no window: it could not attribute again.)
            if (
                (leaking and not self.attempted)
                or deep_due
                or (not self.attempted and n >= self._quiet_until and self._suspicious(steps, values))
            ):
                self.open(n)
                self._deep_window = deep_due
            return
        ready = win.boundaries >= self._window_len + 1
        if ready:
            # (A deep window of a figure other than the ledger opened when deep mode was due: it attributes
            # once it has seen enough boundaries, `window` steps later.)
            if (leaking and not self.attempted) or deep_due or self._deep_window:
                self._deep_window = False
                self._attribute(win, growth)
            # A window costs a dispatch per op where the ledger is not on anyway: close it once it has
            # served (attributed, or the suspicion was not confirmed). With the ledger as the figure it
            # slides on, renewed now and then so that its cohort stays small.
            if self._source != "ledger":
                if self.attempted or not leaking:
                    if not self.attempted:
                        self._quiet_until = n + self._every  # unconfirmed: no new window for a while
                    self.close()
            elif (self.attempted or not leaking) and win.boundaries >= RENEW_AFTER * (self._window_len + 1):
                self.close()
                self.open(n)

    def _suspicious(self, steps: collections.deque[int], values: collections.deque[int]) -> bool:
        if len(values) < 3:
            return False
        gap = steps[-1] - steps[-3]
        return (
            values[-1] - values[-2] > 0
            and values[-2] - values[-3] > 0
            and (values[-1] - values[-3] >= self._min_bytes_per_step * gap)
        )

    def open(self, n: int) -> None:
        before = self._read() if self._host_figure else 0
        self.window = AttributionWindow(self._device, n, self._window_len + 1)
        if self._host_figure:
            # The process's own heap is the figure: what turning the ledger on allocates (its first dispatch
            # loads parts of torch) is torchmem's, not the program's. One op through the mode, then exclude
            # the change from the readings.
            torch.empty(0)
            if not _primed:  # the first time in this process: the garbage that loading left, collected now
                _primed.append(True)
                gc.collect()
            self._exclude(self._read() - before)
        self.window.record()

    def close(self) -> None:
        win, self.window = self.window, None
        if win is not None:
            before = self._read() if self._host_figure else 0
            win.close()
            if self._host_figure:
                self._exclude(self._read() - before)

    def _exclude(self, delta: int) -> None:
        """Leave torchmem's own change of a host figure (``delta`` bytes) out of the readings from now on."""
        self.offset += delta
        self.excluded += abs(delta)

    def _attribute(self, win: AttributionWindow, growth: Growth) -> None:
        if self._attributing:
            return
        self._attributing = True
        # With a host figure, what naming the culprits changes in it (the cycle scan's collection frees the
        # garbage the program left; the holder search's index) is torchmem's too: left out of the readings.
        before = self._read() if self._host_figure else 0
        try:
            self.attempted = True
            self.culprits = find_culprits(
                win,
                growth,
                min_bytes_per_step=self._min_bytes_per_step,
                max_paths=self._max_paths,
                device=self._device,
                note=self._note,
                carried=_carried_here(),
                backward=_backward_ran(),
            )
        except Exception as exc:
            self._on_error("attribution", exc)
        finally:
            self._attributing = False
            if self._host_figure:
                self._exclude(self._read() - before)


def _carried_here() -> frozenset[str]:
    """The variables the program's loops on this thread's stack carry from iteration to iteration (the
    attribution runs at a step's end, inside the program's loop); empty where none is found."""
    import sys

    from torchmem.capture.loop_calls import loop_carried

    try:
        return loop_carried(sys._getframe(1))
    except Exception:
        return frozenset()


def _backward_ran() -> bool | None:
    """Whether the program ran a backward so far, where ``torchmem run`` counts its boundaries (``None``:
    not known)."""
    from torchmem.capture.boundaries import backward_ran

    try:
        return backward_ran()
    except Exception:
        return None


def _no_reading() -> int:
    return 0


def find_culprits(
    win: AttributionWindow,
    growth: Growth,
    *,
    min_bytes_per_step: int,
    max_paths: int,
    device: str,
    note: Callable[[str], None],
    carried: frozenset[str] = frozenset(),
    backward: bool | None = None,
) -> tuple[Culprit, ...]:
    """The culprits of the growth ``win`` saw (the watch's ``growth`` at the last reading): the sites whose
    live bytes kept rising, joined to their holders (``max_paths`` paths per storage), autograd graphs and
    reference cycles. ``carried``: the variables the program's loop carries (preferred among holders of the
    same tensors); ``backward``: whether the program ran a backward (worded into the fixes; ``None``: not
    known)."""
    by_growth = site_growth(list(win.maps))
    if not by_growth:
        return ()
    top = sorted(by_growth.items(), key=lambda kv: -kv[1][0])[:8]
    wanted = {site for site, _ in top}
    entries = ledger().cohort_entries(win.cohort)
    by_site: dict[Site | None, list[tuple[Any, int]]] = {}
    for storage, nbytes, site in entries:
        if site in wanted:
            by_site.setdefault(site, []).append((storage, nbytes))
    entries.clear()
    # Reference cycles first: what only the garbage collector frees has no holder path.
    keys = {s._cdata for lst in by_site.values() for s, _ in lst}
    cyclic = cycle_scan(keys)
    facts: list[SiteGrowth] = []
    samples: list[Any] = []
    sample_meta: list[tuple[Site | None, int]] = []
    for site, (per_step, count_per_step) in top:
        lst = by_site.get(site, [])  # oldest first: the newest may be held by a loop variable
        live = sum(nb for _, nb in lst)
        cyc = [s for s, _ in lst if s._cdata in cyclic]
        if cyc:
            facts.append(
                SiteGrowth(
                    str(site) if site else None,
                    per_step,
                    live,
                    len(lst),
                    count_per_step,
                    (),
                    in_cycle=True,
                    cycle_types=cyclic[cyc[0]._cdata],
                )
            )
            continue
        for s, nb in lst[:3]:
            if s._cdata not in cyclic:
                samples.append(s)
                sample_meta.append((site, nb))
    by_site.clear()
    # Once per leak: the search may take a while on a big heap (torch.compile, distributed imports).
    info: dict[str, Any] = {}
    paths = (
        holder_paths_of_storages(samples, max_paths=max_paths, time_limit=10.0, info=info) if samples else []
    )
    if info.get("truncated") and not any(paths):
        note(
            f"the holder search stopped ({info.get('reason')}) after {info.get('seconds', 0):.1f} s and "
            f"{info.get('visited')} objects: holders are not named"
        )
    samples.clear()
    grouped: dict[Site | None, list[tuple[int, tuple[HolderPath, ...]]]] = {}
    for (site, nb), found in zip(sample_meta, paths):
        grouped.setdefault(site, []).append((nb, found))
    for site, (per_step, count_per_step) in top:
        if site not in grouped:
            continue
        rows = grouped[site]
        unique: dict[str, HolderPath] = {}  # each path once, in the order found
        for _, ps in rows:
            for p in ps:
                unique.setdefault(str(p), p)
        all_paths = tuple(unique.values())
        sampled = sum(nb for nb, _ in rows)
        saved = sum(nb for nb, ps in rows if any(StepKind.SAVED_TENSOR in p.kinds for p in ps))
        live_site = win.maps[-1].get(site, (0, 0))[0] if win.maps else sampled
        facts.append(
            SiteGrowth(
                str(site) if site else None,
                per_step,
                live_site,
                len(rows),
                count_per_step,
                all_paths,
                saved_bytes=int(live_site * saved / sampled) if sampled else 0,
            )
        )
    # A leak's culprits are a fair share of it (of the rate it was found at: below min_bytes_per_step for
    # growth reported for its total); deep mode lists every site that keeps growing.
    limit = min(min_bytes_per_step, growth.min_bytes_per_step or min_bytes_per_step) / 4
    floor = limit if growth.leaking else 4096
    return attribute(
        facts, min_bytes_per_step=min(floor, limit), device=device, carried=carried, backward=backward
    )


def _dict_of(o: Any) -> Any:
    try:
        return object.__getattribute__(o, "__dict__")
    except Exception:  # no __dict__, or a dead weakref.proxy
        return None


def cycle_scan(keys: set[int]) -> dict[int, tuple[str, ...]]:
    """Storages among ``keys`` that only unreachable reference cycles hold, with the types that hold them.

    One ``gc.collect()`` with ``DEBUG_SAVEALL`` set for its duration only (the user's gc flags are restored
    right after), so the unreachable objects can be inspected; they are then released and collected as the
    garbage collector would have done.
    """
    if not keys:
        return {}
    old = gc.get_debug()
    n0 = len(gc.garbage)
    gc.set_debug(old | gc.DEBUG_SAVEALL)
    try:
        gc.collect()
    finally:
        gc.set_debug(old)
    garbage = gc.garbage[n0:]
    del gc.garbage[n0:]
    found: dict[int, tuple[str, ...]] = {}
    if garbage:
        targets: dict[int, int] = {}  # id(tensor) -> storage key
        tensor_t = torch.Tensor
        # type() rather than isinstance(): a dead weakref.proxy in the garbage raises on __class__.
        for o in garbage:
            if issubclass(type(o), tensor_t):
                try:
                    k = o.untyped_storage()._cdata
                except (RuntimeError, NotImplementedError):
                    continue
                if k in keys:
                    targets[id(o)] = k
        if targets:
            # Who in the cycle refers to each tensor: an object directly, or through its (inline) __dict__.
            owners: dict[int, list[Any]] = {}
            for o in garbage:
                if issubclass(type(o), tensor_t):
                    continue
                for r in gc.get_referents(o):
                    k = targets.get(id(r))
                    if k is not None:
                        owners.setdefault(k, []).append(o)
                    elif type(r) is dict and type(o) is not dict:
                        for v in r.values():
                            k2 = targets.get(id(v))
                            if k2 is not None:
                                owners.setdefault(k2, []).append(o)
            holders: dict[int, list[str]] = {}
            for k, objs in owners.items():
                for o in objs:
                    if type(o) is dict:  # a materialised __dict__: name the object that owns it
                        o = next((g for g in garbage if _dict_of(g) is o), o)
                    holders.setdefault(k, []).append(type(o).__name__)
                objs.clear()
            for k in targets.values():
                found[k] = tuple(dict.fromkeys(holders.get(k, ["objects"])))
        garbage.clear()
        gc.collect()
    return found


__all__ = ["RENEW_AFTER", "Attribution", "AttributionWindow", "cycle_scan", "find_culprits"]
