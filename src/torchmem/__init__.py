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

from torchmem import _gc as _gc  # the objects frozen before torchmem (one counter read; see _gc)
from torchmem._version import __version__ as __version__

# The public surface, written once: each module and the public names it defines. ``__all__`` and the lazy
# loading below come from this table; the ``TYPE_CHECKING`` imports are generated from it (run
# ``python tests/test_public_surface.py`` after editing it; tests/test_public_surface.py checks they agree).
# ``import torchmem`` imports none of these modules (nor torch): each name loads its module the first time it
# is used (PEP 562), so importing torchmem costs nothing and does nothing.
_EXPORTS: dict[str, tuple[str, ...]] = {
    "torchmem._errors": (
        "DeviceError",
        "DeviceIndexError",
        "DeviceUnavailableError",
        "TorchmemError",
        "TrackingError",
        "UnknownDeviceError",
        "UnsupportedDeviceError",
    ),
    "torchmem._outputs": ("OutputError", "OutputExistsError"),
    "torchmem.actions.batch_size": (
        "BatchSizeError",
        "BatchSizeResult",
        "DistributedTrialError",
        "Trial",
        "find_batch_size",
    ),
    "torchmem.actions.guard": ("OOMGuard", "oom_guard"),
    "torchmem.actions.limit": (
        "Budget",
        "BudgetExceededError",
        "Limit",
        "LimitError",
        "WorkingSetEntry",
        "budget",
        "limit",
    ),
    "torchmem.actions.release": ("ReleaseFailedError", "ReleasedError", "release"),
    "torchmem.actions.scope": ("Scope", "scope"),
    "torchmem.analysis.estimate": ("FitArgumentError",),
    "torchmem.analysis.holders": ("HoldersTargetError", "find_holders", "holders"),
    "torchmem.analysis.oom": ("is_oom",),
    "torchmem.analysis.targets": ("UnknownTargetError",),
    "torchmem.capture.cpu": ("CpuTracking", "cpu_tracking"),
    "torchmem.capture.fake": ("FakeTensorError",),
    "torchmem.capture.file": (
        "Capture",
        "CaptureError",
        "CaptureFormatError",
        "CaptureVersionError",
        "CaptureWriteError",
        "read_capture",
    ),
    "torchmem.capture.measure": ("estimate",),
    "torchmem.capture.ondemand": ("survivors",),
    "torchmem.capture.oom": ("OOMInputError", "OOMObserver", "attach_oom_observer", "explain_oom"),
    "torchmem.capture.profile": ("ProfileError", "Profiler", "profile"),
    "torchmem.capture.read": ("counters", "live_tensors", "reset_peak", "stats"),
    "torchmem.capture.track": ("Tracker", "track"),
    "torchmem.capture.watch": ("LeakWarning", "WatchError", "Watcher", "watch"),
    "torchmem.capture.workers": ("WorkerWarning",),
    "torchmem.devices": ("HotReading",),
    "torchmem.integrations": ("distributed",),  # a module: torchmem.distributed.gather_stats(), local_stats()
    "torchmem.integrations.distributed": ("DistributedError",),
    "torchmem.integrations.excepthook": ("install", "uninstall"),
    "torchmem.lint": ("LintConfigError", "LintFinding", "lint_paths", "lint_source"),
    "torchmem.report.plot": ("PlotUnavailableError",),
    "torchmem.results._dicts": ("ResultFormatError",),
    "torchmem.results.fit": ("EstimateRow", "MemoryEstimate", "TargetEstimate"),
    "torchmem.results.gpus": ("GpuRow", "GpusReport"),
    "torchmem.results.holders": ("HolderPath", "HolderPaths", "HolderSearch", "StepKind"),
    "torchmem.results.leaks": ("Culprit", "LeakReport"),
    "torchmem.results.live": ("LiveTensor", "LiveTensorReport"),
    "torchmem.results.oom": ("Cause", "Fix", "OOMDiagnosis", "OOMRecovery"),
    "torchmem.results.profile": ("ModuleProfile", "ProfileReconciliation", "ProfileReport"),
    "torchmem.results.ranks": ("DistributedStats", "RankStats"),
    "torchmem.results.release": ("DeviceFigures", "ReleaseReport", "Remaining", "ScopeReport"),
    "torchmem.results.stats": ("Breakdown", "BreakdownRow", "MemoryStats", "ProcessMemory"),
    "torchmem.results.survivors": ("SurvivorGroup", "SurvivorReport"),
    "torchmem.results.track": ("TrackResult",),
}

