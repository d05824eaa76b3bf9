"""The fixes the OOM cause rules suggest: allocator settings that are not already in effect, a smaller batch
with a number when the figures give one, raising a cap, and the standard memory savers.

Each builder returns a :class:`~torchmem.results.oom.Fix` (or ``None`` when the fix does not apply: an
allocator setting already in effect, or one the backend in use ignores). Pure and cheap.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from torchmem.analysis.oom.figures import Figures
from torchmem.results.oom import Fix


def env_name(backend: str | None) -> str:
    """The allocator-settings variable of the backend (ROCm reads its own)."""
    return "PYTORCH_HIP_ALLOC_CONF" if backend == "rocm" else "PYTORCH_CUDA_ALLOC_CONF"


def alloc_conf_fix(f: Figures, settings: Mapping[str, str], key: str, value: str, text: str) -> Fix | None:
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
    return Fix("alloc_conf", text, f"{env_name(f.backend)}={conf}")


def batch_fix(batch_size: int | None, fraction: float | None, why: str) -> Fix:
    """A smaller batch: ``batch_size * fraction`` when both are known and that is smaller, else in words."""
    if batch_size is not None and fraction is not None and 0 < fraction < 1:
        new = max(1, math.floor(batch_size * fraction))
        if new < batch_size:
            return Fix(
                "batch_size",
                f"Use a smaller batch: about {new} instead of {batch_size} ({why}).",
                f"batch_size={new}",
            )
    return Fix("batch_size", f"Use a smaller batch (or micro-batches with gradient accumulation) ({why}).")


def limit_fix(f: Figures) -> Fix:
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


def max_split_mb(request: int) -> int | None:
    """The ``max_split_size_mb`` that keeps blocks of this request's size whole: the largest power of two
    MiB not above it (at least 32); ``None`` for requests under 32 MiB."""
    mib = request >> 20
    if mib < 32:
        return None
    n = 1 << (mib.bit_length() - 1)  # largest power of two MiB <= the request
    return max(32, n)


def autocast_fix(backend: str | None) -> Fix:
    """bf16 autocast on the backend's device type."""
    dev = {"mps": "mps", "xpu": "xpu", "cpu": "cpu"}.get(backend or "", "cuda")
    return Fix(
        "dtype",
        "Run in bf16 (autocast) to halve activation memory, or keep weights in bf16.",
        f"with torch.autocast({dev!r}, dtype=torch.bfloat16): ...",
    )


CHECKPOINT = Fix(
    "checkpointing",
    "If training: recompute activations in backward instead of keeping them (activation checkpointing).",
    "torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)",
)
NO_GRAD = Fix(
    "no_grad",
    "If this is evaluation or inference: run it without autograd so no activations are kept.",
    "with torch.inference_mode(): ...",
)
ZERO_GRAD = Fix(
    "zero_grad",
    "Free gradients between steps instead of zero-filling them.",
    "optimizer.zero_grad(set_to_none=True)",
)
ITEM = Fix(
    "item",
    "Log losses and metrics as Python numbers, not tensors (a kept loss tensor keeps its graph).",
    "running_loss += loss.item()",
)

__all__ = [
    "CHECKPOINT",
    "ITEM",
    "NO_GRAD",
    "ZERO_GRAD",
    "alloc_conf_fix",
    "autocast_fix",
    "batch_fix",
    "env_name",
    "limit_fix",
    "max_split_mb",
]
