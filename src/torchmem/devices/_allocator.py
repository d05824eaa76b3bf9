"""CUDA caching-allocator internals for OOM diagnosis: segment snapshots, the OOM observer, history dumps,
and the device facts the OOM capture needs (device count, UUID for NVML, driver free/total).

Every private entry point is looked up with ``getattr`` and falls back to the public one that gives the
same data (``torch.cuda.memory_snapshot()`` for ``torch._C._cuda_memorySnapshot``). Nothing here
initialises CUDA except :func:`attach_oom_observer`, which torch itself initialises to attach (documented),
and the device-property reads (:func:`device_total`, :func:`device_uuid`), which callers make only once CUDA
is in use. :func:`on_cuda_init` runs a function when the *program* initialises CUDA (torch's lazy-init
queue), so the observer can be attached then without torchmem initialising CUDA first. Each read is one call
into torch; a segment snapshot costs a walk of the allocator's blocks.
"""

from __future__ import annotations

import os
import pickle
import threading
from collections.abc import Callable
from typing import Any

import torch

from torchmem._warn import emit_warning

ObserverFn = Callable[[int, int, int, int], None]


_init_lock = threading.Lock()
# hooks on_cuda_init could not queue (a torch without the lazy-init queue): run by run_pending_cuda_init
_init_pending: list[Callable[[], None]] = []


def cuda_ready() -> bool:
    return bool(torch.cuda.is_available() and torch.cuda.is_initialized())


def has_context(index: int) -> bool:
    """Whether this process has a CUDA context on device ``index`` (never creates one). torch's private
    ``_cuda_hasPrimaryContext`` where it exists; else only the current device counts as having one."""
    probe = getattr(torch._C, "_cuda_hasPrimaryContext", None)
    if probe is not None:
        try:
            return bool(probe(index))
        except Exception:
            pass
    try:
        return int(torch.cuda.current_device()) == index
    except Exception:
        return False


def contexts() -> list[int]:
    """The CUDA devices on which this process has a context, in index order; ``[]`` before the program
    initialises CUDA. Never creates a context (see :func:`has_context`)."""
    if not cuda_ready():
        return []
    return [i for i in range(device_count()) if has_context(i)]


def device_figures(index: int) -> dict[str, int] | None:
    """The allocator's current and peak allocated and reserved bytes of device ``index`` (``allocated``,
    ``reserved``, ``peak_allocated``, ``peak_reserved``), read without flattening every counter; ``None``
    if CUDA is not in use. The peaks are the allocator's own (no reading between two samples is missed)."""
    if not cuda_ready():
        return None
    raw = getattr(torch._C, "_cuda_memoryStats", None)
    if raw is not None:
        try:
            n = raw(index)
            a, r = n["allocated_bytes"]["all"], n["reserved_bytes"]["all"]
            return {
                "allocated": int(a["current"]),
                "reserved": int(r["current"]),
                "peak_allocated": int(a["peak"]),
                "peak_reserved": int(r["peak"]),
            }
        except (KeyError, TypeError, RuntimeError):
            pass
    flat = flat_stats(index) or {}
    try:
        return {
            "allocated": flat["allocated_bytes.all.current"],
            "reserved": flat["reserved_bytes.all.current"],
            "peak_allocated": flat["allocated_bytes.all.peak"],
            "peak_reserved": flat["reserved_bytes.all.peak"],
        }
    except KeyError:
        return None


def current_index() -> int | None:
    """The current CUDA device once CUDA is initialised (never initialises it)."""
    if not cuda_ready():
        return None
    try:
        return int(torch.cuda.current_device())
    except Exception:
        return None


def device_now() -> int | None:
    """The current CUDA device as the driver keeps it, also from inside torch's lazy-init queue (where
    ``torch.cuda.is_initialized()`` is still false); ``None`` where it cannot be read."""
    try:
        return int(torch._C._cuda_getDevice())
    except Exception:
        return None


def wrap_cuda_function(name: str, make: Callable[[Any], Any]) -> Callable[[], None]:
    """Replace ``torch.cuda.<name>`` by ``make(original)``; returns the undo, which puts the original back
    only where the program did not replace it meanwhile."""
    from torchmem._patch import wrap_attribute

    return wrap_attribute(torch.cuda, name, make)


def platform() -> str:
    return "rocm" if getattr(torch.version, "hip", None) else "cuda"


