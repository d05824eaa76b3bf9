"""NVML access (optional: ``pip install torchmem[nvml]``).

Everything here degrades: a missing library, a missing driver or a permission error gives ``None``
figures and one hint (:func:`nvml_problem`), never an exception into the caller. NVML never creates a
CUDA context, so it is safe to read before the process has used the GPU.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any

_lock = threading.Lock()
_state: dict[str, Any] = {"tried": False, "module": None, "problem": None}


@dataclass(frozen=True)
class NvmlProcess:
    pid: int
    name: str | None
    used: int | None  # bytes; None where the driver does not report it (e.g. some containers, MIG)


@dataclass(frozen=True)
class NvmlDevice:
    index: int
    uuid: str
    name: str
    total: int
    used: int
    free: int
    reserved: int | None
    driver: str | None
    processes: tuple[NvmlProcess, ...] | None


def _load() -> Any:
    with _lock:
        if _state["tried"]:
            return _state["module"]
        _state["tried"] = True
        if os.environ.get("TORCHMEM_NO_NVML"):
            _state["problem"] = "NVML disabled by TORCHMEM_NO_NVML."
            return None
        try:
            import pynvml
        except ImportError:
            _state["problem"] = "nvidia-ml-py is not installed: pip install 'torchmem[nvml]'."
            return None
        try:
            pynvml.nvmlInit()
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, NoPermission, ...
            _state["problem"] = f"NVML could not start ({type(exc).__name__}: {exc}); driver figures are n/a."
            return None
        _state["module"] = pynvml
        return pynvml


def nvml_problem() -> str | None:
    """Why NVML figures are missing, or ``None`` when NVML works (loads it on first call)."""
    _load()
    return _state["problem"]  # type: ignore[no-any-return]


def available() -> bool:
    return _load() is not None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _visible_nvml_indices(nv: Any) -> list[int] | None:
    """NVML indices of the CUDA-visible devices, in CUDA order (CUDA_VISIBLE_DEVICES honoured)."""
    count = int(nv.nvmlDeviceGetCount())
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is None:
        return list(range(count))
    out: list[int] = []
    uuids: list[str] | None = None
    for item in (x.strip() for x in env.split(",")):
        if not item:
            break
        if item.lstrip("-").isdigit():
            i = int(item)
            if i < 0 or i >= count:
                break
            out.append(i)
            continue
        if uuids is None:
            uuids = [_text(nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetHandleByIndex(j))) for j in range(count)]
        match = [j for j, u in enumerate(uuids) if u.startswith(item) or u.startswith("GPU-" + item)]
        if len(match) != 1:
            break
        out.append(match[0])
    return out


def device(cuda_index: int, uuid: str | None = None, with_processes: bool = True) -> NvmlDevice | None:
    """NVML's view of the CUDA device ``cuda_index`` (matched by UUID when given), or ``None``."""
    nv = _load()
    if nv is None:
        return None
    try:
        if uuid is not None:
            handle = nv.nvmlDeviceGetHandleByUUID(uuid.encode() if isinstance(uuid, str) else uuid)
            index = int(nv.nvmlDeviceGetIndex(handle))
        else:
            visible = _visible_nvml_indices(nv)
            if visible is None or cuda_index >= len(visible):
                return None
            index = visible[cuda_index]
            handle = nv.nvmlDeviceGetHandleByIndex(index)
        reserved: int | None = None
        try:
            mem = nv.nvmlDeviceGetMemoryInfo(handle, version=nv.nvmlMemory_v2)
            reserved = int(mem.reserved)
        except Exception:
            mem = nv.nvmlDeviceGetMemoryInfo(handle)
        try:
            driver: str | None = _text(nv.nvmlSystemGetDriverVersion())
        except Exception:
            driver = None
        procs = _processes(nv, handle) if with_processes else None
        return NvmlDevice(
            index=index,
            uuid=_text(nv.nvmlDeviceGetUUID(handle)),
            name=_text(nv.nvmlDeviceGetName(handle)),
            total=int(mem.total),
            used=int(mem.used),
            free=int(mem.free),
            reserved=reserved,
            driver=driver,
            processes=procs,
        )
    except Exception as exc:
        with _lock:
            if _state["problem"] is None:
                _state["problem"] = f"NVML query failed ({type(exc).__name__}: {exc})."
        return None


def _processes(nv: Any, handle: Any) -> tuple[NvmlProcess, ...] | None:
    seen: dict[int, NvmlProcess] = {}
    ok = False
    for getter in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        fn = getattr(nv, getter, None)
        if fn is None:
            continue
        try:
            items = fn(handle)
        except Exception:
            continue
        ok = True
        for p in items:
            pid = int(p.pid)
            raw = getattr(p, "usedGpuMemory", None)
            used = None if raw is None or int(raw) >= (1 << 63) - 1 or int(raw) < 0 else int(raw)
            if pid in seen:
                prev = seen[pid].used
                used = None if prev is None or used is None else max(prev, used)
            seen[pid] = NvmlProcess(pid, _process_name(nv, pid), used)
    return tuple(seen.values()) if ok else None


def _process_name(nv: Any, pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8") as f:
            return f.read().strip() or None
    except OSError:
        pass
    try:
        return _text(nv.nvmlSystemGetProcessName(pid))
    except Exception:
        return None
