"""Out-of-memory diagnosis — pure functions: parse an OOM message, classify the cause, choose the fixes.

* :func:`parse_oom_message` reads every field of the OOM messages of torch 1.x–2.x (CUDA and ROCm caching
  allocator, ``cudaMallocAsync``, MPS, XPU, the CPU allocator) and recognises memory errors raised outside the
  allocator (driver ``CUDA error: out of memory``, cuBLAS/cuDNN ``*_ALLOC_FAILED``, NCCL) as such.
* :func:`find_oom_message` finds the OOM message inside a long log or traceback.
* :func:`is_oom` tells an OOM exception by its type and its ``__cause__``/``__context__`` chain; text is read
  only for strings and for foreign ``RuntimeError`` s (ROCm, old torch, CPU, cuBLAS).
* :func:`diagnose` ranks the causes — ``too_large``, ``fragmentation``, ``other_processes``, ``leak``,
  ``pinned_by_exception``, ``working_set`` (and ``outside_allocator`` for memory errors outside PyTorch's
  allocator) — each with its evidence and only the fixes that evidence supports, never a setting already in
  effect.

Nothing here touches a device: live state is gathered by :mod:`torchmem.capture.oom` (which holds the
public :func:`~torchmem.capture.oom.explain_oom`) and handed in as data.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from torchmem._format import fmt_bytes
from torchmem.analysis.fragmentation import (
    AllocatorState,
    FragmentationReport,
    analyze_fragmentation,
    round_request,
)

# ---------------------------------------------------------------------------------------------------------
# sizes

_UNIT = {
    "b": 1,
    "byte": 1,
    "bytes": 1,
    "kib": 1 << 10,
    "kb": 1 << 10,
    "k": 1 << 10,
    "mib": 1 << 20,
    "mb": 1 << 20,
    "m": 1 << 20,
    "gib": 1 << 30,
    "gb": 1 << 30,
    "g": 1 << 30,
    "tib": 1 << 40,
    "tb": 1 << 40,
    "pib": 1 << 50,
    "pb": 1 << 50,
}
_SIZE = r"(\d+(?:\.\d+)?)\s?(bytes|byte|B|KiB|MiB|GiB|TiB|PiB|KB|MB|GB|TB|PB)\b"


def parse_size(text: str) -> int | None:
    """``"2.00 GiB" -> 2147483648``. torch prints sizes in binary units everywhere (MPS labels them "GB").

    Example:
        >>> parse_size("20.00 MiB")
        20971520
    """
    m = re.fullmatch(r"\s*" + _SIZE + r"\s*", text)
    if m is None:
        return None
    return _size(m.group(1), m.group(2))


def _size(num: str, unit: str) -> int:
    return round(float(num) * _UNIT[unit.lower()])


def _precision(num: str, unit: str) -> int:
    """Half a unit of the last printed digit: how far the printed figure may be from the true one."""
    decimals = len(num.split(".")[1]) if "." in num else 0
    return int(_UNIT[unit.lower()] * 0.5 * 10 ** (-decimals))


# ---------------------------------------------------------------------------------------------------------
# parsed message


@dataclass(frozen=True)
class ParsedOOM:
    """The fields of one OOM (or memory-error) message. ``None``: the message does not give the field.

    Attributes:
        text: The message as found (whitespace kept).
        is_oom: The message reports that memory ran out (in the allocator or elsewhere).
        source: Who ran out: ``"allocator"`` (PyTorch's caching allocator), ``"cuda_malloc_async"``,
            ``"mps_allocator"``, ``"xpu_allocator"``, ``"cpu_allocator"``, ``"torchmem_cap"`` (a cap set by
            :func:`torchmem.limit` or ``torchmem.budget(hard=True)``), ``"driver"`` (a CUDA/HIP call outside
            the allocator), ``"cublas"``, ``"cudnn"``, ``"nccl"``; ``None`` when not an OOM.
        backend: ``"cuda"``, ``"rocm"``, ``"mps"``, ``"xpu"`` or ``"cpu"``.
        format: Which message layout matched: ``"torch2"`` (2.1+ sentences), ``"torch1"`` (the
            parenthesised list of 1.x–2.0), ``"torch1_cached"`` (1.0–1.3: "cached"), ``"cuda_malloc_async"``,
            ``"mps"``, ``"cpu"``, ``"torchmem"`` (torchmem's cap), ``"library"`` (a library's status code),
            ``"bare"`` (no figures).
        exception_type: The exception name written before the message (``"torch.OutOfMemoryError"``).
        requested: Bytes of the request that failed.
        device_index: The GPU index in the message.
        device_total: The device's total memory.
        device_free: Free device memory when the request failed (all processes); for ``"torchmem_cap"``,
            what was left under the cap.
        allowed: The per-process limit, when ``set_per_process_memory_fraction`` (or MPS's watermark) set one;
            for ``"torchmem_cap"``, the cap.
        process_used: This process's device memory, PyTorch or not ("Including non-PyTorch memory...").
        other_processes: ``(pid, bytes)`` of every other process the message lists.
        allocated: Bytes PyTorch had allocated to tensors (private pools included).
        private_pools: Of ``allocated``, bytes in private pools (CUDA graphs).
        reserved: Bytes PyTorch's allocator held (allocated + cached).
        reserved_unallocated: Reserved by PyTorch but unallocated: the cache's free bytes.
        other_allocations: MPS: memory allocated outside PyTorch's MPS heaps.
        pool: MPS: the pool of the failed request.
        suggested_setting: The allocator setting the message itself suggests.
        error_code: The library's status or error code (``CUBLAS_STATUS_ALLOC_FAILED``, errno 12...).
        cap_owner: For ``"torchmem_cap"``: who set the cap (``"torchmem.limit()"``,
            ``"torchmem.budget(16.00 MiB)"``).
        precision: Bytes a printed figure may be off by (half its last digit), by field name.
        truncated: The message stops before fields its format always has.
        notes: What the parser noticed (e.g. this process is not named in the process list).
    """

    text: str
    is_oom: bool
    source: str | None = None
    backend: str | None = None
    format: str | None = None
    exception_type: str | None = None
    requested: int | None = None
    device_index: int | None = None
    device_total: int | None = None
    device_free: int | None = None
    allowed: int | None = None
    process_used: int | None = None
    other_processes: tuple[tuple[int, int], ...] = ()
    allocated: int | None = None
    private_pools: int | None = None
    reserved: int | None = None
    reserved_unallocated: int | None = None
    other_allocations: int | None = None
    pool: str | None = None
    suggested_setting: str | None = None
    error_code: str | None = None
    cap_owner: str | None = None
    precision: Mapping[str, int] = field(default_factory=dict)
    truncated: bool = False
    notes: tuple[str, ...] = ()

    @property
    def allocator_oom(self) -> bool:
        """The OOM was raised by a PyTorch allocator (not the driver or a library)."""
        return self.is_oom and self.source in (
            "allocator",
            "cuda_malloc_async",
            "mps_allocator",
            "xpu_allocator",
            "cpu_allocator",
            "torchmem_cap",
        )

    @property
    def others_used(self) -> int:
        return sum(b for _, b in self.other_processes)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["other_processes"] = [{"pid": p, "used": b} for p, b in self.other_processes]
        out["precision"] = dict(self.precision)
        out["notes"] = list(self.notes)
        return out


_OOM_MARKERS = re.compile(
    r"(?:CUDA|HIP|XPU) out of memory"
    r"|\b\w+(?::\d+)? out of memory\. Tried to allocate \S+ ?\S*\. Device \S+ has a limit of"
    r"|MPS backend out of memory"
    r"|DefaultCPUAllocator: (?:not enough memory|can't allocate memory)"
    r"|would exceed allowed memory"
    r"|(?:CUDA|HIP|cuda|hip) (?:driver )?error: out of memory"
    r"|cudaErrorMemoryAllocation|hipErrorOutOfMemory|CUDA_ERROR_OUT_OF_MEMORY"
    r"|CUBLAS_STATUS_ALLOC_FAILED|CUDNN_STATUS_ALLOC_FAILED|HIPBLAS_STATUS_ALLOC_FAILED"
    r"|rocblas_status_memory_error|CUSOLVER_STATUS_ALLOC_FAILED|CUFFT_ALLOC_FAILED"
    r"|Cuda failure 'out of memory'|Failed to CUDA calloc"
    r"|UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY|PI_ERROR_OUT_OF_RESOURCES"
    r"|OutOfMemoryError"
    r"|Tried to allocate \S+ ?\S+ \(GPU \d+;"
)

_EXC_PREFIX = re.compile(
    r"(?P<exc>(?:[A-Za-z_][\w]*\.)*(?:OutOfMemoryError|RuntimeError|DistBackendError|Error|Exception))"
    r":\s*(?=\S)"
)


def _search(pattern: str, text: str) -> re.Match[str] | None:
    return re.search(pattern, text, flags=re.IGNORECASE)


def parse_oom_message(text: str) -> ParsedOOM | None:
    """Parse an OOM message (or a whole log: the last OOM in it is parsed).

    Returns ``None`` when the text holds no memory error at all. A memory error raised outside PyTorch's
    allocator (driver, cuBLAS, cuDNN, NCCL) parses with its ``source`` set; a message cut short parses
    with ``truncated=True`` and the fields it still has.

    Example:
        >>> p = parse_oom_message("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
        ...     "GPU 0 has a total capacity of 79.19 GiB of which 1.20 GiB is free.")
        >>> p.requested, p.device_index, p.source, p.truncated
        (2147483648, 0, 'allocator', True)
    """
    found = find_oom_message(text)
    if found is None:
        return None
    return _parse_one(found)


def find_oom_message(text: str) -> str | None:
    """Find the last OOM message in a log or traceback and return it (its exception prefix included).

    The message runs from the start of the line that holds the OOM marker (or the exception name before
    it) to the end of its paragraph: multi-line formats (``cudaMallocAsync``, NCCL) keep their lines.

    Example:
        >>> find_oom_message("step 3\\nRuntimeError: CUDA error: out of memory\\n\\nother")
        'RuntimeError: CUDA error: out of memory'
    """
    if not isinstance(text, str) or not text.strip():
        return None
    matches = list(_OOM_MARKERS.finditer(text))
    if not matches:
        return None
    m = matches[-1]
    # the marker may sit in a continuation line of a multi-line message: go back to the exception name
    start = text.rfind("\n", 0, m.start()) + 1
    head = text[:start]
    lines = head.split("\n")
    back = len(lines) - 1  # last element is "" (text up to start ends with \n)
    # walk up over a message's earlier lines, stopping at a blank line or a traceback frame line
    while back > 0:
        prev = lines[back - 1]
        if not prev.strip() or prev.lstrip().startswith(("File ", "Traceback", "^", "~")):
            break
        if _EXC_PREFIX.match(text[start:].lstrip()) is not None:
            break
        if _EXC_PREFIX.search(prev) is None and not _continues(prev):
            break
        back -= 1
        start -= len(prev) + 1
    end = len(text)
    blank = re.compile(r"\n\s*\n|\nTraceback |\n\s*File \"|\n(?:During handling|The above exception)")
    b = blank.search(text, m.end())
    if b is not None:
        end = b.start()
    chunk = text[start:end].strip()
    # from the exception name on, if a log prefix (timestamps, rank) precedes it on the line
    e = _EXC_PREFIX.search(chunk)
    if e is not None and e.start() < m.start() - start + 1 and "\n" not in chunk[: e.start()]:
        chunk = chunk[e.start() :]
    return chunk


def _continues(line: str) -> bool:
    """A line that belongs to a multi-line memory message (NCCL's, cudaMallocAsync's)."""
    return bool(re.search(r"NCCL|nccl|Allocation on device|Last error", line))


def _parse_one(text: str) -> ParsedOOM:
    flat = " ".join(text.split())
    exc = None
    em = _EXC_PREFIX.match(flat)
    if em is not None:
        exc = em.group("exc")
    prec: dict[str, int] = {}
    values: dict[str, Any] = {}

    def grab(name: str, *patterns: str) -> None:
        if name in values:
            return
        for pat in patterns:
            mm = _search(pat.replace("SIZE", _SIZE), flat)
            if mm is not None:
                num, unit = mm.group(1), mm.group(2)
                values[name] = _size(num, unit)
                prec[name] = _precision(num, unit)
                return

    backend = _backend(flat)
    source, fmt, code = _source(flat, backend)
    is_oom = source is not None and source != "not_oom"
    if not is_oom:
        return ParsedOOM(text=text, is_oom=False, backend=backend, exception_type=exc, error_code=code)

    cap_owner = None
    if source == "torchmem_cap":
        cm = _CAP.search(flat)
        assert cm is not None
        cap_owner = cm.group("owner")
        for name, group in (
            ("requested", "req"),
            ("allowed", "cap"),
            ("device_free", "free"),
            ("allocated", "alloc"),
        ):
            sz = None if cm.group(group) is None else re.fullmatch(_SIZE, cm.group(group))
            if sz is not None:
                values[name] = _size(sz.group(1), sz.group(2))
                prec[name] = _precision(sz.group(1), sz.group(2))
        dm = re.search(r":(\d+)$", cm.group("device"))
        if dm is not None:
            values["device_index"] = int(dm.group(1))
    if source == "cpu_allocator":
        mm = _search(r"you tried to allocate (\d+) bytes", flat)
        if mm:
            values["requested"] = int(mm.group(1))
            prec["requested"] = 0
        errno = _search(r"Error code (\d+)", flat)
        code = f"errno {errno.group(1)}" if errno else code
    grab(
        "requested",
        r"Tried to allocate SIZE",
        r"Requested\s*:\s*SIZE",
        r"trying to allocate SIZE",
    )
    gpu = _search(r"\bGPU (\d+)\b|on device (\d+)|\bdevice[ :]+(\d+)\b", flat)
    device_index = None if gpu is None else int(next(g for g in gpu.groups() if g is not None))
    if source == "torchmem_cap":
        device_index = values.pop("device_index", None)
    grab("device_total", r"total capac\w* of SIZE", r"SIZE total capacity", r"Device limit\s*:\s*SIZE")
    grab("device_free", r"of which SIZE is free", r"; SIZE free\b", r"Free \(according to CUDA\)\s*:\s*SIZE")
    grab(
        "allowed",
        r"SIZE allowed;",
        r"PyTorch limit \(set by user-supplied memory fraction\)\s*:\s*SIZE",
        r"max allowed: SIZE",
        r"of which SIZE is allowed",
    )
    grab("process_used", r"this process has SIZE memory in use")
    grab(
        "allocated",
        r"Of the allocated memory SIZE is allocated by PyTorch",
        r"SIZE already allocated",
        r"Currently allocated\s*:\s*SIZE",
        r"MPS allocated: SIZE",
        r"SIZE is allocated by PyTorch",
    )
    grab("private_pools", r"with SIZE allocated in private pools")
    grab("reserved_unallocated", r"and SIZE is reserved by PyTorch but unallocated")
    grab("reserved", r"SIZE reserved in total by PyTorch")
    grab("cached", r"SIZE cached\)")
    grab("other_allocations", r"other allocations: SIZE")
    if values.get("allowed") is not None and source == "cuda_malloc_async" and values["allowed"] > (1 << 50):
        values.pop("allowed")  # cudaMallocAsync prints an absurd limit when no fraction is set

    procs: list[tuple[int, int]] = []
    for mm in re.finditer(r"Process (\d+) has " + _SIZE + r" memory in use", flat):
        procs.append((int(mm.group(1)), _size(mm.group(2), mm.group(3))))
    notes: list[str] = []

    pool = _search(r"on (private|shared|default) pool", flat)
    setting = _search(r"(PYTORCH_(?:CUDA|HIP|MPS)_\w+=\S+?)(?=\s|$|\)|\.\s)", flat)
    suggested = setting.group(1).rstrip(".") if setting else None
    if suggested is None and _search(r"try setting max_split_size_mb", flat):
        suggested = "max_split_size_mb"

    # derive what the layout implies
    allocated = values.get("allocated")
    reserved = values.get("reserved")
    unalloc = values.get("reserved_unallocated")
    if values.get("cached") is not None and reserved is None and allocated is not None:
        # torch 1.0-1.3: "cached" is the cache's free part; reserved = allocated + cached
        unalloc = values["cached"]
        reserved = allocated + unalloc
        prec["reserved"] = prec.get("allocated", 0) + prec.get("cached", 0)
        prec["reserved_unallocated"] = prec.get("cached", 0)
    if reserved is None and allocated is not None and unalloc is not None:
        reserved = allocated + unalloc
        prec["reserved"] = prec.get("allocated", 0) + prec.get("reserved_unallocated", 0)
    if unalloc is None and allocated is not None and reserved is not None:
        unalloc = max(0, reserved - allocated)
        prec["reserved_unallocated"] = prec.get("allocated", 0) + prec.get("reserved", 0)
    if fmt is None:
        if "total capacity of" in flat or "total capacty of" in flat or "is reserved by PyTorch" in flat:
            fmt = "torch2"
        elif values.get("cached") is not None:
            fmt = "torch1_cached"
        elif "total capacity;" in flat or "already allocated" in flat:
            fmt = "torch1"
        elif source == "allocator":
            fmt = "bare" if values.get("requested") is None else "torch2"
    process_used = values.get("process_used")
    if process_used is None and procs and reserved is not None and source == "allocator":
        notes.append(
            "The message names no process as this one (process IDs differ inside containers); "
            "one of the listed processes is probably this process."
        )
    truncated = _truncated(fmt, source or "", values, unalloc)
    return ParsedOOM(
        text=text,
        is_oom=True,
        source=source,
        backend=backend,
        format=fmt,
        exception_type=exc,
        requested=values.get("requested"),
        device_index=device_index,
        device_total=values.get("device_total"),
        device_free=values.get("device_free"),
        allowed=values.get("allowed"),
        process_used=process_used,
        other_processes=tuple(procs),
        allocated=allocated,
        private_pools=values.get("private_pools"),
        reserved=reserved,
        reserved_unallocated=unalloc,
        other_allocations=values.get("other_allocations"),
        pool=None if pool is None else pool.group(1).lower(),
        suggested_setting=suggested,
        error_code=code,
        cap_owner=cap_owner,
        precision=prec,
        truncated=truncated,
        notes=tuple(notes),
    )


def _truncated(fmt: str | None, source: str, values: Mapping[str, Any], unalloc: int | None) -> bool:
    if source != "allocator" or fmt is None:
        return False
    if fmt == "bare":
        return True
    need = ["requested", "device_total", "allocated"]
    if fmt in ("torch1", "torch1_cached"):
        need += ["device_free"]
    if fmt == "torch2":
        need += ["device_free"]
    return any(values.get(k) is None for k in need) or unalloc is None


def _backend(flat: str) -> str | None:
    cap = _CAP.search(flat)
    if cap is not None:
        dev = cap.group("device").split(":")[0].lower()
        return {"hip": "rocm"}.get(dev, dev)
    if re.search(r"\bHIP\b|hipError|HIPBLAS|rocblas|PYTORCH_HIP_ALLOC_CONF|\bROCm\b", flat):
        return "rocm"
    if re.search(r"\bMPS\b", flat):
        return "mps"
    if re.search(r"\bXPU\b|UR_RESULT|PI_ERROR|Level.?Zero", flat, flags=re.IGNORECASE):
        return "xpu"
    if re.search(r"DefaultCPUAllocator|alloc_cpu", flat):
        return "cpu"
    if re.search(r"CUDA|cuda|CUBLAS|CUDNN|NCCL|cuBLAS|cuDNN|CUSOLVER|CUFFT|\bGPU\b", flat):
        return "cuda"
    return None


#: The message of torchmem's own cap (``torchmem.limit()``, ``torchmem.budget(hard=True)``; the ledger).
_CAP = re.compile(
    r"\b(?P<dev>\w+(?::\d+)?) out of memory\. Tried to allocate (?P<req>\S+ ?\S*)\. "
    r"Device (?P<device>\S+) has a limit of (?P<cap>\S+ ?\S*) set by (?P<owner>.+?), of which "
    r"(?P<free>\S+ ?\S*) is free\.(?: Of the allocated memory (?P<alloc>\S+ ?\S*) is allocated by "
    r"tensors torchmem tracks)?"
)


def _source(flat: str, backend: str | None) -> tuple[str | None, str | None, str | None]:
    """(source, format, error code) of a message; source ``"not_oom"`` for a known non-memory error."""
    if _CAP.search(flat):
        return "torchmem_cap", "torchmem", None
    if _search(r"(?:CUDA|HIP|XPU) out of memory", flat):
        if _search(r"(?:CUDA|HIP) error: out of memory", flat) and not _search(
            r"(?:CUDA|HIP|XPU) out of memory\.", flat
        ):
            return "driver", "library", "cudaErrorMemoryAllocation"
        return ("xpu_allocator" if backend == "xpu" else "allocator"), None, None
    if _search(r"would exceed allowed memory|Allocation on device \d+ would exceed", flat):
        return "cuda_malloc_async", "cuda_malloc_async", None
    if _search(r"MPS backend out of memory", flat):
        return "mps_allocator", "mps", None
    if _search(r"DefaultCPUAllocator: (?:not enough memory|can't allocate memory)", flat):
        return "cpu_allocator", "cpu", None
    m = _search(r"(CUBLAS_STATUS_ALLOC_FAILED|HIPBLAS_STATUS_ALLOC_FAILED|rocblas_status_memory_error)", flat)
    if m:
        return "cublas", "library", m.group(1)
    m = _search(r"(CUSOLVER_STATUS_ALLOC_FAILED|CUFFT_ALLOC_FAILED)", flat)
    if m:
        return "cublas", "library", m.group(1)
    m = _search(r"(CUDNN_STATUS_ALLOC_FAILED)", flat)
    if m:
        return "cudnn", "library", m.group(1)
    if re.search(r"NCCL|nccl", flat) and _search(r"out of memory|Failed to CUDA calloc|cudaMalloc", flat):
        return "nccl", "library", "ncclUnhandledCudaError"
    m = _search(
        r"((?:CUDA|HIP) (?:driver )?error: out of memory|cudaErrorMemoryAllocation|hipErrorOutOfMemory"
        r"|CUDA_ERROR_OUT_OF_MEMORY)",
        flat,
    )
    if m:
        return "driver", "library", m.group(1)
    m = _search(r"(UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY|PI_ERROR_OUT_OF_RESOURCES)", flat)
    if m:
        return "driver", "library", m.group(1)
    if "OutOfMemoryError" in flat:
        return "allocator", "bare", None
    if _search(r"Tried to allocate \S+ ?\S+ \(GPU \d+;", flat):
        return "allocator", None, None
    return "not_oom", None, None


# ---------------------------------------------------------------------------------------------------------
# exception detection


def _oom_types() -> tuple[type[BaseException], ...]:
    import torch

    out: list[type[BaseException]] = []
    for obj in (getattr(torch, "OutOfMemoryError", None), getattr(torch.cuda, "OutOfMemoryError", None)):
        if isinstance(obj, type) and issubclass(obj, BaseException) and obj not in out:
            out.append(obj)
    return tuple(out)


def _chain(exc: BaseException) -> Iterable[BaseException]:
    seen: set[int] = set()
    cur: BaseException | None = exc
    stack: list[BaseException] = []
    while cur is not None or stack:
        if cur is None:
            cur = stack.pop()
        if id(cur) in seen:
            cur = None
            continue
        seen.add(id(cur))
        yield cur
        if cur.__context__ is not None and cur.__context__ is not cur.__cause__:
            stack.append(cur.__context__)
        cur = cur.__cause__


def oom_exception(exc: BaseException) -> BaseException | None:
    """The OOM in ``exc``'s ``__cause__``/``__context__`` chain (``exc`` itself first), or ``None``.

    Matched by type (``torch.OutOfMemoryError``, which ``torch.cuda.OutOfMemoryError`` aliases); a plain
    ``RuntimeError`` (or ``MemoryError``) counts when its text is a memory error torch raises without the
    OOM type (ROCm on old torch, torch 1.x, the CPU allocator, cuBLAS, the driver).

    Example:
        >>> import torch
        >>> try:
        ...     try:
        ...         raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")
        ...     except RuntimeError as e:
        ...         raise ValueError("step failed") from e
        ... except ValueError as outer:
        ...     type(oom_exception(outer)).__name__
        'OutOfMemoryError'
    """
    types = _oom_types()
    chain = list(_chain(exc))
    for e in chain:
        if types and isinstance(e, types):
            return e
    for e in chain:
        if type(e) in (RuntimeError, MemoryError) or type(e).__name__ in (
            "DistBackendError",
            "AcceleratorError",
        ):
            parsed = parse_oom_message(str(e))
            if parsed is not None and parsed.is_oom:
                return e
        elif isinstance(e, MemoryError):
            return e
    return None


def is_oom(exc_or_message: BaseException | str) -> bool:
    """True when an exception (or its cause/context chain), or a text, reports running out of memory.

    Example:
        >>> import torch, torchmem
        >>> torchmem.is_oom("HIP out of memory. Tried to allocate 20.00 MiB")
        True
        >>> torchmem.is_oom(ValueError("CUDA out of memory"))   # a foreign type: not an OOM by type
        False
        >>> torchmem.is_oom(RuntimeError("wrapper").with_traceback(None)) is False
        True
    """
    if isinstance(exc_or_message, str):
        p = parse_oom_message(exc_or_message)
        return p is not None and p.is_oom
    if isinstance(exc_or_message, BaseException):
        return oom_exception(exc_or_message) is not None
    return False


# ---------------------------------------------------------------------------------------------------------
# settings in effect


def parse_alloc_conf(conf: str | None) -> dict[str, str]:
    """``"expandable_segments:True,max_split_size_mb:128" -> {"expandable_segments": "True", ...}``.

    Example:
        >>> parse_alloc_conf("expandable_segments:True, max_split_size_mb:512")
        {'expandable_segments': 'True', 'max_split_size_mb': '512'}
    """
    out: dict[str, str] = {}
    if not conf:
        return out
    for item in conf.split(","):
        if ":" in item:
            k, v = item.split(":", 1)
            out[k.strip().lower()] = v.strip()
        elif item.strip():
            out[item.strip().lower()] = ""
    return out


# ---------------------------------------------------------------------------------------------------------
# diagnosis data


@dataclass(frozen=True)
class Fix:
    """One concrete change, with the exact setting or code where there is one.

    Attributes:
        kind: ``"alloc_conf"``, ``"batch_size"``, ``"dtype"``, ``"checkpointing"``, ``"no_grad"``,
            ``"zero_grad"``, ``"item"``, ``"release"``, ``"processes"``, ``"limit"``, ``"chunk"``,
            ``"empty_cache"``, ``"leak"``.
        text: What to do and why, in a sentence.
        setting: The exact environment variable or code
            (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``).
    """

    kind: str
    text: str
    setting: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "text": self.text, "setting": self.setting}


@dataclass(frozen=True)
class Cause:
    """One cause of the OOM with its evidence.

    Attributes:
        kind: ``"too_large"``, ``"fragmentation"``, ``"other_processes"``, ``"leak"``,
            ``"pinned_by_exception"``, ``"working_set"`` or ``"outside_allocator"``.
        summary: One sentence.
        evidence: The figures behind it, one per line.
        bytes: The bytes this cause accounts for (shortfall, free cache, other processes' use...).
        confidence: ``"high"``, ``"medium"`` or ``"low"``.
        fixes: The fixes this evidence supports.
    """

    kind: str
    summary: str
    evidence: tuple[str, ...]
    bytes: int | None
    confidence: str
    fixes: tuple[Fix, ...] = ()
    score: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "summary": self.summary,
            "evidence": list(self.evidence),
            "bytes": self.bytes,
            "confidence": self.confidence,
            "fixes": [f.to_dict() for f in self.fixes],
        }


CAUSE_KINDS = (
    "too_large",
    "fragmentation",
    "other_processes",
    "leak",
    "pinned_by_exception",
    "working_set",
    "outside_allocator",
)


@dataclass(frozen=True)
class MachineMemory:
    """The host memory a CPU out-of-memory is judged against (the CPU allocator's message gives none).

    Attributes:
        physical: Total RAM of the machine, ``None`` when unknown.
        physical_source: Where ``physical`` was read (``"MemTotal in /proc/meminfo"``).
        cgroup_limit: The container's (cgroup's) memory limit, ``None`` when none is set.
        cgroup_source: The file ``cgroup_limit`` was read from (``.../memory.max``).
        available: Memory available (``MemAvailable``) when it was read.
        read_here: The figures were read on this machine for a pasted message, which may come from another.
    """

    physical: int | None
    physical_source: str | None = None
    cgroup_limit: int | None = None
    cgroup_source: str | None = None
    available: int | None = None
    read_here: bool = False

    @property
    def limited_by_cgroup(self) -> bool:
        """The cgroup limit binds: it is below the RAM (or the RAM is unknown)."""
        if self.cgroup_limit is None:
            return False
        return self.physical is None or self.cgroup_limit < self.physical

    @property
    def total(self) -> int | None:
        """The most this process can have: the cgroup limit where it binds, else the RAM."""
        return self.cgroup_limit if self.limited_by_cgroup else self.physical

    @property
    def what(self) -> str:
        """The ceiling in words."""
        if self.limited_by_cgroup:
            return "the container's memory limit (cgroup)"
        return "the machine's memory (total RAM)"

    def evidence(self) -> list[str]:
        """One line per figure, each with where it was read."""
        out: list[str] = []
        if self.physical is not None:
            where = f", {self.physical_source}" if self.physical_source else ""
            out.append(f"total RAM: {fmt_bytes(self.physical)} ({self.physical} bytes{where})")
        if self.cgroup_limit is not None:
            where = f", {self.cgroup_source}" if self.cgroup_source else ""
            size = f"{fmt_bytes(self.cgroup_limit)} ({self.cgroup_limit} bytes{where})"
            if self.limited_by_cgroup:
                out.append(f"container memory limit: {size}: below the RAM, so it is the ceiling")
            else:
                out.append(f"container memory limit: {size}: not below the RAM, so the RAM is the ceiling")
        else:
            out.append("container memory limit: none set (no cgroup memory limit)")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "physical": self.physical,
            "physical_source": self.physical_source,
            "cgroup_limit": self.cgroup_limit,
            "cgroup_source": self.cgroup_source,
            "available": self.available,
            "read_here": self.read_here,
            "total": self.total,
        }


@dataclass(frozen=True)
class OOMDiagnosis:
    """Why an allocation failed, ranked, with evidence and fixes. ``str()`` explains it in plain words.

    Attributes:
        is_oom: The input was an out-of-memory error.
        parsed: The fields of the message (``None`` when no message was given or found).
        causes: Causes, most likely first.
        fixes: Every cause's fixes, deduplicated, in rank order.
        state: The allocator state the diagnosis used (``None``: the message alone).
        fragmentation: Fragmentation figures from the state, when there was one.
        settings: Allocator settings in effect (parsed ``PYTORCH_CUDA_ALLOC_CONF``).
        notes: What could not be known, and why.
        machine: The host memory a CPU OOM was judged against (``None``: not a CPU OOM, or unknown).
    """

    is_oom: bool
    parsed: ParsedOOM | None
    causes: tuple[Cause, ...]
    fixes: tuple[Fix, ...]
    state: AllocatorState | None = None
    fragmentation: FragmentationReport | None = None
    settings: Mapping[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    machine: MachineMemory | None = None

    @property
    def cause(self) -> Cause | None:
        """The most likely cause."""
        return self.causes[0] if self.causes else None

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(c.kind for c in self.causes)

    def __str__(self) -> str:
        from torchmem.report.oom import render_diagnosis

        return render_diagnosis(self)

    def to_dict(self) -> dict[str, Any]:
        return {
            "is_oom": self.is_oom,
            "parsed": None if self.parsed is None else self.parsed.to_dict(),
            "causes": [c.to_dict() for c in self.causes],
            "fixes": [f.to_dict() for f in self.fixes],
            "fragmentation": None if self.fragmentation is None else self.fragmentation.to_dict(),
            "state": None if self.state is None else _state_summary(self.state),
            "settings": dict(self.settings),
            "notes": list(self.notes),
            "machine": None if self.machine is None else self.machine.to_dict(),
        }


def _state_summary(s: AllocatorState) -> dict[str, Any]:
    return {
        "device": s.device,
        "reserved": s.reserved,
        "allocated": s.allocated,
        "cached_free": s.cached_free,
        "device_total": s.device_total,
        "device_free": s.device_free,
        "limit": s.limit,
        "process_used": s.process_used,
        "others_used": s.others_used,
        "segments": None if s.segments is None else len(s.segments),
        "snapshot_file": s.snapshot_file,
    }


@dataclass(frozen=True)
class LeakCulprit:
    """A leaking site from a watcher (normalised from whatever object or dict it gave)."""

    site: str | None
    holder: str | None
    bytes: int | None
    fix: str | None
    kind: str | None = None


@dataclass(frozen=True)
class LeakTrend:
    """Growth per step from a running watcher: ``bytes_per_step`` and the culprits it named."""

    bytes_per_step: float
    culprits: tuple[LeakCulprit, ...] = ()
    leaking: bool | None = None
    steps: int | None = None


@dataclass(frozen=True)
class PinnedTensor:
    """Device memory held by a finished exception's frames or by notebook output history."""

    where: str
    bytes: int


@dataclass(frozen=True)
class WorkingSetItem:
    """A holder (or category, or allocation site) of the working set at the moment of the OOM.

    ``kind`` is one of torchmem's tensor categories when known: ``"parameter"``, ``"gradient"``,
    ``"optimizer_state"``, ``"activation"`` (saved for backward), ``"other"``.
    """

    label: str
    bytes: int
    kind: str | None = None


def _get(obj: Any, name: str) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


def as_leak_trend(obj: Any) -> LeakTrend | None:
    """Read a leak trend from a watcher's report, a plain object or a dict with ``bytes_per_step`` and
    ``culprits`` (each with ``site``, ``holder``, ``bytes``, ``fix``, ``kind``). ``None`` passes through.

    Example:
        >>> as_leak_trend({"bytes_per_step": 4096, "culprits": [{"site": "train.py:42", "bytes": 4096}]})
        ... # doctest: +ELLIPSIS
        LeakTrend(bytes_per_step=4096.0, culprits=(LeakCulprit(site='train.py:42', ...),), ...)
    """
    if obj is None or isinstance(obj, LeakTrend):
        return obj
    bps = _get(obj, "bytes_per_step")
    if bps is None:
        return None
    culprits = tuple(
        LeakCulprit(
            site=None if _get(c, "site") is None else str(_get(c, "site")),
            holder=None if _get(c, "holder") is None else str(_get(c, "holder")),
            bytes=None if _get(c, "bytes") is None else int(_get(c, "bytes")),
            fix=None if _get(c, "fix") is None else str(_get(c, "fix")),
            kind=None if _get(c, "kind") is None else str(_get(c, "kind")),
        )
        for c in (_get(obj, "culprits") or ())
    )
    leaking = _get(obj, "leaking")
    steps = _get(obj, "steps")
    return LeakTrend(
        float(bps),
        culprits,
        None if leaking is None else bool(leaking),
        None if steps is None else int(steps),
    )


# ---------------------------------------------------------------------------------------------------------
# the classification


@dataclass
class _Figures:
    """What is known about the moment of the OOM, message and state merged (state wins where both)."""

    requested: int | None = None
    total: int | None = None  # device total
    ceiling: int | None = None  # what this process may use: the limit, else the total
    limit: int | None = None
    free: int | None = None
    allocated: int | None = None
    reserved: int | None = None
    cached: int | None = None
    process_used: int | None = None
    others: tuple[tuple[int, int], ...] = ()
    others_known: bool = False
    self_guessed: int | None = None  # a listed pid that is probably this process
    tol: int = 0
    backend: str | None = None
    source: str | None = None
    cap_owner: str | None = None  # torchmem's cap: who set it
    machine: MachineMemory | None = None  # the host's memory, for a CPU allocator OOM


def _merge(
    parsed: ParsedOOM | None, state: AllocatorState | None, machine: MachineMemory | None = None
) -> _Figures:
    f = _Figures()
    if parsed is not None:
        f.requested = parsed.requested
        f.total = parsed.device_total
        f.limit = parsed.allowed
        f.free = parsed.device_free
        f.allocated = parsed.allocated
        f.reserved = parsed.reserved
        f.cached = parsed.reserved_unallocated
        f.process_used = parsed.process_used
        f.others = parsed.other_processes
        f.others_known = parsed.source == "allocator" and parsed.format == "torch2"
        f.tol = sum(parsed.precision.values()) // max(1, len(parsed.precision)) * 2 if parsed.precision else 0
        f.backend = parsed.backend
        f.source = parsed.source
        f.cap_owner = parsed.cap_owner
        if parsed.source == "mps_allocator":
            f.limit = parsed.allowed
            f.total = parsed.allowed
            f.reserved = parsed.allocated
            f.cached = None
            if parsed.allocated is not None and parsed.other_allocations is not None:
                f.process_used = parsed.allocated + parsed.other_allocations
    if state is not None:
        f.requested = state.requested if state.requested is not None else f.requested
        f.total = state.device_total if state.device_total is not None else f.total
        f.limit = state.limit if state.limit is not None else f.limit
        f.free = state.device_free if state.device_free is not None else f.free
        f.allocated = state.allocated if state.allocated is not None else f.allocated
        f.reserved = state.reserved if state.reserved is not None else f.reserved
        f.cached = state.cached_free if state.cached_free is not None else f.cached
        f.process_used = state.process_used if state.process_used is not None else f.process_used
        if state.other_processes is not None:
            f.others = tuple((p.pid, p.used or 0) for p in state.other_processes)
            f.others_known = True
        f.backend = f.backend or state.platform
        f.tol = 0 if parsed is None else f.tol
    if f.cached is None and f.reserved is not None and f.allocated is not None:
        f.cached = max(0, f.reserved - f.allocated)
    if f.source == "cpu_allocator" and f.total is None and machine is not None and machine.total is not None:
        # the CPU allocator's message gives only the request: the host's memory is the device total
        f.total = machine.total
        f.machine = machine
    # a process in the list that is probably this one (containers hide our pid from NVML)
    if f.process_used is None and f.others and f.reserved is not None:
        cands = [(pid, b) for pid, b in f.others if b + f.tol >= f.reserved]
        if len(cands) == 1:
            f.self_guessed = cands[0][0]
            f.process_used = cands[0][1]
            f.others = tuple(p for p in f.others if p[0] != cands[0][0])
    f.ceiling = f.limit if f.limit is not None else f.total
    return f


_CONF_RANK = {"high": 3.0, "medium": 2.0, "low": 1.0}


def _mib(n: int) -> int:
    return max(1, n >> 20)


def diagnose(
    parsed: ParsedOOM | None,
    state: AllocatorState | None = None,
    *,
    alloc_conf: str | None = None,
    leak: Any = None,
    pinned: Sequence[PinnedTensor] = (),
    working_set: Sequence[WorkingSetItem] = (),
    batch_size: int | None = None,
    grad_enabled: bool | None = None,
    notes: Sequence[str] = (),
    machine: MachineMemory | None = None,
) -> OOMDiagnosis:
    """Classify an OOM from its parsed message and whatever else is known. Pure: no device is read.

    Args:
        parsed: The parsed message (:func:`parse_oom_message`), or ``None`` when only a state is known.
        state: The allocator state at (or near) the OOM; its figures win over the message's rounded ones.
        alloc_conf: ``PYTORCH_CUDA_ALLOC_CONF`` (or the HIP one) in effect; fixes already in effect are never
            suggested. ``None``: the state's, else none.
        leak: A leak trend: a watcher report, object or dict with ``bytes_per_step`` and ``culprits``.
        pinned: Device memory held by finished exceptions' frames or notebook output history.
        working_set: The biggest holders, categories or allocation sites at the OOM.
        batch_size: The batch size of the failing step, to suggest a smaller one.
        grad_enabled: Whether autograd was recording (``False``: no ``no_grad`` fix is suggested).
        notes: Notes to carry into the diagnosis (what capture could not read).
        machine: The host's memory (total RAM, container limit), for an OOM of the CPU allocator, whose
            message gives only the request: a request larger than it is ``too_large``.

    Example:
        >>> p = parse_oom_message(
        ...     "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of "
        ...     "which 1.20 GiB is free. Including non-PyTorch memory, this process has 77.98 GiB memory in "
        ...     "use. Of the allocated memory 60.00 GiB is allocated by PyTorch, and 17.00 GiB is reserved "
        ...     "by PyTorch but unallocated.")
        >>> diagnose(p).causes[0].kind
        'fragmentation'
    """
    out_notes = list(notes)
    if parsed is not None:
        out_notes.extend(parsed.notes)
    if parsed is not None and not parsed.is_oom:
        return OOMDiagnosis(False, parsed, (), (), state, None, {}, tuple(out_notes))
    if parsed is None and state is None:
        out_notes.append("No out-of-memory message and no allocator state: nothing to diagnose.")
        return OOMDiagnosis(False, None, (), (), None, None, {}, tuple(out_notes))
    conf_text = alloc_conf if alloc_conf is not None else (state.alloc_conf if state is not None else None)
    settings = parse_alloc_conf(conf_text)
    f = _merge(parsed, state, machine)
    frag: FragmentationReport | None = None
    if state is not None and state.segments is not None:
        frag = analyze_fragmentation(state.segments, f.requested, f.free)
    if parsed is not None and parsed.truncated:
        out_notes.append("The message is cut short: causes that need the missing figures are not judged.")
    leak_trend = as_leak_trend(leak)
    if (
        f.source == "allocator"
        and f.requested is not None
        and f.free is not None
        and f.free > f.requested + f.tol
    ):
        out_notes.append(
            f"The device reported {fmt_bytes(f.free)} free, more than the {fmt_bytes(f.requested)} "
            "requested, yet the driver refused it: on Windows (WDDM) and with unified memory the driver "
            "can refuse earlier, and a per-allocation size limit or another process allocating at the same "
            "moment has the same effect."
        )

    causes: list[Cause] = []
    if f.source in ("driver", "cublas", "cudnn", "nccl"):
        causes.append(_outside_allocator(parsed, f, settings))
    else:
        big = _too_large(f, settings, batch_size)
        if big is not None:
            # The request can never fit, even with every tensor freed: nothing that frees memory (the working
            # set, a leak, pinned memory, fragmentation, other processes) is a cause or a fix.
            causes.append(big)
        else:
            for c in (
                _fragmentation(f, frag, settings, parsed),
                _other_processes(f),
                _working_set(f, working_set, settings, batch_size, grad_enabled, frag),
            ):
                if c is not None:
                    causes.append(c)
    if not any(c.kind == "too_large" for c in causes):
        lc = _leak(leak_trend)
        if lc is not None:
            causes.append(lc)
        pc = _pinned(pinned, f)
        if pc is not None:
            causes.append(pc)
    if f.source == "cpu_allocator" and f.total is None:
        out_notes.append(
            "The CPU allocator's message gives only the request size, and the machine's memory is not known."
        )
    if f.machine is not None and f.machine.read_here:
        out_notes.append(
            "The CPU allocator's message gives only the request size: the machine's memory was read on "
            "this machine. If the message comes from another machine, judge it against that one's RAM."
        )
    causes.sort(key=lambda c: -c.score)
    # a cause that explains everything makes weaker ones secondary; keep them (ranked) but drop duplicates
    fixes: list[Fix] = []
    seen: set[tuple[str, str | None]] = set()
    for c in causes:
        for fx in c.fixes:
            key = (fx.kind, fx.setting or fx.text)
            if fx.kind == "batch_size" and fx.setting is None and any(x.kind == "batch_size" for x in fixes):
                continue  # one "use a smaller batch" is enough
            if key not in seen:
                seen.add(key)
                fixes.append(fx)
    return OOMDiagnosis(
        is_oom=True,
        parsed=parsed,
        causes=tuple(causes),
        fixes=tuple(fixes),
        state=state,
        fragmentation=frag,
        settings=settings,
        notes=tuple(dict.fromkeys(out_notes)),
        machine=f.machine,
    )


def _env_name(backend: str | None) -> str:
    return "PYTORCH_HIP_ALLOC_CONF" if backend == "rocm" else "PYTORCH_CUDA_ALLOC_CONF"


def _conf_fix(f: _Figures, settings: Mapping[str, str], key: str, value: str, text: str) -> Fix | None:
    """An allocator-setting fix, or ``None`` when that setting is already in effect or does not apply."""
    if f.backend not in ("cuda", "rocm", None) or f.source == "cuda_malloc_async":
        return None
    if settings.get("backend", "native").lower() == "cudamallocasync":
        return None
    if key in settings:
        current = settings[key].lower()
        if key == "expandable_segments" and current in ("true", "1"):
            return None
        if key != "expandable_segments":
            return None
    merged = dict(settings)
    merged[key] = value
    conf = ",".join(f"{k}:{v}" for k, v in merged.items())
    return Fix("alloc_conf", text, f"{_env_name(f.backend)}={conf}")


def _batch_fix(batch_size: int | None, fraction: float | None, why: str) -> Fix:
    if batch_size is not None and fraction is not None and 0 < fraction < 1:
        new = max(1, math.floor(batch_size * fraction))
        if new < batch_size:
            return Fix(
                "batch_size",
                f"Use a smaller batch: about {new} instead of {batch_size} ({why}).",
                f"batch_size={new}",
            )
    return Fix("batch_size", f"Use a smaller batch (or micro-batches with gradient accumulation) ({why}).")


def _too_large(f: _Figures, settings: Mapping[str, str], batch_size: int | None) -> Cause | None:
    r, ceiling = f.requested, f.ceiling
    if r is None or ceiling is None:
        return None
    non_torch = None
    if f.process_used is not None and f.reserved is not None:
        non_torch = max(0, f.process_used - f.reserved)
    most = ceiling - (non_torch or 0)
    if r <= most + f.tol:
        return None
    ev = [f"requested: {fmt_bytes(r)}"]
    limit_set = f.source == "torchmem_cap" or (
        f.limit is not None and f.total is not None and f.limit < f.total
    )
    if r > ceiling and f.machine is not None:
        what = f.machine.what
        summary = f"The single request of {fmt_bytes(r)} is larger than {what}, {fmt_bytes(ceiling)}."
        ev.extend(f.machine.evidence())
    elif r > ceiling:
        what = (
            f"the cap set by {f.cap_owner or 'torchmem'}"
            if f.source == "torchmem_cap"
            else ("the per-process limit" if limit_set else "the whole device")
        )
        summary = f"The single request of {fmt_bytes(r)} is larger than {what} ({fmt_bytes(ceiling)})."
        ev.append(f"{what}: {fmt_bytes(ceiling)}")
    else:
        summary = (
            f"The single request of {fmt_bytes(r)} is more than PyTorch can ever get on this device "
            f"({fmt_bytes(most)}: {fmt_bytes(ceiling)} less {fmt_bytes(non_torch)} outside PyTorch's "
            "allocator)."
        )
        ev.append(f"device total{' (limit)' if limit_set else ''}: {fmt_bytes(ceiling)}")
        ev.append(
            f"this process outside PyTorch's allocator (CUDA context, libraries): {fmt_bytes(non_torch)}"
        )
    ev.append(f"short by {fmt_bytes(r - most)} even if every tensor were freed")
    fixes = [
        _batch_fix(batch_size, most * 0.9 / r, "the request scales with the batch if it is an activation"),
        Fix(
            "chunk",
            "Split the operation that needs it into chunks (e.g. loop over the batch or sequence; "
            "chunked attention/loss), or shard it across devices.",
        ),
        _amp(f.backend),
    ]
    if limit_set:
        fixes.insert(0, _limit_fix(f))
    m = f.machine
    if m is not None and m.limited_by_cgroup and (m.physical is None or r <= m.physical):
        fixes.insert(
            0,
            Fix(
                "limit",
                "The request would fit in the machine's RAM but not under the container's memory limit: "
                "raise the limit (docker run --memory, Kubernetes resources.limits.memory) if the machine "
                "can spare it.",
            ),
        )
    return Cause("too_large", summary, tuple(ev), r - most, "high", tuple(fixes), score=10.0)


def _limit_fix(f: _Figures) -> Fix:
    """Raise the cap the process runs under: torchmem's own, or the CUDA memory fraction."""
    if f.source == "torchmem_cap":
        owner = f.cap_owner or "torchmem.limit()"
        dev = f.backend or "cpu"
        if owner.startswith("torchmem.budget"):
            return Fix("limit", f"The cap is a hard budget ({owner}): raise it if the block may use more.")
        return Fix(
            "limit",
            f"The cap was set by {owner}: raise it, or lift it if this process may use more.",
            f"torchmem.limit(None, {dev!r})",
        )
    return Fix(
        "limit",
        "A per-process limit is set below the device total; raise it if this process may use more.",
        "torch.cuda.set_per_process_memory_fraction(1.0)",
    )


def _max_split_mb(request: int) -> int | None:
    mib = request >> 20
    if mib < 32:
        return None
    n = 1 << (mib.bit_length() - 1)  # largest power of two MiB <= the request
    return max(32, n)


def _fragmentation(
    f: _Figures, frag: FragmentationReport | None, settings: Mapping[str, str], parsed: ParsedOOM | None
) -> Cause | None:
    r = f.requested
    cached = frag.cached_free if frag is not None else f.cached
    if r is None or cached is None or cached <= 0:
        return None
    rr = round_request(r)
    ev: list[str] = []
    if frag is not None:
        if frag.fits_now:
            return None
        largest = frag.largest_free_in_pool or 0
        enough = cached >= rr
        ev.append(
            f"free in PyTorch's cache: {fmt_bytes(cached)} in all, but the largest free block "
            f"of the {frag.pool} pool is {fmt_bytes(largest)} < {fmt_bytes(rr)} requested"
        )
        for p in frag.pools:
            if p.free:
                ev.append(
                    f"  {p.pool} pool, stream {p.stream}{' (private pool)' if p.private else ''}: "
                    f"{p.segments} segment(s), {fmt_bytes(p.free)} free, largest free block "
                    f"{fmt_bytes(p.largest_free)}"
                )
        ev.append(f"external waste (free pieces of partly used segments): {fmt_bytes(frag.external_waste)}")
        if frag.internal_waste is not None:
            ev.append(f"internal waste (rounding inside allocated blocks): {fmt_bytes(frag.internal_waste)}")
        if frag.pending_free:
            ev.append(f"freed but awaiting another stream: {fmt_bytes(frag.pending_free)}")
        if frag.fits_after_empty_cache is not None:
            ev.append(
                "after empty_cache(): "
                + ("it would fit" if frag.fits_after_empty_cache else "it would still not fit")
                + f" (device free {fmt_bytes(f.free)} + whole free segments {fmt_bytes(frag.whole_free)})"
            )
        if frag.fits_with_expandable is not None and not frag.expandable_in_use:
            ev.append(
                "with expandable_segments: "
                + ("it would fit" if frag.fits_with_expandable else "it would not fit either")
                + f" (device free {fmt_bytes(f.free)} + the cache's free pages)"
            )
        if enough:
            conf, score = "high", 8.0
            summary = (
                f"Fragmentation: the cache holds {fmt_bytes(cached)} free, enough for the "
                f"{fmt_bytes(r)} request, but no free block is large enough."
            )
        elif frag.fits_with_expandable:
            conf, score = "medium", 5.0
            summary = (
                f"Fragmentation: device free memory plus the cache's {fmt_bytes(cached)} of free pieces "
                f"would cover the {fmt_bytes(r)} request if they were contiguous."
            )
        else:
            return None
        fits_exp = frag.fits_with_expandable
    else:
        free = f.free
        if cached + f.tol >= r and r <= (2 << 20):
            conf, score = "medium", 4.0
            summary = (
                f"Possibly fragmentation: {fmt_bytes(cached)} is cached free, more than the {fmt_bytes(r)} "
                "requested, but small requests are served only from the small-block pool and the free "
                "pieces may all be in the large one."
            )
        elif cached + f.tol >= r:
            conf, score = "high", 8.0
            summary = (
                f"Fragmentation: {fmt_bytes(cached)} is reserved by PyTorch but unallocated — more than the "
                f"{fmt_bytes(r)} requested — yet no cached block was large enough."
            )
        elif free is not None and cached + free + f.tol >= r and cached >= r // 4:
            conf, score = "medium", 4.0
            summary = (
                f"Fragmentation: {fmt_bytes(cached)} reserved but unallocated plus {fmt_bytes(free)} free on "
                f"the device would cover the {fmt_bytes(r)} request, had they been one block."
            )
        else:
            return None
        ev.append(f"requested: {fmt_bytes(r)}")
        ev.append(f"reserved by PyTorch but unallocated (cached free pieces): {fmt_bytes(cached)}")
        if free is not None:
            ev.append(f"free on the device: {fmt_bytes(free)}")
        ev.append(
            "PyTorch already returned every entirely free segment to the driver before raising, so what "
            "remains cached are pieces of segments that still hold tensors: empty_cache() cannot help."
        )
        fits_exp = None if free is None else free + cached >= rr
    fixes: list[Fix] = []
    exp = _conf_fix(
        f,
        settings,
        "expandable_segments",
        "True",
        "Let segments grow and map freed pages again instead of splitting fixed segments "
        "(the cache's free pieces become usable for large requests).",
    )
    if exp is not None and (fits_exp is None or fits_exp):
        fixes.append(exp)
    n = _max_split_mb(r)
    if n is not None:
        ms = _conf_fix(
            f,
            settings,
            "max_split_size_mb",
            str(n),
            f"Stop the allocator from splitting blocks of {n} MiB or more, so blocks that large stay whole "
            f"for requests like this {fmt_bytes(r)} one (an alternative to expandable_segments, which "
            "ignores it: use one or the other).",
        )
        if ms is not None:
            fixes.append(ms)
    if f.limit is not None and (f.total is None or f.limit < f.total):
        gc = _conf_fix(
            f,
            settings,
            "garbage_collection_threshold",
            "0.8",
            "With a memory fraction set, reclaim unused cached blocks once usage passes 80 % of the limit, "
            "before the allocator gives up.",
        )
        if gc is not None:
            fixes.append(gc)
    if frag is not None and frag.fits_after_empty_cache and frag.whole_free:
        fixes.append(
            Fix(
                "empty_cache",
                "Whole free segments are cached: return them to the driver before the big allocation.",
                "torch.cuda.empty_cache()",
            )
        )
    if parsed is not None and parsed.private_pools:
        ev.append(f"allocated in private pools (CUDA graphs): {fmt_bytes(parsed.private_pools)}")
    return Cause("fragmentation", summary, tuple(ev), cached, conf, tuple(fixes), score=score)


def _used_outside(f: _Figures) -> tuple[int, str] | None:
    """Device memory in use that is neither PyTorch's cache nor (when known) this process's own overhead:
    ``(bytes, who)``, or ``None`` when the figures are missing."""
    if f.total is None or f.free is None or f.reserved is None:
        return None
    used = f.total - f.free
    if f.process_used is not None:
        out = used - f.process_used
        return (out, "other processes") if out > 0 else None
    out = used - f.reserved
    return (out, "other processes, or this process's CUDA context and libraries") if out > 0 else None


def _other_processes(f: _Figures) -> Cause | None:
    r, free = f.requested, f.free
    listed = sum(b for _, b in f.others)
    outside = _used_outside(f)
    ev = [f"process {pid}: {fmt_bytes(b)}" for pid, b in sorted(f.others, key=lambda p: -p[1])]
    if f.self_guessed is not None:
        ev.append(f"(process {f.self_guessed}, with {fmt_bytes(f.process_used)}, is taken to be this one)")
    others = listed
    who = "Other processes"
    if outside is not None and outside[0] > listed + max(f.tol, 64 << 20):
        others = outside[0]
        allowance = 0 if f.process_used is not None else _CONTEXT_ALLOWANCE
        others = max(0, others - allowance)
        ev.append(
            f"used on the device outside this PyTorch: {fmt_bytes(outside[0])} ({outside[1]}"
            + (f"; {fmt_bytes(allowance)} of it allowed for this process's CUDA context" if allowance else "")
            + ")"
        )
        if listed == 0:
            who = "Memory outside this PyTorch (" + outside[1] + ")"
    if others <= 0:
        return None
    if r is not None and free is not None:
        if free + f.tol >= r:
            return None
        short = r - free
        if others + f.tol >= short:
            big = others >= (f.ceiling or others) * 0.1
            conf, score = ("high", 7.0) if big and listed else (("medium", 4.5) if big else ("low", 2.5))
            summary = (
                f"{who} use {fmt_bytes(others)} of this device; without them the {fmt_bytes(r)} "
                f"request would have found room (only {fmt_bytes(free)} was free)."
            )
        else:
            conf, score = "low", 2.0
            summary = f"{who} use {fmt_bytes(others)} of this device, less than the shortfall."
    else:
        conf, score = "low", 1.5
        summary = f"{who} use {fmt_bytes(others)} of this device."
    fixes = (
        Fix(
            "processes",
            "Stop or move the other processes on this GPU (nvidia-smi lists them), or run on a free GPU.",
            "CUDA_VISIBLE_DEVICES=<free gpu index>",
        ),
    )
    return Cause("other_processes", summary, tuple(ev), others, conf, fixes, score=score)


#: What a CUDA context and library handles typically take (H100, torch 2.11: ~0.5 GiB; smaller GPUs less).
_CONTEXT_ALLOWANCE = 1 << 30


_CHECKPOINT = Fix(
    "checkpointing",
    "If training: recompute activations in backward instead of keeping them (activation checkpointing).",
    "torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)",
)


def _amp(backend: str | None) -> Fix:
    dev = {"mps": "mps", "xpu": "xpu", "cpu": "cpu"}.get(backend or "", "cuda")
    return Fix(
        "dtype",
        "Run in bf16 (autocast) to halve activation memory, or keep weights in bf16.",
        f"with torch.autocast({dev!r}, dtype=torch.bfloat16): ...",
    )


_NO_GRAD = Fix(
    "no_grad",
    "If this is evaluation or inference: run it without autograd so no activations are kept.",
    "with torch.inference_mode(): ...",
)
_ZERO_GRAD = Fix(
    "zero_grad",
    "Free gradients between steps instead of zero-filling them.",
    "optimizer.zero_grad(set_to_none=True)",
)
_ITEM = Fix(
    "item",
    "Log losses and metrics as Python numbers, not tensors (a kept loss tensor keeps its graph).",
    "running_loss += loss.item()",
)


def _working_set(
    f: _Figures,
    items: Sequence[WorkingSetItem],
    settings: Mapping[str, str],
    batch_size: int | None,
    grad_enabled: bool | None,
    frag: FragmentationReport | None,
) -> Cause | None:
    r, alloc, ceiling = f.requested, f.allocated, f.ceiling
    if alloc is None and not items:
        if r is None:
            return None
        # CPU / bare messages: only the request is known
        ev0 = [f"requested: {fmt_bytes(r)}"]
        if f.machine is not None:
            ev0.extend(f.machine.evidence())
        return Cause(
            "working_set",
            f"The allocation of {fmt_bytes(r)} did not fit in what was left; the message gives no breakdown.",
            tuple(ev0),
            r,
            "low",
            (_batch_fix(batch_size, None, "the usual lever"), _amp(f.backend), _NO_GRAD),
            score=1.0,
        )
    total_items = sum(i.bytes for i in items)
    alloc = alloc if alloc is not None else total_items
    ev = [f"allocated to tensors by PyTorch: {fmt_bytes(alloc)}"]
    share = None
    room: int | None = None
    own_room: int | None = None
    if ceiling:
        share = alloc / ceiling
        ev[0] += f" ({share:.0%} of the {fmt_bytes(ceiling)} {'limit' if f.limit else 'device'})"
        non_torch = max(0, (f.process_used or 0) - (f.reserved or 0))
        outside = _used_outside(f)
        others = max(sum(b for _, b in f.others), 0 if outside is None else outside[0])
        room = ceiling - non_torch - others
        own_room = ceiling - non_torch
    if r is not None:
        ev.append(f"requested on top: {fmt_bytes(r)}")
    if f.process_used is not None and f.reserved is not None and f.process_used > f.reserved:
        what = (
            "other allocations outside PyTorch's MPS heaps"
            if f.source == "mps_allocator"
            else "this process outside PyTorch's allocator (CUDA context, libraries)"
        )
        ev.append(f"{what}: {fmt_bytes(f.process_used - f.reserved)}")
    need = alloc + (r or 0)
    if room is not None and r is not None:
        ev.append(
            f"tensors + request = {fmt_bytes(need)}; room for PyTorch with the device to itself: "
            f"{fmt_bytes(own_room)}, with the other users as they were: {fmt_bytes(room)}"
        )
    by_kind: dict[str, int] = {}
    for it in sorted(items, key=lambda i: -i.bytes)[:10]:
        ev.append(f"  {it.label}: {fmt_bytes(it.bytes)}" + (f" ({it.kind})" if it.kind else ""))
    for it in items:
        if it.kind:
            by_kind[it.kind] = by_kind.get(it.kind, 0) + it.bytes
    if own_room is not None and r is not None and need + f.tol >= own_room:
        conf, score = "high", 9.0
    elif share is None:
        conf, score = "low", 2.0
    elif share >= 0.9:
        conf, score = "high", 6.0 + share
    elif share >= 0.6:
        conf, score = "medium", 3.0 + share
    else:
        conf, score = "low", 1.0 + share
    summary = (
        f"The working set is too large: tensors hold {fmt_bytes(alloc)}"
        + (f" of {fmt_bytes(ceiling)}" if ceiling else "")
        + (f", and the step asked for {fmt_bytes(r)} more." if r is not None else ".")
    )
    if conf == "low":
        summary = f"Tensors hold {fmt_bytes(alloc)}" + (f" of {fmt_bytes(ceiling)}" if ceiling else "") + "."
    fixes: list[Fix] = []
    fraction: float | None = None
    if room is not None and r is not None:
        fixed = sum(by_kind.get(k, 0) for k in ("parameter", "gradient", "optimizer_state"))
        variable = alloc - fixed + r
        if variable > 0 and room - fixed > 0:
            fraction = (room - fixed) * 0.9 / variable
    why = (
        "assuming activations scale with the batch; parameters, gradients and optimizer state do not"
        if by_kind
        else "assuming all allocated memory scales with the batch, an upper bound"
    )
    fixes.append(_batch_fix(batch_size, fraction, why))
    act = by_kind.get("activation")
    if not by_kind or act:
        fixes.append(_amp(f.backend))
        if grad_enabled is not False:
            fixes.append(_CHECKPOINT)
    if grad_enabled is not False:
        fixes.append(_NO_GRAD)
    if not by_kind or by_kind.get("gradient"):
        fixes.append(_ZERO_GRAD)
    if by_kind.get("optimizer_state") and by_kind["optimizer_state"] >= alloc * 0.3:
        fixes.append(
            Fix(
                "dtype",
                "Optimizer state is a large share: use an 8-bit or factored optimizer, "
                "or shard it (ZeRO/FSDP).",
            )
        )
    fixes.append(_ITEM)
    if f.source == "torchmem_cap":
        fixes.append(_limit_fix(f))
    return Cause("working_set", summary, tuple(ev), alloc, conf, tuple(fixes), score=score)


def _leak(trend: LeakTrend | None) -> Cause | None:
    if trend is None or trend.bytes_per_step <= 0 or trend.leaking is False:
        return None
    bps = int(trend.bytes_per_step)
    ev = [
        f"memory grows by {fmt_bytes(bps)} per step" + (f" over {trend.steps} steps" if trend.steps else "")
    ]
    fixes: list[Fix] = []
    for c in trend.culprits[:10]:
        where = " ".join(x for x in (c.site, f"held by {c.holder}" if c.holder else None) if x)
        ev.append(f"  {where or 'unknown site'}: {fmt_bytes(c.bytes)}" + (f" ({c.kind})" if c.kind else ""))
        if c.fix:
            fixes.append(Fix("leak", f"{where}: {c.fix}" if where else c.fix))
    if not fixes:
        fixes.append(_ITEM)
        fixes.append(
            Fix(
                "leak",
                "Do not keep tensors that carry a graph across steps; store .detach() or .item() values.",
            )
        )
    conf = "high" if trend.leaking else "medium"
    return Cause(
        "leak",
        f"Memory leaks {fmt_bytes(bps)} per step: the OOM is where the growth ran out of room.",
        tuple(ev),
        bps,
        conf,
        tuple(fixes),
        score=7.5 if trend.leaking else 5.0,
    )


def _pinned(pinned: Sequence[PinnedTensor], f: _Figures) -> Cause | None:
    held = sum(p.bytes for p in pinned)
    if held <= 0:
        return None
    ev = [f"{p.where}: {fmt_bytes(p.bytes)}" for p in sorted(pinned, key=lambda p: -p.bytes)[:10]]
    big = f.requested is not None and held >= f.requested
    summary = (
        f"{fmt_bytes(held)} of device memory is still held by a finished exception's frames or notebook "
        f"output history" + (" — enough to fit the request." if big else ".")
    )
    fixes = (
        Fix(
            "release",
            "Free what the old traceback / notebook outputs hold "
            "(torchmem clears the frames and empties the cache).",
            "torchmem.release()",
        ),
        Fix("release", "Or drop the references by hand.", "sys.last_traceback = None; %reset -f out"),
    )
    return Cause(
        "pinned_by_exception",
        summary,
        tuple(ev),
        held,
        "high" if big else "medium",
        fixes,
        score=9.5 if big else 4.5,
    )


def _outside_allocator(parsed: ParsedOOM | None, f: _Figures, settings: Mapping[str, str]) -> Cause:
    src = f.source or "driver"
    what = {
        "driver": "a CUDA call outside PyTorch's caching allocator (the driver or a kernel launch)",
        "cublas": "cuBLAS (its handle or workspace)",
        "cudnn": "cuDNN (its workspace)",
        "nccl": "NCCL (its communication buffers)",
    }.get(src, src)
    code = parsed.error_code if parsed is not None else None
    ev = [f"error: {code}" if code else f"source: {src}"]
    ev.append(
        "PyTorch's allocator did not fail: device memory ran out for memory it does not manage, usually "
        "because PyTorch's cache or other processes already hold the device."
    )
    fixes = [
        Fix(
            "empty_cache",
            "Return PyTorch's cached free blocks to the driver before the library needs memory "
            "(e.g. before creating the NCCL communicator or the first matmul).",
            "torch.cuda.empty_cache()",
        ),
        _batch_fix(None, None, "less of the device held by tensors leaves room for library buffers"),
    ]
    if src == "nccl":
        fixes.append(Fix("processes", "Reduce NCCL's buffers if the job allows it.", "NCCL_BUFFSIZE=2097152"))
    if src == "driver":
        fixes.append(
            Fix(
                "processes",
                "Run with synchronous launches to find the call that really failed.",
                "CUDA_LAUNCH_BLOCKING=1",
            )
        )
    return Cause(
        "outside_allocator",
        f"Memory ran out in {what}, not in PyTorch's allocator.",
        tuple(ev),
        None,
        "high",
        tuple(fixes),
        score=6.0,
    )


__all__ = [
    "CAUSE_KINDS",
    "Cause",
    "Fix",
    "LeakCulprit",
    "LeakTrend",
    "MachineMemory",
    "OOMDiagnosis",
    "ParsedOOM",
    "PinnedTensor",
    "WorkingSetItem",
    "as_leak_trend",
    "diagnose",
    "find_oom_message",
    "is_oom",
    "oom_exception",
    "parse_alloc_conf",
    "parse_oom_message",
    "parse_size",
]
