"""OOM classification on allocator states shaped like ``torch.cuda.memory_snapshot()`` output.

Hand-written states cover each rule; the states recorded on a GPU by tests/gpu/make_oom_fixtures.py
(tests/data/oom_states/*.json) are checked too when present.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from torchmem.analysis.fragmentation import AllocatorState, analyze_fragmentation, round_request
from torchmem.analysis.oom import (
    PinnedTensor,
    WorkingSetItem,
    as_leak_evidence,
    diagnose,
    parse_alloc_conf,
    parse_oom_message,
)

MiB = 1 << 20
GiB = 1 << 30
STATES = Path(__file__).resolve().parent.parent / "data" / "oom_states"


def seg(
    blocks: list[tuple[int, str]], stream: int = 0, kind: str = "large", device: int = 0
) -> dict[str, Any]:
    total = sum(b for b, _ in blocks)
    alloc = sum(b for b, s in blocks if s == "active_allocated")
    active = sum(b for b, s in blocks if s != "inactive")
    return {
        "device": device,
        "address": 0,
        "total_size": total,
        "allocated_size": alloc,
        "active_size": active,
        "stream": stream,
        "segment_type": kind,
        "blocks": [{"size": b, "state": s, "requested_size": b} for b, s in blocks],
    }


def fragmented_state(**kw: Any) -> AllocatorState:
    # 8 segments of 20 MiB, each: 10 MiB in use, 10 MiB free -> 80 MiB free, largest free block 10 MiB
    segs = [seg([(10 * MiB, "active_allocated"), (10 * MiB, "inactive")]) for _ in range(8)]
    base: dict[str, Any] = {"device_total": 1 * GiB, "device_free": 0, "requested": 30 * MiB}
    base.update(kw)
    return AllocatorState.from_snapshot(segs, device_index=0, **base)


def test_state_figures_from_segments() -> None:
    s = fragmented_state()
    assert s.reserved == 160 * MiB
    assert s.allocated == 80 * MiB
    assert s.cached_free == 80 * MiB
    back = AllocatorState.from_dict(json.loads(json.dumps(s.to_dict())))
    assert back == s


def test_fragmentation_report_per_pool_and_stream() -> None:
    segs = AllocatorState.from_snapshot(
        [
            seg([(10 * MiB, "active_allocated"), (6 * MiB, "inactive"), (4 * MiB, "inactive")]),
            seg([(2 * MiB, "inactive")], kind="small"),
            seg([(20 * MiB, "inactive")], stream=7),
            seg([(1 * MiB, "active_awaiting_free"), (19 * MiB, "active_allocated")], stream=7),
        ]
    ).segments
    assert segs is not None
    r = analyze_fragmentation(segs, request=12 * MiB, device_free=4 * MiB)
    assert r.cached_free == 32 * MiB
    assert r.largest_free == 20 * MiB
    assert r.whole_free == 22 * MiB  # the small segment and the stream-7 segment are entirely free
    assert r.external_waste == 10 * MiB
    assert r.pending_free == 1 * MiB
    assert r.internal_waste == 0
    assert r.fits_now is True  # the free 20 MiB block on stream 7
    pools = {(p.pool, p.stream): p for p in r.pools}
    assert pools[("large", 0)].largest_free == 6 * MiB
    assert pools[("large", 7)].free == 20 * MiB
    assert pools[("small", 0)].free == 2 * MiB


def test_fragmentation_cause_with_state() -> None:
    s = fragmented_state()
    d = diagnose(None, s, alloc_conf="")
    assert d.is_oom
    top = d.causes[0]
    assert top.kind == "fragmentation"
    assert top.confidence == "high"
    assert top.bytes == 80 * MiB
    assert any("largest free block of the large pool is 10.00 MiB" in e for e in top.evidence)
    assert d.fragmentation is not None
    assert d.fragmentation.fits_now is False
    assert d.fragmentation.fits_after_empty_cache is False
    assert d.fragmentation.fits_with_expandable is True
    settings = [f.setting for f in d.fixes if f.kind == "alloc_conf"]
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in settings
    assert "PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:16" not in settings  # 30 MiB request: < 32 MiB, none


def test_fix_already_in_effect_is_not_suggested() -> None:
    d = diagnose(None, fragmented_state(), alloc_conf="expandable_segments:True")
    assert all((f.setting or "").split("=")[-1] != "expandable_segments:True" for f in d.fixes)
    d2 = diagnose(None, fragmented_state(requested=64 * MiB), alloc_conf="max_split_size_mb:128")
    assert not any("max_split_size_mb:64" in (f.setting or "") for f in d2.fixes)
    assert any(
        f.setting == "PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:128,expandable_segments:True"
        for f in d2.fixes
    )


def test_async_backend_gets_no_native_allocator_settings() -> None:
    d = diagnose(None, fragmented_state(), alloc_conf="backend:cudaMallocAsync")
    assert not [f for f in d.fixes if f.kind == "alloc_conf"]


def test_rocm_fixes_name_the_hip_variable() -> None:
    d = diagnose(None, fragmented_state(platform="rocm"), alloc_conf="")
    assert any((f.setting or "").startswith("PYTORCH_HIP_ALLOC_CONF=") for f in d.fixes)


def test_too_large_state() -> None:
    s = AllocatorState.from_snapshot([], device_total=16 * GiB, device_free=15 * GiB, requested=20 * GiB)
    d = diagnose(None, s, batch_size=64)
    assert d.causes[0].kind == "too_large"
    assert d.causes[0].bytes == 4 * GiB
    batch = next(f for f in d.causes[0].fixes if f.kind == "batch_size")
    assert batch.setting == "batch_size=46"  # 64 * 16/20 * 0.9


def test_other_processes_state() -> None:
    from torchmem.analysis.fragmentation import OtherProcess

    s = AllocatorState.from_snapshot(
        [seg([(2 * GiB, "active_allocated")])],
        device_total=16 * GiB,
        device_free=1 * GiB,
        process_used=2 * GiB + 500 * MiB,
        other_processes=(OtherProcess(4242, 12 * GiB, "python"),),
        requested=3 * GiB,
    )
    d = diagnose(None, s)
    assert d.causes[0].kind == "other_processes"
    assert "process 4242: 12.00 GiB" in d.causes[0].evidence
    assert d.causes[0].fixes[0].setting == "CUDA_VISIBLE_DEVICES=<free gpu index>"


def test_working_set_with_categories_suggests_a_batch() -> None:
    s = AllocatorState.from_snapshot(
        [seg([(15 * GiB, "active_allocated")])],
        device_total=16 * GiB,
        device_free=512 * MiB,
        requested=1 * GiB,
    )
    items = [
        WorkingSetItem("parameters", 3 * GiB, "parameter"),
        WorkingSetItem("gradients", 3 * GiB, "gradient"),
        WorkingSetItem("activations", 9 * GiB, "activation"),
    ]
    d = diagnose(None, s, working_set=items, batch_size=32, grad_enabled=True)
    ws = d.causes[0]
    assert ws.kind == "working_set" and ws.confidence == "high"
    kinds = [f.kind for f in ws.fixes]
    assert "checkpointing" in kinds and "zero_grad" in kinds
    batch = next(f for f in ws.fixes if f.kind == "batch_size")
    # room: 16 GiB less 0.5 GiB used outside PyTorch, less 6 GiB that does not scale = 9.5 GiB for
    # activations + request (10 GiB), at 90 % -> 32 * 0.855
    assert batch.setting == "batch_size=27"


def test_no_grad_fix_only_when_grad_was_on() -> None:
    s = AllocatorState.from_snapshot(
        [seg([(15 * GiB, "active_allocated")])], device_total=16 * GiB, device_free=0, requested=2 * GiB
    )
    assert "no_grad" in [f.kind for f in diagnose(None, s, grad_enabled=True).fixes]
    assert "no_grad" not in [f.kind for f in diagnose(None, s, grad_enabled=False).fixes]


def test_leak_trend_from_dict_and_object() -> None:
    class Culprit:
        site = "train.py:42"
        holder = "losses"
        bytes = 4 * MiB
        fix = "store loss.item(), not loss"
        kind = "retained_graph"

    class Report:
        bytes_per_step = 4 * MiB
        culprits = (Culprit(),)
        leaking = True

    for leak in (Report(), {"bytes_per_step": 4 * MiB, "culprits": [vars(Culprit) | {}], "leaking": True}):
        trend = as_leak_evidence(leak)
        assert trend is not None and trend.bytes_per_step == 4 * MiB
        d = diagnose(None, fragmented_state(), leak=leak)
        leak_cause = next(c for c in d.causes if c.kind == "leak")
        assert leak_cause.confidence == "high"
        assert any("train.py:42" in e for e in leak_cause.evidence)
    assert as_leak_evidence({"nothing": 1}) is None


def test_pinned_by_exception_ranks_first_when_it_covers_the_request() -> None:
    pinned = [PinnedTensor("sys.last_traceback -> frame train.py:42 step() local 'acts'", 2 * GiB)]
    s = AllocatorState.from_snapshot(
        [seg([(15 * GiB, "active_allocated")])], device_total=16 * GiB, device_free=0, requested=1 * GiB
    )
    d = diagnose(None, s, pinned=pinned)
    assert d.causes[0].kind == "pinned_by_exception"
    assert d.fixes[0].setting == "torchmem.release()"


def test_message_and_state_together_state_wins() -> None:
    p = parse_oom_message(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 30.00 MiB. GPU 0 has a total "
        "capacity of 1.00 GiB of which 0 bytes is free. Of the allocated memory 80.00 MiB is allocated "
        "by PyTorch, and 80.00 MiB is reserved by PyTorch but unallocated."
    )
    d = diagnose(p, fragmented_state())
    assert d.causes[0].kind == "fragmentation"
    assert d.state is not None and d.parsed is p


def test_alloc_conf_parsing() -> None:
    assert parse_alloc_conf(None) == {}
    assert parse_alloc_conf("expandable_segments:True,garbage_collection_threshold:0.6") == {
        "expandable_segments": "True",
        "garbage_collection_threshold": "0.6",
    }
    assert round_request(1) == 512


def test_garbage_collection_threshold_only_with_a_limit() -> None:
    no_limit = diagnose(None, fragmented_state(), alloc_conf="")
    assert not any("garbage_collection_threshold" in (f.setting or "") for f in no_limit.fixes)
    limited = diagnose(None, fragmented_state(limit=512 * MiB), alloc_conf="")
    assert any("garbage_collection_threshold:0.8" in (f.setting or "") for f in limited.fixes)


# --- states recorded on a GPU ------------------------------------------------------------------------------

_FIXTURES = {
    "fragmentation.json": "fragmentation",
    "too_large.json": "too_large",
    "working_set.json": "working_set",
}


@pytest.mark.parametrize("name", sorted(_FIXTURES))
def test_recorded_gpu_state(name: str) -> None:
    path = STATES / name
    if not path.exists():
        pytest.skip(f"{path} not recorded yet (run tests/gpu/make_oom_fixtures.py on a GPU)")
    data = json.loads(path.read_text())
    state = AllocatorState.from_dict(data["state"])
    parsed = parse_oom_message(data["message"])
    assert parsed is not None and parsed.is_oom
    d = diagnose(parsed, state, alloc_conf=data.get("alloc_conf") or "")
    assert d.causes[0].kind == _FIXTURES[name], str(d)
    stats = state.stats or {}
    if "reserved_bytes.all.current" in stats:
        assert state.reserved == stats["reserved_bytes.all.current"]
        assert state.allocated == stats["allocated_bytes.all.current"]


def test_a_request_that_can_never_fit_is_the_only_cause_and_gets_no_freeing_fixes() -> None:
    from torchmem.analysis.oom import diagnose, parse_oom_message

    msg = (
        "CUDA out of memory. Tried to allocate 79.18 GiB. GPU 0 has a total capacity of 79.18 GiB of which "
        "76.65 GiB is free. Including non-PyTorch memory, this process has 2.52 GiB memory in use. Of the "
        "allocated memory 2.00 GiB is allocated by PyTorch, and 0 bytes is reserved by PyTorch but "
        "unallocated."
    )
    p = parse_oom_message(msg)
    assert p is not None
    d = diagnose(p)
    assert [c.kind for c in d.causes] == ["too_large"]
    kinds = {fx.kind for fx in d.fixes}
    texts = " ".join(fx.text + (fx.setting or "") for fx in d.fixes)
    assert "zero_grad" not in texts and ".item()" not in texts, kinds
