"""``torchmem.watch()``: per-step memory monitoring that finds leaks and names them.

Light mode reads one allocator figure at step boundaries (every step, or every other step when a step is so
short that the read would cost more than 1 % of it). When the figure grows steadily, an *attribution window*
opens: the exact storage ledger records each new storage's allocation site for a few steps, and the sites
whose live bytes keep rising are joined to the objects that hold them (:func:`torchmem.holders`), to the
autograd graphs they belong to and to reference cycles. Deep mode opens such windows periodically even
without growth. On a device without allocator statistics (the CPU) the ledger is the figure itself, on for
the whole watch, unless ``source="heap"`` asks for the C heap in use as the figure (one ~1 µs read per step,
the ledger on only in attribution windows, as with an allocator).

Cost per step: one reading, then O(1) work (:class:`~torchmem.analysis.leaks.GrowthStream`'s pre-checks and
a bounded series): flat in the number of steps (``benchmarks/watch_cost.py``).
"""

from __future__ import annotations

import collections
import gc
import logging
import math
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack
from typing import Any, Generic, TypeVar

import torch

from torchmem._errors import TorchmemError
from torchmem._format import fmt_bytes
from torchmem._warn import emit_warning
from torchmem.analysis.holders.survivors import holder_paths_of_storages
from torchmem.analysis.leaks import (
    STEADY_EVIDENCE,
    GrowthStream,
    attribute,
    detect_growth,
    inner_growth,
    large_growth,
    run_threshold,
    short_run_growth,
    site_growth,
    with_total,
)
from torchmem.devices import Backend, DeviceLike, backend, ledger, resolve
from torchmem.devices._host import heap_in_use, process_rss
from torchmem.devices._ledger import Cohort, Site
from torchmem.results.holders import HolderPath, StepKind
from torchmem.results.leaks import Culprit, Growth, LeakReport, SiteGrowth
from torchmem.results.survivors import SurvivorReport

_log = logging.getLogger("torchmem")
T = TypeVar("T")

# Readings after the warm-up that the steady test needs (detect_growth's steady_samples).
STEADY_READINGS = 5
# Readings the detector judges (detect_growth's window).
WINDOW_READINGS = 32
# With the ledger as the figure, the attribution window that slides along is renewed after this many times
# its length while it has nothing to attribute: its cohort never accumulates a whole run's storages.
_RENEW_AFTER = 8
# A host figure's reading is timed every this many readings, and the stride chosen again.
_RETUNE_EVERY = 64
# A relaxed watcher (see Watcher._relax_after): the readings' share of a step, and the widest stride.
_RELAXED_SHARE = 0.0025
_RELAXED_MAX_STRIDE = 256

SOURCES = ("auto", "allocator", "ledger", "heap")

# Active watchers per device; weak, so the registry never keeps a watcher (or what it wraps) alive.
_active: weakref.WeakValueDictionary[str, Watcher[Any]] = weakref.WeakValueDictionary()
_active_lock = threading.Lock()


def active_watchers() -> list[Watcher[Any]]:
    """The users' watchers running now (one per device at most)."""
    with _active_lock:
        return [w for w in _active.values() if w._started and not w._stopped]


# Whether a watcher on a host figure turned the ledger on once in this process (see _open_window).
_primed: list[bool] = []


class WatchError(TorchmemError):
    """A watcher cannot start or is used the wrong way (a second watcher on a device, no statistics)."""


class LeakWarning(UserWarning):
    """Emitted once per watcher when memory is found to grow step over step."""


class _AttributionWindow:
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