def alloc_conf() -> str | None:
    """The allocator configuration string in effect for this process (environment), ``None`` if unset.

    torch 2.9+ reads ``PYTORCH_ALLOC_CONF`` for every device; older torch reads ``PYTORCH_CUDA_ALLOC_CONF``
    (``PYTORCH_HIP_ALLOC_CONF`` on ROCm). Settings given in several are joined (later ones win in torch).
    """
    names = ["PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"]
    if platform() == "rocm":
        names.append("PYTORCH_HIP_ALLOC_CONF")
    parts = [os.environ[n] for n in names if os.environ.get(n)]
    return ",".join(parts) if parts else None


def segments(index: int | None = None) -> list[dict[str, Any]] | None:
    """The allocator's segments (``torch.cuda.memory_snapshot()`` format) of device ``index`` (all devices
    when ``None``), without trace entries where torch allows it. ``None`` if CUDA is not in use."""
    if not cuda_ready():
        return None
    raw = getattr(torch._C, "_cuda_memorySnapshot", None)
    segs: Any = None
    if raw is not None:
        for args in (((0, 0, False),), (None,), ()):
            try:
                segs = raw(*args)["segments"]
                break
            except (TypeError, RuntimeError):
                continue
    if segs is None:
        try:
            segs = torch.cuda.memory_snapshot(include_traces=False)  # type: ignore[call-arg]
        except TypeError:
            segs = torch.cuda.memory_snapshot()
    out = [dict(s) for s in segs]
    if index is not None:
        out = [s for s in out if s.get("device", index) == index]
    for s in out:  # frames and history make snapshots big; the diagnosis needs sizes and states only
        s["blocks"] = [
            {k: b[k] for k in ("size", "requested_size", "state", "address") if k in b}
            for b in s.get("blocks", ())
        ]
        s.pop("frames", None)
    return out


def flat_stats(index: int) -> dict[str, int] | None:
    if not cuda_ready():
        return None
    return {k: int(v) for k, v in torch.cuda.memory_stats(index).items() if isinstance(v, (int, float))}


_BRIEF = ("allocated_bytes", "reserved_bytes", "active_bytes")


def brief_stats(index: int) -> dict[str, int] | None:
    """The current allocated, reserved and active bytes of device ``index`` (flat keys, as
    :func:`flat_stats` names them), read without flattening every counter: a tenth of its cost, for a
    reading at each of many OOMs. ``None`` if CUDA is not in use."""
    if not cuda_ready():
        return None
    raw = getattr(torch._C, "_cuda_memoryStats", None)
    if raw is not None:
        try:
            nested = raw(index)
            return {f"{k}.all.current": int(nested[k]["all"]["current"]) for k in _BRIEF}
        except (KeyError, TypeError, RuntimeError):
            pass
    return flat_stats(index)


def mem_info(index: int) -> tuple[int, int] | None:
    if not cuda_ready() or not has_context(index):
        return None
    free, total = torch.cuda.mem_get_info(index)
    return int(free), int(total)


def device_total(index: int) -> int | None:
    if not torch.cuda.is_available():
        return None
    return int(torch.cuda.get_device_properties(index).total_memory)


def history_enabled() -> bool | None:
    """Whether ``torch.cuda.memory._record_memory_history`` is recording (``None``: torch cannot say)."""
    fn = getattr(torch._C, "_cuda_isHistoryEnabled", None)
    if fn is None or not cuda_ready():
        return None
    try:
        return bool(fn())
    except RuntimeError:
        return None


def dump_snapshot(path: str) -> bool:
    """Write the full snapshot (with history) as the pickle https://pytorch.org/memory_viz opens."""
    mem: Any = torch.cuda.memory
    dump = getattr(mem, "_dump_snapshot", None)
    if dump is not None:
        dump(path)
        return True
    snap = getattr(mem, "_snapshot", None)
    if snap is None:
        return False
    with open(path, "wb") as f:
        pickle.dump(snap(), f)
    return True