if TYPE_CHECKING:
    # BEGIN generated from _EXPORTS by `python tests/test_public_surface.py`: do not edit by hand
    # isort: off
    from torchmem._errors import (
        DeviceError as DeviceError,
        DeviceIndexError as DeviceIndexError,
        DeviceUnavailableError as DeviceUnavailableError,
        TorchmemError as TorchmemError,
        TrackingError as TrackingError,
        UnknownDeviceError as UnknownDeviceError,
        UnsupportedDeviceError as UnsupportedDeviceError,
    )
    from torchmem._outputs import OutputError as OutputError, OutputExistsError as OutputExistsError
    from torchmem.actions.batch_size import (
        BatchSizeError as BatchSizeError,
        BatchSizeResult as BatchSizeResult,
        DistributedTrialError as DistributedTrialError,
        Trial as Trial,
        find_batch_size as find_batch_size,
    )
    from torchmem.actions.guard import OOMGuard as OOMGuard, oom_guard as oom_guard
    from torchmem.actions.limit import (
        Budget as Budget,
        BudgetExceededError as BudgetExceededError,
        Limit as Limit,
        LimitError as LimitError,
        WorkingSetEntry as WorkingSetEntry,
        budget as budget,
        limit as limit,
    )
    from torchmem.actions.release import (
        ReleaseFailedError as ReleaseFailedError,
        ReleasedError as ReleasedError,
        release as release,
    )
    from torchmem.actions.scope import Scope as Scope, scope as scope
    from torchmem.analysis.estimate import FitArgumentError as FitArgumentError
    from torchmem.analysis.holders import (
        HoldersTargetError as HoldersTargetError,
        find_holders as find_holders,
        holders as holders,
    )
    from torchmem.analysis.oom import is_oom as is_oom
    from torchmem.analysis.targets import UnknownTargetError as UnknownTargetError
    from torchmem.capture.cpu import CpuTracking as CpuTracking, cpu_tracking as cpu_tracking
    from torchmem.capture.fake import FakeTensorError as FakeTensorError
    from torchmem.capture.file import (
        Capture as Capture,
        CaptureError as CaptureError,
        CaptureFormatError as CaptureFormatError,
        CaptureVersionError as CaptureVersionError,
        CaptureWriteError as CaptureWriteError,
        read_capture as read_capture,
    )
    from torchmem.capture.measure import estimate as estimate
    from torchmem.capture.ondemand import survivors as survivors
    from torchmem.capture.oom import (
        OOMInputError as OOMInputError,
        OOMObserver as OOMObserver,
        attach_oom_observer as attach_oom_observer,
        explain_oom as explain_oom,
    )
    from torchmem.capture.profile import (
        ProfileError as ProfileError,
        Profiler as Profiler,
        profile as profile,
    )
    from torchmem.capture.read import (
        counters as counters,
        live_tensors as live_tensors,
        reset_peak as reset_peak,
        stats as stats,
    )
    from torchmem.capture.track import Tracker as Tracker, track as track
    from torchmem.capture.watch import (
        LeakWarning as LeakWarning,
        WatchError as WatchError,
        Watcher as Watcher,
        watch as watch,
    )
    from torchmem.capture.workers import WorkerWarning as WorkerWarning
    from torchmem.devices import HotReading as HotReading
    from torchmem.integrations import distributed as distributed
    from torchmem.integrations.distributed import DistributedError as DistributedError
    from torchmem.integrations.excepthook import install as install, uninstall as uninstall
    from torchmem.lint import (
        LintConfigError as LintConfigError,
        LintFinding as LintFinding,
        lint_paths as lint_paths,
        lint_source as lint_source,
    )
    from torchmem.report.plot import PlotUnavailableError as PlotUnavailableError
    from torchmem.results._dicts import ResultFormatError as ResultFormatError
    from torchmem.results.fit import (
        EstimateRow as EstimateRow,
        MemoryEstimate as MemoryEstimate,
        TargetEstimate as TargetEstimate,
    )
    from torchmem.results.gpus import GpuRow as GpuRow, GpusReport as GpusReport
    from torchmem.results.holders import (
        HolderPath as HolderPath,
        HolderPaths as HolderPaths,
        HolderSearch as HolderSearch,
        StepKind as StepKind,
    )
    from torchmem.results.leaks import Culprit as Culprit, LeakReport as LeakReport
    from torchmem.results.live import LiveTensor as LiveTensor, LiveTensorReport as LiveTensorReport
    from torchmem.results.oom import (
        Cause as Cause,
        Fix as Fix,
        OOMDiagnosis as OOMDiagnosis,
        OOMRecovery as OOMRecovery,
    )
    from torchmem.results.profile import (
        ModuleProfile as ModuleProfile,
        ProfileReconciliation as ProfileReconciliation,
        ProfileReport as ProfileReport,
    )
    from torchmem.results.ranks import DistributedStats as DistributedStats, RankStats as RankStats
    from torchmem.results.release import (
        DeviceFigures as DeviceFigures,
        ReleaseReport as ReleaseReport,
        Remaining as Remaining,
        ScopeReport as ScopeReport,
    )
    from torchmem.results.stats import (
        Breakdown as Breakdown,
        BreakdownRow as BreakdownRow,
        MemoryStats as MemoryStats,
        ProcessMemory as ProcessMemory,
    )
    from torchmem.results.survivors import SurvivorGroup as SurvivorGroup, SurvivorReport as SurvivorReport
    from torchmem.results.track import TrackResult as TrackResult
    # isort: on
    # END generated
else:
    _MODULE_OF: dict[str, str] = {name: module for module, names in _EXPORTS.items() for name in names}
    __all__ = sorted([*_MODULE_OF, "__version__"])

    def __getattr__(name: str) -> Any:
        module = _MODULE_OF.get(name)
        if module is None:
            raise AttributeError(f"module 'torchmem' has no attribute {name!r}")
        parent = importlib.import_module(module)
        try:
            value = getattr(parent, name)
        except AttributeError:  # a submodule its package does not import (torchmem.distributed)
            value = importlib.import_module(f"{module}.{name}")
        globals()[name] = value  # the next access is a plain attribute read
        return value

    def __dir__() -> list[str]:
        return sorted(set(globals()) | set(__all__))


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext torchmem``: the ``%torchmem`` / ``%%torchmem`` magics and the OOM handler for cells
    (see docs/integrations.md). Called by IPython; importing torchmem does not run it."""
    from torchmem.integrations.notebook import load

    load(ipython)
