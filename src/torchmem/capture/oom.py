"""OOM capture: the allocator state at the moment of an OOM, the process-wide OOM observer, memory pinned by
old exceptions, and the public :func:`explain_oom`, which gathers what is known live and hands it to the pure
:func:`torchmem.analysis.oom.diagnose`.

Every device read goes through the device layer (:mod:`torchmem.devices._allocator` for the caching
allocator's segments, counters and observer; :mod:`torchmem.devices._nvml` for other processes;
:mod:`torchmem.devices._host` for the host's memory). torch cannot detach an allocator OOM observer, so
torchmem attaches **one** per process, on first request, and dispatches to the callbacks registered with
:func:`attach_oom_observer`; :meth:`OOMObserver.detach` unregisters a callback (the torch-side observer
stays, doing nothing but a cheap capture: segment sizes and states, no stack frames).
"""

from __future__ import annotations

import os
import sys
import threading
import time
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from torchmem._errors import TorchmemError
from torchmem._exceptions import exception_chain
from torchmem._warn import emit_warning
from torchmem.analysis.oom import diagnose, oom_exception, parse_oom_message
from torchmem.devices import DeviceLike, cuda_available, resolve
from torchmem.devices import _allocator as al
from torchmem.results.oom import (
    AllocatorState,
    MachineMemory,
    OOMDiagnosis,
    OtherProcess,
    PinnedTensor,
    WorkingSetItem,
)


class OOMInputError(TorchmemError):
    """``explain_oom`` was given something that is neither an exception nor a message."""


# ---------------------------------------------------------------------------------------------------------
# state capture


def capture_state(
    device: DeviceLike = None,
    *,
    requested: int | None = None,
    device_free: int | None = None,
    limit: int | None = None,
    snapshot_file: str | None = None,
) -> AllocatorState:
    """Read the CUDA allocator's state of ``device`` now: segments and blocks, counters, driver figures
    and other processes (NVML, when available). Cheap: no history, no stack frames.

    A device that is not CUDA, or CUDA not yet used by this process, gives a state with ``None`` figures
    and a note (nothing is initialised).

    Example:
        >>> s = capture_state("cpu")
        >>> s.segments is None
        True
    """
    dev = resolve(device)
    notes: list[str] = []
    if dev.type != "cuda":
        return AllocatorState(
            device=str(dev), platform=dev.type, notes=(f"No allocator segments on {dev.type}.",)
        )
    idx = dev.index or 0
    if not al.cuda_ready():
        return AllocatorState(
            device=str(dev),
            platform=al.platform(),
            alloc_conf=al.alloc_conf(),
            notes=("CUDA is not initialised in this process: nothing is allocated yet.",),
        )
    segs: list[dict[str, Any]] | None
    try:
        segs = al.segments(idx)
    except Exception as exc:  # a torch without snapshots, or one that fails: degrade
        segs = None
        notes.append(f"Segments could not be read ({type(exc).__name__}: {exc}).")
    info = al.mem_info(idx) if device_free is None else None
    free = device_free if device_free is not None else (info[0] if info else None)
    total = al.device_total(idx)
    process_used, others = _processes(idx)
    if others is None:
        from torchmem.devices import _nvml

        problem = _nvml.nvml_problem()
        if problem:
            notes.append(problem)
    kw: dict[str, Any] = {
        "device": f"cuda:{idx}",
        "stats": al.flat_stats(idx),
        "device_total": total,
        "device_free": free,
        "limit": limit if limit is not None and (total is None or limit < total) else None,
        "process_used": process_used,
        "other_processes": others,
        "requested": requested,
        "alloc_conf": al.alloc_conf(),
        "platform": al.platform(),
        "timestamp": time.time(),
        "snapshot_file": snapshot_file,
        "grad_enabled": torch.is_grad_enabled(),
        "notes": tuple(notes),
    }
    if segs is None:
        return AllocatorState(**kw)
    return AllocatorState.from_snapshot(segs, **kw)


