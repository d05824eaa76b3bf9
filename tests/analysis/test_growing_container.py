"""Which container grows decides cache vs accumulation (issue 26): the container whose key differs between
the kept storages' holder paths. A list of per-step records (``history[9]['dists']``) accumulates; a dict
keyed by a string that never repeats (``cache['e3-b7']``) is a cache; a dict of fixed keys holding growing
lists (``history['loss'][12]``) accumulates. Real objects, real holder searches."""

from __future__ import annotations

from typing import Any

import torch

from torchmem.analysis.culprits import attribute
from torchmem.analysis.holders.survivors import holder_paths_of_storages
from torchmem.results.leaks import SiteGrowth

MiB = 1 << 20


class Trainer:
    def __init__(self) -> None:
        self.records = [{"dists": torch.randn(128, 128)} for _ in range(5)]
        self.by_key = {f"e{i}-b{i * 7}": torch.randn(128, 128) for i in range(5)}
        self.by_name = {"loss": [torch.randn(128, 128) for _ in range(5)]}


trainer = Trainer()


def _kind(storages: list[Any]) -> Any:
    found = holder_paths_of_storages(storages)
    paths = tuple(p for ps in found for p in ps[:1])
    assert len(paths) == len(storages), found
    (c,) = attribute([SiteGrowth("train.py:3", float(MiB), 5 * MiB, 5, 1.0, paths)], device="cpu")
    return c


def test_a_list_of_records_accumulates() -> None:
    c = _kind([r["dists"].untyped_storage() for r in trainer.records[-3:]])
    assert c.kind == "device_accumulation", c
    assert "`trainer.records` accumulates" in c.fix, c.fix


def test_a_dict_keyed_by_new_strings_is_a_cache() -> None:
    c = _kind([t.untyped_storage() for t in list(trainer.by_key.values())[-3:]])
    assert c.kind == "cache", c
    assert "the cache `trainer.by_key` never evicts" in c.fix, c.fix


def test_a_dict_of_lists_accumulates() -> None:
    c = _kind([t.untyped_storage() for t in trainer.by_name["loss"][-3:]])
    assert c.kind == "device_accumulation", c
