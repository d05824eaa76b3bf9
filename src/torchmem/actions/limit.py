"""``torchmem.limit()`` and ``torchmem.budget()``: cap a process's device memory, or a block's peak.

On CUDA, :func:`limit` is the caching allocator's per-process fraction, set from an exact byte figure; on
the CPU it is a hard cap on the exact ledger (:func:`torchmem.cpu_tracking`'s figure) that makes the op
crossing it raise a real ``torch.OutOfMemoryError`` — so OOM handling code can be tested on any machine.
:func:`budget` measures a block's peak (allocator peak on CUDA, ledger watermark on the CPU) and fails the
block with :class:`BudgetExceededError` and its working set when the peak is over.
"""

from __future__ import annotations

import math
import re
import sys
import threading
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from types import TracebackType
from typing import Any, TypeVar, cast

import torch

from torchmem._decorate import ContextDecorator
from torchmem._errors import TorchmemError, UnsupportedDeviceError
from torchmem._format import fmt_bytes
from torchmem._units import UNITS_TEXT, unit_bytes
from torchmem.devices import DeviceLike, backend, cuda_initialized, ledger, resolve
from torchmem.devices import _ops as ops
from torchmem.devices._ledger import Cap

F = TypeVar("F", bound=Callable[..., Any])


class LimitError(TorchmemError):
    """``limit()`` or ``budget()`` was given a size it cannot use, or was undone the wrong way."""


@dataclass(frozen=True)
class WorkingSetEntry:
    """One live storage at the moment a budget was crossed (or at the block's end where that is unknown).

    Attributes:
        bytes: Size of the storage.
        shape: Shape of one tensor on it (``None`` where no Python tensor views it).
        dtype: Its dtype, e.g. ``"float32"`` (``None`` likewise).
        holders: Readable holder paths (``"frame model.py:12 in forward() local 'h'"``), possibly empty.
    """

    bytes: int
    shape: tuple[int, ...] | None
    dtype: str | None
    holders: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        what = ""
        if self.dtype is not None and self.shape is not None:
            what = f" {self.dtype}[{', '.join(str(d) for d in self.shape)}]"
        held = f" held by {self.holders[0]}" if self.holders else ""
        return f"{fmt_bytes(self.bytes)}{what}{held}"


class BudgetExceededError(TorchmemError):
    """A ``torchmem.budget()`` block needed more memory than its budget.

    Attributes:
        device: The device measured.
        budget: The budget, in bytes (memory above what was allocated when the block began).
        used: The block's peak above that starting figure.
        peak: The absolute peak (``None`` where unknown).
        hard: Whether the budget was enforced at allocation time (the block then stopped at the crossing).
        working_set: The largest live storages when the block crossed its budget (CPU, or CUDA with
            ``hard=True``) or when it ended (CUDA soft budgets), largest first.
    """

    def __init__(
        self,
        device: str,
        budget: int,
        used: int | None,
        peak: int | None,
        hard: bool,
        working_set: tuple[WorkingSetEntry, ...],
        stopped: bool = False,
    ) -> None:
        self.device = device
        self.budget = budget
        self.used = used
        self.peak = peak
        self.hard = hard
        self.working_set = working_set
        if stopped:
            head = (
                f"The block ran out of its hard budget of {fmt_bytes(budget)} on {device}: an allocation "
                f"would have taken it over (it had used {fmt_bytes(used)} at its peak before that)."
            )
        else:
            head = (
                f"The block needed {fmt_bytes(used)} on {device} at its peak, over its budget of "
                f"{fmt_bytes(budget)}."
            )
        lines = [head]
        if working_set:
            lines.append("Working set when it crossed the budget, largest first:")
            lines.extend(f"  {w}" for w in working_set)
        super().__init__(
            "\n".join(lines) + "\n",
            "Free what the working set names before the block, use a smaller batch, or raise the budget.",
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "budget": self.budget,
            "used": self.used,
            "peak": self.peak,
            "hard": self.hard,
            "working_set": [w.to_dict() for w in self.working_set],
        }


# -- sizes ----------------------------------------------------------------------------------------------
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*|%)\s*$")


_MAX_BYTES = (1 << 63) - 1  # what allocators count in: more than any device can have
_UNITS_TEXT = UNITS_TEXT + "; % (of the device)"