def _processes(idx: int) -> tuple[int | None, tuple[OtherProcess, ...] | None]:
    from torchmem.devices import _nvml

    nv = _nvml.device(idx, al.device_uuid(idx))
    if nv is None or nv.processes is None:
        return None, None
    me = os.getpid()
    used = next((p.used for p in nv.processes if p.pid == me), None)
    others = tuple(OtherProcess(p.pid, p.used, p.name) for p in nv.processes if p.pid != me)
    return used, others


# ---------------------------------------------------------------------------------------------------------
# the process-wide OOM observer

OOMCallback = Callable[[AllocatorState], None]

_lock = threading.Lock()
_registry: dict[str, Any] = {
    "attached": False,
    "problem": None,
    "callbacks": [],  # list[OOMObserver]
    "last": {},  # device index -> AllocatorState
    "reported": set(),
}


@dataclass
class OOMObserver:
    """Handle of a registered OOM callback.

    Attributes:
        callback: Called with the :class:`AllocatorState` captured at each OOM (may be ``None``).
        snapshot_dir: Where a memory_viz snapshot is written at each OOM while history recording is on.
        active: Whether it is still registered.
        problem: Why torch's observer could not be attached (``None``: attached).
    """

    callback: OOMCallback | None
    snapshot_dir: str | None
    active: bool = True
    problem: str | None = None

    def detach(self) -> None:
        """Stop calling this callback (torch's own observer cannot be removed; it stays, idle and cheap)."""
        with _lock:
            if self in _registry["callbacks"]:
                _registry["callbacks"].remove(self)
        self.active = False

    def __enter__(self) -> OOMObserver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.detach()


def _report_once(key: str, message: str) -> None:
    with _lock:
        if key in _registry["reported"]:
            return
        _registry["reported"].add(key)
    emit_warning(message)  # the user's line; never raises, even with warnings as errors


def _on_oom(device: int, requested: int, limit_or_total: int, device_free: int) -> None:
    """torch calls this after an allocation failed, before raising (the allocator lock is released)."""
    try:
        with _lock:
            handles = list(_registry["callbacks"])
        snap_file = None
        dirs = [h.snapshot_dir for h in handles if h.snapshot_dir]
        if dirs and al.history_enabled():
            os.makedirs(dirs[0], exist_ok=True)
            path = os.path.join(dirs[0], f"oom_cuda{device}_{os.getpid()}_{time.time_ns()}.pickle")
            try:
                if al.dump_snapshot(path):
                    snap_file = path
            except Exception as exc:
                _report_once(
                    "dump", f"torchmem could not write the OOM snapshot ({type(exc).__name__}: {exc})."
                )
        state = capture_state(
            torch.device("cuda", device),
            requested=requested,
            device_free=device_free,
            limit=limit_or_total,
            snapshot_file=snap_file,
        )
        with _lock:
            _registry["last"][device] = state
        for h in handles:
            if h.callback is None:
                continue
            try:
                h.callback(state)
            except Exception as exc:
                _report_once(f"cb{id(h)}", f"torchmem: an OOM callback failed ({type(exc).__name__}: {exc}).")
    except Exception as exc:  # never let the observer turn an OOM into something else
        _report_once("observer", f"torchmem's OOM observer failed ({type(exc).__name__}: {exc}).")


