"""scope() on the CPU with real tensors, modules and autograd graphs; the ledger gives exact bytes."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import torchmem
from torchmem.actions import scope as scope_mod
from torchmem.devices import _ops as ops
from torchmem.devices import ledger


def test_cache_is_emptied_on_every_device_the_block_allocated_on_even_when_nothing_survived(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[torch.device] = []
    real = ops.empty_cache

    def recording(device: torch.device) -> bool:  # a spy: the real empty_cache still runs
        calls.append(device)
        return real(device)

    monkeypatch.setattr(ops, "empty_cache", recording)
    with torchmem.scope() as sc:
        tmp = torch.ones(4096)
        (tmp * 2).sum()
        del tmp
    assert calls == [torch.device("cpu")]
    r = sc.report
    assert r is not None
    assert r.born_bytes > 0 and r.survived_bytes == 0 and r.kept_bytes == 0
    assert r.devices == ("cpu",)


def test_a_block_that_allocates_nothing_empties_no_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[torch.device] = []

    def recording(device: torch.device) -> bool:
        calls.append(device)
        return False

    monkeypatch.setattr(ops, "empty_cache", recording)
    x = torch.ones(8)
    with torchmem.scope() as sc:
        x.add_(1)  # in place: no new storage
    assert sc.report is not None and sc.report.devices == () and calls == []


def _forward(model: torch.nn.Module) -> torch.Tensor:
    # The input and every activation are held only by the output's autograd graph.
    out: torch.Tensor = model(torch.randn(32, 64)).square().sum()
    return out


def test_keep_covers_the_autograd_graph_of_the_kept_output() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))
    with torchmem.scope() as sc:
        loss = sc.keep(_forward(model))
    r = sc.report
    assert r is not None
    assert r.survived_bytes == 0, str(r)
    assert r.survivors == ()
    # The loss, and the activations its graph saved: input (32x64), hidden (32x128, saved by ReLU and the
    # second Linear), the output (32x8, saved by square).
    assert r.kept_bytes >= 4 + (32 * 64 + 32 * 128 + 32 * 8) * 4
    loss.backward()  # the graph really is intact
    assert model[0].weight.grad is not None


def test_keep_of_a_graph_counts_a_leaf_only_the_graph_holds() -> None:
    def make() -> torch.Tensor:
        w = torch.randn(64, 64, requires_grad=True)  # a leaf created inside, held only by AccumulateGrad
        return (w * 3).sum()

    with torchmem.scope() as sc:
        out = sc.keep(make())
    r = sc.report
    assert r is not None
    assert r.survived_bytes == 0, str(r)
    assert r.kept_bytes >= 64 * 64 * 4
    del out


def test_an_unkept_graph_is_still_reported_with_its_holder() -> None:
    model = torch.nn.Linear(64, 64)
    history: list[torch.Tensor] = []
    with torchmem.scope() as sc:
        out = sc.keep(model(torch.randn(16, 64)).sum().detach())
        history.append(model(torch.randn(16, 64)).sum())  # a loss with its graph: a leak
    r = sc.report
    assert r is not None
    assert r.survived_bytes >= 16 * 64 * 4  # the saved input of the leaked graph
    assert any("history" in p for s in r.survivors for p in s.paths)
    del out


def test_a_failing_holder_search_is_reported_and_the_ledger_goes_off(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(storages: list[Any], max_paths: int = 4, time_limit: float = 2.0) -> list[tuple[str, ...]]:
        raise RuntimeError("holder search exploded")

    monkeypatch.setattr(scope_mod, "holders_of_storages", broken)
    kept_alive: list[torch.Tensor] = []
    with torchmem.scope() as sc:
        kept_alive.append(torch.ones(1000))
    r = sc.report
    assert r is not None
    assert not ledger().active and torch._C._len_torch_dispatch_stack() == 0
    assert any("holder search" in e and "exploded" in e for e in r.errors)
    assert r.survived_bytes == 4000  # the figures are still given, without paths
    assert r.survivors[0].paths == ()
    assert r.devices == ("cpu",)
    assert "error:" in str(r)


class _Unwalkable:
    """An object whose attributes cannot be read: walking it for keep() raises inside __exit__."""

    @property
    def __dict__(self) -> dict[str, Any]:  # type: ignore[override]
        raise RuntimeError("no attributes for you")


def test_a_kept_object_that_cannot_be_walked_is_reported_not_raised() -> None:
    with torchmem.scope() as sc:
        sc.keep(_Unwalkable())
        x = torch.ones(10)
    r = sc.report
    assert r is not None
    assert not ledger().active and torch._C._len_torch_dispatch_stack() == 0
    assert any("kept objects" in e for e in r.errors)
    assert r.survived_bytes == 40  # x was not recognised as kept, and that is said
    del x


def test_the_users_exception_propagates_and_the_failure_is_still_reported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(storages: list[Any], max_paths: int = 4, time_limit: float = 2.0) -> list[tuple[str, ...]]:
        raise RuntimeError("holder search exploded")

    monkeypatch.setattr(scope_mod, "holders_of_storages", broken)
    sc = torchmem.scope()
    with pytest.raises(ValueError, match="the user's own"), sc:
        t = torch.ones(100)  # noqa: F841 - held by the traceback
        raise ValueError("the user's own")
    assert not ledger().active and torch._C._len_torch_dispatch_stack() == 0
    assert sc.report is not None and any("exploded" in e for e in sc.report.errors)


def test_a_scope_can_be_reused_after_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    sc = torchmem.scope()
    monkeypatch.setattr(scope_mod, "holders_of_storages", None)  # calling it raises TypeError
    keep = []
    with sc:
        keep.append(torch.ones(3))
    assert sc.report is not None and sc.report.errors
    monkeypatch.undo()
    with sc:
        keep.append(torch.ones(5))
    assert sc.report is not None and sc.report.errors == () and sc.report.survived_bytes == 20


def test_a_scope_report_round_trips() -> None:
    from torchmem.results.release import ScopeReport

    kept = []
    with torchmem.scope() as sc:
        kept.append(torch.ones(256))  # survives without being kept: a survivor with a holder path
    r = sc.report
    assert r is not None and r.survivors
    assert ScopeReport.from_dict(r.to_dict()) == r
    assert str(ScopeReport.from_dict(r.to_dict())) == str(r)
