"""``torchmem.find_batch_size()``: the largest batch size whose step fits, found by modelling its peak.

A step's peak memory is close to linear in the batch size: ``peak(bs) = a + b * bs`` (weights, gradients
and optimizer state are the constant, activations and temporaries the slope). The search measures the
peak of a few real trials, fits lines through the measured points nearest the boundary, predicts the
largest size whose peak stays within the device's capacity (its free memory, or the :func:`torchmem.limit`
in force) minus a safety margin, and verifies the prediction with a real trial. On CUDA two figures are
measured: the caching allocator's reserved peak (what the cap applies to) and the allocated peak (what
the step's tensors need, a hard lower bound: no size whose allocated peak passes the cap can run). With
``margin=0`` they give a band for the largest size that runs; the search aims just under its top and
stops when the largest size that ran is within the tolerance of it. A prediction that fails is refined
from the new point (regula falsi when the failed trial's peak is known, a small step down or the careful
end of the band after an out-of-memory error, then bisection between the largest size known to fit and
the smallest known not to). A trial is a warm-up when it leaves live tensors behind (optimizer state),
measured on allocated bytes — never on reserved ones, which keep the step's freed segments cached.
Memory is released between trials, and an out-of-memory error's frames are cleared so that its tensors
do not stay pinned.

Under ``torch.distributed`` every rank takes the same path: each trial's outcome and each next size are
agreed with ``all_reduce(MIN)``, so all ranks return the same batch size.
"""

from __future__ import annotations

import functools
import gc
import importlib
import inspect
import math
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar, cast, overload

import torch

from torchmem._errors import TorchmemError
from torchmem.analysis.estimate import FitArgumentError
from torchmem.capture.track import Tracker
from torchmem.devices import Backend, CpuBackend, DeviceLike, backend, resolve
from torchmem.devices import _ops as ops

R = TypeVar("R")

_GROWTH = 32  # largest factor a prediction may jump above the largest size known to fit


class BatchSizeError(TorchmemError):
    """No batch size fits: even the smallest one tried ran out of memory.

    Attributes:
        batch_size: The smallest size tried (1 unless ``min_size`` says otherwise).
        diagnosis: The :class:`~torchmem.OOMDiagnosis` of that out-of-memory error where torchmem could
            build one, else ``None``.
        trials: The trials that were run.
    """

    def __init__(
        self, message: str, hint: str, *, batch_size: int, diagnosis: Any, trials: tuple[Trial, ...]
    ) -> None:
        super().__init__(message, hint)
        self.batch_size = batch_size
        self.diagnosis = diagnosis
        self.trials = trials


class DistributedTrialError(TorchmemError):
    """Another rank's trial raised an error that is not an out-of-memory error (that rank re-raises it)."""


# -- results ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Trial:
    """One call of the step at one batch size.

    Attributes:
        batch_size: The size tried.
        ok: It ran without running out of memory and (with a margin or a capacity) within the budget.
        oom: It raised ``torch.OutOfMemoryError`` (on any rank, under torch.distributed).
        peak: Its peak, in bytes, of the figure the search models (``metric`` of the result), absolute;
            ``None`` when it ran out of memory.
        seconds: Wall time of the call.
        note: ``"warm-up"`` (it left live tensors behind, e.g. optimizer state created by the first
            step), ``"over budget"``, ``"out of memory"``, ``"stopped after its optimizer steps"``
            (decorator probes), ``"closing run"`` (the answer run once more at the end, after an
            out-of-memory call left tensors behind) or empty.
        allocated_peak: CUDA: its peak of allocated (live tensor) bytes, absolute, which the search
            models beside the reserved peak; ``None`` on the CPU (the ledger is exact) or when it did not
            run.
    """

    batch_size: int
    ok: bool
    oom: bool
    peak: int | None
    seconds: float
    note: str = ""
    allocated_peak: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class BatchSizeResult:
    """What :func:`find_batch_size` found.

    Attributes:
        batch_size: The largest size that ran within the budget (the answer).
        trials: Every call of the step, in order.
        predicted: The model's last prediction of the largest size within the budget (before clamping to
            ``max_size`` or to the sizes known to fail; on CUDA with ``margin=0``, the top of the band:
            where the allocated-peak line reaches the capacity); ``None`` if no model could be fitted.
        true_max_upper_bound: The smallest size that ran out of memory (the true maximum is below it);
            ``None`` if nothing ran out of memory.
        seconds: Wall time of the whole search.
        device: The device measured.
        metric: The figure modelled: ``"reserved"`` (CUDA allocator), ``"allocated"`` or ``"ledger"``
            (exact CPU tensor bytes).
        capacity: Bytes that figure may reach: the device's free memory plus what this process holds, or
            the :func:`torchmem.limit` in force, or ``capacity=``; ``None`` if unknown.
        budget: ``capacity`` less ``margin`` of the headroom above ``baseline``.
        baseline: The figure before the first trial.
        margin: The safety margin asked for.
        fixed_bytes / bytes_per_sample: The fitted line ``peak = fixed + per_sample * batch_size``.
        world_size: Ranks that agreed on the result (1 outside torch.distributed).
        note: Why the search stopped where it did, in words.
        extra: Model details for people and tests: ``"band"`` (the ``(lo, hi)`` sizes where the reserved
            and the allocated lines reach the budget) and ``"allocated_line"`` (``(fixed, per_sample)``
            of allocated bytes), where fitted.
    """

    batch_size: int
    trials: tuple[Trial, ...]
    predicted: int | None
    true_max_upper_bound: int | None
    seconds: float
    device: str
    metric: str
    capacity: int | None
    budget: int | None
    baseline: int | None
    margin: float
    fixed_bytes: float | None
    bytes_per_sample: float | None
    world_size: int = 1
    note: str = ""
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def num_trials(self) -> int:
        return len(self.trials)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["num_trials"] = self.num_trials
        return d

    def __str__(self) -> str:
        from torchmem.report.fit import render_batch_size

        return render_batch_size(self)


