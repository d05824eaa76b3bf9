"""OOM messages as data: find the last one in a log, and read every field it states — table-driven.

Three tables say everything the parser knows about the messages of torch 1.x–2.x (CUDA and ROCm caching
allocator, ``cudaMallocAsync``, MPS, XPU, the CPU allocator, torchmem's own cap) and about the memory errors
raised outside the allocator (the driver's ``CUDA error: out of memory``, cuBLAS/cuDNN ``*_ALLOC_FAILED``,
NCCL):

* :data:`SOURCES` — one :class:`SourceRule` per kind of message: the marker that spots it in a log, the
  pattern that tells it (the first row that matches names the source, the layout and the error code), and
  the phrases only it has, whose named groups are the fields it yields;
* :data:`FIELDS` — the phrases several kinds share (torch's sentences), each a :class:`FieldRule` whose
  named groups are :class:`~torchmem.results.oom.ParsedOOM` fields (``{requested}`` in a written pattern is
  a size as torch prints it, read into ``requested``); for every field the first phrase that states it wins;
* :data:`BACKENDS` — the device kind, from the first pattern that matches.

So a new message format is one row in :data:`SOURCES`: its marker, its pattern and its phrases (plus a row
in :data:`BACKENDS` if it is a new device kind). What a layout implies (reserved = allocated + cached free, a
message cut short) is derived afterwards. Sizes are binary as torch prints them ("GB" is GiB), through
:mod:`torchmem._units`.

Cost: one whitespace-collapsing pass and a few dozen searches with precompiled regular expressions per
message; no device is touched and nothing is imported but the base helpers and the result types.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from torchmem._units import NUMBER_AND_UNIT, parse_size, unit_bytes
from torchmem.results.oom import ParsedOOM

_SIZE_PARTS = re.compile(NUMBER_AND_UNIT, re.IGNORECASE)


def _re(pattern: str, *, case_sensitive: bool = False) -> re.Pattern[str]:
    """Compile a table pattern: ``{name}`` becomes a named group holding a size (``"2.00 GiB"``)."""
    expanded = re.sub(r"\{(\w+)\}", lambda m: f"(?P<{m.group(1)}>{NUMBER_AND_UNIT})", pattern)
    return re.compile(expanded, 0 if case_sensitive else re.IGNORECASE)


# ---------------------------------------------------------------------------------------------------------
# the rows


@dataclass(frozen=True)
class FieldRule:
    """A phrase of a message that states fields.

    Each named group of ``pattern`` is read into the :class:`~torchmem.results.oom.ParsedOOM` field of its
    name — a size, unless :data:`READERS` reads the group otherwise — and ``constants`` (``(field, value)``
    pairs) are set when the phrase is present. ``not_for``: sources whose messages this phrase must not be
    read from (their own rows say it).
    """

    pattern: re.Pattern[str]
    constants: tuple[tuple[str, str], ...] = ()
    not_for: frozenset[str] = frozenset()


#: Groups that are not sizes: group name -> (field filled, how the text is read).
READERS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "device_index": ("device_index", int),
    "cap_device": ("device_index", lambda text: int(text.rsplit(":", 1)[1]) if ":" in text else None),
    "cap_owner": ("cap_owner", str),
    "errno": ("error_code", lambda text: f"errno {text}"),
    "pool": ("pool", str.lower),
    "suggested_setting": ("suggested_setting", lambda text: text.rstrip(".")),
}


#: ``SourceRule.code``: the error code is the text the pattern matched.
MATCHED = "<matched>"


@dataclass(frozen=True)
class SourceRule:
    """One kind of memory-error message: how to spot it in a log, how to tell it, what it states.

    The rule applies when ``pattern`` matches the (whitespace-collapsed) message, ``also`` matches too,
    ``unless`` does not, and the message's backend is ``backend`` (when given). The message is then of
    ``source``, laid out as ``format`` (``None``: told apart later by its wording, :data:`LAYOUTS`), with
    error code ``code`` (:data:`MATCHED`: the matched text). ``marker`` finds such a message in a log
    (case-sensitive; ``None``: an earlier row's marker finds it). ``fields``: the phrases only this kind of
    message has, read before the shared :data:`FIELDS`.
    """

    pattern: re.Pattern[str]
    source: str
    format: str | None
    code: str | None = None
    also: re.Pattern[str] | None = None
    unless: re.Pattern[str] | None = None
    backend: str | None = None
    marker: re.Pattern[str] | None = None
    fields: tuple[FieldRule, ...] = ()

    def match(self, flat: str, backend: str | None) -> re.Match[str] | None:
        m = self.pattern.search(flat)
        if m is None or (self.backend is not None and backend != self.backend):
            return None
        if self.also is not None and self.also.search(flat) is None:
            return None
        if self.unless is not None and self.unless.search(flat) is not None:
            return None
        return m


def _marker(pattern: str) -> re.Pattern[str]:
    return _re(pattern, case_sensitive=True)


#: The message of torchmem's own cap (``torchmem.limit()``, ``torchmem.budget(hard=True)``; the ledger).
CAP_MESSAGE = _re(
    r"\b\w+(?::\d+)? out of memory\. Tried to allocate (?P<requested>\S+ ?\S*)\. "
    r"Device (?P<cap_device>\S+) has a limit of (?P<allowed>\S+ ?\S*) set by (?P<cap_owner>.+?), of which "
    r"(?P<device_free>\S+ ?\S*) is free\.(?: Of the allocated memory (?P<allocated>\S+ ?\S*) is allocated "
    r"by tensors torchmem tracks)?",
    case_sensitive=True,
)

_DEVICE_OOM = _re(r"(?:CUDA|HIP|XPU) out of memory")

#: Every kind of memory-error message, first match wins. A message no row matches is not a memory error.
SOURCES: tuple[SourceRule, ...] = (
    SourceRule(
        CAP_MESSAGE,
        "torchmem_cap",
        "torchmem",
        marker=_marker(
            r"\b\w+(?::\d+)? out of memory\. Tried to allocate \S+ ?\S*\. Device \S+ has a limit of"
        ),
        fields=(FieldRule(CAP_MESSAGE),),  # request, cap, what it left, the ledger's tensors, the device
    ),
    # "CUDA error: out of memory" glued to text that also says "CUDA out of memory" without its sentence
    SourceRule(
        _DEVICE_OOM,
        "driver",
        "library",
        "cudaErrorMemoryAllocation",
        also=_re(r"(?:CUDA|HIP) error: out of memory"),
        unless=_re(r"(?:CUDA|HIP|XPU) out of memory\."),
        marker=_marker(r"(?:CUDA|HIP|XPU) out of memory"),
    ),
    SourceRule(_DEVICE_OOM, "xpu_allocator", None, backend="xpu"),
    SourceRule(_DEVICE_OOM, "allocator", None),
    SourceRule(
        _re(r"would exceed allowed memory|Allocation on device \d+ would exceed"),
        "cuda_malloc_async",
        "cuda_malloc_async",
        marker=_marker(r"would exceed allowed memory"),
    ),
    SourceRule(
        _re(r"MPS backend out of memory"),
        "mps_allocator",
        "mps",
        marker=_marker(r"MPS backend out of memory"),
    ),
    SourceRule(
        _re(r"DefaultCPUAllocator: (?:not enough memory|can't allocate memory)"),
        "cpu_allocator",
        "cpu",
        marker=_marker(r"DefaultCPUAllocator: (?:not enough memory|can't allocate memory)"),
        fields=(
            FieldRule(_re(r"you tried to allocate {requested}")),  # N bytes
            FieldRule(_re(r"Error code (?P<errno>\d+)")),
        ),
    ),
    SourceRule(
        _re(r"CUBLAS_STATUS_ALLOC_FAILED|HIPBLAS_STATUS_ALLOC_FAILED|rocblas_status_memory_error"),
        "cublas",
        "library",
        MATCHED,
        marker=_marker(r"CUBLAS_STATUS_ALLOC_FAILED|HIPBLAS_STATUS_ALLOC_FAILED|rocblas_status_memory_error"),
    ),
    SourceRule(
        _re(r"CUSOLVER_STATUS_ALLOC_FAILED|CUFFT_ALLOC_FAILED"),
        "cublas",
        "library",
        MATCHED,
        marker=_marker(r"CUSOLVER_STATUS_ALLOC_FAILED|CUFFT_ALLOC_FAILED"),
    ),
    SourceRule(
        _re(r"CUDNN_STATUS_ALLOC_FAILED"),
        "cudnn",
        "library",
        MATCHED,
        marker=_marker(r"CUDNN_STATUS_ALLOC_FAILED"),
    ),
    SourceRule(
        _re(r"NCCL|nccl", case_sensitive=True),
        "nccl",
        "library",
        "ncclUnhandledCudaError",
        also=_re(r"out of memory|Failed to CUDA calloc|cudaMalloc"),
        marker=_marker(r"Cuda failure 'out of memory'|Failed to CUDA calloc"),
    ),
    SourceRule(
        _re(
            r"(?:CUDA|HIP) (?:driver )?error: out of memory|cudaErrorMemoryAllocation|hipErrorOutOfMemory"
            r"|CUDA_ERROR_OUT_OF_MEMORY"
        ),
        "driver",
        "library",
        MATCHED,
        marker=_marker(
            r"(?:CUDA|HIP|cuda|hip) (?:driver )?error: out of memory"
            r"|cudaErrorMemoryAllocation|hipErrorOutOfMemory|CUDA_ERROR_OUT_OF_MEMORY"
        ),
    ),
    SourceRule(
        _re(r"UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY|PI_ERROR_OUT_OF_RESOURCES"),
        "driver",
        "library",
        MATCHED,
        marker=_marker(r"UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY|PI_ERROR_OUT_OF_RESOURCES"),
    ),
    SourceRule(
        _re(r"OutOfMemoryError", case_sensitive=True),
        "allocator",
        "bare",
        marker=_marker(r"OutOfMemoryError"),
    ),
    SourceRule(  # torch 1.x pasted without its head
        _re(r"Tried to allocate \S+ ?\S+ \(GPU \d+;"),
        "allocator",
        None,
        marker=_marker(r"Tried to allocate \S+ ?\S+ \(GPU \d+;"),
    ),
)


# ---------------------------------------------------------------------------------------------------------
# the device kind

#: The device kind, first match wins (torchmem's cap names its device, and is read before these).
BACKENDS: tuple[tuple[re.Pattern[str], str], ...] = (
    (_re(r"\bHIP\b|hipError|HIPBLAS|rocblas|PYTORCH_HIP_ALLOC_CONF|\bROCm\b", case_sensitive=True), "rocm"),
    (_re(r"\bMPS\b", case_sensitive=True), "mps"),
    (_re(r"\bXPU\b|UR_RESULT|PI_ERROR|Level.?Zero"), "xpu"),
    (_re(r"DefaultCPUAllocator|alloc_cpu", case_sensitive=True), "cpu"),
    (_re(r"CUDA|cuda|CUBLAS|CUDNN|NCCL|cuBLAS|cuDNN|CUSOLVER|CUFFT|\bGPU\b", case_sensitive=True), "cuda"),
)


def _backend(flat: str) -> str | None:
    cap = CAP_MESSAGE.search(flat)
    if cap is not None:
        kind = cap.group("cap_device").split(":")[0].lower()
        return {"hip": "rocm"}.get(kind, kind)
    return next((backend for pattern, backend in BACKENDS if pattern.search(flat)), None)


# ---------------------------------------------------------------------------------------------------------
# the figures

#: The phrases several kinds of message share (the layouts that print each are in the comments), read after
#: the matched :class:`SourceRule`'s own ``fields``. For every field the first rule that reads it wins, so a
#: layout's own phrase comes before a looser one. ``cached`` is torch 1.0-1.3's name for the cache's free
#: part; it is turned into ``reserved_unallocated``.
FIELDS: tuple[FieldRule, ...] = (
    FieldRule(_re(r"Tried to allocate {requested}")),  # torch 1.x, 2.x, MPS, XPU
    FieldRule(_re(r"Requested\s*:\s*{requested}")),  # cudaMallocAsync
    FieldRule(_re(r"trying to allocate {requested}")),
    FieldRule(  # not from torchmem's cap, whose own row reads its device
        _re(r"(?:\bGPU (?=\d+\b)|on device (?=\d)|\bdevice[ :]+(?=\d+\b))(?P<device_index>\d+)"),
        not_for=frozenset({"torchmem_cap"}),
    ),
    FieldRule(_re(r"total capac\w* of {device_total}")),  # torch 2.x ("capacty" in 2.1)
    FieldRule(_re(r"{device_total} total capacity")),  # torch 1.x
    FieldRule(_re(r"Device limit\s*:\s*{device_total}")),  # cudaMallocAsync
    FieldRule(_re(r"of which {device_free} is free")),  # torch 2.x
    FieldRule(_re(r"; {device_free} free\b")),  # torch 1.x
    FieldRule(_re(r"Free \(according to CUDA\)\s*:\s*{device_free}")),  # cudaMallocAsync
    FieldRule(_re(r"{allowed} allowed;")),  # a memory fraction, torch 1.x-2.x
    FieldRule(_re(r"PyTorch limit \(set by user-supplied memory fraction\)\s*:\s*{allowed}")),  # async
    FieldRule(_re(r"max allowed: {allowed}")),  # MPS watermark
    FieldRule(_re(r"of which {allowed} is allowed")),
    FieldRule(_re(r"this process has {process_used} memory in use")),  # torch 2.x
    FieldRule(_re(r"Of the allocated memory {allocated} is allocated by PyTorch")),  # torch 2.x
    FieldRule(_re(r"{allocated} already allocated")),  # torch 1.x
    FieldRule(_re(r"Currently allocated\s*:\s*{allocated}")),  # cudaMallocAsync
    FieldRule(_re(r"MPS allocated: {allocated}")),  # MPS
    FieldRule(_re(r"{allocated} is allocated by PyTorch")),
    FieldRule(_re(r"with {private_pools} allocated in private pools")),  # torch 2.x, CUDA graphs
    FieldRule(_re(r"and {reserved_unallocated} is reserved by PyTorch but unallocated")),  # torch 2.x
    FieldRule(_re(r"{reserved} reserved in total by PyTorch")),  # torch 1.4-2.0
    FieldRule(_re(r"{cached} cached\)")),  # torch 1.0-1.3
    FieldRule(_re(r"other allocations: {other_allocations}")),  # MPS
    FieldRule(_re(r"on (?P<pool>private|shared|default) pool")),  # MPS
    FieldRule(_re(r"(?P<suggested_setting>PYTORCH_(?:CUDA|HIP|MPS)_\w+=\S+?)(?=\s|$|\)|\.\s)")),
    FieldRule(_re(r"try setting max_split_size_mb"), constants=(("suggested_setting", "max_split_size_mb"),)),
)

#: Every other process the message lists (torch 2.x: "Process 1234 has 2.00 GiB memory in use").
PROCESS = _re(r"Process (?P<pid>\d+) has {used} memory in use", case_sensitive=True)

#: Layouts told apart by their wording, for a source whose rule names none; first match wins.
LAYOUTS: tuple[tuple[re.Pattern[str], str], ...] = (
    (_re(r"total capacity of|total capacty of|is reserved by PyTorch", case_sensitive=True), "torch2"),
    (_re(r"{cached} cached\)"), "torch1_cached"),
    (_re(r"total capacity;|already allocated", case_sensitive=True), "torch1"),
)

#: The figures a layout of PyTorch's caching allocator always prints: a message without one was cut short.
ALWAYS_PRINTED: dict[str, tuple[str, ...]] = {
    "torch2": ("requested", "device_total", "allocated", "device_free"),
    "torch1": ("requested", "device_total", "allocated", "device_free"),
    "torch1_cached": ("requested", "device_total", "allocated", "device_free"),
}
_ALWAYS_PRINTED_ELSEWHERE = ("requested", "device_total", "allocated")


def _size(text: str) -> tuple[int, int] | None:
    """``"2.00 GiB" -> (bytes, precision)``: precision is half a unit of the last printed digit, how far the
    printed figure may be from the true one. ``None``: not a size."""
    m = _SIZE_PARTS.fullmatch(text)
    scale = None if m is None else unit_bytes(m.group(2))
    if m is None or scale is None:
        return None
    number = m.group(1)
    value = int(number) * scale if number.isdigit() else round(float(number) * scale)
    decimals = len(number.split(".")[1]) if "." in number else 0
    return value, int(scale * 0.5 * 10 ** (-decimals))


def _read_fields(flat: str, kind: SourceRule) -> tuple[dict[str, Any], dict[str, int]]:
    """Every field the rules read from ``flat`` (the kind's own phrases first, then the shared
    :data:`FIELDS`), and the precision of each size."""
    values: dict[str, Any] = {}
    precision: dict[str, int] = {}
    for rule in (*kind.fields, *FIELDS):
        if kind.source in rule.not_for:
            continue
        m = rule.pattern.search(flat)
        if m is None:
            continue
        for group, text in m.groupdict().items():
            if text is None:
                continue
            if group in READERS:
                name, read = READERS[group]
                if name not in values and (value := read(text)) is not None:
                    values[name] = value
            elif group not in values and (sized := _size(text)) is not None:
                values[group], precision[group] = sized
        for name, constant in rule.constants:
            values.setdefault(name, constant)
    return values, precision


# ---------------------------------------------------------------------------------------------------------
# finding the message


@functools.lru_cache(maxsize=4)
def _markers(kinds: tuple[SourceRule, ...]) -> re.Pattern[str]:
    """The rows' markers as one pattern: what marks a memory error in a log."""
    return re.compile("|".join(k.marker.pattern for k in kinds if k.marker is not None))


# A whole (dotted) exception name ending in Error or Exception: never the tail of a longer name, so
# "torch.AcceleratorError:" is read as that name, not as "Error".
_EXC_PREFIX = re.compile(r"(?<![\w.])(?P<exc>(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception)):\s*(?=\S)")
_MESSAGE_END = re.compile(r"\n\s*\n|\nTraceback |\n\s*File \"|\n(?:During handling|The above exception)")
_CONTINUATION = re.compile(r"NCCL|nccl|Allocation on device|Last error")


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
    matches = list(_markers(SOURCES).finditer(text))
    if not matches:
        return None
    m = matches[-1]
    # the marker may sit in a continuation line of a multi-line message: go back to the exception name
    start = text.rfind("\n", 0, m.start()) + 1
    lines = text[:start].split("\n")
    back = len(lines) - 1  # the last element is "" (the text up to start ends with \n)
    # walk up over a message's earlier lines, stopping at a blank line or a traceback frame line
    while back > 0:
        prev = lines[back - 1]
        if not prev.strip() or prev.lstrip().startswith(("File ", "Traceback", "^", "~")):
            break
        if _EXC_PREFIX.match(text[start:].lstrip()) is not None:
            break
        if _EXC_PREFIX.search(prev) is None and _CONTINUATION.search(prev) is None:
            break
        back -= 1
        start -= len(prev) + 1
    end = len(text)
    b = _MESSAGE_END.search(text, m.end())
    if b is not None:
        end = b.start()
    chunk = text[start:end].strip()
    # from the exception name on, if a log prefix (timestamps, rank) precedes it on the line
    e = _EXC_PREFIX.search(chunk)
    if e is not None and e.start() < m.start() - start + 1 and "\n" not in chunk[: e.start()]:
        chunk = chunk[e.start() :]
    return chunk


# ---------------------------------------------------------------------------------------------------------
# parsing


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


def _parse_one(text: str) -> ParsedOOM:
    flat = " ".join(text.split())
    em = _EXC_PREFIX.match(flat)
    exc = None if em is None else em.group("exc")
    backend = _backend(flat)
    rule, matched = next(((r, m) for r in SOURCES if (m := r.match(flat, backend)) is not None), (None, None))
    if rule is None or matched is None:
        return ParsedOOM(text=text, is_oom=False, backend=backend, exception_type=exc)
    source = rule.source
    values, prec = _read_fields(flat, rule)
    code = values.get("error_code", matched.group(0) if rule.code == MATCHED else rule.code)
    if values.get("allowed") is not None and source == "cuda_malloc_async" and values["allowed"] > (1 << 50):
        del values["allowed"]  # cudaMallocAsync prints an absurd limit when no fraction is set
    procs = tuple(
        (int(m.group("pid")), sized[0]) for m in PROCESS.finditer(flat) if (sized := _size(m.group("used")))
    )

    # what the layout implies
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
    fmt = rule.format
    if fmt is None:
        fmt = next((layout for pattern, layout in LAYOUTS if pattern.search(flat)), None)
    if fmt is None and source == "allocator":
        fmt = "bare" if values.get("requested") is None else "torch2"
    notes: list[str] = []
    process_used = values.get("process_used")
    if process_used is None and procs and reserved is not None and source == "allocator":
        notes.append(
            "The message names no process as this one (process IDs differ inside containers); "
            "one of the listed processes is probably this process."
        )
    return ParsedOOM(
        text=text,
        is_oom=True,
        source=source,
        backend=backend,
        format=fmt,
        exception_type=exc,
        requested=values.get("requested"),
        device_index=values.get("device_index"),
        device_total=values.get("device_total"),
        device_free=values.get("device_free"),
        allowed=values.get("allowed"),
        process_used=process_used,
        other_processes=procs,
        allocated=allocated,
        private_pools=values.get("private_pools"),
        reserved=reserved,
        reserved_unallocated=unalloc,
        other_allocations=values.get("other_allocations"),
        pool=values.get("pool"),
        suggested_setting=values.get("suggested_setting"),
        error_code=code,
        cap_owner=values.get("cap_owner"),
        precision=prec,
        truncated=_truncated(fmt, source, values, unalloc),
        notes=tuple(notes),
    )


def _truncated(fmt: str | None, source: str, values: Mapping[str, Any], unalloc: int | None) -> bool:
    """The caching allocator's message stops before figures its layout always prints."""
    if source != "allocator" or fmt is None:
        return False
    if fmt == "bare":
        return True
    need = ALWAYS_PRINTED.get(fmt, _ALWAYS_PRINTED_ELSEWHERE)
    return any(values.get(k) is None for k in need) or unalloc is None


__all__ = [
    "ALWAYS_PRINTED",
    "BACKENDS",
    "CAP_MESSAGE",
    "FIELDS",
    "LAYOUTS",
    "MATCHED",
    "PROCESS",
    "READERS",
    "SOURCES",
    "FieldRule",
    "SourceRule",
    "find_oom_message",
    "parse_oom_message",
    "parse_size",
]
