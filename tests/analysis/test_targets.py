"""The target table, the caching allocator's rounding and the sharding arithmetic (pure)."""

from __future__ import annotations

import pytest

from torchmem.analysis.estimate import FitArgumentError
from torchmem.analysis.targets import (
    TARGETS,
    Target,
    UnknownTargetError,
    attention_backend,
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


def test_every_named_gpu_has_its_compute_capability_and_a_size_is_a_generic_gpu() -> None:
    assert resolve_target("H100").sm == (9, 0) and resolve_target("T4").sm == (7, 5)
    assert all(t.sm is not None for t in TARGETS.values())
    assert resolve_target("24GiB").sm == (8, 0)
    assert Target("bare", 1 << 30, 0, 0, 0).sm is None  # CPU kernel choices (the CPU-ledger comparisons)


def test_training_holds_the_forward_and_the_backward_threads_workspaces() -> None:
    h100 = resolve_target("H100")
    assert h100.workspaces(False) == 32 << 20
    assert h100.workspaces(True) == 64 << 20
    assert resolve_target("A100-40GB").workspaces(False) == 8 * 2**20 + 128 * 1024


_ATT = {
    "q_heads": 12,
    "kv_heads": 12,
    "head_dim": 64,
    "v_head_dim": 64,
    "q_len": 512,
    "kv_len": 512,
    "mask": False,
    "causal": True,
    "grad": True,
}


@pytest.mark.parametrize(
    ("sm", "dtype", "change", "backend"),
    [
        ((9, 0), "float32", {}, "efficient"),  # no fp32 flash: the memory-efficient kernel
        ((9, 0), "bfloat16", {}, "flash"),
        ((9, 0), "float16", {"mask": True, "causal": False}, "efficient"),  # flash takes no mask
        ((9, 0), "bfloat16", {"kv_heads": 4}, "flash"),  # flash takes grouped-query heads
        ((9, 0), "float32", {"kv_heads": 4}, "math"),  # ... the efficient kernel does not (torch <= 2.11)
        ((9, 0), "bfloat16", {"head_dim": 320, "v_head_dim": 320}, "efficient"),
        ((9, 0), "float32", {"head_dim": 66, "v_head_dim": 66}, "math"),  # not GEMM-aligned
        ((9, 0), "bfloat16", {"q_len": 1}, "efficient"),  # causal over unequal lengths: not flash
        ((8, 9), "bfloat16", {"head_dim": 256, "v_head_dim": 256}, "efficient"),  # sm89 training: <= 192
        ((8, 9), "bfloat16", {"head_dim": 256, "v_head_dim": 256, "grad": False}, "flash"),
        ((7, 5), "float16", {}, "efficient"),  # T4: no flash before sm80
        ((7, 5), "bfloat16", {}, "math"),  # ... and no fused kernel for bf16
        ((7, 0), "float32", {"head_dim": 66, "v_head_dim": 66}, "efficient"),  # no alignment rule pre-TC
        ((9, 0), "float64", {}, "math"),
    ],
)
def test_attention_backend_follows_the_cuda_dispatch_rules(
    sm: tuple[int, int], dtype: str, change: dict[str, object], backend: str
) -> None:
    args = {**_ATT, **change}
    assert attention_backend(sm, dtype=dtype, **args) == backend  # type: ignore[arg-type]


def test_a_strided_mask_or_input_takes_the_math_path() -> None:
    # every fused kernel needs stride 1 in the last dimension of q, k, v and the mask
    # (check_last_dim_stride_equals_1_dense): T5's position bias under transformers 5.17 is a permuted
    # embedding; the H100 took the math path for it (its saved scores and probabilities measured).
    common = {
        "dtype": "float32",
        "q_heads": 8,
        "kv_heads": 8,
        "head_dim": 64,
        "v_head_dim": 64,
        "q_len": 256,
        "kv_len": 256,
        "mask": True,
        "causal": False,
        "grad": True,
    }
    assert attention_backend((9, 0), **common) == "efficient"
    assert attention_backend((9, 0), **common, last_dim_contiguous=False) == "math"