def _examples(budget: bool) -> str:
    """Examples that parse (a test checks every quoted one), and how to have no cap at all."""
    if budget:
        return (
            "Pass the memory the block may add to what was allocated when it began: bytes as an int or a "
            "size string (1 << 30, '512MiB', '2GB') or a share of the device (0.25, '25%'). A block with "
            "no budget is simply not wrapped in torchmem.budget()."
        )
    return (
        "Pass bytes as an int or a size string (8 << 30, '8GiB', '512MB') or a share of the device (0.5, "
        "'50%'); torchmem.limit(None) lifts the limit."
    )


def _parse(value: object, what: str, *, for_budget: bool = False) -> tuple[int | None, float | None]:
    """``(bytes, None)`` or ``(None, fraction)`` from an int, a float in (0, 1], or ``"2GiB"``/``"50%"``.

    ``what`` names the argument in messages (``"The limit"``); ``for_budget`` picks the hint that fits
    :func:`budget` (which has no ``None``).
    """
    hint = _examples(for_budget)
    if value is None and for_budget:
        raise LimitError(
            "The budget cannot be None: a budget() block is always measured against a size.", hint
        )
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        kind = "a bool" if isinstance(value, bool) else f"a {type(value).__name__}"
        raise LimitError(
            f"{what} must be a number of bytes (int), a fraction of the device's memory (float in (0, 1]) "
            f"or a size string; got {value!r} ({kind}).",
            hint,
        )
    if isinstance(value, int):
        return _check_bytes(value, what, None, hint), None
    if isinstance(value, float):
        return None, _check_fraction(value, what, None, hint)
    m = _SIZE.match(value)
    if m is None:
        stripped = value.strip()
        if stripped.startswith("-"):
            raise LimitError(f"{what} cannot be negative; got {value!r}.", hint)
        if re.match(r"^[0-9]*\.?[0-9]+[eE][+-]?[0-9]+", stripped):
            raise LimitError(
                f"Cannot read {value!r} as a size: scientific notation is not accepted in a size string; "
                "write the number out, pass an int, or use a unit (8GB rather than 8e9).",
                hint,
            )
        bad_unit = re.match(r"^[0-9]*\.?[0-9]+\s*(\S+)$", stripped)
        if bad_unit is not None:
            raise LimitError(
                f"Cannot read {value!r} as a size: unknown unit {bad_unit.group(1)!r}. Units: {_UNITS_TEXT}.",
                hint,
            )
        raise LimitError(
            f"Cannot read {value!r} as a size: write a number and an optional unit. Units: {_UNITS_TEXT}.",
            hint,
        )
    unit = m.group(2).lower()
    scale = unit_bytes(unit) if unit != "%" else None
    if scale is None and unit != "%":
        raise LimitError(
            f"Cannot read {value!r} as a size: unknown unit {m.group(2)!r}. Units: {_UNITS_TEXT}.", hint
        )
    number = float(m.group(1))
    if unit == "%":
        return None, _check_fraction(number / 100.0, what, value, hint)
    assert scale is not None
    return _check_bytes(int(number * scale), what, value, hint), None


def _check_bytes(n: int, what: str, text: str | None, hint: str) -> int:
    source = f" ({text!r})" if text is not None else ""
    if n <= 0:
        raise LimitError(f"{what} must be a positive number of bytes; got {n}{source}.", hint)
    if n > _MAX_BYTES:
        raise LimitError(
            f"{what} of {n} bytes{source} is more memory than any device has (at most 2**63 - 1 bytes).", hint
        )
    return n


def _check_fraction(f: float, what: str, text: str | None, hint: str) -> float:
    if 0.0 < f <= 1.0:
        return f
    if text is not None:  # a percentage string
        raise LimitError(
            f"{what} {text!r} is out of range: a percentage of the device's memory must be in (0, 100].", hint
        )
    if math.isnan(f):
        raise LimitError(f"{what} must be a size; got nan (not a number).", hint)
    if math.isinf(f):
        raise LimitError(f"{what} must be a finite size; got {f}.", hint)
    why = f"{what} is the float {f}, read as a fraction of the device's memory, which must be in (0, 1]"
    if 1.0 < f <= 100.0 and f.is_integer():
        why += f"; for {f:g}% of the device pass {f / 100:g} or '{f:g}%'"
    elif 1.0 < f <= 100.0:
        why += f"; {f:g} would be {f * 100:g}% of the device, more than it has"
    elif f > 1.0 and f.is_integer() and f <= _MAX_BYTES:
        why += f"; for {int(f)} bytes pass the int {int(f)}"
    raise LimitError(why + ".", hint)


