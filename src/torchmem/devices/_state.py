"""Process-wide switches of the CUDA runtime that make host memory grow while they are on.

Read by the host watcher when the host grows (never per step): whether ``torch.cuda.memory.
_record_memory_history`` is recording (each allocation and free keeps a trace entry with its stack on the
host), and whether ``torch.backends.cudnn.benchmark`` is on in a process that uses CUDA (each new
convolution shape is benchmarked and its plan cached on the host, for the life of the process). Each read is
guarded: it never initialises CUDA, and a figure torch cannot give is ``None``.
"""

from __future__ import annotations

import torch

from torchmem.devices._allocator import cuda_ready, history_enabled


def cuda_in_use() -> bool:
    """This process has initialised CUDA (reading it never initialises it).

    Example:
        >>> cuda_in_use() in (True, False)
        True
    """
    try:
        return cuda_ready()
    except Exception:
        return False


def memory_history_recording() -> bool | None:
    """Whether the CUDA caching allocator records its history (``_record_memory_history``): ``None`` where
    CUDA is not in use or torch cannot say.

    Example:
        >>> memory_history_recording() in (True, False, None)
        True
    """
    if not cuda_in_use():
        return None
    try:
        return history_enabled()
    except Exception:
        return None


def cudnn_benchmark_on() -> bool | None:
    """Whether ``torch.backends.cudnn.benchmark`` is on in a process that uses CUDA with cuDNN: ``None``
    where CUDA is not in use or cuDNN is not available (then the flag changes nothing).

    Example:
        >>> cudnn_benchmark_on() in (True, False, None)
        True
    """
    if not cuda_in_use():
        return None
    try:
        cudnn = torch.backends.cudnn
        if not cudnn.is_available() or not cudnn.enabled:
            return None
        return bool(cudnn.benchmark)
    except Exception:
        return None


__all__ = ["cuda_in_use", "cudnn_benchmark_on", "memory_history_recording"]
