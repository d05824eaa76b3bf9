"""No figure in any report is ever negative: where two readings disagree, the report says so (issue 13)."""

from __future__ import annotations

import re

import numpy as np
import torch

import torchmem
from stats_data import cuda_stats
from torchmem._format import fmt_remainder

MiB = 1 << 20
_NEGATIVE = re.compile(r"(?<![\w+])-\d")


def test_a_remainder_is_never_printed_negative() -> None:
    assert fmt_remainder(-1536) == "0 B (the readings disagree by 1.50 KiB)"
    assert fmt_remainder(2048) == "2.00 KiB" and fmt_remainder(None) == "n/a"


def test_a_breakdown_whose_readings_disagree_says_so_instead_of_a_negative_row() -> None:
    # An NVML reading taken before the allocator grew: the rows add up to more than the process's usage,
    # and the device's usage is below this process's plus the others'.
    s = cuda_stats(
        allocated=900 * MiB,
        reserved=1000 * MiB,
        cached=100 * MiB,
        device_used=1200 * MiB,
        unexplained=1100 * MiB - 500 * MiB - 1000 * MiB,
    )
    b = s.breakdown()
    rest = next(r for r in b.process if r.label == "unexplained")
    assert rest.bytes == 0 and "the readings disagree by 400.00 MiB" in rest.note
    text = str(b)
    assert not _NEGATIVE.search(text), text


def test_storages_sharing_memory_are_counted_once_and_nothing_is_negative() -> None:
    # Two storages over the same memory (two tensors made from one numpy array): each tensor lists its
    # bytes, the total counts the memory once and says what was shared.
    a = np.zeros(MiB, dtype=np.float32)
    t1, t2 = torch.from_numpy(a), torch.from_numpy(a)
    assert t1.untyped_storage()._cdata != t2.untyped_storage()._cdata
    with torchmem.cpu_tracking():
        r = torchmem.live_tensors("cpu", holders=False)
    mine = [t for t in r.tensors if t.bytes == 4 * MiB]
    assert len(mine) >= 2
    assert r.aliased >= 4 * MiB
    assert r.total <= sum(t.bytes for t in r.tensors) - 4 * MiB
    assert r.unexplained is None or r.unexplained >= 0
    assert r.excess >= 0
    text = str(r)
    assert "shared by several storages (counted once in the total)" in text
    assert not _NEGATIVE.search(text.replace("1024x1024", "")), text
    del t1, t2