def _fraction_for(nbytes: int, total: int) -> float:
    """The fraction ``f`` with ``int(f * total) == nbytes``: what the CUDA allocator computes its cap from."""
    f = nbytes / total
    for _ in range(64):
        got = int(f * float(total))
        if got < nbytes:
            f = math.nextafter(f, math.inf)
        elif got > nbytes:
            f = math.nextafter(f, -math.inf)
        else:
            break
    return min(f, 1.0)


# -- OOM events -----------------------------------------------------------------------------------------
def _oom_event(cap: Cap) -> None:
    """A hard cap's ``on_cross``: the op is refused and raises ``torch.OutOfMemoryError`` next. Tell
    :func:`torchmem.capture.oom.watch_ooms`'s watchers, once per refused op: every hard cap the op took
    over calls this, and the tightest hard cap of the device is always one of them, so only it reports.
    Costs nothing unless that module is loaded (nobody can be watching otherwise); never raises."""
    events = sys.modules.get("torchmem.capture.oom")
    if events is None or not cap.hard:
        return
    try:
        hard = [c for c in ledger().caps(cap.device) if c.hard and c.on_cross is not None]
        if hard and min(hard, key=lambda c: c.bytes) is not cap:  # min(): the first of equal caps
            return
        events.record_cap_oom(cap)
    except Exception as exc:  # the OOM must go on as it is
        ledger().report_error("an OOM event", exc)


# -- limit ----------------------------------------------------------------------------------------------
class _CpuLimit:
    """The one CPU cap ``limit()`` keeps, and the ledger it keeps on for the thread that set it."""

    def __init__(self, nbytes: int) -> None:
        self.cap = Cap("cpu", nbytes, hard=True, owner="torchmem.limit()", on_cross=_oom_event)
        self.stack = ExitStack()
        self.thread = threading.get_ident()
        self.stack.enter_context(ledger().enabled())
        ledger().add_cap(self.cap)

    def close(self) -> None:
        if threading.get_ident() != self.thread:
            raise LimitError(
                "The CPU limit was set on another thread; its ledger can only be switched off there.",
                "Call torchmem.limit(None, 'cpu') on the thread that set the limit.",
            )
        ledger().remove_cap(self.cap)
        self.stack.close()


_lock = threading.RLock()
_cpu: _CpuLimit | None = None
_cuda_original: dict[str, float] = {}  # fraction in effect before torchmem first changed it, per device


def _cpu_current() -> int | None:
    return None if _cpu is None else _cpu.cap.bytes


def _set_cpu(nbytes: int | None) -> None:
    global _cpu
    if nbytes is None:
        if _cpu is not None:
            _cpu.close()
            _cpu = None
    elif _cpu is None:
        _cpu = _CpuLimit(nbytes)
    else:
        _cpu.cap.bytes = nbytes


def _set_cuda(dev: torch.device, fraction: float, nbytes: int | None) -> None:
    label = str(dev)
    if label not in _cuda_original:
        current = ops.get_cuda_memory_fraction(dev) if cuda_initialized() else None
        _cuda_original[label] = 1.0 if current is None else current
    ops.set_cuda_memory_fraction(dev, fraction, nbytes)


class Limit:
    """Handle returned by :func:`limit`: what is in effect now, and how to undo it.

    Used as a context manager, the previous setting comes back at the end of the block; ``restore()``
    does the same at any time.

    Attributes:
        device: The device capped.
        bytes: The cap in bytes (``None`` after ``limit(None)``).
        fraction: The cap as a fraction of the device's total (``None`` where the total is unknown).
    """

    def __init__(
        self, dev: torch.device, nbytes: int | None, fraction: float | None, previous: Callable[[], None]
    ) -> None:
        self.device = str(dev)
        self.bytes = nbytes
        self.fraction = fraction
        self._previous: Callable[[], None] | None = previous

    def restore(self) -> None:
        """Put back the setting that was in effect before this ``limit()`` call (idempotent)."""
        undo, self._previous = self._previous, None
        if undo is not None:
            with _lock:
                undo()

    def __enter__(self) -> Limit:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.restore()

    def __repr__(self) -> str:
        return f"<torchmem.limit {self.device}: {fmt_bytes(self.bytes) if self.bytes else 'none'}>"


