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

from torchmem._errors import (
    DeviceError,
    DeviceIndexError,
    DeviceUnavailableError,
    TorchmemError,
    TrackingError,
    UnknownDeviceError,
    UnsupportedDeviceError,
)
from torchmem._version import __version__
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
from torchmem.analysis.oom import is_oom
from torchmem.capture.cpu import CpuTracking, cpu_tracking
from torchmem.capture.file import Capture, CaptureError, read_capture
from torchmem.capture.measure import estimate
from torchmem.capture.oom import OOMInputError, OOMObserver, attach_oom_observer, explain_oom
from torchmem.capture.profile import ProfileError, Profiler, profile
from torchmem.capture.read import counters, live_tensors, reset_peak, stats
from torchmem.capture.track import Tracker, track
from torchmem.capture.watch import LeakWarning, Watcher, WatchError, watch
from torchmem.devices import HotReading
from torchmem.integrations.excepthook import install, uninstall
from torchmem.results.fit import EstimateRow, MemoryEstimate
from torchmem.results.holders import HolderPath, HolderSearch
from torchmem.results.leaks import Culprit, LeakReport
from torchmem.results.live import LiveTensor, LiveTensorReport
from torchmem.results.oom import Cause, Fix, OOMDiagnosis, OOMRecovery
from torchmem.results.profile import ModuleProfile, ProfileReconciliation, ProfileReport
from torchmem.results.release import DeviceFigures, ReleaseReport, Remaining, ScopeReport
from torchmem.results.stats import Breakdown, BreakdownRow, MemoryStats, ProcessMemory
from torchmem.results.track import TrackResult

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
    "TorchmemError",
    "TrackResult",
    "Tracker",
    "TrackingError",
    "Trial",
    "UnknownDeviceError",
    "UnsupportedDeviceError",
    "WatchError",
    "Watcher",
    "WorkingSetEntry",
    "__version__",
    "attach_oom_observer",
    "budget",
    "counters",
    "cpu_tracking",
    "estimate",
    "explain_oom",
    "find_batch_size",
    "find_holders",
    "holders",
    "install",
    "is_oom",
    "limit",
    "live_tensors",
    "oom_guard",
    "profile",
    "read_capture",
    "release",
    "reset_peak",
    "scope",
    "stats",
    "track",
    "uninstall",
    "watch",
]
