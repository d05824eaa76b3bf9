"""Shared fixtures for the CPU test suite (tests/gpu has its own)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest
import torch

from torchmem.devices import ledger


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: without xdist it is never called
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """The workers of ``-n auto`` (pyproject's addopts): one per core, up to 4, on a machine without a GPU;
    none (the tests run in this process, one at a time) where a CUDA GPU is present, since the GPU tests
    measure the device to the byte and must have it to themselves, or on a single core.
    ``TORCHMEM_TEST_WORKERS`` overrides."""
    forced = os.environ.get("TORCHMEM_TEST_WORKERS")
    if forced is not None:
        return int(forced)
    if torch.cuda.is_available():
        return 0
    cpus = _cpus()
    return min(cpus, 4) if cpus >= 2 else 0


# In a worker of ``-n``, torch's CPU threads share the cores with the other workers: so do those of the
# processes the tests start (``python -m torchmem run ...``, torchrun's ranks), unless the test sets its own
# (OpenMP's idle threads spin: on 2 cores a default child burned ~15 % more CPU time for the same work).
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    _threads = max(1, _cpus() // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    torch.set_num_threads(_threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(_threads))


def storage_bytes(*tensors: torch.Tensor) -> int:
    """Sum of ``untyped_storage().nbytes()`` over the distinct storages behind ``tensors``."""
    seen: dict[int, int] = {}
    for t in tensors:
        s = t.untyped_storage()
        seen[s._cdata] = s.nbytes()
    return sum(seen.values())


@pytest.fixture
def nbytes() -> Callable[..., int]:
    """The real byte size of the storages behind some tensors (views of one storage count once)."""
    return storage_bytes


@pytest.fixture(autouse=True)
def _no_leaked_tracking() -> Iterator[None]:
    """Every test starts and ends with the ledger off and no dispatch mode pushed."""
    assert not ledger().active, "a previous test left cpu_tracking on"
    assert torch._C._len_torch_dispatch_stack() == 0
    yield
    assert not ledger().active, "this test left cpu_tracking on"
    assert torch._C._len_torch_dispatch_stack() == 0


@pytest.fixture(autouse=True)
def _not_compiled_before(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts as a process torch.compile never compiled in: an earlier test in the same worker may
    have compiled (the host watcher then records no lines, so as not to make compiled code recompile), and
    the tests must not depend on which file ran before them. Compiling inside the test counts as usual."""
    import sys

    utils = sys.modules.get("torch._dynamo.utils")
    if utils is not None:
        monkeypatch.setitem(utils.counters["frames"], "total", 0)


# The order of the files (pyproject's addopts pass --no-loadscope-reorder, so that pytest-xdist hands the
# workers whole files in this order, not the largest count of tests first):
# - First, the files whose module fixtures run whole programs in child processes, longest first: started
#   first, each on a worker of its own, none is left for the end while the other workers are idle.
# - Last, the modules that import a large framework (Lightning, transformers), longest first: once
#   imported, a framework's objects stay in the session and every garbage collection of every later test
#   walks them (the holder searches and the batch-size trials collect often: four such files took 40 % more
#   CPU time after transformers and Lightning were imported); the modules import it in their first test (the
#   estimate tests build transformers models).
_FIRST = (
    "scenarios/test_run_programs.py",
    "scenarios/test_corpus.py",
    "distributed/test_ranks.py",
    "capture/test_host_kinds_cpu.py",
)
# Next to last, the files that leave the worker's heap larger for good but do not depend on its size
# themselves (or little): torch.compile's imports (inductor, networkx: ~55,000 objects), matplotlib
# (~40,000), IPython (~45,000), the linter's caches of parsed files (~50,000). Every garbage collection,
# host scan and holder search of a later test walks those objects: the files whose cost grows with the heap
# (the host watcher's scans, holder searches, leak scenarios) run before them, in a heap ~25 % smaller.
_LATE = (
    "analysis/lint/",
    "capture/test_profile.py",
    "report/test_report.py",
    "actions/test_guard.py",
    "actions/test_release.py",
    "cli/test_cli_errors.py",
)
_LAST = (
    "capture/test_fake_estimate.py",
    "cli/test_estimate_cli.py",
    "integrations/test_lightning.py",
    "integrations/test_transformers.py",
    "capture/test_short_verdicts.py",
)


def _place(item: pytest.Item) -> tuple[int, int]:
    path = "/" + item.nodeid.split("::")[0]
    for group, files in ((0, _FIRST), (2, _LATE), (3, _LAST)):
        for k, name in enumerate(files):
            if path.endswith("/" + name) or (name.endswith("/") and "/" + name in path):
                return group, k
    return 1, 0


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=_place)  # a stable sort: each file's own tests keep their order


@pytest.fixture
def unhurried_oom_holders(monkeypatch: pytest.MonkeyPatch) -> None:
    """An OOM's holder search with a time limit no loaded machine reaches, a full shared budget (what
    earlier tests' OOMs spent is theirs) and no fan-in limit: for tests that check what the search finds, not
    its bounds."""
    from torchmem.analysis.oom import holders
    from torchmem.capture import oom

    monkeypatch.setattr(holders, "TIME_LIMIT", 30.0)
    monkeypatch.setitem(oom._registry, "budget", [None, 0.0])
    # The test runner's own objects: with ~2,000 collected tests, what every item refers to (the session,
    # the config) has more referrers than the search follows per object, and a search that climbs from a
    # tensor an item's parameters hold reaches it ("stopped at its fan_in"): not what these tests check.
    from torchmem.analysis.holders import search

    monkeypatch.setattr(search, "FAN_IN", 1 << 16)