def attach_oom_observer(
    callback: OOMCallback | None = None, *, snapshot_dir: str | None = None
) -> OOMObserver:
    """Capture the allocator state at every CUDA OOM of this process (and call ``callback`` with it).

    The first call attaches torchmem's single observer to PyTorch's caching allocator (this initialises
    CUDA, as torch does to attach); later calls only register more callbacks. When
    ``torch.cuda.memory._record_memory_history()`` is recording and ``snapshot_dir`` is given, each OOM
    also writes a snapshot pickle there that https://pytorch.org/memory_viz opens. The last state per
    device is kept for :func:`explain_oom` (:func:`last_oom_state`).

    Where torch has no observer (no CUDA, the ``cudaMallocAsync`` backend, an old torch) the handle's
    ``problem`` says why and nothing is captured; no exception is raised.

    Example:
        >>> obs = attach_oom_observer(lambda state: print(state.requested))   # doctest: +SKIP
        >>> obs.detach()                                                      # doctest: +SKIP
    """
    handle = OOMObserver(callback, snapshot_dir)
    with _lock:
        attached = _registry["attached"]
    if not attached:
        problem = al.attach_oom_observer(_on_oom)
        with _lock:
            _registry["attached"] = problem is None
            _registry["problem"] = problem
    with _lock:
        handle.problem = _registry["problem"]
        if _registry["attached"]:
            _registry["callbacks"].append(handle)
        else:
            handle.active = False
    return handle


def last_oom_state(device: int | None = None) -> AllocatorState | None:
    """The state the observer captured at the most recent OOM (of ``device``, else of any device)."""
    with _lock:
        last: dict[int, AllocatorState] = dict(_registry["last"])
    if device is not None:
        return last.get(device)
    if not last:
        return None
    return max(last.values(), key=lambda s: s.timestamp or 0.0)


# ---------------------------------------------------------------------------------------------------------
# memory pinned by old exceptions and notebook output


def _tensors_in(obj: Any, depth: int = 2) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if depth <= 0:
        return []
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [t for x in list(obj)[:1000] for t in _tensors_in(x, depth - 1)]
    if isinstance(obj, dict):
        return [t for x in list(obj.values())[:1000] for t in _tensors_in(x, depth - 1)]
    return []


def _storage_key(t: torch.Tensor) -> tuple[str, int] | None:
    try:
        st = t.untyped_storage()
        return (str(t.device), int(st.data_ptr()))
    except Exception:
        return None


def _nbytes(t: torch.Tensor) -> int:
    try:
        return int(t.untyped_storage().nbytes())
    except Exception:
        return 0


def pinned_tensors(
    device: torch.device | None = None, *, exclude: BaseException | None = None
) -> list[PinnedTensor]:
    """Device memory held by a finished exception (``sys.last_exc`` / ``last_traceback``) and by IPython's
    output history (``Out``, ``_``): storages on ``device`` (every non-CPU device when ``None``), one entry
    per holder, each storage counted once. Parameters are skipped (a model holds them anyway); an old
    exception in ``exclude``'s cause/context chain (the OOM being explained, or the exception that wraps
    it) is skipped: its frames are the working set, not an old leftover.
    """
    seen: set[tuple[str, int]] = set()
    out: list[PinnedTensor] = []

    def wanted(t: torch.Tensor) -> bool:
        if isinstance(t, torch.nn.Parameter):
            return False
        if device is None:
            return t.device.type not in ("cpu", "meta")
        return t.device == device or (t.device.type == device.type and device.index is None)

    def add(where: str, objs: list[torch.Tensor]) -> None:
        total = 0
        for t in objs:
            if not wanted(t):
                continue
            key = _storage_key(t)
            if key is None or key in seen:
                continue
            seen.add(key)
            total += _nbytes(t)
        if total:
            out.append(PinnedTensor(where, total))

    # the whole chain, causes and contexts: every part of it is the OOM being explained
    excluded = {id(e) for e in exception_chain(exclude)}
    last = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    tbs: list[types.TracebackType] = []
    if last is not None:
        # the old exception and its cause/context chain: a wrapped OOM's frames are in its __cause__
        tbs.extend(
            e.__traceback__
            for e in exception_chain(last)
            if id(e) not in excluded and e.__traceback__ is not None
        )
    else:
        last_tb = getattr(sys, "last_traceback", None)
        if last_tb is not None:
            tbs.append(last_tb)
    for first in tbs:
        tb: types.TracebackType | None = first
        while tb is not None:
            frame = tb.tb_frame
            code = frame.f_code
            for name, value in list(frame.f_locals.items()):
                add(
                    f"sys.last_traceback -> frame {os.path.basename(code.co_filename)}:{tb.tb_lineno} "
                    f"{code.co_name}() local {name!r}",
                    _tensors_in(value),
                )
            tb = tb.tb_next
    tbs.clear()
    ip = sys.modules.get("IPython")
    get = getattr(ip, "get_ipython", None) if ip is not None else None
    shell = get() if get is not None else None
    ns = getattr(shell, "user_ns", None)
    if isinstance(ns, dict):
        outs = ns.get("Out")
        if isinstance(outs, dict):
            for k, v in list(outs.items()):
                add(f"IPython Out[{k}]", _tensors_in(v))
        for name in ("_", "__", "___"):
            if name in ns:
                add(f"IPython {name}", _tensors_in(ns[name]))
    return out


