"""Target GPUs and the arithmetic a device-free estimate adds to tracked tensor bytes (pure).

A fake-tensor run (:mod:`torchmem.capture.fake`) counts the bytes of every tensor a step creates, exactly,
but on no device. What a real GPU adds is here:

- **the target table** (:data:`TARGETS`, :func:`resolve_target`): total memory as torch reports it, the
  CUDA context a fresh process takes before it allocates anything, the libraries' memory outside the
  caching allocator (cuBLAS handles, loaded kernels) and the cuBLAS workspace (inside it). The H100 row is
  this project's own measurement (NVML, per process: 518 MiB context, 224 MiB more after the first GEMMs,
  79.18 GiB total, docs/benchmarks.md); the others are typical figures for current drivers, marked so.
- **the caching allocator's rounding** (:func:`round_block`, :func:`segment_size`): every block is a
  multiple of 512 bytes; requests up to 1 MiB come from 2 MiB segments, up to 10 MiB from 20 MiB
  segments, larger ones from segments rounded up to 2 MiB.
- **a fragmentation allowance** (:data:`FRAGMENTATION`): reserved memory above the allocated peak, as a
  fraction of it.
- **NCCL buffers** (:data:`NCCL_ALLOWANCE`) when distributed.
- **the GPU's kernel choices** that change what a step holds (:func:`attention_backend`,
  :meth:`Target.workspaces`): which fused attention kernel ``scaled_dot_product_attention`` takes on the
  target's compute capability (the fake run is a CPU run, whose choice differs), and how many cuBLAS
  workspaces a step holds (one per thread issuing GEMMs: forward, and autograd's backward thread).
- **sharding** (:func:`shard`): what each rank holds of parameters, gradients and optimizer state under
  DDP, FSDP (FSDP2 ``fully_shard``) and the ZeRO stages, and the communication buffers each adds.

Example:
    >>> t = resolve_target("h100")
    >>> t.name, round(t.total / 2**30, 2)
    ('H100-80GB', 79.18)
    >>> round_block(1), round_block(513), segment_size(600 * 1024), segment_size(3 << 20)
    (512, 1024, 2097152, 20971520)
    >>> s = shard("zero2", 4, parameters=400, gradients=400, optimizer_state=800)
    >>> (s.parameters, s.gradients, s.optimizer_state)
    (400, 100, 200)
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from torchmem.analysis.estimate import FitArgumentError

_MiB = 1 << 20
_GiB = 1 << 30

#: Reserved memory above the allocated peak, as a fraction of the allocated peak: an allowance for the
#: caching allocator's split blocks and cached segments that a step cannot reuse (not measured per model).
FRAGMENTATION = 0.05

#: Memory NCCL takes per rank outside the caching allocator once the default group's communicator exists
#: (its buffers per channel and peer, the channels' state, its kernels): measured on 2 H100s over NVLink,
#: NCCL 2.28.3, 24 channels: 844 MiB per rank (a further group's communicator added 486 MiB).
NCCL_ALLOWANCE = 844 * _MiB

_BLOCK = 512  # kMinBlockSize
_SMALL = 1 * _MiB  # kSmallSize: requests up to this come from the small pool
_SMALL_SEGMENT = 2 * _MiB  # kSmallBuffer
_MIN_LARGE = 10 * _MiB  # kMinLargeAlloc
_LARGE_SEGMENT = 20 * _MiB  # kLargeBuffer
_ROUND_LARGE = 2 * _MiB  # kRoundLarge


@dataclass(frozen=True)
class Target:
    """A GPU an estimate is for.

    Attributes:
        name: Canonical name, e.g. ``"H100-80GB"``.
        total: Total memory as torch reports it (``mem_get_info``'s total), bytes.
        context: The CUDA context of a fresh process (outside the allocator), bytes.
        libraries: Memory the first kernels and library handles add outside the allocator (cuBLAS,
            cuDNN handles, loaded modules), bytes.
        workspace: The cuBLAS workspace torch allocates through the caching allocator (one per handle and
            stream), bytes.
        measured: Whether ``context`` and ``libraries`` were measured by this project (else typical).
        sm: The compute capability (``(9, 0)`` for an H100): the device-free estimate then reproduces the
            GPU's kernel choices (fused attention, foreach optimizers, composite ops' temporaries). ``None``
            keeps the CPU's choices (a bare size budget compared with the CPU ledger).
    """

    name: str
    total: int
    context: int
    libraries: int
    workspace: int
    measured: bool = False
    sm: tuple[int, int] | None = None

    @property
    def overhead(self) -> int:
        """Bytes in use outside the caching allocator before the first tensor: context + libraries."""
        return self.context + self.libraries

    def workspaces(self, training: bool) -> int:
        """The cuBLAS workspace bytes a step holds at its peak: one per (thread, stream) that runs GEMMs
        (torch >= 2.3 allocates them through the caching allocator, keyed by handle and stream, and keeps
        them). Inference: the main thread's. Training: also autograd's backward thread's (its own cuBLAS
        handle), live from the first backward on, so in every phase of the steady-state step.

        Example:
            >>> t = resolve_target("H100")
            >>> t.workspaces(False) >> 20, t.workspaces(True) >> 20
            (32, 64)
        """
        return self.workspace * (2 if training else 1)


def _gib(x: float) -> int:
    return round(x * _GiB)


_WS_SM90 = 32 * _MiB  # torch's default cuBLAS workspace on sm90 (CUBLAS_WORKSPACE_CONFIG :4096:8)
_WS = 8 * _MiB + 128 * 1024  # elsewhere (:4096:2:16:8)

#: The known targets. The H100 figures are this project's measurement (H100 80GB HBM3, driver 580.159,
#: torch 2.11+cu130); the others are typical of current drivers with lazy module loading. The
#: workspace sizes are torch's defaults per compute capability; ``sm`` is the GPU's.
TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target("H100-80GB", _gib(79.18), 518 * _MiB, 224 * _MiB, _WS_SM90, measured=True, sm=(9, 0)),
        Target("H200", _gib(139.81), 520 * _MiB, 224 * _MiB, _WS_SM90, sm=(9, 0)),
        Target("A100-80GB", _gib(79.15), 420 * _MiB, 200 * _MiB, _WS, sm=(8, 0)),
        Target("A100-40GB", _gib(39.39), 420 * _MiB, 200 * _MiB, _WS, sm=(8, 0)),
        Target("L4", _gib(22.05), 380 * _MiB, 180 * _MiB, _WS, sm=(8, 9)),
        Target("A10G", _gib(22.19), 380 * _MiB, 180 * _MiB, _WS, sm=(8, 6)),
        Target("T4", _gib(14.75), 300 * _MiB, 150 * _MiB, _WS, sm=(7, 5)),
        Target("V100-16GB", _gib(15.77), 310 * _MiB, 150 * _MiB, _WS, sm=(7, 0)),
        Target("V100-32GB", _gib(31.74), 310 * _MiB, 150 * _MiB, _WS, sm=(7, 0)),
        Target("RTX4090", _gib(23.65), 400 * _MiB, 180 * _MiB, _WS, sm=(8, 9)),
        Target("RTX3090", _gib(23.69), 380 * _MiB, 180 * _MiB, _WS, sm=(8, 6)),
    )
}

_ALIASES = {
    "H100": "H100-80GB",
    "H10080": "H100-80GB",
    "H100SXM": "H100-80GB",
    "H100PCIE": "H100-80GB",
    "H200141GB": "H200",
    "A100": "A100-80GB",
    "A10080": "A100-80GB",
    "A10040": "A100-40GB",
    "4090": "RTX4090",
    "3090": "RTX3090",
    "V100": "V100-16GB",
    "V10016": "V100-16GB",
    "V10032": "V100-32GB",
}


def _squash(name: str) -> str:
    s = re.sub(r"[^A-Z0-9]", "", name.upper())
    s = s.removeprefix("NVIDIA").removeprefix("GEFORCE")
    return s.replace("GB", "").replace("HBM3E", "").replace("HBM3", "").replace("HBM2E", "")


class UnknownTargetError(FitArgumentError):
    """The target name is not in :data:`TARGETS` (and is not a size such as ``"24GB"``)."""


def target_names() -> list[str]:
    """The canonical names of the known targets."""
    return list(TARGETS)


def resolve_target(name: str | Target) -> Target:
    """The :class:`Target` for ``name``: a known name or alias (case, spaces and dashes ignored:
    ``"h100"``, ``"A100-40GB"``, ``"NVIDIA GeForce RTX 4090"``), or a bare size (``"24GiB"``, ``"16GB"``,
    binary units as torch's messages mean them) for an unnamed GPU with a typical context.

    Raises:
        UnknownTargetError: neither a known name nor a size.
    """
    if isinstance(name, Target):
        return name
    key = _squash(name)
    by_key = {_squash(n): t for n, t in TARGETS.items()}
    if key in by_key:
        return by_key[key]
    if key in _ALIASES:
        return TARGETS[_ALIASES[key]]
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(GIB|GB|G)?\s*", name.upper())
    if m:
        return Target(
            f"{m.group(1)} GiB GPU", _gib(float(m.group(1))), 400 * _MiB, 180 * _MiB, _WS, sm=(8, 0)
        )
    raise UnknownTargetError(
        f"Unknown target GPU {name!r}.", f"Use one of {', '.join(TARGETS)}, or a size such as '24GiB'."
    )


def round_block(nbytes: int) -> int:
    """The caching allocator's block for a request of ``nbytes``: a multiple of 512 bytes, at least 512."""
    if nbytes <= 0:
        return 0
    return ((nbytes + _BLOCK - 1) // _BLOCK) * _BLOCK


def segment_size(nbytes: int) -> int:
    """The segment ``cudaMalloc`` gets when no cached block fits a request of ``nbytes``."""
    size = round_block(nbytes)
    if size <= _SMALL:
        return _SMALL_SEGMENT
    if size < _MIN_LARGE:
        return _LARGE_SEGMENT
    return ((size + _ROUND_LARGE - 1) // _ROUND_LARGE) * _ROUND_LARGE


def reserved_for(allocated_peak: int, fragmentation: float = FRAGMENTATION) -> int:
    """Reserved (``cudaMalloc``'d) bytes to expect at an allocated peak: the peak plus the allowance."""
    return int(allocated_peak * (1.0 + fragmentation))


#: ``scaled_dot_product_attention``'s kernels, as :func:`attention_backend` names them.
ATTENTION_BACKENDS = ("flash", "efficient", "math")


def attention_backend(
    sm: tuple[int, int],
    *,
    dtype: str,
    q_heads: int,
    kv_heads: int,
    head_dim: int,
    v_head_dim: int,
    q_len: int,
    kv_len: int,
    mask: bool,
    causal: bool,
    grad: bool,
    last_dim_contiguous: bool = True,
) -> str:
    """The kernel CUDA's ``scaled_dot_product_attention`` takes on a GPU of compute capability ``sm``:
    ``"flash"`` (saves the output and a logsumexp), ``"efficient"`` (the same, and the mask it was given)
    or ``"math"`` (materialises the scores: batch x heads x q_len x kv_len, and saves the probabilities).

    The rules are torch's (``sdp_utils.cpp``, torch 2.4-2.11, default priority), reduced to what decides
    memory: flash needs fp16/bf16, sm80+, no mask, equal head dims up to 256 (192 when training on
    sm86/89/120) and no causal mask over unequal lengths; it takes grouped-query heads. The memory-efficient
    kernel takes fp32 too (bf16 from sm80), masks, head dims aligned to the GEMM (4 elements on sm80+,
    8 for half precision before), but not grouped-query heads (``enable_gqa``: measured on the H100, torch
    2.11; a newer torch that runs it fused makes this rule over-estimate, the safe side). cuDNN attention,
    preferred on sm90+ with a recent cuDNN, holds what flash holds. Every fused kernel needs the last
    dimension of the query, key, value and mask to have stride 1 (``check_last_dim_stride_equals_1_dense``,
    ``last_dim_contiguous``): T5's relative-position bias, a permuted embedding passed as the mask by
    transformers 5.17, is not, so T5 took the math path on the H100 (its training peak was 14 % above an
    estimate that took the memory-efficient kernel). Everything else takes the math path. ``dtype`` is
    the query's (``"float32"``, ``"float16"``, ``"bfloat16"``).

    Example:
        >>> attention_backend((9, 0), dtype="float32", q_heads=12, kv_heads=12, head_dim=64, v_head_dim=64,
        ...                   q_len=512, kv_len=512, mask=False, causal=True, grad=True)
        'efficient'
        >>> attention_backend((9, 0), dtype="float32", q_heads=16, kv_heads=8, head_dim=64, v_head_dim=64,
        ...                   q_len=512, kv_len=512, mask=False, causal=True, grad=True)
        'math'
        >>> attention_backend((8, 0), dtype="bfloat16", q_heads=16, kv_heads=8, head_dim=128,
        ...                   v_head_dim=128, q_len=2048, kv_len=2048, mask=False, causal=True, grad=True)
        'flash'
        >>> attention_backend((9, 0), dtype="float32", q_heads=8, kv_heads=8, head_dim=64, v_head_dim=64,
        ...                   q_len=256, kv_len=256, mask=True, causal=False, grad=True,
        ...                   last_dim_contiguous=False)
        'math'
    """
    half = dtype in ("float16", "bfloat16")
    if half and dtype == "bfloat16" and sm < (8, 0):
        return "math"  # no fused kernel takes bf16 before Ampere
    if not last_dim_contiguous:
        return "math"
    heads_divide = kv_heads > 0 and q_heads % kv_heads == 0
    flash_dim = 192 if grad and sm in ((8, 6), (8, 9), (12, 0)) else 256
    if (
        half
        and (8, 0) <= sm <= (12, 1)
        and not mask
        and head_dim == v_head_dim <= flash_dim
        and heads_divide
        and not (causal and q_len != kv_len)
    ):
        return "flash"
    tensor_cores = sm >= (8, 0) or (sm >= (7, 0) and half)
    align = 4 if sm >= (8, 0) else 1
    if tensor_cores:
        align = max(align, 8 if half else 4)
    if (
        sm >= (5, 0)
        and dtype in ("float32", "float16", "bfloat16")
        and q_heads == kv_heads
        and head_dim > 0
        and v_head_dim > 0
        and head_dim % align == 0
        and v_head_dim % align == 0
    ):
        return "efficient"
    return "math"


STRATEGIES = ("none", "ddp", "zero1", "zero2", "zero3", "fsdp")


@dataclass(frozen=True)
class Shard:
    """What one rank holds of the model's state, and the buffers its strategy adds (bytes).

    Attributes:
        parameters / gradients / optimizer_state: The rank's share.
        gather: Unsharded parameters all-gathered at once during forward and backward (FSDP/ZeRO-3: the
            root's parameters, kept gathered, plus three units: the one running, the one prefetched and
            the prefetched unit's flat all-gather output before its copy-out).
        reduce: Gradient buffers in backward (DDP: a flat copy of every gradient; ZeRO-2: one unit's
            unsharded gradients; FSDP/ZeRO-3: three units: the unit's unsharded gradients, its flat
            reduce-scatter input and the previous unit's reduce-scatter still in flight).
        nccl: NCCL's own buffers, outside the caching allocator.
    """

    parameters: int
    gradients: int
    optimizer_state: int
    gather: int = 0
    reduce: int = 0
    nccl: int = 0


def shard(
    strategy: str,
    world_size: int,
    *,
    parameters: int,
    gradients: int,
    optimizer_state: int,
    largest_unit: int = 0,
    root_unit: int = 0,
    largest_unit_grads: int | None = None,
    nccl: int = NCCL_ALLOWANCE,
) -> Shard:
    """One rank's share of the state under ``strategy`` with ``world_size`` ranks.

    ``"none"``: everything; ``"ddp"``: everything, plus DDP's gradient buckets (a flat copy of the
    gradients, ``gradient_as_bucket_view=False``, the default); ``"zero1"``: optimizer state sharded;
    ``"zero2"``: and gradients (plus one unit's unsharded gradients); ``"zero3"`` / ``"fsdp"``: and
    parameters (plus the gathered root and units, see :class:`Shard`). Shares are rounded up (padding).
    The FSDP buffers were checked against a 2-rank FSDP2 run on gloo (tests/capture/test_fake_estimate.py).

    Example:
        >>> s = shard("fsdp", 2, parameters=1000, gradients=1000, optimizer_state=2000, largest_unit=200,
        ...           root_unit=100, nccl=0)
        >>> (s.parameters, s.gradients, s.optimizer_state, s.gather, s.reduce)
        (500, 500, 1000, 700, 600)
    """
    if strategy not in STRATEGIES:
        raise FitArgumentError(
            f"Unknown sharding strategy {strategy!r}.", f"Use one of {', '.join(STRATEGIES)}."
        )
    n = max(int(world_size), 1)

    def part(x: int) -> int:
        return -(-x // n)

    unit_grads = largest_unit if largest_unit_grads is None else largest_unit_grads
    comm = nccl if n > 1 else 0
    if strategy == "none" or (n == 1 and strategy == "ddp"):
        return Shard(parameters, gradients, optimizer_state)
    if strategy == "ddp":
        return Shard(parameters, gradients, optimizer_state, reduce=gradients, nccl=comm)
    if strategy == "zero1":
        return Shard(parameters, gradients, part(optimizer_state), nccl=comm)
    if strategy == "zero2":
        return Shard(parameters, part(gradients), part(optimizer_state), reduce=unit_grads, nccl=comm)
    return Shard(
        part(parameters),
        part(gradients),
        part(optimizer_state),
        gather=root_unit + 3 * largest_unit,
        reduce=3 * unit_grads,
        nccl=comm,
    )


__all__ = [
    "ATTENTION_BACKENDS",
    "FRAGMENTATION",
    "NCCL_ALLOWANCE",
    "STRATEGIES",
    "TARGETS",
    "Shard",
    "Target",
    "UnknownTargetError",
    "attention_backend",
    "reserved_for",
    "resolve_target",
    "round_block",
    "segment_size",
    "shard",
    "target_names",
]