def limit(bytes_or_fraction: int | float | str | None, device: DeviceLike = None) -> Limit:
    """Cap this process's memory on a device, in bytes or as a fraction of the device; ``None`` lifts it.

    - **CUDA**: sets the caching allocator's per-process fraction (``set_per_process_memory_fraction``)
      to the fraction whose cap is exactly the bytes asked for. The allocator checks it when it reserves a
      new segment: reserved memory (allocated plus cached) can never pass the cap, and the allocation that
      would take it over raises ``torch.OutOfMemoryError``. Initialises CUDA.
    - **CPU**: a hard cap on the exact ledger (the figure ``torchmem.stats("cpu").allocated`` reports while
      :func:`torchmem.cpu_tracking` is on; the ledger is switched on for the calling thread while the cap is
      set). The op whose new storages take it over is undone (its outputs freed) and raises a real
      ``torch.OutOfMemoryError`` with a CUDA-style message. Only storages created while the ledger is on
      count.

    ``limit(None)`` restores the setting from before torchmem's first ``limit()`` on that device; the
    returned handle (also a context manager) restores the one from just before this call. The cap in
    effect is what ``torchmem.devices._ops.memory_limit(device)`` reports.

    Args:
        bytes_or_fraction: Bytes (``int``), a fraction of the device's total (``float`` in (0, 1]), a
            size string (``"8GiB"``, ``"512MB"``, ``"50%"``) or ``None`` to lift the cap. Units are binary,
            as in torch's own messages: ``"20GB"`` is ``20 * 2**30`` bytes, the same as ``"20GiB"``, so a
            size copied from an OOM message means what it said (``torchmem._units``).
        device: The device (default: the current accelerator, else CPU).

    Returns:
        A :class:`Limit` handle.

    Raises:
        LimitError: a size that is not positive, a fraction out of range, more bytes than the device has.
        UnsupportedDeviceError: a device kind other than CUDA and CPU.

    Example:
        >>> import torch, torchmem
        >>> with torchmem.limit(1 << 20, "cpu"):
        ...     try:
        ...         x = torch.ones(1 << 19)         # 2 MiB over a 1 MiB cap
        ...     except torch.OutOfMemoryError as e:
        ...         print(str(e).split(".")[0])
        CPU out of memory
    """
    dev = resolve(device)
    if dev.type not in ("cuda", "cpu"):
        raise UnsupportedDeviceError(
            f"torchmem.limit() cannot cap {dev.type} memory yet.", "Supported: cuda and cpu."
        )
    with _lock:
        if bytes_or_fraction is None:
            return _lift(dev)
        nbytes, fraction = _parse(bytes_or_fraction, "The limit")
        if dev.type == "cpu":
            total = ops.cpu_total_memory()
            if nbytes is None:
                if total is None:
                    raise LimitError(
                        "The machine's memory size is unknown, so a fraction cannot be turned into bytes.",
                        "Pass a number of bytes.",
                    )
                nbytes = int(cast(float, fraction) * total)
            if total is not None and nbytes > total:
                raise LimitError(
                    f"The limit of {fmt_bytes(nbytes)} is more than this machine's memory "
                    f"({fmt_bytes(total)}): it could never be reached.",
                    f"Pass at most {total} bytes, a fraction such as 0.5, or torchmem.limit(None, 'cpu') "
                    "to lift the limit.",
                )
            fraction = None if total is None else nbytes / total
            prev = _cpu_current()
            _set_cpu(nbytes)
            return Limit(dev, nbytes, fraction, lambda: _set_cpu(prev))
        total = ops.cuda_total_memory(dev)
        if nbytes is None:
            nbytes = int(cast(float, fraction) * total)
        if nbytes > total:
            raise LimitError(
                f"The limit of {fmt_bytes(nbytes)} is more than {dev} has ({fmt_bytes(total)}): it could "
                "never be reached.",
                f"Pass at most {total} bytes, a fraction such as 0.9, or torchmem.limit(None) to lift the "
                "limit.",
            )
        fraction = _fraction_for(nbytes, total)
        prev_fraction = ops.get_cuda_memory_fraction(dev)
        prev_bytes = ops.memory_limit(dev)
        prev_f = 1.0 if prev_fraction is None else prev_fraction
        _set_cuda(dev, fraction, nbytes)
        return Limit(dev, nbytes, fraction, lambda: ops.set_cuda_memory_fraction(dev, prev_f, prev_bytes))