class Watcher(Generic[T]):
    """Watches device memory across steps; returned by :func:`watch`.

    Use it as an iterable wrapper (``for batch in torchmem.watch(loader)``), as a context manager with
    :meth:`step`, or with ``optimizer_steps=True`` to count optimizer steps. :meth:`report` can be called at
    any time, also after the watch ended.
    """

    def __init__(
        self,
        iterable: Iterable[T] | None,
        device: DeviceLike,
        mode: str,
        warmup: int,
        min_bytes_per_step: int,
        window: int,
        every: int,
        stride: int | None,
        max_stride: int | None,
        source: str,
        optimizer_steps: bool,
        on_leak: Callable[[LeakReport], Any] | None,
        warn: bool,
        max_paths: int,
        survivors: bool = False,
    ) -> None:
        if mode not in ("light", "deep"):
            raise WatchError(f"mode must be 'light' or 'deep', not {mode!r}.", "Use mode='light' (default).")
        if source not in SOURCES:
            raise WatchError(
                f"source must be 'auto', 'allocator', 'ledger' or 'heap', not {source!r}.",
                "Leave it at 'auto'.",
            )
        for name, v, lo in (("warmup", warmup, 0), ("window", window, 2), ("every", every, 1)):
            if not isinstance(v, int) or isinstance(v, bool) or v < lo:
                raise WatchError(f"{name} must be an integer >= {lo}, not {v!r}.")
        for name, val in (("stride", stride), ("max_stride", max_stride)):
            if val is not None and (not isinstance(val, int) or isinstance(val, bool) or val < 1):
                raise WatchError(f"{name} must be a positive integer or None, not {val!r}.")
        if min_bytes_per_step <= 0:
            raise WatchError(f"min_bytes_per_step must be positive, not {min_bytes_per_step!r}.")
        self._iterable = iterable
        self._device_spec = device
        self.mode = mode
        self.warmup = warmup
        self.min_bytes_per_step = int(min_bytes_per_step)
        self._window_len = window
        self._every = every
        self._stride_fixed = stride
        self._max_stride = max_stride
        self._source_wanted = source
        self._optimizer_steps = optimizer_steps
        self._on_leak = on_leak
        self._warn = warn
        self._max_paths = max_paths
        self._want_survivors = bool(survivors)
        self._survivors: Any = None  # a LoopSurvivors with survivors=True

        self.device: torch.device | None = None
        self.source = "n/a"
        self.steps = 0
        self._backend: Backend | None = None
        self._stack: ExitStack | None = None
        self._started = False
        self._stopped = False
        self._thread: int | None = None
        self._series: list[tuple[int, int]] = []
        self._keep_every = 1
        # The detector, over the last WINDOW_READINGS readings after the warm-up.
        self._stream = GrowthStream(self.min_bytes_per_step, STEADY_READINGS, WINDOW_READINGS)
        # A threshold never hides growth that is large over the run: the first reading after the warm-up,
        # and the same test at the run's own rate once the growth since it is large (see _over_the_run).
        self._run_first: tuple[int, int] | None = None
        self._run_stream: GrowthStream | None = None
        self._post_steps = self._stream.steps
        self._post_values = self._stream.values
        self._reader: Callable[[], int] = _no_reading
        self._offset = 0  # torchmem's own change of a host figure, left out of the readings (source="heap")
        self._excluded = 0
        self._stride = 1
        self._stride_note: str | None = None
        self._readings = 0  # after the warm-up
        # After this many readings (``torchmem run``: a long run), the stride is chosen again now and then
        # from the readings' cost in the loop, to keep them under _RELAXED_SHARE of the run, max_stride aside.
        self._relax_after: int | None = None
        self._tune_cost: float | None = None
        self._tune_at: tuple[int, float] | None = None  # (step, time) of the last timed reading
        self._read_cost = 0.0
        self._read_times: list[float] = []
        self._last_t: float | None = None
        self._durations: collections.deque[float] = collections.deque(maxlen=16)
        self._window: _AttributionWindow | None = None
        self._growth: Growth = Growth(False, 0.0, 0.0, "none", 0, "no steps yet")
        self._explained: tuple[tuple[int, int], Growth] | None = None
        self._detected_at: int | None = None
        self._stopped_at: int | None = None
        self._culprits: tuple[Culprit, ...] = ()
        self._notes: list[str] = []
        self._errors: set[str] = set()
        self._warned = False
        self._hook: Any = None
        self._attributing = False
        self._attempted = False
        self._quiet_until = 0
        self._exclusive = True  # counts as the one user watcher of its device
        self._workers: Any = None  # the DataLoader checks (capture/workers.py) of a user's watcher

    # -- lifecycle -------------------------------------------------------------------------------
    def __enter__(self) -> Watcher[T]:
        self._start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __iter__(self) -> Iterator[T]:
        if self._iterable is None:
            raise WatchError(
                "This watcher wraps no iterable.", "Pass one: `for batch in torchmem.watch(loader): ...`."
            )
        it = iter(self._iterable)
        self._start()
        try:
            first = True
            while True:
                if not first:
                    self.step()  # the body of the previous item is done: a step boundary
                first = False
                try:
                    item = next(it)
                except StopIteration:
                    return
                yield item
        finally:
            self.stop()

    def _start(self) -> None:
        if self._started:
            raise WatchError(
                "This watcher was already started.", "Create a new torchmem.watch() for each run."
            )
        dev = resolve(self._device_spec)
        label = str(dev)
        if not self._exclusive:  # torchmem run's own watcher: the program may still start its own
            self._setup(dev)
            self._started = True
            return
        with _active_lock:
            other = _active.get(label)
            if other is not None and not other._stopped:
                raise WatchError(
                    f"Another torchmem.watch() is already active on {label}.",
                    "Use one watcher per device: stop the first (leave its block or loop) before starting "
                    "another, or call .step() on the one you have.",
                )
            _active[label] = self
        try:
            self._setup(dev)
        except BaseException:
            with _active_lock:
                if _active.get(label) is self:
                    del _active[label]
            raise
        self._started = True
        if self._warn:  # the user's watcher (torchmem run has its own checks, on its sampler thread)
            try:
                from torchmem.capture.workers import WorkerChecks, WorkerWarning

                def say(_code: str, text: str) -> None:
                    emit_warning(f"torchmem: {text}", WorkerWarning)

                checks = WorkerChecks(dev, say)
                checks.install()
                self._workers = checks
            except Exception as exc:
                _log.debug("watch(): the DataLoader checks could not be set up: %r", exc)

    def _setup(self, dev: torch.device) -> None:
        self.device = dev
        be = backend(dev)
        self._backend = be
        self._stack = ExitStack()
        # The CPU has no allocator: its figure is the ledger's (even inside cpu_tracking()), or the C heap's.
        has_stats = dev.type != "cpu" and be.hot().allocated is not None
        if self._source_wanted == "allocator" and not has_stats:
            raise WatchError(
                f"{dev} has no allocator statistics to watch.",
                "Use source='auto' or 'ledger': torchmem then counts tensor storages exactly (costs per op)"
                + (", or source='heap' (the C heap in use, ~1 µs per step)." if dev.type == "cpu" else "."),
            )
        if self._source_wanted == "heap":
            if dev.type != "cpu":
                raise WatchError(
                    f"source='heap' reads the process's C heap, which holds CPU tensors, not those of {dev}.",
                    "Use source='auto' for an accelerator, or device='cpu'.",
                )
            if heap_in_use() is not None:
                self.source, self._reader = "heap", _heap_reading
            elif process_rss() is not None:  # not glibc >= 2.33: the resident set size
                self.source, self._reader = "rss", _rss_reading
            else:
                raise WatchError(
                    "Neither the C heap (glibc mallinfo2) nor the resident set size can be read here.",
                    "Use source='auto' (torchmem's exact tensor accounting on the CPU).",
                )
        elif self._source_wanted == "ledger" or not has_stats:
            try:
                self._stack.enter_context(ledger().enabled())
            except TorchmemError as exc:
                raise WatchError(
                    f"{dev} has no memory statistics and no exact tensor accounting: {exc.message}",
                    "Watch a CUDA/XPU/MPS device, or upgrade torch.",
                ) from exc
            self.source = "ledger"
            led, label = ledger(), str(dev)
            self._reader = lambda: led.current(label)
        else:
            self.source = "allocator"

            def allocated() -> int:
                v = be.hot().allocated
                return int(v) if v is not None else 0

            self._reader = allocated
        if self._stride_fixed is not None:
            self._stride = self._stride_fixed
        self._thread = threading.get_ident()
        # What one reading costs, to choose a sampling stride that keeps light mode under 1 % of a step.
        t0 = time.perf_counter()
        for _ in range(5):
            self._read()
        self._read_cost = (time.perf_counter() - t0) / 5
        if self._want_survivors:
            from torchmem.capture.survivors import LoopSurvivors

            # A quarter of the leak threshold per step, as under `torchmem run`.
            self._survivors = LoopSurvivors(str(dev), min_bytes_per_step=max(1, self.min_bytes_per_step // 4))
        if self._optimizer_steps:
            from torch.optim.optimizer import register_optimizer_step_post_hook

            self._hook = register_optimizer_step_post_hook(self._on_optimizer_step)
        self._last_t = time.perf_counter()

    def stop(self) -> None:
        """End the watch (idempotent): remove hooks, close attribution windows, turn the ledger off."""
        if self._stopped or not self._started:
            self._stopped = True
            return
        self._stopped = True
        try:
            if self._workers is not None:
                self._workers.uninstall()
            if self._hook is not None:
                self._hook.remove()
                self._hook = None
            if self._window is not None:
                self._close_window()
            if self._survivors is not None:
                self._survivors.stop()
            if self._stack is not None:
                self._stack.close()
        finally:
            with _active_lock:
                label = str(self.device)
                if _active.get(label) is self:
                    del _active[label]

    def _on_optimizer_step(self, *_args: Any, **_kwargs: Any) -> None:
        if threading.get_ident() == self._thread:
            self.step()

    # -- the per-step work -----------------------------------------------------------------------
    def _read(self) -> int:
        return self._reader()

    def step(self) -> None:
        """Mark the end of one step. Never raises: an internal error is reported once and the step goes on."""
        if not self._started:
            raise WatchError("step() before the watch started.", "Use `with torchmem.watch() as w:`.")
        if self._stopped:
            return
        self.steps += 1
        try:
            if self._workers is not None:
                self._workers.poll()
            if self._survivors is not None:
                self._survivors.boundary(self.steps)
            self._step()
        except Exception as exc:  # never break the user's loop
            self._report_error("step", exc)

    def step_at(self, value: int) -> None:
        """:meth:`step` with the figure read earlier (``value``, as the reader returns it): a step whose end
        is known only afterwards (a boundary recognised at its second occurrence ended its first step too)."""
        reader = self._reader
        self._reader = lambda: value
        try:
            self.step()
        finally:
            self._reader = reader

    def _step(self) -> None:
        n = self.steps
        if n <= self.warmup + 1:  # step durations matter only to choose the stride, at the warm-up's end
            now = time.perf_counter()
            if self._last_t is not None:
                self._durations.append(now - self._last_t)
            self._last_t = now
            if n == self.warmup + 1 and self._stride_fixed is None and self._durations:
                self._choose_stride()
        win = self._window
        if win is not None:
            win.record()
        elif n % self._stride:
            return
        if n <= self.warmup:
            t0 = time.perf_counter()
            value = self._reader()
            self._read_times.append(time.perf_counter() - t0)
            if not n % self._keep_every:
                self._record(n, value)
            if n == self.warmup and self._wants_window_from_start():
                self._open_window(n)
            return
        self._readings = k = self._readings + 1
        if (
            k % _RETUNE_EVERY
            or self._stride_fixed is not None
            or not (self._host_figure or (self._relax_after is not None and k >= self._relax_after))
        ):
            value = self._reader() - self._offset
        else:
            t0 = time.perf_counter()
            value = self._reader() - self._offset
            t1 = time.perf_counter()
            self._retune(n, t1 - t0, t1)
        if not n % self._keep_every:
            self._record(n, value)
        stream = self._stream
        growth = stream.add(n, value)
        if self._run_first is None:
            self._run_first = (n, value)
        growth = self._over_the_run(n, value, growth)
        if len(stream.values) < 2:
            return
        self._growth = growth
        leaking = growth.leaking
        if leaking:
            if self._detected_at is None:
                self._detected_at = n
            self._stopped_at = None
        elif self._detected_at is not None and self._stopped_at is None and self._flat(stream.values):
            self._stopped_at = n
        # Attribution windows.
        deep_due = self.mode == "deep" and n % self._every == 0
        if win is None:
            # (Once attributed, a suspicion opens no window: it could not attribute again.)
            if (
                (leaking and not self._attempted)
                or deep_due
                or (
                    not self._attempted
                    and n >= self._quiet_until
                    and self._suspicious(stream.steps, stream.values)
                )
            ):
                self._open_window(n)
        else:
            ready = win.boundaries >= self._window_len + 1
            if ready:
                if (leaking and not self._attempted) or deep_due:
                    self._attribute(win)
                # A window costs a dispatch per op where the ledger is not on anyway: close it once it has
                # served (attributed, or the suspicion was not confirmed). With the ledger as the figure it
                # slides on, renewed now and then so that its cohort stays small.
                if self.source != "ledger":
                    if self._attempted or not leaking:
                        if not self._attempted:
                            self._quiet_until = n + self._every  # unconfirmed: no new window for a while
                        self._close_window()
                elif (self._attempted or not leaking) and win.boundaries >= _RENEW_AFTER * (
                    self._window_len + 1
                ):
                    self._close_window()
                    self._open_window(n)
        if leaking and self._attempted and not self._warned:
            self._announce()

    def _over_the_run(self, n: int, value: int, growth: Growth) -> Growth:
        """``growth``, or a leak where growth below ``min_bytes_per_step`` is large over the run.

        Once the figure grew since the first reading after the warm-up by 256 MiB or more, or more than
        doubled by 32 MiB or more (:func:`~torchmem.analysis.leaks.large_total`), the growth test also runs
        at half the run's mean rate (a second :class:`GrowthStream`, O(1) per reading like the first): growth
        still going on at that pace is a leak whatever the threshold, reported with its total. A one-time
        rise is not: the readings since do not rise at that pace.
        """
        first = self._run_first
        rs = self._run_stream
        if rs is None:
            if first is None:
                return growth
            thr = run_threshold(first, (n, value))
            if thr is None or thr >= self.min_bytes_per_step:
                return growth
            rs = self._run_stream = GrowthStream(thr, STEADY_READINGS, WINDOW_READINGS)
            for x, y in list(zip(self._post_steps, self._post_values))[:-1]:
                rs.add(x, y)
        found = rs.add(n, value)
        if growth.leaking or not found.leaking or first is None:
            return growth
        return large_growth(found, first, (n, value), self.min_bytes_per_step)

    def _choose_stride(self) -> None:
        """Read every step, or every k-th step when a reading would cost more than 0.5 % of a step."""
        step_time = sorted(self._durations)[len(self._durations) // 2]
        in_loop = sorted(self._read_times)[len(self._read_times) // 2] if self._read_times else 0.0
        self._set_stride(step_time, max(self._read_cost, in_loop))

    def _set_stride(self, step_time: float, cost: float) -> None:
        """The stride for readings of ``cost`` seconds on steps of ``step_time``: each under 0.5 % of a step,
        at most ``max_stride`` steps apart; a host figure (whose reading grows with the heap's fragmentation:
        tens of µs) is read rarely enough to stay under 2 % of the run whatever ``max_stride`` says."""
        if self.source == "ledger" or step_time <= 0:
            return
        relaxed = self._relax_after is not None and self._readings >= self._relax_after
        if relaxed:  # a long run: the readings' share of it, whatever max_stride says
            k = min(_RELAXED_MAX_STRIDE, max(1, math.ceil(cost / (_RELAXED_SHARE * step_time))))
            capped = False
        else:
            k = max(1, math.ceil(cost / (0.005 * step_time)))
            capped = self._max_stride is not None and k > self._max_stride
            if self._max_stride is not None:
                k = min(k, self._max_stride)
        floor = math.ceil(cost / (0.02 * step_time)) if self._host_figure else 1
        if floor > k:
            k, capped = floor, False
        if k == self._stride:
            return
        self._stride = k
        self._stride_note = (
            f"a step takes {step_time * 1e6:.0f} µs and a reading {cost * 1e6:.1f} µs: reading every {k} "
            "steps" + (" (max_stride caps it, to keep detection within 10 steps)" if capped else "")
            if k > 1
            else None
        )

    def _retune(self, n: int, cost: float, now: float) -> None:
        """Now and then, for a host figure or a relaxed watcher: choose the stride again from the reading's
        cost in the loop (a moving average: one reading may wait for the GIL or find a cold cache)."""
        avg = self._tune_cost
        self._tune_cost = avg = cost if avg is None else 0.7 * avg + 0.3 * cost
        if self._tune_at is not None and n > self._tune_at[0]:
            self._set_stride((now - self._tune_at[1]) / (n - self._tune_at[0]), avg)
        self._tune_at = (n, now)

    def _record(self, n: int, value: int) -> None:
        """Keep the series for the report: every reading up to 4096, then every 2nd, 4th, ... (bounded)."""
        self._series.append((n, value))
        if len(self._series) >= 4096:
            self._series = self._series[::2]
            self._keep_every *= 2

    def _wants_window_from_start(self) -> bool:
        # With the ledger on anyway (CPU), sites cost little more: record them from the end of the warm-up.
        return self.source == "ledger"

    def _suspicious(self, steps: collections.deque[int], values: collections.deque[int]) -> bool:
        if len(values) < 3:
            return False
        gap = steps[-1] - steps[-3]
        return (
            values[-1] - values[-2] > 0
            and values[-2] - values[-3] > 0
            and (values[-1] - values[-3] >= self.min_bytes_per_step * gap)
        )

    def _flat(self, values: collections.deque[int]) -> bool:
        k = 5
        if len(values) < k:
            return False
        tail = [values[-i] for i in range(1, k + 1)]
        return max(tail) - min(tail) < self.min_bytes_per_step * (k - 1) / 2

    def _open_window(self, n: int) -> None:
        dev = str(self.device)
        before = self._reader() if self._host_figure else 0
        self._window = _AttributionWindow(dev, n, self._window_len + 1)
        if self._host_figure:
            # The process's own heap is the figure: what turning the ledger on allocates (its first dispatch
            # loads parts of torch) is torchmem's, not the program's. One op through the mode, then exclude
            # the change from the readings.
            torch.empty(0)
            if not _primed:  # the first time in this process: the garbage that loading left, collected now
                _primed.append(True)
                gc.collect()
            self._exclude(self._reader() - before)
        self._window.record()

    def _close_window(self) -> None:
        win, self._window = self._window, None
        if win is not None:
            before = self._reader() if self._host_figure else 0
            win.close()
            if self._host_figure:
                self._exclude(self._reader() - before)

    def _exclude(self, delta: int) -> None:
        """Leave torchmem's own change of a host figure (``delta`` bytes) out of the readings from now on."""
        self._offset += delta
        self._excluded += abs(delta)

    @property
    def _host_figure(self) -> bool:
        return self.source in ("heap", "rss")

    # -- attribution -----------------------------------------------------------------------------
    def _attribute(self, win: _AttributionWindow) -> None:
        if self._attributing:
            return
        self._attributing = True
        try:
            self._attempted = True
            self._culprits = self._find_culprits(win)
        except Exception as exc:
            self._report_error("attribution", exc)
        finally:
            self._attributing = False

    def _find_culprits(self, win: _AttributionWindow) -> tuple[Culprit, ...]:
        growth = site_growth(list(win.maps))
        if not growth:
            return ()
        top = sorted(growth.items(), key=lambda kv: -kv[1][0])[:8]
        wanted = {site for site, _ in top}
        entries = ledger().cohort_entries(win.cohort)
        by_site: dict[Site | None, list[tuple[Any, int]]] = {}
        for storage, nbytes, site in entries:
            if site in wanted:
                by_site.setdefault(site, []).append((storage, nbytes))
        entries.clear()
        # Reference cycles first: what only the garbage collector frees has no holder path.
        keys = {s._cdata for lst in by_site.values() for s, _ in lst}
        cyclic = _cycle_scan(keys)
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
            holder_paths_of_storages(samples, max_paths=self._max_paths, time_limit=10.0, info=info)
            if samples
            else []
        )
        if info.get("truncated") and not any(paths):
            self._notes.append(
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
        limit = min(self.min_bytes_per_step, self._growth.min_bytes_per_step or self.min_bytes_per_step) / 4
        floor = limit if self._growth.leaking else 4096
        return attribute(facts, min_bytes_per_step=min(floor, limit), device=str(self.device))

    # -- reporting -------------------------------------------------------------------------------
    def _announce(self) -> None:
        self._warned = True
        rep = self.report()
        top = rep.culprits[0] if rep.culprits else None
        what = "memory" if rep.device.split(":")[0] == "cpu" else "device memory"
        msg = f"torchmem: {what} grows by {fmt_bytes(rep.bytes_per_step)}/step on {rep.device}"
        if top is not None:
            msg += f"; {top.site or '?'} held by {top.holder or '?'}: {top.fix}"
        exc = emit_warning(msg, LeakWarning, log_level=logging.INFO, warn=self._warn)
        if exc is not None:  # warnings configured as errors: never break the step
            self._report_error("warning", exc)
        if self._on_leak is not None:
            try:
                self._on_leak(rep)
            except Exception as exc:
                self._report_error("on_leak callback", exc)

    def _report_error(self, where: str, exc: BaseException) -> None:
        if where in self._errors:
            return
        self._errors.add(where)
        note = f"internal error in {where} ({type(exc).__name__}: {exc}); the step went on"
        self._notes.append(note)
        _log.warning("torchmem.watch: %s", note)

    @property
    def leaking(self) -> bool:
        """Whether memory grows steadily as of the last reading (O(1): call it at every step)."""
        return self._growth.leaking

    @property
    def culprits(self) -> tuple[Culprit, ...]:
        """The culprits named so far (O(1); :meth:`report` has them with the verdict and the readings)."""
        return self._culprits

    def _verdict(self) -> tuple[str, str, float, float]:
        """``(verdict, reason, growth per step, confidence)``: never a bare "no leak"; always why."""
        stride = self._stride_fixed or self._stride
        first = self.warmup + STEADY_READINGS * stride  # the step of the first possible verdict
        reads = f"{STEADY_READINGS} readings" + (f", one every {stride} steps" if stride > 1 else "")
        # (growth smaller than STEADY_EVIDENCE thresholds over those readings needs more of them)
        big = fmt_bytes(int(STEADY_EVIDENCE * self.min_bytes_per_step / ((STEADY_READINGS - 1) * stride)))
        reads += f"; growth under {big}/step needs more"
        if self.steps == 0:
            return (
                "no_steps",
                "no steps were recorded (the loop ran 0 times, or step() was never called): wrap the loop "
                "(`for batch in torchmem.watch(loader)`), call `w.step()` at the end of each step, or, with "
                "optimizer_steps=True, check that `optimizer.step()` runs on the thread that started the "
                "watch",
                0.0,
                0.0,
            )
        short = self._short_run()
        if short is not None:
            return "leak", short.reason, short.bytes_per_step, short.confidence
        if self.steps <= self.warmup:
            return (
                "too_few",
                f"{self.steps} step(s), all within the {self.warmup}-step warm-up: not enough to judge; the "
                f"first verdict needs {first} steps (warm-up {self.warmup} + {reads}): run more steps, or "
                "pass a smaller warmup=",
                0.0,
                0.0,
            )
        g = self._growth
        if g.leaking:
            return "leak", g.reason, g.bytes_per_step, g.confidence
        if len(self._post_values) < STEADY_READINGS:
            return (
                "too_few",
                f"{self.steps} steps, {len(self._post_values)} reading(s) after the {self.warmup}-step "
                f"warm-up: not enough to judge; the first verdict needs {first} steps (warm-up "
                f"{self.warmup} + {reads}): run more steps",
                0.0,
                g.confidence,
            )
        key = (self.steps, len(self._post_values))
        if self._explained is None or self._explained[0] != key:
            g = detect_growth(
                list(self._post_steps), list(self._post_values), min_bytes_per_step=self.min_bytes_per_step
            )
            if self._run_first is not None:
                g = with_total(g, self._run_first, (self._post_steps[-1], self._post_values[-1]))
            self._explained = (key, g)
        g = self._explained[1]
        verdict = "stopped" if self._stopped_at is not None else g.verdict
        if verdict in ("stopped", "noisy", "flat", "below_threshold"):
            inner = inner_growth(self._series, self.min_bytes_per_step)
            if inner is not None:
                rate, length, height, ramps = inner
                return (
                    "inner_growth",
                    f"the figure climbs by {fmt_bytes(int(rate))}/step for about {length} steps and falls "
                    f"back at the end ({ramps} times): each call's peak grows by {fmt_bytes(height)} with "
                    "its inner loop, and with the loop's length (a graph or state carried from one iteration "
                    "to the next); nothing is kept across calls. Fix: run the loop under torch.no_grad() "
                    "(or torch.inference_mode()) when no gradient is needed, else detach what one iteration "
                    "hands to the next (`h = h.detach()`)",
                    rate,
                    g.confidence,
                )
        return verdict, g.reason, g.trend_per_step, g.confidence

    def _short_run(self) -> Growth | None:
        """A run too short for the growth tests, judged on its readings from the first step (warm-up
        included) when its growth is overwhelming (:func:`short_run_growth`)."""
        if self._growth.leaking or self.steps == 0 or len(self._post_values) >= STEADY_READINGS:
            return None
        return short_run_growth(self._series, self.min_bytes_per_step)

    def survivors(self, time_limit: float = 2.0) -> SurvivorReport:
        """What the loop allocated in its recorded steps and is still alive, by allocation site and holder.

        Needs ``watch(..., survivors=True)``. Can be called at any time, in the loop or after it: a site
        whose storages are alive from (nearly) every recorded step *accumulates* (a leak, named even in a
        loop of a few steps, too short for the growth detector).

        Args:
            time_limit: Seconds the holder search may take (0: none).

        Raises:
            WatchError: the watcher was made without ``survivors=True``, or has not started.
        """
        if not self._want_survivors:
            raise WatchError(
                "This watcher does not record the loop's survivors.",
                "Create it with `torchmem.watch(..., survivors=True)`.",
            )
        if self._survivors is None:
            raise WatchError("The watch has not started.", "Call it inside the loop or after it.")
        rep: SurvivorReport = self._survivors.report(total_steps=self.steps, time_limit=time_limit)
        return rep

    def report(self) -> LeakReport:
        """The current verdict, culprits and readings (a frozen :class:`LeakReport`).

        When nothing is reported, ``reason`` says why — growth below ``min_bytes_per_step`` (with the value
        that would report it), too few steps (how many are needed), flat, shrinking or noisy — and what to do.
        """
        verdict, reason, trend, confidence = self._verdict()
        short = verdict == "leak" and not self._growth.leaking  # a short run's overwhelming growth
        notes = list(self._notes)
        if self._stride_note is not None:
            notes.insert(0, self._stride_note)
        if self.source == "ledger":
            notes.append(
                "figures: torchmem's exact tensor accounting (this device has no allocator statistics)"
            )
        elif self._host_figure:
            what = (
                "the C heap in use (glibc mallinfo2: CPU tensor storages, autograd graphs and other native "
                "allocations)"
                if self.source == "heap"
                else "the process's resident set size (RSS; the C heap cannot be read here)"
            )
            notes.append(
                f"figures: {what}; allocation sites from torchmem's exact tensor accounting, on only while "
                "growth was being attributed"
                + (
                    f" (what turning it on and off changed, {fmt_bytes(self._excluded)}, is left out)"
                    if self._excluded
                    else ""
                )
            )
        return LeakReport(
            device=str(self.device) if self.device is not None else "n/a",
            source=self.source,
            mode=self.mode,
            steps=self.steps,
            warmup=self.warmup,
            leaking=self._growth.leaking or short,
            bytes_per_step=trend if short else self._growth.bytes_per_step,
            confidence=confidence,
            detected_at=self.steps if short else self._detected_at,
            stopped_at=self._stopped_at,
            reason=reason,
            culprits=self._culprits,
            series=tuple(self._series),
            notes=tuple(notes),
            verdict=verdict,
            trend_per_step=trend,
            min_bytes_per_step=self.min_bytes_per_step,
        )


def _no_reading() -> int:
    return 0


def _heap_reading() -> int:
    return heap_in_use() or 0


def _rss_reading() -> int:
    return process_rss() or 0


def _dict_of(o: Any) -> Any:
    try:
        return object.__getattribute__(o, "__dict__")
    except Exception:  # no __dict__, or a dead weakref.proxy
        return None


def _cycle_scan(keys: set[int]) -> dict[int, tuple[str, ...]]:
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


def watch(
    iterable: Iterable[T] | None = None,
    *,
    device: DeviceLike = None,
    mode: str = "light",
    warmup: int = 3,
    min_bytes_per_step: int = 256 * 1024,
    window: int = 4,
    every: int = 128,
    stride: int | None = None,
    max_stride: int | None = 2,
    source: str = "auto",
    optimizer_steps: bool = False,
    on_leak: Callable[[LeakReport], Any] | None = None,
    warn: bool = True,
    max_paths: int = 3,
    survivors: bool = False,
) -> Watcher[T]:
    """Watch device memory step by step; find steady growth and name the allocation site and holder.

    Args:
        iterable: Wrap it: each item is one step (``for batch in torchmem.watch(loader): ...``). Without it,
            use the watcher as a context manager and call ``.step()``, or pass ``optimizer_steps=True``.
        device: The device to watch (default: the current accelerator, else the CPU).
        mode: ``"light"``: one cheap reading per step boundary, attribution only once memory grows;
            ``"deep"``: also an attribution window every ``every`` steps.
        warmup: Steps ignored by the detector (optimizer state, lazily built buffers, workspaces).
        min_bytes_per_step: Smallest growth per step reported as a leak (default 256 KiB). Steady growth
            below it is not reported as a leak, but the report says so: ``reason`` gives the growth per
            step and the ``min_bytes_per_step`` that would report it (docs/leaks.md).
        window: Steps an attribution window records allocation sites for.
        every: In deep mode, steps between attribution windows.
        stride: Read every ``stride``-th step; ``None`` chooses from the warm-up: every step, or every
            k-th step when one reading costs more than 0.5 % of a step (capped by ``max_stride``).
        max_stride: The most steps between readings when the stride is chosen automatically. The default,
            2, keeps detection of a steady leak within 10 steps after the warm-up; ``None`` lets very short
            steps be read rarely enough to stay under 0.5 % (detection then takes 5 readings).
        source: The figure read at each step. ``"auto"``: the allocator's counters where the device has
            them, else (the CPU) torchmem's exact tensor accounting, on for the whole watch (a few µs per
            op). ``"allocator"``: fail where the device has no allocator statistics. ``"ledger"``: the exact
            accounting on any device. ``"heap"`` (CPU only): the C heap in use (glibc ``mallinfo2``, ~1 µs
            per step; the resident set size where it cannot be read, and the report's ``source`` then says
            ``"rss"``). It also counts memory that is not a tensor (autograd graphs, other native
            allocations), so it finds host-side growth too; the exact accounting runs only in attribution
            windows, while growth is named, as with an allocator. What turning it on and off changes in the
            heap is left out of the readings.
        optimizer_steps: Count a step at every ``optimizer.step()`` of any optimizer (on this thread).
        on_leak: Called once with the :class:`LeakReport` when a leak is found and attributed.
        warn: Emit one :class:`LeakWarning` when a leak is found (it is always logged to the
            ``"torchmem"`` logger at INFO level).
        max_paths: Holder paths kept per culprit storage.
        survivors: Also record what a few steps of the loop allocate and keep (the exact tensor accounting
            with birth sites, on for up to 8 steps after the first, within ~10 % of the run's time), for
            :meth:`Watcher.survivors`: a leak named even in a loop of 3 steps.

    Returns:
        A :class:`Watcher`; ``.report()`` gives the :class:`LeakReport`.

    Raises:
        WatchError: bad arguments, another watcher active on the device, or a device with no statistics
            and no exact accounting.

    Example:
        >>> import torch, torchmem
        >>> model = torch.nn.Linear(512, 512)
        >>> losses = []
        >>> w = torchmem.watch(range(12), device="cpu", warn=False)
        >>> for step in w:     # validation without no_grad(), keeping the loss tensors and their graphs
        ...     losses.append(model(torch.randn(256, 512)).square().mean())
        >>> r = w.report()
        >>> r.leaking, r.culprits[0].kind, r.culprits[0].holder
        (True, 'retained_graph', '...losses[...')
        >>> print(r.culprits[0].fix)
        `losses` keeps one autograd graph per step (...): store `loss.item()` for logging, or ...

        The C heap as the figure (a ~1 µs reading per step; the ledger only while growth is named):

        >>> kept = []
        >>> with torchmem.watch(device="cpu", source="heap", stride=1, warn=False) as w:
        ...     for _ in range(14):
        ...         kept.append(torch.ones(512, 1024))  # 2 MiB per step, never freed
        ...         w.step()
        >>> r = w.report()
        >>> r.leaking, r.culprits[0].holder
        (True, '...kept[...')

        What a loop of four steps left alive, by site (``survivors=True``):

        >>> outs = []
        >>> with torchmem.watch(device="cpu", survivors=True, warn=False) as w:
        ...     for _ in range(4):
        ...         outs.append(model(torch.randn(256, 512)))  # each output keeps its graph
        ...         w.step()
        >>> s = w.survivors()
        >>> s.leaking, s.groups[0].verdict
        (True, 'accumulates')
    """
    return Watcher(
        iterable,
        device,
        mode,
        warmup,
        min_bytes_per_step,
        window,
        every,
        stride,
        max_stride,
        source,
        optimizer_steps,
        on_leak,
        warn,
        max_paths,
        survivors,
    )


__all__ = ["LeakWarning", "WatchError", "Watcher", "watch"]
