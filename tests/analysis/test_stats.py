"""Pure arithmetic of ``build_stats`` / ``build_breakdown``, the context-probe interpretation and byte
formatting, with literal numbers (no device is read here)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from torchmem import BreakdownRow, MemoryStats, ProcessMemory
from torchmem._format import fmt_bytes, fmt_ratio
from torchmem.analysis.stats import build_breakdown, build_stats
from torchmem.devices._context import ContextEstimate, interpret

GiB = 1 << 30
MiB = 1 << 20

ALLOCATOR = {
    "allocated_bytes.all.current": 600 * MiB,
    "reserved_bytes.all.current": 1000 * MiB,
    "active_bytes.all.current": 650 * MiB,
    "requested_bytes.all.current": 590 * MiB,
    "inactive_split_bytes.all.current": 100 * MiB,
    "allocated_bytes.all.peak": 900 * MiB,
    "reserved_bytes.all.peak": 1200 * MiB,
    "num_ooms": 1,
    "num_alloc_retries": 2,
}


def _cuda(**kw: Any) -> MemoryStats:
    args: dict[str, Any] = {
        "device": "cuda:0",
        "platform": "cuda",
        "name": "Test GPU",
        "timestamp": 1700000000.0,
        "allocator": ALLOCATOR,
    }
    args.update(kw)
    return build_stats(**args)


# -- build_stats ---------------------------------------------------------------------------------------


def test_allocator_figures_are_read_by_key() -> None:
    s = _cuda()
    assert s.allocated == 600 * MiB
    assert s.reserved == 1000 * MiB
    assert s.active == 650 * MiB
    assert s.requested == 590 * MiB
    assert s.fragmented == 100 * MiB
    assert s.peak_allocated == 900 * MiB
    assert s.peak_reserved == 1200 * MiB
    assert s.num_ooms == 1
    assert s.alloc_retries == 2
    assert (s.device, s.platform, s.name, s.timestamp) == ("cuda:0", "cuda", "Test GPU", 1700000000.0)


def test_cached_is_reserved_minus_allocated_and_fragmentation_is_split_share() -> None:
    s = _cuda()
    assert s.cached == 400 * MiB
    assert s.fragmentation == pytest.approx(0.25)
    assert isinstance(s.fragmentation, float)


def test_zero_cache_gives_zero_fragmentation() -> None:
    alloc = dict(ALLOCATOR)
    alloc["reserved_bytes.all.current"] = alloc["allocated_bytes.all.current"]
    alloc["inactive_split_bytes.all.current"] = 0
    s = _cuda(allocator=alloc)
    assert s.cached == 0
    assert s.fragmentation == 0.0


def test_missing_keys_stay_none_and_propagate() -> None:
    alloc = {"allocated_bytes.all.current": 10}
    s = _cuda(allocator=alloc, process_used=100, context=5)
    assert s.allocated == 10
    assert s.reserved is None
    assert s.cached is None
    assert s.fragmented is None
    assert s.fragmentation is None
    assert s.num_ooms is None
    assert s.non_torch is None
    assert s.unexplained is None


def test_no_allocator_uses_hot_and_none_never_becomes_zero() -> None:
    s = build_stats(
        device="mps:0",
        platform="mps",
        name=None,
        timestamp=1.0,
        allocator=None,
        hot=(None, None, None, None, None),
    )
    for f in (
        "allocated",
        "reserved",
        "active",
        "requested",
        "cached",
        "fragmented",
        "fragmentation",
        "peak_allocated",
        "peak_reserved",
        "num_ooms",
        "alloc_retries",
        "device_total",
        "device_free",
        "device_used",
        "process_used",
        "context",
        "non_torch",
        "unexplained",
        "other_processes",
        "pinned_host",
    ):
        assert getattr(s, f) is None, f
    assert s.other_allocators == {}


def test_no_allocator_and_no_hot_is_all_none() -> None:
    s = build_stats(device="x", platform="xpu", name=None, timestamp=0.0, allocator=None)
    assert (s.allocated, s.reserved, s.active, s.peak_allocated, s.peak_reserved) == (None,) * 5


def test_hot_figures_without_allocator() -> None:
    s = build_stats(
        device="mps:0",
        platform="mps",
        name=None,
        timestamp=1.0,
        allocator=None,
        hot=(300, 500, None, None, None),
        process_used=800,
    )
    assert (s.allocated, s.reserved, s.active) == (300, 500, None)
    assert s.cached == 200
    assert s.fragmentation is None  # no split figure from this backend
    assert s.requested is None and s.num_ooms is None
    assert s.non_torch == 300


def test_empty_allocator_dict_means_nothing_initialised_so_zeros() -> None:
    s = _cuda(allocator={})
    assert (s.allocated, s.reserved, s.active, s.requested, s.fragmented) == (0, 0, 0, 0, 0)
    assert (s.peak_allocated, s.peak_reserved, s.num_ooms, s.alloc_retries) == (0, 0, 0, 0)
    assert s.cached == 0
    assert s.fragmentation == 0.0


def test_mem_info_wins_over_nvml() -> None:
    s = _cuda(mem_info=(3 * GiB, 80 * GiB), nvml_total=81 * GiB, nvml_used=70 * GiB)
    assert s.device_total == 80 * GiB
    assert s.device_free == 3 * GiB
    assert s.device_used == 77 * GiB


def test_nvml_fallback_when_mem_info_unknown() -> None:
    s = _cuda(mem_info=None, nvml_total=80 * GiB, nvml_used=30 * GiB)
    assert s.device_total == 80 * GiB
    assert s.device_used == 30 * GiB
    assert s.device_free == 50 * GiB


@pytest.mark.parametrize(("total", "used"), [(80 * GiB, None), (None, 30 * GiB), (None, None)])
def test_partial_nvml_gives_no_device_figures(total: int | None, used: int | None) -> None:
    s = _cuda(mem_info=None, nvml_total=total, nvml_used=used)
    assert (s.device_total, s.device_free, s.device_used) == (None, None, None)


def test_non_torch_and_unexplained_arithmetic() -> None:
    s = _cuda(
        process_used=2000 * MiB, context=500 * MiB, other_allocators={"cupy": 64 * MiB, "jax": 36 * MiB}
    )
    assert s.non_torch == 1000 * MiB  # process - reserved
    assert s.unexplained == 2000 * MiB - 500 * MiB - 1000 * MiB - 100 * MiB
    assert s.other_allocators == {"cupy": 64 * MiB, "jax": 36 * MiB}


def test_unexplained_is_none_without_a_context_estimate() -> None:
    s = _cuda(process_used=2000 * MiB, context=None)
    assert s.non_torch == 1000 * MiB
    assert s.unexplained is None


def test_unknown_process_usage_propagates() -> None:
    s = _cuda(process_used=None, context=500 * MiB)
    assert s.non_torch is None
    assert s.unexplained is None


def test_unexplained_may_be_negative() -> None:
    s = _cuda(process_used=1200 * MiB, context=500 * MiB)
    assert s.unexplained == -300 * MiB


def test_cpu_platform_has_no_non_torch_or_unexplained() -> None:
    s = build_stats(
        device="cpu",
        platform="cpu",
        name="CPU",
        timestamp=1.0,
        allocator=None,
        hot=(4096, None, None, 8192, None),
        mem_info=(6 * GiB, 16 * GiB),
        process_used=300 * MiB,
    )
    assert s.allocated == 4096 and s.peak_allocated == 8192
    assert s.reserved is None and s.cached is None
    assert s.non_torch is None and s.unexplained is None
    assert (s.device_total, s.device_free, s.device_used) == (16 * GiB, 6 * GiB, 10 * GiB)


def test_other_processes_used() -> None:
    s = _cuda(other_processes=(ProcessMemory(1, "a", 100), ProcessMemory(2, None, 250)))
    assert s.other_processes_used == 350
    s = _cuda(other_processes=(ProcessMemory(1, "a", 100), ProcessMemory(2, "b", None)))
    assert s.other_processes_used is None
    assert _cuda(other_processes=None).other_processes_used is None
    assert _cuda(other_processes=()).other_processes_used == 0


def test_memory_stats_is_frozen() -> None:
    s = _cuda()
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.allocated = 0  # type: ignore[misc]


# -- build_breakdown -----------------------------------------------------------------------------------


def _sum_rows(rows: tuple[BreakdownRow, ...]) -> int:
    return sum(r.bytes for r in rows if r.bytes is not None)


def test_breakdown_rows_sum_exactly_to_process_used() -> None:
    s = _cuda(
        process_used=2000 * MiB + 7,
        context=500 * MiB,
        context_method="nvml-process",
        other_allocators={"cupy": 64 * MiB},
    )
    b = build_breakdown(s)
    assert b == s.breakdown()
    labels = [r.label for r in b.process]
    assert labels == ["CUDA context (estimate)", "PyTorch reserved", "cupy memory pool", "unexplained"]
    assert all(r.bytes is not None for r in b.process)
    assert _sum_rows(b.process) == b.process_used == 2000 * MiB + 7
    context_row, torch_row, cupy_row, rest = b.process
    assert context_row.bytes == 500 * MiB and "per PID" in context_row.note
    assert cupy_row.bytes == 64 * MiB
    assert rest.bytes == 2000 * MiB + 7 - 500 * MiB - 1000 * MiB - 64 * MiB
    # PyTorch reserved = allocated + cached; the split part is inside the cache.
    assert torch_row.bytes == 1000 * MiB
    allocated_row, cached_row = torch_row.children
    assert allocated_row.bytes + cached_row.bytes == torch_row.bytes  # type: ignore[operator]
    assert cached_row.bytes == 400 * MiB
    (split_row,) = cached_row.children
    assert split_row.bytes == 100 * MiB and split_row.note == "25% of the cache"


def test_breakdown_without_context_folds_it_into_unexplained() -> None:
    s = _cuda(process_used=2000 * MiB, context=None, other_allocators={"cupy": 24 * MiB})
    b = build_breakdown(s)
    assert b.process[0].bytes is None
    assert b.process[-1].label == "context + unexplained"
    assert b.process[-1].bytes == 2000 * MiB - 1000 * MiB - 24 * MiB
    assert _sum_rows(b.process) == 2000 * MiB


def test_breakdown_device_side_other_processes_and_unattributed() -> None:
    others = (ProcessMemory(11, "python", 3 * GiB), ProcessMemory(12, None, 1 * GiB))
    s = _cuda(process_used=2 * GiB, mem_info=(70 * GiB, 80 * GiB), other_processes=others)
    b = build_breakdown(s)
    assert b.device_used == 10 * GiB
    assert b.device_total == 80 * GiB
    assert b.other_processes == others
    assert b.unattributed == 10 * GiB - 2 * GiB - 4 * GiB
    assert b.process_used + sum(p.used for p in others) + b.unattributed == b.device_used  # type: ignore[operator,misc]


def test_breakdown_unattributed_unknown_when_any_other_process_is_unknown() -> None:
    others = (ProcessMemory(11, "python", 3 * GiB), ProcessMemory(12, None, None))
    s = _cuda(process_used=2 * GiB, mem_info=(70 * GiB, 80 * GiB), other_processes=others)
    assert build_breakdown(s).unattributed is None
    s = _cuda(process_used=2 * GiB, mem_info=(70 * GiB, 80 * GiB), other_processes=None)
    assert build_breakdown(s).unattributed is None


def test_breakdown_with_unknown_process_usage_says_so() -> None:
    s = _cuda(process_used=None, mem_info=(70 * GiB, 80 * GiB), other_processes=())
    b = build_breakdown(s)
    assert b.process_used is None
    assert b.unattributed is None
    assert b.process[-1].bytes is None
    assert any("cannot be reconciled" in n for n in b.notes)


def test_cpu_breakdown() -> None:
    s = build_stats(
        device="cpu",
        platform="cpu",
        name="CPU",
        timestamp=1.0,
        allocator=None,
        hot=(None, None, None, None, None),
        mem_info=(6 * GiB, 16 * GiB),
        process_used=300 * MiB,
        notes=("tracking is off",),
    )
    b = s.breakdown()
    assert [r.bytes for r in b.process] == [300 * MiB, None]
    assert "cpu_tracking" in b.process[1].note
    assert b.process_used == 300 * MiB
    assert b.device_used == 10 * GiB and b.device_total == 16 * GiB
    assert b.other_processes is None and b.unattributed is None
    assert b.notes == ("tracking is off",)


def test_to_dict_is_json_serialisable() -> None:
    s = _cuda(
        process_used=2 * GiB,
        context=500 * MiB,
        context_method="nvml-device-delta",
        other_allocators={"cupy": 1},
        other_processes=(ProcessMemory(5, "x", 10), ProcessMemory(6, None, None)),
        notes=("a note",),
    )
    d = s.to_dict()
    assert json.loads(json.dumps(d)) == d
    assert d["other_processes"] == [
        {"pid": 5, "name": "x", "used": 10, "relation": "", "parent": None},
        {"pid": 6, "name": None, "used": None, "relation": "", "parent": None},
    ]
    assert d["notes"] == ["a note"]
    assert d["other_allocators"] == {"cupy": 1}
    assert d["cached"] == 400 * MiB
    assert set(d) == {f.name for f in dataclasses.fields(MemoryStats)}
    bd = s.breakdown().to_dict()
    assert json.loads(json.dumps(bd)) == bd
    assert bd["process"][1]["children"][1]["children"][0]["bytes"] == 100 * MiB
    assert bd["other_processes"][1] == {"pid": 6, "name": None, "used": None, "relation": "", "parent": None}


def test_to_dict_keeps_none() -> None:
    s = build_stats(device="cpu", platform="cpu", name=None, timestamp=0.0, allocator=None)
    d = s.to_dict()
    assert d["allocated"] is None and d["other_processes"] is None
    assert json.loads(json.dumps(d))["allocated"] is None


def test_str_shows_na_for_none() -> None:
    s = _cuda(process_used=None)
    text = str(s)
    assert text.splitlines()[0] == "cuda:0 (Test GPU)"
    assert "n/a" in text
    assert "600.00 MiB" in text and "400.00 MiB" in text
    assert "1 / 2" in text  # OOMs / retries
    cpu = build_stats(device="cpu", platform="cpu", name=None, timestamp=0.0, allocator=None)
    assert str(cpu).count("n/a") == 5
    b = str(s.breakdown())
    assert "n/a" in b and "PyTorch reserved" in b


# -- context-probe interpretation ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"self": 500 * MiB}, ContextEstimate(500 * MiB, "nvml-process")),
        ({"self": 500 * MiB, "before": 0, "after": 900 * MiB}, ContextEstimate(500 * MiB, "nvml-process")),
        ({"before": 100 * MiB, "after": 600 * MiB}, ContextEstimate(500 * MiB, "nvml-device-delta")),
        ({"self": 0, "before": 100, "after": 700}, ContextEstimate(600, "nvml-device-delta")),
        ({"before": 600, "after": 600}, None),
        ({"before": 700, "after": 600}, None),
        ({"before": 100}, None),
        ({"after": 100}, None),
        ({"nvml_error": "NVMLError_LibraryNotFound", "used_after": 500 * MiB}, None),
        ({"self": "500", "before": "1", "after": "2"}, None),
        ({}, None),
    ],
)
def test_interpret(data: dict[str, int | str], expected: ContextEstimate | None) -> None:
    assert interpret(data) == expected


# -- formatting ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "signed", "text"),
    [
        (None, False, "n/a"),
        (None, True, "n/a"),
        (0, False, "0 B"),
        (0, True, "0 B"),
        (1, False, "1 B"),
        (1023, False, "1023 B"),
        (1024, False, "1.00 KiB"),
        (1536, False, "1.50 KiB"),
        (MiB, False, "1.00 MiB"),
        (12 * MiB, True, "+12.00 MiB"),
        (-4096, False, "-4.00 KiB"),
        (-4096, True, "-4.00 KiB"),
        (5, True, "+5 B"),
        (3 * GiB, False, "3.00 GiB"),
        (1 << 40, False, "1.00 TiB"),
        (1 << 50, False, "1024.00 TiB"),
    ],
)
def test_fmt_bytes(n: int | None, signed: bool, text: str) -> None:
    assert fmt_bytes(n, signed=signed) == text


def test_fmt_ratio() -> None:
    assert fmt_ratio(None) == "n/a"
    assert fmt_ratio(0.25) == "25.0%"
    assert fmt_ratio(0.0) == "0.0%"
