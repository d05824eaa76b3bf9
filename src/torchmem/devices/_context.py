"""Estimate of the CUDA context's size: what a fresh process on this GPU uses before it allocates anything.

No API reports the size of a live context, and it cannot be freed in-process. torchmem measures it once in a
child process — ``torch.cuda.init()`` and one synchronize on the same device, then NVML's figure for that
child's PID (or, where NVML cannot see PIDs, the device's used memory before and after) — and caches the
result per GPU UUID, driver version, torch version and ``CUDA_MODULE_LOADING`` in
``$TORCHMEM_CACHE_DIR`` (default ``~/.cache/torchmem``). Set ``TORCHMEM_CONTEXT_PROBE=0`` to skip it; the
context then shows as ``n/a`` and is folded into the unexplained remainder.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

_PROBE = r"""
import json, os, sys, time
idx = int(sys.argv[1])
out = {}
nv = None
try:
    import pynvml as nv
    nv.nvmlInit()
    uuid = sys.argv[2]
    h = nv.nvmlDeviceGetHandleByUUID(uuid.encode()) if uuid else nv.nvmlDeviceGetHandleByIndex(idx)
    out["before"] = int(nv.nvmlDeviceGetMemoryInfo(h).used)
except Exception as exc:
    nv = None
    out["nvml_error"] = repr(exc)
import torch
torch.cuda.set_device(idx)
torch.cuda.synchronize()
free, total = torch.cuda.mem_get_info(idx)
out["used_after"] = int(total - free)
if nv is not None:
    out["after"] = int(nv.nvmlDeviceGetMemoryInfo(h).used)
    try:
        for p in nv.nvmlDeviceGetComputeRunningProcesses(h):
            if int(p.pid) == os.getpid() and p.usedGpuMemory is not None:
                out["self"] = int(p.usedGpuMemory)
    except Exception as exc:
        out["proc_error"] = repr(exc)
print("TORCHMEM_PROBE " + json.dumps(out))
"""

_memo: dict[str, ContextEstimate | None] = {}
_memo_lock = threading.Lock()


@dataclass(frozen=True)
class ContextEstimate:
    bytes: int
    method: str  # "nvml-process" | "nvml-device-delta"


def _cache_file() -> Path:
    root = os.environ.get("TORCHMEM_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "torchmem"
    )
    return Path(root) / "context.json"


def _key(uuid: str, driver: str | None) -> str:
    return "|".join(
        [uuid, driver or "?", str(torch.__version__), os.environ.get("CUDA_MODULE_LOADING", "default")]
    )


def probe_enabled() -> bool:
    return os.environ.get("TORCHMEM_CONTEXT_PROBE", "1").lower() not in ("0", "false", "no", "off")


def estimate(cuda_index: int, uuid: str, driver: str | None, probe: bool = True) -> ContextEstimate | None:
    """Context size for this GPU, from the memo, the disk cache, or a new probe (a few seconds, once;
    ``probe=False``: the memo and the cache only)."""
    if not probe_enabled():
        return None
    key = _key(uuid, driver)
    with _memo_lock:
        if key in _memo:
            return _memo[key]
        found = _read_cache(key)
        if found is None:
            if not probe:
                return None
            found = _run_probe(cuda_index, uuid)
            if found is not None:
                _write_cache(key, found)
        _memo[key] = found
        return found


def _read_cache(key: str) -> ContextEstimate | None:
    try:
        data = json.loads(_cache_file().read_text())
        item = data[key]
        return ContextEstimate(int(item["bytes"]), str(item["method"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_cache(key: str, est: ContextEstimate) -> None:
    path = _cache_file()
    # A read-only home only costs a re-probe in the next process.
    with contextlib.suppress(OSError):
        try:
            data = json.loads(path.read_text())
            if not isinstance(data, dict):
                data = {}
        except (OSError, ValueError):
            data = {}
        data[key] = {"bytes": est.bytes, "method": est.method}
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, path)


def _run_probe(cuda_index: int, uuid: str) -> ContextEstimate | None:
    env = dict(os.environ)
    env["TORCHMEM_CONTEXT_PROBE"] = "0"
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _PROBE, str(cuda_index), uuid],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    for line in proc.stdout.splitlines():
        if line.startswith("TORCHMEM_PROBE "):
            data = json.loads(line[len("TORCHMEM_PROBE ") :])
            return interpret(data)
    return None


def interpret(data: dict[str, int | str]) -> ContextEstimate | None:
    """Turn the probe's readings into an estimate (the per-process figure wins over a device delta)."""
    own = data.get("self")
    if isinstance(own, int) and own > 0:
        return ContextEstimate(own, "nvml-process")
    before, after = data.get("before"), data.get("after")
    if isinstance(before, int) and isinstance(after, int) and after > before:
        return ContextEstimate(after - before, "nvml-device-delta")
    return None