def attach_oom_observer(fn: ObserverFn) -> str | None:
    """Attach ``fn(device, requested, limit_or_total, device_free)`` to the caching allocator's OOM path.

    torch cannot detach an observer; callers attach once per process and dispatch themselves. Returns
    ``None`` on success, else why it could not be attached. Attaching initialises CUDA (torch does it).
    """
    attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
    if attach is None:
        return "this torch has no allocator OOM observer (torch._C._cuda_attach_out_of_memory_observer)."
    if not torch.cuda.is_available():
        return "no CUDA device is available."
    try:
        attach(fn)
    except (RuntimeError, TypeError) as exc:  # cudaMallocAsync backend: not supported
        return f"the allocator refused the observer ({exc})."
    return None


def device_count() -> int:
    """Visible CUDA (or ROCm) devices; 0 without CUDA. Does not initialise CUDA."""
    return int(torch.cuda.device_count()) if torch.cuda.is_available() else 0


def device_uuid(index: int) -> str | None:
    """The UUID of CUDA device ``index`` as NVML names it (``"GPU-…"``, ``"MIG-…"``), ``None`` when torch
    cannot say. Reads the device properties, which initialises CUDA: call it once CUDA is in use."""
    try:
        raw = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    except Exception:  # an old torch, or a device that cannot be queried: NVML matches by index instead
        return None
    if raw is None:
        return None
    text = str(raw)
    return text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"


def _never_raises(fn: Callable[[], None]) -> Callable[[], None]:
    """``fn`` wrapped so that an error is reported once and never raised: torch re-raises an error of a
    queued call as ``DeferredCudaCallError`` from the program's first CUDA call, which must not fail for
    us."""
    reported: list[bool] = []

    def run() -> None:
        try:
            fn()
        except Exception as exc:
            if not reported:
                reported.append(True)
                emit_warning(f"torchmem: a CUDA start-up hook failed ({type(exc).__name__}: {exc}).")

    return run


def on_cuda_init(fn: Callable[[], None]) -> str | None:
    """Call ``fn()`` once the program initialises CUDA — at once when it already has — without initialising
    CUDA: ``fn`` goes on torch's lazy-initialisation queue (``torch.cuda._lazy_call``), which torch runs on
    the thread that initialises CUDA, right after the driver and the caching allocator are set up and before
    the program's first CUDA call goes on. An error in ``fn`` is reported once, never raised (torch would
    raise it into the program's CUDA call).

    Returns ``None`` when ``fn`` ran or is queued; else why it could not be queued (a torch without the
    queue): ``fn`` then waits for :func:`run_pending_cuda_init`, which callers invoke at moments of their
    own (a step). On a torch without CUDA ``fn`` is queued and simply never runs.

    Example:
        >>> on_cuda_init(lambda: None) is None
        True
    """
    run = _never_raises(fn)
    if torch.cuda.is_initialized():
        run()
        return None
    lazy = getattr(torch.cuda, "_lazy_call", None)
    if callable(lazy):
        try:
            lazy(run)  # runs it now, under torch's init lock, if CUDA was initialised meanwhile
            return None
        except Exception as exc:  # a changed private signature: fall back to polling
            why = f"torch.cuda._lazy_call failed ({type(exc).__name__}: {exc})"
    else:
        why = "this torch has no lazy-initialisation queue (torch.cuda._lazy_call)"
    with _init_lock:
        _init_pending.append(run)
    return why + "; the hook runs at the next check once CUDA is in use."


def run_pending_cuda_init() -> None:
    """Run the hooks :func:`on_cuda_init` could not queue, once CUDA is initialised (cheap otherwise)."""
    if not _init_pending or not torch.cuda.is_initialized():
        return
    with _init_lock:
        pending = list(_init_pending)
        _init_pending.clear()
    for run in pending:
        run()


def private_pool_segments(index: int) -> list[tuple[tuple[int, int], int, int]] | None:
    """``(pool id, address, size)`` of every segment of device ``index`` that belongs to a private memory
    pool (CUDA graphs: ``torch.cuda.graph``, torch.compile's ``reduce-overhead``); ``None`` if CUDA is not in
    use or torch's snapshot has no pool ids. One allocator snapshot (a few ms on a large cache)."""
    segs = segments(index)
    if segs is None:
        return None
    out: list[tuple[tuple[int, int], int, int]] = []
    for s in segs:
        pool = s.get("segment_pool_id")
        if pool is None:
            return None  # this torch does not say which pool a segment is in
        pid = (int(pool[0]), int(pool[1]))
        if pid != (0, 0):
            out.append((pid, int(s.get("address", 0)), int(s.get("total_size", 0))))
    return out
