"""torchmem: every PyTorch device-memory question answered — where it went, who holds it, what fits.

Importing torchmem does no work: it does not initialise CUDA, change allocator settings, reset peak
statistics or start threads.

Example:
    >>> import torchmem
    >>> print(torchmem.stats())            # doctest: +SKIP
    >>> with torchmem.track() as t:        # doctest: +SKIP
    ...     ...
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from torchmem._version import __version__

if TYPE_CHECKING:  # the names, for type checkers and editors; at run time they load on first use
    from torchmem._errors import (
        DeviceError,
        DeviceIndexError,
        DeviceUnavailableError,
        TorchmemError,
        TrackingError,
        UnknownDeviceError,
        UnsupportedDeviceError,
    )
    from torchmem.actions.batch_size import (
        BatchSizeError,
        BatchSizeResult,
        DistributedTrialError,
        Trial,
        find_batch_size,
    )
    from torchmem.actions.guard import OOMGuard, oom_guard
    from torchmem.actions.limit import (
        Budget,
        BudgetExceededError,
        Limit,
        LimitError,
        WorkingSetEntry,
        budget,
        limit,
    )
    from torchmem.actions.release import (
        ReleasedError,
        ReleaseError,
        release,
    )
    from torchmem.actions.scope import Scope, scope
    from torchmem.analysis.estimate import FitArgumentError
    from torchmem.analysis.holders import find_holders, holders
    from torchmem.analysis.lint import LintFinding, lint_paths, lint_source
    from torchmem.analysis.oom import is_oom
    from torchmem.capture.cpu import CpuTracking, cpu_tracking
    from torchmem.capture.file import Capture, CaptureError, read_capture
    from torchmem.capture.measure import estimate
    from torchmem.capture.ondemand import survivors
    from torchmem.capture.oom import OOMInputError, OOMObserver, attach_oom_observer, explain_oom
    from torchmem.capture.profile import ProfileError, Profiler, profile
    from torchmem.capture.read import counters, live_tensors, reset_peak, stats
    from torchmem.capture.track import Tracker, track
    from torchmem.capture.watch import LeakWarning, Watcher, WatchError, watch
    from torchmem.capture.workers import WorkerWarning
    from torchmem.devices import HotReading
    from torchmem.integrations import distributed
    from torchmem.integrations.excepthook import install, uninstall
    from torchmem.results.fit import EstimateRow, MemoryEstimate
    from torchmem.results.holders import HolderPath, HolderSearch
    from torchmem.results.leaks import Culprit, LeakReport
    from torchmem.results.live import LiveTensor, LiveTensorReport
    from torchmem.results.oom import Cause, Fix, OOMDiagnosis, OOMRecovery
    from torchmem.results.profile import ModuleProfile, ProfileReconciliation, ProfileReport
    from torchmem.results.release import DeviceFigures, ReleaseReport, Remaining, ScopeReport
    from torchmem.results.stats import Breakdown, BreakdownRow, MemoryStats, ProcessMemory
    from torchmem.results.survivors import SurvivorGroup, SurvivorReport
    from torchmem.results.track import TrackResult

# Public name -> the module that defines it. ``import torchmem`` imports none of them (nor torch): each loads
# the first time it is used (PEP 562), so importing torchmem costs nothing and does nothing.
_EXPORTS: dict[str, str] = {
    "BatchSizeError": "torchmem.actions.batch_size",
    "BatchSizeResult": "torchmem.actions.batch_size",
    "Breakdown": "torchmem.results.stats",
    "BreakdownRow": "torchmem.results.stats",
    "Budget": "torchmem.actions.limit",
    "BudgetExceededError": "torchmem.actions.limit",
    "Capture": "torchmem.capture.file",
    "CaptureError": "torchmem.capture.file",
    "Cause": "torchmem.results.oom",
    "CpuTracking": "torchmem.capture.cpu",
    "Culprit": "torchmem.results.leaks",
    "DeviceError": "torchmem._errors",
    "DeviceFigures": "torchmem.results.release",
    "DeviceIndexError": "torchmem._errors",
    "DeviceUnavailableError": "torchmem._errors",
    "DistributedTrialError": "torchmem.actions.batch_size",
    "EstimateRow": "torchmem.results.fit",
    "FitArgumentError": "torchmem.analysis.estimate",
    "Fix": "torchmem.results.oom",
    "HolderPath": "torchmem.results.holders",
    "HolderSearch": "torchmem.results.holders",
    "HotReading": "torchmem.devices",
    "LeakReport": "torchmem.results.leaks",
    "LeakWarning": "torchmem.capture.watch",
    "Limit": "torchmem.actions.limit",
    "LimitError": "torchmem.actions.limit",
    "LiveTensor": "torchmem.results.live",
    "LiveTensorReport": "torchmem.results.live",
    "MemoryEstimate": "torchmem.results.fit",
    "MemoryStats": "torchmem.results.stats",
    "ModuleProfile": "torchmem.results.profile",
    "OOMDiagnosis": "torchmem.results.oom",
    "OOMGuard": "torchmem.actions.guard",
    "OOMInputError": "torchmem.capture.oom",
    "OOMObserver": "torchmem.capture.oom",
    "OOMRecovery": "torchmem.results.oom",
    "ProcessMemory": "torchmem.results.stats",
    "ProfileError": "torchmem.capture.profile",
    "ProfileReconciliation": "torchmem.results.profile",
    "ProfileReport": "torchmem.results.profile",
    "Profiler": "torchmem.capture.profile",
    "ReleaseError": "torchmem.actions.release",
    "ReleaseReport": "torchmem.results.release",
    "ReleasedError": "torchmem.actions.release",
    "Remaining": "torchmem.results.release",
    "Scope": "torchmem.actions.scope",
    "ScopeReport": "torchmem.results.release",
    "TorchmemError": "torchmem._errors",
    "TrackResult": "torchmem.results.track",
    "Tracker": "torchmem.capture.track",
    "TrackingError": "torchmem._errors",
    "Trial": "torchmem.actions.batch_size",
    "UnknownDeviceError": "torchmem._errors",
    "UnsupportedDeviceError": "torchmem._errors",
    "WatchError": "torchmem.capture.watch",
    "Watcher": "torchmem.capture.watch",
    "WorkingSetEntry": "torchmem.actions.limit",
    "attach_oom_observer": "torchmem.capture.oom",
    "budget": "torchmem.actions.limit",
    "counters": "torchmem.capture.read",
    "cpu_tracking": "torchmem.capture.cpu",
    "estimate": "torchmem.capture.measure",
    "explain_oom": "torchmem.capture.oom",
    "find_batch_size": "torchmem.actions.batch_size",
    "find_holders": "torchmem.analysis.holders",
    "holders": "torchmem.analysis.holders",
    "install": "torchmem.integrations.excepthook",
    "is_oom": "torchmem.analysis.oom",
    "limit": "torchmem.actions.limit",
    "live_tensors": "torchmem.capture.read",
    "oom_guard": "torchmem.actions.guard",
    "profile": "torchmem.capture.profile",
    "read_capture": "torchmem.capture.file",
    "release": "torchmem.actions.release",
    "reset_peak": "torchmem.capture.read",
    "scope": "torchmem.actions.scope",
    "stats": "torchmem.capture.read",
    "survivors": "torchmem.capture.ondemand",
    "SurvivorGroup": "torchmem.results.survivors",
    "SurvivorReport": "torchmem.results.survivors",
    "track": "torchmem.capture.track",
    "uninstall": "torchmem.integrations.excepthook",
    "watch": "torchmem.capture.watch",
    "WorkerWarning": "torchmem.capture.workers",
    "LintFinding": "torchmem.analysis.lint",
    "lint_paths": "torchmem.analysis.lint",
    "lint_source": "torchmem.analysis.lint",
    "distributed": "torchmem.integrations",
}

__all__ = [
    "BatchSizeError",
    "BatchSizeResult",
    "Breakdown",
    "BreakdownRow",
    "Budget",
    "BudgetExceededError",
    "Capture",
    "CaptureError",
    "Cause",
    "CpuTracking",
    "Culprit",
    "DeviceError",
    "DeviceFigures",
    "DeviceIndexError",
    "DeviceUnavailableError",
    "DistributedTrialError",
    "EstimateRow",
    "FitArgumentError",
    "Fix",
    "HolderPath",
    "HolderSearch",
    "HotReading",
    "LeakReport",
    "LeakWarning",
    "Limit",
    "LimitError",
    "LintFinding",
    "LiveTensor",
    "LiveTensorReport",
    "MemoryEstimate",
    "MemoryStats",
    "ModuleProfile",
    "OOMDiagnosis",
    "OOMGuard",
    "OOMInputError",
    "OOMObserver",
    "OOMRecovery",
    "ProcessMemory",
    "ProfileError",
    "ProfileReconciliation",
    "ProfileReport",
    "Profiler",
    "ReleaseError",
    "ReleaseReport",
    "ReleasedError",
    "Remaining",
    "Scope",
    "ScopeReport",
    "SurvivorGroup",
    "SurvivorReport",
    "TorchmemError",
    "TrackResult",
    "Tracker",
    "TrackingError",
    "Trial",
    "UnknownDeviceError",
    "UnsupportedDeviceError",
    "WatchError",
    "Watcher",
    "WorkerWarning",
    "WorkingSetEntry",
    "__version__",
    "attach_oom_observer",
    "budget",
    "counters",
    "cpu_tracking",
    "distributed",
    "estimate",
    "explain_oom",
    "find_batch_size",
    "find_holders",
    "holders",
    "install",
    "is_oom",
    "limit",
    "lint_paths",
    "lint_source",
    "live_tensors",
    "oom_guard",
    "profile",
    "read_capture",
    "release",
    "reset_peak",
    "scope",
    "stats",
    "survivors",
    "track",
    "uninstall",
    "watch",
]


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext torchmem``: the ``%torchmem`` / ``%%torchmem`` magics and the OOM handler for cells
    (see docs/integrations.md). Called by IPython; importing torchmem does not run it."""
    from torchmem.integrations.notebook import load

    load(ipython)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'torchmem' has no attribute {name!r}")
    if name == "distributed":  # a module: torchmem.distributed.gather_stats(), local_stats()
        value = importlib.import_module("torchmem.integrations.distributed")
    else:
        value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next access is a plain attribute read
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
