"""Shared fixtures for the CPU test suite (tests/gpu has its own)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch

from torchmem.devices import ledger


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


# Modules that import a large framework (Lightning, transformers) run last: once imported, a framework's
# objects stay in the session and every garbage collection of every later test walks them (the holder
# searches and the batch-size trials collect often); the modules import it in their first test (the
# estimate tests build transformers models).
_LAST = (
    "capture/test_fake_estimate.py",
    "cli/test_estimate_cli.py",
    "integrations/test_lightning.py",
    "integrations/test_transformers.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.nodeid.split("::")[0].endswith(_LAST))  # a stable sort


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