def _lift(dev: torch.device) -> Limit:
    if dev.type == "cpu":
        prev = _cpu_current()
        _set_cpu(None)
        return Limit(dev, None, None, lambda: _set_cpu(prev))
    label = str(dev)
    original = _cuda_original.pop(label, None)
    if original is None:  # torchmem never changed it: nothing to lift
        return Limit(dev, None, None, lambda: None)
    prev_fraction = ops.get_cuda_memory_fraction(dev)
    prev_bytes = ops.memory_limit(dev)
    ops.set_cuda_memory_fraction(dev, original, None)
    prev_f = original if prev_fraction is None else prev_fraction

    def undo() -> None:
        _set_cuda(dev, prev_f, prev_bytes)

    return Limit(dev, None, None if original >= 1.0 else original, undo)


# -- budget ---------------------------------------------------------------------------------------------
def _working_set_of(storages: list[tuple[Any, int]]) -> tuple[WorkingSetEntry, ...]:
    """Sizes, one shape/dtype and holder paths of some storages (one heap scan, time-limited search)."""
    from torchmem.analysis.holders.survivors import _aliases, holders_of_storages

    if not storages:
        return ()
    objs = [s for s, _ in storages]
    groups = _aliases(objs, limit=1)
    metas = [
        (tuple(g[0].shape), str(g[0].dtype).replace("torch.", "")) if g else (None, None) for g in groups
    ]
    groups.clear()
    try:
        paths = holders_of_storages(objs, max_paths=2, time_limit=3.0)  # a failing block: no hurry
    except Exception:  # a holder search that fails must not hide the budget error
        paths = [() for _ in objs]
    out = tuple(
        WorkingSetEntry(n, shape, dtype, p) for (_, n), (shape, dtype), p in zip(storages, metas, paths)
    )
    objs.clear()
    return out


def _working_set_live(dev: torch.device, top: int) -> tuple[WorkingSetEntry, ...]:
    from torchmem.analysis.live import collect_live

    report = collect_live(dev, None, with_holders=True)
    return tuple(
        WorkingSetEntry(t.bytes, t.shape, t.dtype, (t.holder,) if t.holder else ())
        for t in report.tensors[:top]
    )


class _Open:
    __slots__ = ("cap", "hard_limit", "mark", "stack", "tracker", "ws")

    def __init__(self) -> None:
        self.stack = ExitStack()
        self.cap: Cap | None = None
        self.mark: Any = None
        self.tracker: Any = None
        self.hard_limit: Limit | None = None
        self.ws: tuple[WorkingSetEntry, ...] | None = None


class Budget(ContextDecorator):
    """Context manager and decorator returned by :func:`budget`.

    After the block, :attr:`used` is its peak above the memory allocated when it began and :attr:`peak`
    the absolute peak.
    """

    def __init__(self, nbytes: int, device: DeviceLike, hard: bool, top: int) -> None:
        self.budget = nbytes
        self._spec = device
        self.hard = hard
        self.top = top
        self.used: int | None = None
        self.peak: int | None = None
        self._open: list[_Open] = []

    def __enter__(self) -> Budget:
        dev = resolve(self._spec)
        if dev.type not in ("cuda", "cpu"):
            raise UnsupportedDeviceError(
                f"torchmem.budget() cannot measure {dev.type} memory yet.", "Supported: cuda and cpu."
            )
        o = _Open()
        led = ledger()
        if dev.type == "cpu":
            o.stack.enter_context(led.enabled())
            o.mark = led.open_watermark("cpu")

            def snapshot(cap: Cap, o: _Open = o) -> None:
                _oom_event(cap)  # a hard budget's refusal is an OOM the program may catch
                if o.ws is None:
                    o.ws = _working_set_of(led.largest("cpu", self.top))

            o.cap = Cap(
                "cpu",
                o.mark.start + self.budget,
                hard=self.hard,
                owner=f"torchmem.budget({fmt_bytes(self.budget)})",
                on_cross=snapshot,
            )
            led.add_cap(o.cap)
        else:
            from torchmem.capture.track import Tracker

            o.tracker = Tracker(dev, survivors=False)
            o.tracker.__enter__()
            if self.hard:
                start = backend(dev).hot().allocated or 0
                try:
                    o.hard_limit = limit(start + self.budget, dev)
                except BaseException:
                    o.tracker.__exit__(None, None, None)
                    raise
        self._dev = dev
        self._open.append(o)
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        o = self._open.pop()
        dev = self._dev
        fired = False
        if o.cap is not None:
            ledger().remove_cap(o.cap)
            ledger().close_watermark(o.mark)
            self.peak = o.mark.peak
            self.used = o.mark.peak - o.mark.start
            fired = o.cap.hard and o.cap.crossed
            o.stack.close()
        else:
            if o.hard_limit is not None:
                o.hard_limit.restore()
            o.tracker.__exit__(None, None, None)
            res = o.tracker.result
            self.peak, self.used = res.peak, res.peak_delta
            fired = self.hard
        if ev is not None:
            from torchmem.actions.guard import find_oom

            if fired and isinstance(ev, Exception) and find_oom(ev) is not None:
                ws = o.ws if o.ws is not None else _working_set_live(dev, self.top)
                raise BudgetExceededError(
                    str(dev), self.budget, self.used, self.peak, self.hard, ws, stopped=True
                ) from ev
            return  # any other exception (an inner budget's too) passes through untouched
        if self.used is not None and self.used > self.budget:
            ws = o.ws if o.ws is not None else _working_set_live(dev, self.top)
            raise BudgetExceededError(str(dev), self.budget, self.used, self.peak, self.hard, ws)


