"""The metric-state culprit (issue 26): tensors kept in a list attribute of a metric-like object — its class
computes a result from what it collects (``compute``) and can empty it (``reset``/``clear``) — are named as
that object's state with the fix ``metric.reset()`` after each ``compute()``; a list of an object that cannot
be reset, or that computes nothing, keeps today's accumulation fix. The holder paths come from real holder
searches on real objects."""

from __future__ import annotations

from typing import Any

import torch

from torchmem.analysis.culprits import attribute
from torchmem.analysis.holders.survivors import holder_paths_of_storages
from torchmem.results.leaks import SiteGrowth

MiB = 1 << 20


class Metric:
    def __init__(self) -> None:
        self.scores: list[torch.Tensor] = []

    def update(self, x: torch.Tensor) -> None:
        self.scores.append(x)

    def compute(self) -> torch.Tensor:
        return torch.cat(self.scores).mean()

    def reset(self) -> None:
        self.scores = []


class ClearedMetric(Metric):
    reset = None  # type: ignore[assignment]

    def clear(self) -> None:
        self.scores = []


class NoReset:
    """Computes, but has no way to empty what it keeps."""

    def __init__(self) -> None:
        self.scores: list[torch.Tensor] = []

    def compute(self) -> torch.Tensor:
        return torch.cat(self.scores).mean()


class NoCompute:
    """Can be reset, but computes nothing from what it keeps (a recorder, not a metric)."""

    def __init__(self) -> None:
        self.scores: list[torch.Tensor] = []

    def reset(self) -> None:
        self.scores = []


def _fill(holder: Any) -> Any:
    for _ in range(4):
        holder.scores.append(torch.randn(256, 256))
    return holder.scores[-1].untyped_storage()


def _culprit_of(storage: Any) -> Any:
    (paths,) = holder_paths_of_storages([storage])
    assert paths, "the holder search found no path"
    growth = SiteGrowth(
        site="eval.py:9",
        bytes_per_step=float(MiB),
        live_bytes=4 * MiB,
        storages=4,
        storages_per_step=1.0,
        paths=paths,
    )
    (c,) = attribute([growth], device="cpu")
    return c


# module globals: what a script's top level makes
auroc = Metric()
recall = ClearedMetric()
plain = NoReset()
recorder = NoCompute()


def test_a_metric_that_is_never_reset_is_named_with_its_reset() -> None:
    c = _culprit_of(_fill(auroc))
    assert c.kind == "metric_state", c
    assert "`auroc.reset()` after each `compute()`" in c.fix and "`auroc.scores`" in c.fix, c.fix


def test_a_metric_emptied_by_clear_gets_clear() -> None:
    c = _culprit_of(_fill(recall))
    assert c.kind == "metric_state", c
    assert "`recall.clear()`" in c.fix, c.fix


def test_a_metric_kept_in_a_local_is_named_by_the_local() -> None:
    metric = Metric()
    c = _culprit_of(_fill(metric))
    assert c.kind == "metric_state" and "`metric.reset()`" in c.fix, c.fix


def test_without_a_reset_or_without_compute_it_is_no_metric_state() -> None:
    for name in ("plain", "recorder"):
        c = _culprit_of(_fill(globals()[name]))
        assert c.kind == "device_accumulation", (name, c)
        assert "reset()" not in c.fix, c.fix


def test_a_plain_list_keeps_the_accumulation_fix() -> None:
    kept: list[torch.Tensor] = [torch.randn(256, 256) for _ in range(4)]
    (paths,) = holder_paths_of_storages([kept[-1].untyped_storage()])
    growth = SiteGrowth("eval.py:9", float(MiB), 4 * MiB, 4, 1.0, paths)
    (c,) = attribute([growth], device="cpu")
    assert c.kind == "device_accumulation" and "reset" not in c.fix, c


class TwoStates(Metric):
    def __init__(self) -> None:
        super().__init__()
        self.targets: list[torch.Tensor] = []


pair = TwoStates()


def test_the_states_of_one_metric_are_one_culprit() -> None:
    for _ in range(4):
        pair.scores.append(torch.randn(256, 256))
        pair.targets.append(torch.randn(128, 256))
    (scores,) = holder_paths_of_storages([pair.scores[-1].untyped_storage()])
    (targets,) = holder_paths_of_storages([pair.targets[-1].untyped_storage()])
    growth = [
        SiteGrowth("eval.py:9", float(MiB), 4 * MiB, 4, 1.0, scores),
        SiteGrowth("eval.py:10", MiB / 2, 2 * MiB, 4, 1.0, targets),
    ]
    (c,) = attribute(growth, device="cpu")
    assert c.kind == "metric_state" and c.bytes_per_step == 1.5 * MiB, c
    assert [s for s, _ in c.sites] == ["eval.py:9", "eval.py:10"], c.sites
    assert "`pair.scores` and `pair.targets`" in c.fix and "`pair.reset()`" in c.fix, c.fix