# -- out-of-memory detection and cleanup ---------------------------------------------------------------
def _oom_type() -> type[BaseException]:
    t = getattr(torch, "OutOfMemoryError", None)
    if t is None:  # torch < 2.5 exports it under torch.cuda only
        t = torch.cuda.OutOfMemoryError
    return cast(type[BaseException], t)


def is_oom(exc: BaseException | None) -> bool:
    """Whether ``exc`` is, or was caused by, ``torch.OutOfMemoryError`` (by type, not by message).

    Uses :func:`torchmem.analysis.oom.is_oom` where it exists.
    """
    try:
        from torchmem.analysis import oom as _oom_mod

        shared = getattr(_oom_mod, "is_oom", None)
    except ImportError:
        shared = None
    if shared is not None:
        return bool(shared(exc))
    oom = _oom_type()
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, oom):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ if exc.__cause__ is not None else exc.__context__
    return False


def _diagnose(exc: BaseException) -> Any:
    try:
        from torchmem.analysis import oom as _oom_mod
    except ImportError:
        return None
    explain = getattr(_oom_mod, "explain_oom", None)
    if explain is None:
        return None
    try:
        return explain(exc)
    except Exception:  # a diagnosis that fails must not hide the real error
        return None


def _clear_frames(exc: BaseException) -> None:
    """Clear the locals of every finished frame in ``exc``'s traceback (and its chain) so they die now."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if e.__traceback__ is not None:
            traceback.clear_frames(e.__traceback__)
            e.__traceback__ = None
        e = e.__cause__ if e.__cause__ is not None else e.__context__


def _release(dev: torch.device) -> None:
    gc.collect()
    ops.synchronize(dev)
    ops.empty_cache(dev)


# -- distributed agreement ------------------------------------------------------------------------------
class _Group:
    """``all_reduce(MIN)`` over the default process group, or the identity outside torch.distributed."""

    def __init__(self, enabled: bool | None, dev: torch.device) -> None:
        self.world = 1
        self.rank = 0
        self.device = torch.device("cpu")
        dist = getattr(torch, "distributed", None)
        on = dist is not None and dist.is_available() and dist.is_initialized()
        if enabled and not on:
            raise FitArgumentError(
                "distributed=True but torch.distributed has no initialised process group.",
                "Call torch.distributed.init_process_group() first, or leave distributed=None.",
            )
        self.on = bool(on) if enabled is None else bool(enabled and on)
        if self.on and dist is not None:
            self.world = int(dist.get_world_size())
            self.rank = int(dist.get_rank())
            if str(dist.get_backend()).lower() == "nccl":
                self.device = dev if dev.type == "cuda" else torch.device("cuda", 0)

    def min(self, *values: int) -> list[int]:
        if not self.on:
            return list(values)
        import torch.distributed as dist

        t = torch.tensor(list(values), dtype=torch.int64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        out = [int(v) for v in t.tolist()]
        del t
        return out


# -- the search ----------------------------------------------------------------------------------------
class _Probe(BaseException):
    """Raised from an optimizer step hook to stop a decorator probe once its step peak has been seen."""


_NOISE = 1 << 16  # bytes left behind below this are allocator rounding, not state


@dataclass
class _Outcome:
    status: str  # "ok" | "oom" | "error"
    peak: int | None  # peak of the modelled figure (reserved on CUDA, the ledger on the CPU)
    before: int | None  # the modelled figure before and after the call
    after: int | None
    seconds: float
    exc: BaseException | None = None
    finished: bool = True  # the call returned (not stopped by a probe)
    allocated_peak: int | None = None  # CUDA: peak of allocated (live tensor) bytes; None on the CPU
    allocated_before: int | None = None  # live tensor bytes before and after the call
    allocated_after: int | None = None


def _left_behind(out: _Outcome) -> int:
    """Bytes of live tensors a call that ran left behind (state it created, e.g. optimizer state), or 0.

    Measured on *allocated* bytes, never on reserved ones: the caching allocator keeps the segments of a
    step's freed temporaries until the cache is emptied, so reserved after a step sits near its peak
    whether or not anything survived (that retained cache was once mistaken for state, which doubled the
    fitted slope on CUDA).
    """
    if out.status != "ok" or out.allocated_before is None or out.allocated_after is None:
        return 0
    left = out.allocated_after - out.allocated_before
    return left if left >= _NOISE else 0


class _Meter:
    """Runs one call under a peak measurement of the modelled figure and turns OOM into an outcome."""

    def __init__(self, dev: torch.device) -> None:
        self.dev = dev
        self.be: Backend = backend(dev)
        self.cpu = isinstance(self.be, CpuBackend)
        self.metric = "ledger" if self.cpu else "reserved"

    def figure(self) -> int | None:
        hot = self.be.hot()
        if self.cpu:
            return hot.allocated
        return hot.reserved if hot.reserved is not None else hot.allocated

    def allocated(self) -> int | None:
        """Live tensor bytes where they differ from the modelled figure (CUDA); ``None`` on the CPU."""
        return None if self.cpu else self.be.hot().allocated

    def live(self) -> int | None:
        """Live tensor bytes now (CUDA: allocated; CPU: the ledger), as ``_Outcome.allocated_before``."""
        return self.be.hot().allocated

    def capacity(self, given: int | None) -> int | None:
        if given is not None:
            return given
        limit = ops.memory_limit(self.dev)
        now = self.figure() or 0
        info = self.be.mem_info()
        hw = None if info is None else now + info[0]
        if limit is None:
            return hw
        return limit if hw is None else min(limit, hw)

    def call(self, fn: Callable[[int], Any], bs: int) -> _Outcome:
        tracker = Tracker(self.dev, survivors=False)
        exc: BaseException | None = None
        finished = True
        t0 = time.perf_counter()
        tracker.__enter__()
        peak_reserved: int | None = None
        try:
            try:
                fn(bs)  # the return value is dropped at once: it may hold device memory
            except _Probe:
                finished = False
            except Exception as e:
                exc = e
            if not self.cpu:
                peak_reserved = self.be.hot().peak_reserved
        finally:
            tracker.__exit__(None, None, None)
        seconds = time.perf_counter() - t0
        res = tracker.result
        assert res is not None
        a0, a1 = res.allocated_before, res.allocated_after
        low: int | None = None
        if self.cpu:
            before, after, peak = a0, a1, res.peak
        else:
            before, after = res.reserved_before, res.reserved_after
            peak = peak_reserved if peak_reserved is not None else res.peak
            if peak is not None and before is not None:
                peak = max(peak, before)
            low = res.peak
        status = "ok" if exc is None else ("oom" if is_oom(exc) else "error")
        return _Outcome(
            status,
            peak if status == "ok" else None,
            before,
            after,
            seconds,
            exc=exc,
            finished=finished,
            allocated_peak=low if status == "ok" else None,
            allocated_before=a0,
            allocated_after=a1,
        )


@dataclass
class _Point:
    """A size that fit: its measured peaks (absolute bytes) and the state its call left behind."""

    peak: int | None  # the modelled figure (reserved / ledger)
    low: int | None  # allocated bytes (CUDA only)
    left: int  # bytes left behind (> 0: a warm-up; its steady peak is at most peak + left)

    def value(self, which: str, corrected: bool) -> float | None:
        v = self.peak if which == "peak" else self.low
        if v is None:
            return None
        return float(v + (self.left if corrected else 0))


Line = tuple[float, float]  # (fixed bytes, bytes per sample)


def _through(p: tuple[int, float], q: tuple[int, float]) -> Line | None:
    (s1, p1), (s2, p2) = p, q
    if s1 == s2:
        return None
    b = (p2 - p1) / (s2 - s1)
    return p1 - b * s1, b


def _cross(line: Line | None, level: float) -> float | None:
    """Where ``line`` reaches ``level`` (``None`` when it never rises)."""
    if line is None or line[1] <= 0:
        return None
    return (level - line[0]) / line[1]


class _Search:
    """The model-based search state (pure: sizes, peaks and outcomes in, next size out).

    Two figures can be modelled: ``peak``, the figure the budget applies to (CUDA: the caching
    allocator's reserved bytes; CPU: the exact ledger), and, on CUDA, ``low``, the allocated bytes. With
    ``enforce`` (a margin, or ``capacity=``) a size fits when its measured ``peak`` stays within the
    budget, so only ``peak`` matters. Without it a size fits when it runs, and on CUDA what it needs lies
    between the two: a step needs at least its allocated peak, and at most its reserved peak measured
    from an empty cache (under the cap the allocator frees cached segments and retries before it runs
    out of memory; reserved also rises in segment-sized steps and, near the cap, saturates). The models
    then give a band ``[lo, hi]``: ``lo`` where the reserved line reaches the cap, ``hi`` where the
    allocated line does — no size above ``hi`` can fit. The search aims just under ``hi``, stops when
    the largest size that ran is within ``tolerance`` of it (or of the smallest that failed), and
    otherwise verifies every prediction with a real trial.
    """

    def __init__(self, start: int, max_size: int, min_size: int, tolerance: float) -> None:
        self.start = start
        self.max_size = max_size
        self.min_size = min_size
        self.tol = tolerance
        self.good: dict[int, _Point] = {}
        self.bad: int | None = None
        self.bad_peak: int | None = None  # the smallest failing size's peaks, when it ran (over budget)
        self.bad_low: int | None = None
        self.oom_min: int | None = None
        self.state = 0  # bytes left behind by warm-up trials: fixed memory in every later step
        self.predicted: int | None = None
        self.line: Line | None = None
        self.low_line: Line | None = None
        self.band: tuple[float | None, float | None] = (None, None)
        self.fails_in_row = 0
        self.note = ""

    def record(
        self, bs: int, ok: bool, oom: bool, peak: int | None, left: int, low: int | None = None
    ) -> None:
        """Record one trial: ``peak``/``low`` its raw peaks, ``left`` the bytes it left behind."""
        if ok:
            self.good[bs] = _Point(peak, low, max(left, 0))
            self.state += max(left, 0)
            self.fails_in_row = 0
            return
        self.fails_in_row += 1
        if oom:
            self.oom_min = bs if self.oom_min is None else min(self.oom_min, bs)
        if self.bad is None or bs <= self.bad:
            self.bad_peak = None if oom else peak
            self.bad_low = None if oom else low
            self.bad = bs
        for s in [s for s in self.good if s >= bs]:  # a later failure wins over an earlier success
            del self.good[s]

    # -- models -----------------------------------------------------------------------------------
    def _fit(self, which: str, corrected: bool = True) -> Line | None:
        """The line through the two measured points nearest the boundary (it passes through them)."""
        pts = [(s, p.value(which, corrected)) for s, p in sorted(self.good.items())]
        known = [(s, v) for s, v in pts if v is not None]
        if not known:
            return None
        g, vg = known[-1]
        bad_v = self.bad_peak if which == "peak" else self.bad_low
        if self.bad is not None and bad_v is not None and self.bad > g:
            return _through((g, vg), (self.bad, float(bad_v)))  # regula falsi
        others = known[:-1]
        steady = [q for q in others if not self.good[q[0]].left] or others
        if not steady:
            return None
        # Reserved bytes move in segment-sized steps: points too close give a noisy slope.
        gap = 0.9 if which == "peak" else 1.0
        far = [q for q in steady if q[0] <= gap * g]
        return _through(far[-1] if far else steady[0], (g, vg))

    def _proportional(self, which: str, base: int | None, level: float) -> float | None:
        """Where a line through ``(0, base + state)`` and the largest size that fit reaches ``level``."""
        if base is None or not self.good:
            return None
        g = max(self.good)
        v = self.good[g].value(which, True)
        b0 = float(base + self.state)
        if v is None or v <= b0:
            return None
        return g * (level - b0) / (v - b0)

    def _band(
        self, budget: int, enforce: bool, corrected: bool
    ) -> tuple[float | None, float | None, Line | None, Line | None]:
        line = self._fit("peak", corrected)
        lo = hi = _cross(line, budget)
        low_line = None
        if not enforce:
            low_line = self._fit("low", corrected)
            p_low = _cross(low_line, budget)
            if p_low is not None:
                lo, hi = (p_low, p_low) if lo is None else (min(lo, p_low), max(lo, p_low))
        return lo, hi, line, low_line

    # -- the decision -----------------------------------------------------------------------------
    def next_size(
        self,
        budget: int | None,
        baseline: int | None,
        low_baseline: int | None = None,
        enforce: bool = True,
    ) -> int | None:
        """The next size to try, or ``None`` when the search is done.

        Args:
            budget: Bytes the modelled figure may reach (``None``: unknown, no model).
            baseline: The modelled figure before the search.
            low_baseline: Allocated bytes before the search (CUDA), for the allocated model.
            enforce: A size fits only when its measured peak is within ``budget`` (a margin, or
                ``capacity=``); else when it runs, which the allocated model bounds from above.
        """
        if not self.good:
            if self.bad is None:
                return self.start
            if self.bad <= self.min_size:
                return None
            return max(self.min_size, self.bad // 2)
        g = max(self.good)
        if g >= self.max_size:
            self.note = (
                f"ran within the budget up to max_size={self.max_size}; the true maximum may be higher"
            )
            return None
        bad = self.bad
        tol = self.tol

        def step(n: int) -> int:
            return max(1, math.ceil(tol * n))

        if bad is not None and bad - g <= step(bad):
            self.note = f"converged: {g} fits, {bad} does not"
            return None
        upper = bad - 1 if bad is not None else min(self.max_size, g * _GROWTH)

        lo = hi = None
        one_point = False
        if budget is not None:
            lo, hi, line, low_line = self._band(budget, enforce, True)
            if hi is not None and hi < g:
                # A warm-up's correction (its peak plus what it left behind) over-counts when the
                # call's peak already held that state: refit through the raw measurements.
                lo, hi, line, low_line = self._band(budget, enforce, False)
            if line is not None:
                self.line = line
            if low_line is not None:
                self.low_line = low_line
            if hi is None:
                # One point (or flat lines): proportional models through the baseline.
                one_point = True
                props = [self._proportional("peak", baseline, budget)]
                if not enforce:
                    props.append(self._proportional("low", low_baseline, budget))
                known = [p for p in props if p is not None]
                if known:
                    lo, hi = min(known), max(known)
                    if self.line is None and baseline is not None:
                        v = cast(float, self.good[g].value("peak", True))
                        b0 = float(baseline + self.state)
                        self.line = (b0, (v - b0) / g)
            if hi is not None:
                self.band = (lo, hi)
                self.predicted = math.floor(hi)

        def clip(n: int) -> int:
            return min(max(n, g + 1), upper)

        if hi is None or lo is None:
            # No model (capacity unknown, or nothing grows): grow 4x, then bisect.
            if bad is None:
                return clip(4 * g)
            return (g + bad) // 2

        if self.fails_in_row == 0:
            if one_point:
                # The proportional model errs large when the step's fixed memory is below the
                # baseline: aim at 90 % of the careful model, and never stop on one point.
                aim = 0.9 * lo if 0.9 * lo > g * (1 + tol) else lo * (1 - tol / 2)
                if len(self.good) > 1:
                    # Two sizes with the same peak: a batch-independent phase (e.g. the optimizer
                    # step) sets it at small sizes, and the proportional model errs small: 4x.
                    aim = max(aim, 4.0 * g)
                return clip(math.floor(aim)) if aim > g else clip(g + step(g))
            if hi < g:
                # The model is contradicted by a size that ran: verify upwards with a small step.
                return clip(g + 2 * step(g))
            if g >= math.floor(hi * (1 - tol)):
                if enforce or self.low_line is None:
                    self.note = f"the model puts the largest size within the budget at {math.floor(hi)}"
                else:
                    self.note = (
                        f"the allocated-peak model bounds the largest size that can run at "
                        f"{math.floor(hi)}; {g} ran"
                    )
                return None
            # Where the measured figure itself decides, aim at the prediction. Nothing above the top
            # of a band runs: aim just under it (a quarter of its width, at least half the tolerance).
            backoff = 0.0 if enforce or self.low_line is None else max(0.5 * tol * hi, 0.25 * (hi - lo))
            aim = hi - backoff
            prop = self._proportional("peak", baseline, cast(int, budget))
            # The proportional model errs small whenever the step's fixed memory is above the baseline:
            # a secant far beyond it (e.g. through a point whose peak a batch-independent phase set)
            # is capped by it, but it may not hold the search below 2x.
            growth = max(prop if prop is not None else 0.0, 2.0 * g)
            n = math.floor(min(aim, growth))
            if bad is not None and not g < n < bad:
                return (g + bad) // 2
            return clip(n)
        b = cast(int, bad)
        if self.bad_peak is not None:
            # Over budget with a known peak: regula falsi (the line runs through it), else bisection.
            n = math.floor(hi)
            return n if g < n < b else (g + b) // 2
        # Out of memory: one step down when close (after the first failure), else the largest of the
        # midpoint and the careful models below the failure: the low end of the band (the reserved
        # line) and the proportional model from the largest size that fit.
        if self.fails_in_row == 1 and b - g <= 3 * step(b):
            return clip(b - step(b))
        prop = self._proportional("peak", baseline, cast(int, budget))
        options = [(g + b) // 2]
        options += [math.floor(x) for x in (lo, prop) if x is not None and g < math.floor(x) < b]
        return clip(max(options))


# -- public entry points --------------------------------------------------------------------------------
def _check_size(name: str, v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise FitArgumentError(f"{name} must be a positive int, got {v!r}.", f"Pass e.g. {name}=8.")
    return v


def _search(
    fn: Callable[[int], Any],
    *,
    start: int,
    max_size: int,
    min_size: int,
    margin: float,
    device: DeviceLike,
    distributed: bool | None,
    capacity: int | None,
    max_trials: int,
    tolerance: float,
) -> tuple[BatchSizeResult, Any]:
    t_start = time.perf_counter()
    dev = resolve(device)
    meter = _Meter(dev)
    group = _Group(distributed, dev)
    search = _Search(start, max_size, min_size, tolerance)
    trials: list[Trial] = []
    _release(dev)
    baseline = meter.figure()
    low_baseline = meter.allocated()
    cap = meter.capacity(capacity)
    enforce = margin > 0 or capacity is not None
    diagnosis: Any = None

    def budget_now() -> tuple[int | None, int | None]:
        nonlocal cap
        if cap is None:
            cap = meter.capacity(capacity)
        if cap is None:
            return None, None
        base = baseline or 0
        return cap, int(cap - margin * max(cap - base, 0))

    size: int | None = start
    closing = False  # this call is the closing run (see below)
    closed = False  # a closing run has been made
    beyond = False  # a closing run has been made beyond max_trials (one at most)
    limited = False  # the search was cut short by max_trials
    stale_bytes = 0  # what the last out-of-memory call left behind (this rank), before a closing run
    while size is not None and (closing or len(trials) < max_trials):
        out = meter.call(fn, size)
        status = {"ok": 1, "oom": 0, "error": -1}[out.status]
        _, bud = budget_now()
        over = out.status == "ok" and enforce and bud is not None and out.peak is not None and out.peak > bud
        local_ok = 1 if (status == 1 and not over) else 0
        agreed = group.min(status, local_ok, group.rank if status == -1 else group.world)
        if out.status == "error":
            exc = cast(BaseException, out.exc)
            out.exc = None
            raise exc
        if agreed[0] == -1:
            if out.exc is not None:
                _clear_frames(out.exc)
            out = _Outcome("error", None, None, None, 0.0)
            _release(dev)
            raise DistributedTrialError(
                f"Rank {agreed[2]} raised an error that is not an out-of-memory error during the batch-size "
                f"trial at {size}; it re-raises it.",
                "Look at that rank's traceback.",
            )
        oom = agreed[0] == 0
        ok = bool(agreed[1])
        if out.exc is not None:
            if size <= min_size and diagnosis is None:
                diagnosis = _diagnose(out.exc)
            _clear_frames(out.exc)
            out.exc = None
        left = _left_behind(out)
        note = "out of memory" if oom else ("over budget" if not ok else "")
        if ok and left:
            note = "warm-up"
        if out.status == "ok" and not out.finished:
            note = (note + "; " if note else "") + "stopped after its optimizer steps"
        if closing:
            note = "closing run" + ("; " + note if note else "")
        trials.append(Trial(size, ok, oom, out.peak, out.seconds, note, out.allocated_peak))
        search.record(size, ok, oom, out.peak, left, out.allocated_peak)
        live_before = out.allocated_before if out.status == "oom" else None  # this rank's own OOM
        out = _Outcome("ok", None, None, None, 0.0)
        _release(dev)
        # A call stopped by an out-of-memory error skips the rest of the step, and so the step's own
        # clean-up: gradients already accumulated by a partial backward stay set (and would be added to
        # the next real step's). Measured after its frames are cleared and the cache emptied.
        stale = 0
        if live_before is not None:
            now = meter.live()
            # The CPU ledger is exact: any byte counts; CUDA's allocated figure has allocator rounding.
            if now is not None and now - live_before >= (1 if meter.cpu else _NOISE):
                stale = now - live_before
        was_closing, closing = closing, False
        if was_closing and ok:
            break  # the step ran to its end at the answer: done
        _, bud = budget_now()
        nxt = search.next_size(bud, baseline, low_baseline, enforce)
        # Every rank proposes (a size at or below the largest that fit means "done"), so every rank
        # makes the same number of collective calls and takes the smallest proposal.
        g = max(search.good) if search.good else 0
        agreed_next = group.min(nxt if nxt is not None else g)[0]
        nxt = agreed_next if agreed_next > g else None
        if nxt is not None and len(trials) >= max_trials:
            nxt, limited = None, True
        size = nxt
        # The search ends on a call that ran out of memory and left tensors behind: run the answer once
        # more, so that the step finishes and releases them itself (one call beyond max_trials at most).
        # Any rank's leftovers make every rank take it.
        if size is None and search.good and not beyond and group.min(0 if stale else 1)[0] == 0:
            stale_bytes = stale
            size = max(search.good)
            closing = closed = True
            beyond = len(trials) >= max_trials

    if not search.good:
        tried = trials[-1].batch_size if trials else start
        raise BatchSizeError(
            f"Even batch size {tried} runs out of memory on {dev}"
            + (f" (capacity {cap} bytes)" if cap is not None else "")
            + ".",
            "Free memory held elsewhere (torchmem.release), use bf16/AMP, activation checkpointing or a "
            "smaller model; see the diagnosis attached to this error (.diagnosis).",
            batch_size=tried,
            diagnosis=diagnosis,
            trials=tuple(trials),
        )
    chosen = max(search.good)
    chosen = group.min(chosen)[0]
    note = search.note
    if limited:
        note = f"stopped after max_trials={max_trials}"
    if closed:
        left_txt = f"{stale_bytes} bytes" if stale_bytes else "tensors"
        note = (note + "; " if note else "") + (
            f"closing run: a call that ran out of memory left {left_txt} behind (e.g. gradients of a "
            "partial backward), so the largest size that fit was run once more to let the step release them"
        )
        if trials[-1].note.startswith("closing run") and not trials[-1].ok:
            note += f" (it ran out of memory: {chosen} is the largest size that fit before it)"
    if search.oom_min is None and not note.startswith("ran within"):
        note = (note + "; " if note else "") + "no trial ran out of memory"
    line = search.line
    _, bud = budget_now()
    result = BatchSizeResult(
        batch_size=chosen,
        trials=tuple(trials),
        predicted=search.predicted,
        true_max_upper_bound=search.oom_min,
        seconds=time.perf_counter() - t_start,
        device=str(dev),
        metric=meter.metric,
        capacity=cap,
        budget=bud,
        baseline=baseline,
        margin=margin,
        fixed_bytes=None if line is None else line[0],
        bytes_per_sample=None if line is None else line[1],
        world_size=group.world,
        note=note,
        extra={
            k: v
            for k, v in (("band", search.band), ("allocated_line", search.low_line))
            if v is not None and v != (None, None)
        },
    )
    return result, None


@overload
def find_batch_size(
    fn: Callable[[int], Any],
    *,
    start: int = ...,
    max_size: int = ...,
    margin: float = ...,
    device: DeviceLike = ...,
    distributed: bool | None = ...,
    capacity: int | None = ...,
    max_trials: int = ...,
    tolerance: float = ...,
    min_size: int = ...,
) -> BatchSizeResult: ...


@overload
def find_batch_size(
    fn: None = ...,
    *,
    starting_batch_size: int,
    margin: float = ...,
    device: DeviceLike = ...,
    distributed: bool | None = ...,
    max_trials: int = ...,
    tolerance: float = ...,
    probe_steps: int | None = ...,
) -> Callable[[Callable[..., R]], Callable[..., R]]: ...


@overload
def find_batch_size(
    fn: Callable[..., R],
    *,
    starting_batch_size: int,
    margin: float = ...,
    device: DeviceLike = ...,
    distributed: bool | None = ...,
    max_trials: int = ...,
    tolerance: float = ...,
    probe_steps: int | None = ...,
) -> Callable[..., R]: ...


def find_batch_size(
    fn: Callable[..., Any] | None = None,
    *,
    start: int = 8,
    max_size: int = 1 << 16,
    margin: float = 0.1,
    device: DeviceLike = None,
    distributed: bool | None = None,
    capacity: int | None = None,
    max_trials: int = 12,
    tolerance: float = 0.02,
    min_size: int = 1,
    starting_batch_size: int | None = None,
    probe_steps: int | None = 2,
) -> Any:
    """Find the largest batch size whose step runs without running out of memory, with a safety margin.

    **Function form** — ``find_batch_size(step)`` calls ``step(batch_size)`` (one training step; search
    an evaluation step separately, it fits far more) a few times and returns a :class:`BatchSizeResult`:

    1. the first trial runs at ``start`` (halved on out-of-memory until one fits);
    2. the peak of each trial (CUDA: the caching allocator's reserved peak and its allocated peak,
       measured like :func:`torchmem.track` — which resets torch's peak counters at each trial; CPU: the
       exact ledger's watermark) fits a line ``peak = a + b * batch_size`` through the measured points
       nearest the boundary (a trial that created state, e.g. optimizer state, counts it as fixed memory);
    3. the model predicts the largest size whose peak stays within the budget — ``capacity`` (the device's
       free memory plus what the process holds, or the :func:`torchmem.limit` in force) less ``margin`` of
       the headroom above what was in use before the search — and a real trial verifies it. On CUDA with
       ``margin=0`` the reserved and allocated lines bound the answer from below and above (under the cap
       the allocator frees cached segments before it gives up); the search aims just under the allocated
       bound and stops within ``tolerance`` of it. It never stops on a model that a size which ran
       contradicts;
    4. a failed prediction is refined (regula falsi from a known peak, a small step down or the careful end
       of the band after an out-of-memory error, then bisection between the largest size that fit and the
       smallest that did not) until the two are within ``tolerance``.

    Between trials, garbage is collected and the device cache emptied; a caught out-of-memory error has
    its traceback frames cleared so its tensors do not stay allocated. With ``margin=0`` the answer is the
    largest size that runs (within ``tolerance``); with a margin, the largest whose measured peak leaves
    that share of the headroom free.

    **Decorator form** (accelerate's ``find_executable_batch_size`` spelling, so code can switch)::

        @torchmem.find_batch_size(starting_batch_size=128)
        def train(batch_size, model, optimizer): ...

        train(model, optimizer)    # runs train at the largest size that fits, returns its result

    The wrapped function runs once at ``starting_batch_size``; if that runs out of memory, the search
    above runs below it with *probes*: calls stopped after ``probe_steps`` ``torch.optim`` optimizer
    steps (the peak of a training step is reached by then), then the function runs to the end at the
    size found (and the search goes on below it if that run still runs out of memory). As with
    accelerate, build the model, optimizer and data inside the function, or make it safe to restart.
    ``wrapper.result`` holds the last :class:`BatchSizeResult`.

    **torch.distributed** (``distributed=None``: whenever a process group is initialised): every trial's
    outcome and every next size are agreed with ``all_reduce(MIN)``, so all ranks run the same sizes and
    return the same answer — the largest that fits on every rank. A non-OOM error on one rank makes the
    others raise :class:`DistributedTrialError` instead of waiting.

    Args:
        fn: The step: ``fn(batch_size)``. Function form only; the decorator form wraps it.
        start: First size tried (function form).
        max_size: Largest size tried; reaching it without failure returns it with a note.
        margin: Share of the headroom (capacity above the pre-search baseline) kept free, in ``[0, 1)``.
        device: The device the step uses (default: current accelerator, else CPU).
        distributed: ``None`` (auto), ``True`` (require a process group) or ``False`` (do not sync).
        capacity: Bytes the modelled figure may reach, instead of what the device and limit allow; a trial
            whose peak goes over the budget counts as not fitting even without an out-of-memory error.
        max_trials: Most calls of the step, plus at most one closing run: when the search ends on a call
            that ran out of memory and left tensors behind (gradients of a partial backward, since its
            ``zero_grad`` never ran), the largest size that fit runs once more so the step releases them.
        tolerance: Stop when the smallest failing size is within this share of the largest fitting one.
        min_size: The smallest size worth trying (usually 1).
        starting_batch_size: accelerate's argument: selects the decorator form.
        probe_steps: Decorator probes stop after this many optimizer steps (``None``: run to the end).

    Returns:
        A :class:`BatchSizeResult` (function form), or the decorated function (decorator form).

    Raises:
        BatchSizeError: even ``min_size`` runs out of memory (``.diagnosis`` explains the OOM where torchmem
            can build one).
        FitArgumentError: a size that is not a positive int, ``start > max_size``, a margin outside [0, 1).
        Exception: whatever ``fn`` raises that is not an out-of-memory error, untouched, at once.

    Example:
        >>> import torch, torchmem
        >>> model = torch.nn.Linear(256, 256)
        >>> def step(bs):
        ...     model(torch.randn(bs, 256)).square().mean().backward()
        >>> with torchmem.limit("64MiB", "cpu"):
        ...     r = torchmem.find_batch_size(step, device="cpu", margin=0.0)
        >>> r.batch_size > 1000
        True
    """
    if not isinstance(margin, (int, float)) or isinstance(margin, bool) or not 0.0 <= margin < 1.0:
        raise FitArgumentError(f"margin must be in [0, 1), got {margin!r}.", "Pass e.g. margin=0.1.")
    if not isinstance(tolerance, (int, float)) or not 0.0 <= tolerance < 0.5:
        raise FitArgumentError(f"tolerance must be in [0, 0.5), got {tolerance!r}.", "Pass e.g. 0.02.")
    _check_size("max_trials", max_trials)
    _check_size("min_size", min_size)
    if capacity is not None:
        _check_size("capacity", capacity)
    if starting_batch_size is not None:
        size = _check_size("starting_batch_size", starting_batch_size)
        if probe_steps is not None:
            _check_size("probe_steps", probe_steps)

        def decorate(function: Callable[..., Any]) -> Callable[..., Any]:
            return _decorator(
                function,
                size,
                margin=margin,
                device=device,
                distributed=distributed,
                max_trials=max_trials,
                tolerance=tolerance,
                min_size=min_size,
                probe_steps=probe_steps,
            )

        return decorate if fn is None else decorate(fn)
    if fn is None:
        raise FitArgumentError(
            "find_batch_size() needs the step function, or starting_batch_size= for the decorator form.",
            "Call find_batch_size(step) or decorate with @find_batch_size(starting_batch_size=128).",
        )
    if not callable(fn):
        raise FitArgumentError(f"fn must be callable, got {type(fn).__name__}.", "Pass the step function.")
    _check_size("start", start)
    _check_size("max_size", max_size)
    if start > max_size:
        raise FitArgumentError(
            f"start={start} is above max_size={max_size}.", "Lower start or raise max_size."
        )
    if min_size > start:
        raise FitArgumentError(f"min_size={min_size} is above start={start}.", "Lower min_size.")
    result, _ = _search(
        fn,
        start=start,
        max_size=max_size,
        min_size=min_size,
        margin=float(margin),
        device=device,
        distributed=distributed,
        capacity=capacity,
        max_trials=max_trials,
        tolerance=float(tolerance),
    )
    return result


def _decorator(
    function: Callable[..., Any],
    starting: int,
    *,
    margin: float,
    device: DeviceLike,
    distributed: bool | None,
    max_trials: int,
    tolerance: float,
    min_size: int,
    probe_steps: int | None,
) -> Callable[..., Any]:
    try:
        sig: inspect.Signature | None = inspect.signature(function)
    except (TypeError, ValueError):
        sig = None

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if sig is not None:
            ps = list(sig.parameters.values())
            variadic = any(p.kind == p.VAR_POSITIONAL for p in ps)
            if not variadic and len(ps) < len(args) + 1:
                raise FitArgumentError(
                    f"{function.__name__}() got the batch size as an argument, but the decorator passes it.",
                    f"Call {function.__name__}(...) without the batch size.",
                )
        dev = resolve(device)

        def probe(bs: int) -> Any:
            if probe_steps is None:
                return function(bs, *args, **kwargs)
            return _run_probe(lambda n: function(n, *args, **kwargs), bs, probe_steps)

        top = starting
        trials: list[Trial] = []
        for _ in range(max_trials):
            group = _Group(distributed, dev)
            t0 = time.perf_counter()
            status, value = 1, None
            try:
                value = function(top, *args, **kwargs)
            except Exception as e:
                if not is_oom(e):
                    raise
                _clear_frames(e)
                del e
                status = 0
            if group.min(status)[0] == 1:
                return value
            value = None
            _release(dev)
            trials.append(Trial(top, False, True, None, time.perf_counter() - t0, "out of memory (full run)"))
            if top <= min_size:
                break
            result, _ = _search(
                probe,
                start=max(min_size, top // 2),
                max_size=top - 1,
                min_size=min_size,
                margin=margin,
                device=dev,
                distributed=distributed,
                capacity=None,
                max_trials=max_trials,
                tolerance=tolerance,
            )
            trials.extend(result.trials)
            wrapper.result = result  # type: ignore[attr-defined]
            top = result.batch_size
        raise BatchSizeError(
            f"No batch size from {starting} down to {min_size} ran {function.__name__}() to the end "
            f"on {dev}.",
            "Free memory held elsewhere, or use a smaller model, bf16/AMP or activation checkpointing.",
            batch_size=min_size,
            diagnosis=None,
            trials=tuple(trials),
        )

    wrapper.result = None  # type: ignore[attr-defined]
    return wrapper


def _run_probe(full: Callable[[int], Any], bs: int, steps: int) -> Any:
    """Run ``full(bs)`` but stop it (raise :class:`_Probe`) after ``steps`` optimizer steps."""
    try:
        hooks_mod: Any = importlib.import_module("torch.optim.optimizer")
    except ImportError:  # pragma: no cover - present in every supported torch
        hooks_mod = None
    register = getattr(hooks_mod, "register_optimizer_step_post_hook", None)
    if register is None:
        return full(bs)
    count = [0]

    def hook(_opt: Any, _args: Any, _kwargs: Any) -> None:
        count[0] += 1
        if count[0] >= steps:
            raise _Probe()

    handle = register(hook)
    try:
        return full(bs)
    finally:
        handle.remove()


__all__ = [
    "BatchSizeError",
    "BatchSizeResult",
    "DistributedTrialError",
    "FitArgumentError",
    "Trial",
    "find_batch_size",
    "is_oom",
]
