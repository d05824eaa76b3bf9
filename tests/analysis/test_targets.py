"""The target table, the caching allocator's rounding and the sharding arithmetic (pure)."""

from __future__ import annotations

import pytest

from torchmem.analysis.estimate import FitArgumentError
from torchmem.analysis.targets import (
    TARGETS,
    UnknownTargetError,
    reserved_for,
    resolve_target,
    round_block,
    segment_size,
    shard,
)


@pytest.mark.parametrize(
    ("alias", "name"),
    [
        ("H100-80GB", "H100-80GB"),
        ("h100", "H100-80GB"),
        ("NVIDIA H100 80GB HBM3", "H100-80GB"),
        ("A100-40GB", "A100-40GB"),
        ("a100 80gb", "A100-80GB"),
        ("L4", "L4"),
        ("T4", "T4"),
        ("RTX4090", "RTX4090"),
        ("NVIDIA GeForce RTX 4090", "RTX4090"),
        ("H200", "H200"),
    ],
)
def test_aliases(alias: str, name: str) -> None:
    assert resolve_target(alias).name == name


def test_h100_figures_are_this_projects_measurement() -> None:
    t = TARGETS["H100-80GB"]
    assert t.measured and t.context == 518 << 20 and t.overhead == 742 << 20
    assert round(t.total / 2**30, 2) == 79.18
    assert all(not x.measured for n, x in TARGETS.items() if n != "H100-80GB")
    assert all(x.total > x.overhead > 0 for x in TARGETS.values())


def test_sizes_and_unknown_names() -> None:
    assert resolve_target("24GiB").total == 24 << 30
    with pytest.raises(UnknownTargetError, match="Unknown target") as info:
        resolve_target("B9000")
    assert "H100-80GB" in info.value.hint


def test_allocator_rounding() -> None:
    assert [round_block(n) for n in (0, 1, 512, 513, 4096 + 1)] == [0, 512, 512, 1024, 4608]
    assert segment_size(1) == 2 << 20 and segment_size(1 << 20) == 2 << 20
    assert segment_size((1 << 20) + 1) == 20 << 20 and segment_size(9 << 20) == 20 << 20
    assert segment_size(11 << 20) == 12 << 20 and segment_size((10 << 20) + 1) == 12 << 20
    assert reserved_for(1000, 0.1) == 1100


def test_sharding_arithmetic() -> None:
    kw = {"parameters": 800, "gradients": 800, "optimizer_state": 1600, "largest_unit": 100, "root_unit": 50}
    assert shard("none", 8, **kw) == shard("ddp", 1, **kw)
    ddp = shard("ddp", 8, **kw)
    assert (ddp.parameters, ddp.gradients, ddp.optimizer_state, ddp.reduce) == (800, 800, 1600, 800)
    assert ddp.nccl > 0
    z1, z2, z3 = (shard(s, 8, **kw) for s in ("zero1", "zero2", "zero3"))
    assert (z1.parameters, z1.gradients, z1.optimizer_state) == (800, 800, 200)
    assert (z2.parameters, z2.gradients, z2.optimizer_state, z2.reduce) == (800, 100, 200, 100)
    assert (z3.parameters, z3.gradients, z3.optimizer_state) == (100, 100, 200)
    assert z3.gather == 50 + 3 * 100 and z3 == shard("fsdp", 8, **kw)
    odd = shard("fsdp", 3, **{**kw, "parameters": 10})
    assert odd.parameters == 4  # padded up
    with pytest.raises(FitArgumentError):
        shard("tp", 2, **kw)
