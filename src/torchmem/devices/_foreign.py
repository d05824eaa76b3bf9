"""Device memory held by other allocators in this process, where they can be read without side effects.

Only libraries the user has already imported are asked; none is imported here. CuPy's default pool is
read; JAX is not, because asking it for devices can start its backend and pre-allocate most of the GPU.
"""

from __future__ import annotations

import sys
from typing import Any


def foreign_pools(cuda_index: int) -> dict[str, int]:
    """Bytes reserved on ``cuda_index`` by other libraries' pools, by library name."""
    out: dict[str, int] = {}
    cp: Any = sys.modules.get("cupy")
    if cp is not None:
        try:
            with cp.cuda.Device(cuda_index):
                total = int(cp.get_default_memory_pool().total_bytes())
            if total:
                out["cupy"] = total
        except Exception:  # cupy without a usable runtime: nothing it holds
            pass
    return out
