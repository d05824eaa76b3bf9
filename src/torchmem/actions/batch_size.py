"""``torchmem.find_batch_size()``: the largest batch size whose step fits, found by modelling its peak.

A step's peak memory is close to linear in the batch size: ``peak(bs) = a + b * bs`` (weights, gradients
and optimizer state are the constant, activations and temporaries the slope). The search measures the
peak of a few real trials, fits the line, predicts the largest size whose peak stays within the device's
capacity (its free memory, or the :func:`torchmem.limit` in force) minus a safety margin, and verifies the
prediction with a real trial. A prediction that fails is refined from the new point (regula falsi when the
failed trial's peak is known, a small step down from it, then bisection between the largest size known
to fit and the smallest known not to). Memory is released between trials, and an out-of-memory error's
frames are cleared so that its tensors do not stay pinned.

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
        note: ``"warm-up"`` (it left memory behind, e.g. optimizer state), ``"over budget"``, ``"out of
            memory"``, ``"stopped after N optimizer steps"`` (decorator probes) or empty.
    """

    batch_size: int
    ok: bool
    oom: bool
    peak: int | None
    seconds: float
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class BatchSizeResult:
    """What :func:`find_batch_size` found.

    Attributes:
        batch_size: The largest size that ran within the budget (the answer).
        trials: Every call of the step, in order.
        predicted: The model's last prediction of the largest size within the budget (before clamping to
            ``max_size`` or to the sizes known to fail); ``None`` if no model could be fitted.
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


@dataclass
class _Outcome:
    status: str  # "ok" | "oom" | "error"
    peak: int | None
    before: int | None
    after: int | None
    seconds: float
    exc: BaseException | None = None
    finished: bool = True  # the call returned (not stopped by a probe)


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
        if self.cpu:
            before, after, peak = res.allocated_before, res.allocated_after, res.peak
        else:
            before, after = res.reserved_before, res.reserved_after
            peak = peak_reserved if peak_reserved is not None else res.peak
            if peak is not None and before is not None:
                peak = max(peak, before)
        if exc is None:
            return _Outcome("ok", peak, before, after, seconds, finished=finished)
        if is_oom(exc):
            return _Outcome("oom", None, before, after, seconds, exc=exc)
        return _Outcome("error", None, before, after, seconds, exc=exc)


class _Search:
    """The model-based search state (pure: sizes, peaks and outcomes in, next size out)."""

    def __init__(self, start: int, max_size: int, min_size: int, tolerance: float) -> None:
        self.start = start
        self.max_size = max_size
        self.min_size = min_size
        self.tol = tolerance
        self.good: dict[int, tuple[int | None, int | None, bool]] = {}  # size -> (raw, corrected, warm)
        self.bad: int | None = None
        self.bad_peak: int | None = None
        self.oom_min: int | None = None
        self.predicted: int | None = None
        self.line: tuple[float, float] | None = None
        self.fails_in_row = 0
        self.note = ""

    def record(self, bs: int, ok: bool, oom: bool, peak: int | None, survived: int) -> None:
        if ok:
            warm = survived > 0
            corrected = None if peak is None else peak + max(survived, 0)
            self.good[bs] = (peak, corrected, warm)
            self.fails_in_row = 0
            return
        self.fails_in_row += 1
        if oom:
            self.oom_min = bs if self.oom_min is None else min(self.oom_min, bs)
        if self.bad is None or bs <= self.bad:
            self.bad_peak = None if oom else peak
            self.bad = bs

    def _line(self, p: tuple[int, float], q: tuple[int, float]) -> tuple[float, float] | None:
        (s1, p1), (s2, p2) = p, q
        if s1 == s2:
            return None
        b = (p2 - p1) / (s2 - s1)
        return p1 - b * s1, b

    def _models(self, budget: int, baseline: int | None) -> tuple[float | None, float | None]:
        """``(secant, proportional)``: where each model's peak reaches ``budget`` (unclamped), or ``None``.

        The secant runs through the two points nearest the boundary (the largest size that fit and the
        smallest over budget, or the two largest that fit); the proportional model through the baseline
        and the largest size that fit, which errs small whenever the step's fixed memory is above the
        baseline (and a small size's peak set by a batch-independent phase, e.g. the optimizer step,
        cannot mislead it into a huge jump).
        """
        sizes = sorted(self.good)
        g = sizes[-1]
        raw, corr, warm = self.good[g]
        secant: float | None = None
        proportional: float | None = None
        line = None
        if raw is not None:
            if self.bad is not None and self.bad_peak is not None:
                line = self._line((g, float(raw)), (self.bad, float(self.bad_peak)))
            else:
                # The second point: a size well below the largest (close points give a noisy slope),
                # steady (not a warm-up) where possible.
                cands = [s for s in sizes[:-1] if self.good[s][0] is not None]
                steady = [s for s in cands if not self.good[s][2]] or cands
                far = [s for s in steady if s <= 0.75 * g]
                if steady:
                    # A warm-up point's own peak may lack the state it created; its raw peak steepens
                    # the line, which errs towards a smaller size.
                    s2 = far[-1] if far else steady[0]
                    p_g = float(corr if warm and corr is not None else raw)
                    line = self._line((s2, float(cast(int, self.good[s2][0]))), (g, p_g))
        if line is not None:
            self.line = line
            a, b = line
            if b > 0:
                secant = (budget - a) / b
        top = corr if corr is not None else raw
        if top is not None and baseline is not None and top > baseline:
            b = (top - baseline) / g
            proportional = (budget - baseline) / b
            if self.line is None:
                self.line = (float(baseline), b)
        return secant, proportional

    def next_size(self, budget: int | None, baseline: int | None) -> int | None:
        """The next size to try, or ``None`` when the search is done."""
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
        if bad is not None and bad - g <= max(1, math.ceil(self.tol * bad)):
            self.note = f"converged: {g} fits, {bad} does not"
            return None
        secant = proportional = None
        if budget is not None:
            secant, proportional = self._models(budget, baseline)
        if secant is not None:
            self.predicted = math.floor(secant)
        elif proportional is not None and self.predicted is None:
            self.predicted = math.floor(proportional)

        def inside(x: float | None) -> int | None:
            if x is None:
                return None
            n = math.floor(x)
            return n if g < n and (bad is None or n < bad) else None

        if self.fails_in_row == 0:
            # The last trial fit: step up from it by the model.
            if secant is not None and secant - g < max(1.0, self.tol * secant):
                self.note = f"the model puts the largest size within the budget at {math.floor(secant)}"
                return None
            if bad is None:
                # The secant may come from a point in a flat region (small sizes, where a batch-independent
                # phase such as the optimizer step sets the peak) and overshoot; the proportional model
                # errs small there, so take the smaller, but jump at least 4x.
                low = 4.0 * g if proportional is None else max(proportional, 4.0 * g)
                cand_f = low if secant is None else min(secant, low)
                cand = min(math.floor(cand_f), self.max_size, g * _GROWTH)
            else:
                cand = inside(secant) or inside(proportional) or (g + bad) // 2
        elif self.bad_peak is not None:
            # The failure was over budget with a known peak: regula falsi, else bisection.
            cand = inside(secant) or (g + bad) // 2  # type: ignore[operator]
        elif self.fails_in_row == 1:
            # An out-of-memory error after a prediction: the more careful model, then a small step down.
            b = cast(int, bad)
            options = [n for n in (inside(secant), inside(proportional)) if n is not None]
            cand = min(options) if options else max(g + 1, b - max(1, math.ceil(self.tol * b)))
        else:
            cand = (g + cast(int, bad)) // 2
        if cand <= g:
            self.note = f"{g} fits and the model leaves no room for {g + 1}"
            return None
        return cand


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
    while size is not None and len(trials) < max_trials:
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
        survived = 0
        if out.before is not None and out.after is not None and out.status == "ok":
            survived = max(out.after - out.before, 0)
            if survived < (1 << 16):  # allocator rounding noise, not state
                survived = 0
        note = "out of memory" if oom else ("over budget" if not ok else "")
        if ok and survived:
            note = "warm-up"
        if out.status == "ok" and not out.finished:
            note = (note + "; " if note else "") + "stopped after its optimizer steps"
        trials.append(Trial(size, ok, oom, out.peak, out.seconds, note))
        search.record(size, ok, oom, out.peak, survived)
        out = _Outcome("ok", None, None, None, 0.0)
        _release(dev)
        _, bud = budget_now()
        nxt = search.next_size(bud, baseline)
        # Every rank proposes (a size at or below the largest that fit means "done"), so every rank
        # makes the same number of collective calls and takes the smallest proposal.
        g = max(search.good) if search.good else 0
        agreed_next = group.min(nxt if nxt is not None else g)[0]
        nxt = agreed_next if agreed_next > g else None
        size = nxt

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
    if size is not None and len(trials) >= max_trials:
        note = f"stopped after max_trials={max_trials}"
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
    2. the peak of each trial (CUDA: the caching allocator's reserved peak, measured like
       :func:`torchmem.track` — which resets torch's peak counters at each trial; CPU: the exact ledger's
       watermark) fits a line ``peak = a + b * batch_size``;
    3. the model predicts the largest size whose peak stays within the budget — ``capacity`` (the device's
       free memory plus what the process holds, or the :func:`torchmem.limit` in force) less ``margin`` of
       the headroom above what was in use before the search — and a real trial verifies it;
    4. a failed prediction is refined (regula falsi from a known peak, a small step down after an
       out-of-memory error, then bisection between the largest size that fit and the smallest that did
       not) until the two are within ``tolerance``.

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
        max_trials: Most calls of the step.
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