def budget(
    bytes: int | float | str, device: DeviceLike = None, *, hard: bool = False, top: int = 5
) -> Budget:
    """Fail a block whose peak memory goes over a budget, naming what it held when it crossed.

    The budget is the memory the block may add, at its worst, to what was allocated when it began.

    - **CUDA**: the block's allocator peak is measured like :func:`torchmem.track` measures it: exact, on
      torch's peak counter shared with the program (``max_memory_allocated()`` keeps its meaning) and with
      an enclosing ``track()``/``budget()``, which still gets its own correct peak. The
      working set is the largest live tensors at the end of the block (with ``hard=True``: at the
      failure, while the exception still holds its frames). ``hard=True`` also caps the allocator with
      :func:`limit` at ``allocated at entry + budget`` for the block; that cap applies to *reserved*
      memory, so cached blocks count against it too (call ``empty_cache()`` first for an exact cap).
    - **CPU**: the exact ledger's watermark (the ledger is on for the block). The working set — largest
      live storages with one shape each and holder paths — is taken at the moment the block first crossed
      the budget. ``hard=True`` makes the op that would cross raise ``torch.OutOfMemoryError`` right there
      (inner code may catch it, e.g. a batch-size search).

    A block that raises for another reason passes its exception through untouched; a hard budget's own
    OOM leaving the block becomes a :class:`BudgetExceededError` (the OOM is its ``__cause__``).
    Budgets nest: each one measures its own block and fails on its own figure; an inner failure passes
    through the outer ones unchanged.

    Args:
        bytes: The budget: bytes, a size string (``"2GiB"``), or a fraction of the device's total.
        device: The device (default: the current accelerator, else CPU).
        hard: Enforce at allocation time instead of checking the peak at the end.
        top: How many storages the working set lists.

    Returns:
        A :class:`Budget` (context manager and decorator); ``.used`` and ``.peak`` after the block.

    Raises:
        BudgetExceededError: at the end of the block, when its peak was over the budget.
        LimitError: a budget that is not a positive size.

    Example:
        >>> import torch, torchmem
        >>> with torchmem.budget("16MiB", "cpu") as b:
        ...     x = torch.ones(1024, 1024)            # 4 MiB
        >>> b.used
        4194304
    """
    nbytes, fraction = _parse(bytes, "The budget", for_budget=True)
    if nbytes is None:
        dev = resolve(device)
        total = ops.cuda_total_memory(dev) if dev.type == "cuda" else ops.cpu_total_memory()
        if total is None:
            raise LimitError("The device's memory size is unknown.", "Pass a number of bytes.")
        nbytes = int(cast(float, fraction) * total)
    if top < 0:
        raise LimitError(
            f"top (how many storages the working set lists) must be 0 or more; got {top}.",
            "Leave it at its default of 5, or pass 0 to list none.",
        )
    return Budget(nbytes, device, hard, top)