# ---------------------------------------------------------------------------------------------------------
# the public entry point


def explain_oom(
    exc_or_message: BaseException | str,
    *,
    device: DeviceLike = None,
    state: AllocatorState | None = None,
    leak: Any = None,
    batch_size: int | None = None,
    working_set: Sequence[WorkingSetItem] = (),
    alloc_conf: str | None = None,
) -> OOMDiagnosis:
    """Explain an out-of-memory error: ranked causes, each with its evidence and the fixes it supports.

    Given an exception, the OOM is found by type in its ``__cause__``/``__context__`` chain, and the
    allocator state comes from the OOM observer (:func:`attach_oom_observer`) when it captured this OOM,
    else it is read now (a note says so). Given a message (a pasted log line), only the message is used —
    unless ``device`` or ``state`` is given, which says the message comes from this process. Memory held by
    an earlier exception or notebook output is looked for in this process when explaining a live exception.

    Args:
        exc_or_message: The exception (any exception whose chain holds the OOM) or the message text.
        device: The device of the OOM (default: the one the message names, else the current one).
        state: An allocator state to use instead of reading one.
        leak: A leak trend from a running watcher (its report, or a dict with ``bytes_per_step`` and
            ``culprits``).
        batch_size: The batch size of the failing step, to suggest a smaller one.
        working_set: The step's biggest holders or categories, when known.
        alloc_conf: The allocator settings in effect (default: ``PYTORCH_CUDA_ALLOC_CONF`` and friends from
            the environment).

    Returns:
        An :class:`~torchmem.results.oom.OOMDiagnosis`; ``is_oom`` is ``False`` (and nothing else is set)
        when the input is not an out-of-memory error.

    Raises:
        OOMInputError: ``exc_or_message`` is neither an exception nor a string.

    Example:
        >>> import torchmem
        >>> d = torchmem.explain_oom("CUDA out of memory. Tried to allocate 96.00 GiB. GPU 0 has a total "
        ...     "capacity of 79.19 GiB of which 70.00 GiB is free.")     # doctest: +SKIP
        >>> d.causes[0].kind                                               # doctest: +SKIP
        'too_large'
    """
    live_exc: BaseException | None = None
    if isinstance(exc_or_message, str):
        text = exc_or_message
    elif isinstance(exc_or_message, BaseException):
        live_exc = oom_exception(exc_or_message)
        text = str(live_exc) if live_exc is not None else str(exc_or_message)
        if live_exc is not None and not text.strip():
            text = f"{type(live_exc).__name__}: out of memory"
    else:
        raise OOMInputError(
            f"explain_oom needs an exception or a message, not a {type(exc_or_message).__name__}.",
            "Pass the caught exception (except torch.OutOfMemoryError as e: explain_oom(e)) or its text.",
        )
    parsed = parse_oom_message(text)
    if isinstance(exc_or_message, BaseException) and live_exc is None:
        return OOMDiagnosis(
            False,
            parsed if parsed is not None and not parsed.is_oom else None,
            (),
            (),
            notes=(f"{type(exc_or_message).__name__} is not an out-of-memory error.",),
        )
    if parsed is None and live_exc is not None:
        parsed = parse_oom_message(f"{type(live_exc).__name__}: {text}")
    if parsed is None:
        return OOMDiagnosis(False, None, (), (), notes=("The text holds no out-of-memory message.",))
    if not parsed.is_oom:
        return diagnose(parsed)
    notes: list[str] = []
    this_process = live_exc is not None or device is not None or state is not None
    if state is None and this_process and parsed.backend in ("cuda", "rocm", None):
        dev = _oom_device(device, parsed.device_index)
        if dev is not None and dev.type == "cuda":
            captured = last_oom_state(dev.index)
            if (
                captured is not None
                and captured.timestamp is not None
                and time.time() - captured.timestamp < 600
                and _same_request(captured.requested, parsed.requested)
            ):
                state = captured
            elif al.cuda_ready():
                state = capture_state(dev, requested=parsed.requested)
                notes.append(
                    "Allocator state read after the OOM, not at it (attach_oom_observer() captures it at the "
                    "moment); temporaries freed while the exception unwound are not in it."
                )
    pinned: list[PinnedTensor] = []
    if live_exc is not None:
        try:
            # the OOM's device: torchmem's CPU cap counts CPU tensors; elsewhere the accelerators' ones
            on = torch.device("cpu") if parsed.backend == "cpu" else None
            outer = exc_or_message if isinstance(exc_or_message, BaseException) else live_exc
            pinned = pinned_tensors(on, exclude=outer)
        except Exception as exc:
            notes.append(f"Could not look for memory held by old exceptions ({type(exc).__name__}).")
    conf = (
        alloc_conf if alloc_conf is not None else (state.alloc_conf if state is not None else al.alloc_conf())
    )
    machine = None
    if parsed.source == "cpu_allocator" and parsed.device_total is None:
        # the CPU allocator's message gives only the request: judge it against this machine's memory
        machine = machine_memory(read_here=not this_process)
    return diagnose(
        parsed,
        state,
        alloc_conf=conf,
        leak=leak,
        pinned=pinned,
        working_set=working_set,
        batch_size=batch_size,
        grad_enabled=None if state is None else state.grad_enabled,
        notes=notes,
        machine=machine,
    )


