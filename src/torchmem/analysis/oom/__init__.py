"""Out-of-memory diagnosis — pure functions: parse an OOM message, tell an OOM exception, classify the cause,
choose the fixes.

* :mod:`~torchmem.analysis.oom.messages` — :func:`parse_oom_message` reads every field of the OOM messages of
  torch 1.x–2.x (CUDA and ROCm caching allocator, ``cudaMallocAsync``, MPS, XPU, the CPU allocator,
  torchmem's cap) and recognises memory errors raised outside the allocator (driver, cuBLAS/cuDNN, NCCL),
  from tables where a new message format is a row; :func:`find_oom_message` finds the message in a log.
* :mod:`~torchmem.analysis.oom.detect` — :func:`is_oom` / :func:`oom_exception` tell an OOM exception by its
  type along its ``__cause__``/``__context__`` chain; text is read only for strings and for foreign
  ``RuntimeError`` s (ROCm, old torch, CPU, cuBLAS).
* :mod:`~torchmem.analysis.oom.figures` — the message's and the allocator state's figures merged, and the
  allocator settings in effect (:func:`parse_alloc_conf`).
* :mod:`~torchmem.analysis.oom.causes` and :mod:`~torchmem.analysis.oom.fixes` — one rule per cause kind
  (``too_large``, ``fragmentation``, ``other_processes``, ``leak``, ``pinned_by_exception``,
  ``working_set``, ``outside_allocator``), each with its evidence and only the fixes that evidence supports,
  never a setting already in effect.
* :mod:`~torchmem.analysis.oom.diagnose` — :func:`diagnose` runs the rules and ranks the causes.

The result types (:class:`OOMDiagnosis`, :class:`Cause`, :class:`Fix`, :class:`ParsedOOM`...) live in
:mod:`torchmem.results.oom` and are re-exported here. Nothing here touches a device: live state is gathered
by :mod:`torchmem.capture.oom` (which holds the public :func:`~torchmem.capture.oom.explain_oom`) and handed
in as data. Importing this package costs the compilation of the message tables' regular expressions.
"""

from __future__ import annotations

from torchmem.analysis.oom.detect import is_oom, oom_exception
from torchmem.analysis.oom.diagnose import as_leak_evidence, diagnose
from torchmem.analysis.oom.figures import parse_alloc_conf
from torchmem.analysis.oom.messages import find_oom_message, parse_oom_message, parse_size
from torchmem.results.oom import (
    CAUSE_KINDS,
    Cause,
    Fix,
    LeakEvidence,
    LeakSite,
    MachineMemory,
    OOMDiagnosis,
    ParsedOOM,
    PinnedTensor,
    WorkingSetItem,
)

__all__ = [
    "CAUSE_KINDS",
    "Cause",
    "Fix",
    "LeakEvidence",
    "LeakSite",
    "MachineMemory",
    "OOMDiagnosis",
    "ParsedOOM",
    "PinnedTensor",
    "WorkingSetItem",
    "as_leak_evidence",
    "diagnose",
    "find_oom_message",
    "is_oom",
    "oom_exception",
    "parse_alloc_conf",
    "parse_oom_message",
    "parse_size",
]