def machine_memory(*, read_here: bool = False) -> MachineMemory | None:
    """This machine's memory as :func:`~torchmem.analysis.oom.diagnose` takes it: total RAM, the cgroup
    (container) limit when one is set, what is available; ``None`` when none of it can be read.

    ``read_here``: the figures are for a pasted message, which may come from another machine (a note says
    so in the diagnosis).

    Example:
        >>> m = machine_memory()
        >>> m is None or (m.total or 1) > 0
        True
    """
    from torchmem.devices._host import host_memory

    try:
        h = host_memory()
    except Exception:  # reading the OS must never turn an OOM explanation into another error
        return None
    if h.physical is None and h.cgroup_limit is None:
        return None
    return MachineMemory(
        physical=h.physical,
        physical_source=h.physical_source,
        cgroup_limit=h.cgroup_limit,
        cgroup_source=h.cgroup_source,
        available=h.available,
        read_here=read_here,
    )


def _same_request(a: int | None, b: int | None) -> bool:
    if a is None or b is None:
        return True
    return abs(a - b) <= max(1 << 20, b // 100)


def _oom_device(device: DeviceLike, index: int | None) -> torch.device | None:
    """The device of the OOM: the one given, else the CUDA device the message names when this process sees
    it, else the current one; ``None`` without CUDA."""
    if device is not None:
        return resolve(device)
    if not cuda_available():
        return None
    if index is not None and index < al.device_count():
        return torch.device("cuda", index)
    return resolve(None)
