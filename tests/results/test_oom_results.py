"""The OOM diagnosis's result types read back from their stored form: ``T.from_dict(x.to_dict()) == x`` on
real diagnoses (every message of the corpus, the allocator states recorded on a GPU, a real CPU out-of-memory
error, memory pinned by a real old traceback), through JSON as a capture file stores them, and ``str()`` is
the text ``torchmem explain`` prints."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import torchmem
from torchmem.analysis.fragmentation import analyze_fragmentation
from torchmem.analysis.oom import as_leak_evidence, diagnose, parse_oom_message
from torchmem.capture.oom import explain_oom, pinned_tensors
from torchmem.results._dicts import ResultFormatError
from torchmem.results.oom import (
    AllocatorState,
    Cause,
    Fix,
    FragmentationReport,
    LeakEvidence,
    MachineMemory,
    OOMDiagnosis,
    OtherProcess,
    ParsedOOM,
    PinnedTensor,
    WorkingSetItem,
    render_diagnosis,
    render_fields,
)

DATA = Path(__file__).resolve().parent.parent / "data"
MESSAGES = sorted((DATA / "oom_messages").glob("*.txt"))
STATES = sorted((DATA / "oom_states").glob("*.json"))
MiB = 1 << 20
GiB = 1 << 30


def _body(path: Path) -> str:
    return "\n".join(ln for ln in path.read_text().splitlines() if not ln.startswith("# "))


def _stored(obj: Any) -> Any:
    """``obj.to_dict()`` as a capture file holds it: through JSON."""
    return json.loads(json.dumps(obj.to_dict()))


@pytest.mark.parametrize("path", MESSAGES, ids=lambda p: p.stem)
def test_every_corpus_diagnosis_round_trips(path: Path) -> None:
    parsed = parse_oom_message(_body(path))
    if parsed is None:  # not a memory error: the documented no-op diagnosis
        d = explain_oom(_body(path))
        assert not d.is_oom and OOMDiagnosis.from_dict(_stored(d)) == d
        return
    assert ParsedOOM.from_dict(_stored(parsed)) == parsed
    d = diagnose(parsed, batch_size=32, grad_enabled=True)
    back = OOMDiagnosis.from_dict(_stored(d))
    assert back == d
    assert str(back) == str(d)
    assert render_diagnosis(back, fields=True) == render_diagnosis(d, fields=True)
    for c in d.causes:
        assert Cause.from_dict(_stored(c)) == c
        for f in c.fixes:
            assert Fix.from_dict(_stored(f)) == f


@pytest.mark.parametrize("path", STATES, ids=lambda p: p.stem)
def test_recorded_gpu_states_round_trip_and_the_diagnosis_keeps_all_but_the_segments(path: Path) -> None:
    data = json.loads(path.read_text())
    state = AllocatorState.from_dict(data["state"])
    assert AllocatorState.from_dict(_stored(state)) == state
    d = diagnose(parse_oom_message(data["message"]), state, alloc_conf=data.get("alloc_conf") or "")
    stored = _stored(d)
    assert stored["state"]["reserved"] == state.reserved  # a summary of the state is kept, not its segments
    back = OOMDiagnosis.from_dict(stored)
    assert back == dataclasses.replace(d, state=None)
    assert back.kinds == d.kinds
    if d.fragmentation is not None:
        assert FragmentationReport.from_dict(_stored(d.fragmentation)) == d.fragmentation
        assert back.fragmentation == d.fragmentation


def test_a_state_with_segments_and_processes_round_trips() -> None:
    blocks = [{"size": 10 * MiB, "state": "active_allocated", "requested_size": 9 * MiB, "address": 4096}]
    segments = [
        {
            "device": 0,
            "address": 4096,
            "total_size": 20 * MiB,
            "stream": 7,
            "segment_type": "large",
            "segment_pool_id": [1, 2],
            "blocks": [*blocks, {"size": 10 * MiB, "state": "inactive"}],
            "frames": [{"filename": "x.py"}],  # torch's snapshot carries more than the diagnosis reads
        }
    ]
    state = AllocatorState.from_snapshot(
        segments,
        device_index=0,
        device_total=GiB,
        device_free=0,
        other_processes=(OtherProcess(4242, 512 * MiB, "python"),),
        stats={"reserved_bytes.all.current": 20 * MiB},
        requested=12 * MiB,
        notes=("read in a test",),
    )
    assert state.segments is not None and state.segments[0].allocated_size == 10 * MiB  # summed from blocks
    assert state.segments[0].private
    assert AllocatorState.from_dict(_stored(state)) == state
    report = analyze_fragmentation(state.segments, request=12 * MiB, device_free=0)
    assert FragmentationReport.from_dict(_stored(report)) == report
    assert "largest free block 10.00 MiB" in str(report)
    assert "process 4242 (python): 512.00 MiB" in str(state)


def test_a_real_cpu_oom_round_trips_with_the_machine_it_was_judged_against() -> None:
    try:
        torch.empty(10**13)
    except RuntimeError as e:
        err = e
    else:  # pragma: no cover
        pytest.skip("this machine allocated 37 TiB")
    d = explain_oom(err)
    assert d.is_oom and d.kinds == ("too_large",)
    stored = _stored(d)
    if d.machine is not None:
        assert stored["machine"]["total"] == d.machine.total  # the ceiling is stored, and ignored on reading
        assert MachineMemory.from_dict(stored["machine"]) == d.machine
    assert OOMDiagnosis.from_dict(stored) == d
    assert str(OOMDiagnosis.from_dict(stored)) == str(d)


def test_cause_score_is_stored_so_the_ranking_reads_back() -> None:
    d = torchmem.explain_oom(_body(DATA / "oom_messages" / "torch2_private_pools_container.txt"))
    assert len(d.causes) >= 2
    scores = [c["score"] for c in d.to_dict()["causes"]]
    assert scores == sorted(scores, reverse=True) and scores[0] > 0
    assert [c.score for c in OOMDiagnosis.from_dict(_stored(d)).causes] == scores


def test_the_evidence_types_round_trip(monkeypatch: pytest.MonkeyPatch) -> None:
    def step() -> None:
        acts = torch.ones(1 << 18)  # 1 MiB held by the frame of a finished exception
        raise RuntimeError(f"failed with {acts.shape}")

    try:
        step()
    except RuntimeError as e:
        old = e
    monkeypatch.setattr(sys, "last_value", old, raising=False)
    monkeypatch.setattr(sys, "last_traceback", old.__traceback__, raising=False)
    monkeypatch.delattr(sys, "last_exc", raising=False)
    (pinned,) = pinned_tensors(torch.device("cpu"))
    assert PinnedTensor.from_dict(_stored(pinned)) == pinned
    assert str(pinned).endswith(": 1.00 MiB")

    item = WorkingSetItem("activations", 3 * GiB, "activation")
    assert WorkingSetItem.from_dict(_stored(item)) == item
    assert str(item) == "activations: 3.00 GiB (activation)"

    evidence = as_leak_evidence(
        {
            "bytes_per_step": 4 * MiB,
            "leaking": True,
            "steps": 12,
            "culprits": [{"site": "train.py:42", "holder": "losses", "bytes": 4 * MiB, "fix": "use .item()"}],
        }
    )
    assert isinstance(evidence, LeakEvidence)
    assert LeakEvidence.from_dict(_stored(evidence)) == evidence
    assert str(evidence).splitlines() == [
        "memory grows by 4.00 MiB per step over 12 steps",
        "  train.py:42 held by losses: 4.00 MiB",
    ]


def test_str_is_the_text_torchmem_explain_prints() -> None:
    parsed = parse_oom_message(_body(DATA / "oom_messages" / "torch2_private_pools_container.txt"))
    assert parsed is not None
    d = diagnose(parsed)
    text = str(d)
    assert text == render_diagnosis(d)
    assert text.startswith("Out of memory on GPU 0: 546.00 MiB requested (PyTorch's caching allocator)")
    assert "1. [high] fragmentation: Fragmentation: 736.86 MiB is reserved by PyTorch" in text
    assert (
        "  - Let segments grow" in text and "      PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in text
    )
    assert str(parsed) == render_fields(parsed)
    assert "reserved, unallocated  736.86 MiB" in str(parsed)
    first = d.causes[0]
    assert str(first).splitlines()[0] == f"[high] fragmentation: {first.summary}"
    fix = d.fixes[0]
    assert str(fix) == f"- {fix.text}\n    {fix.setting}"
    with_fields = render_diagnosis(d, fields=True)
    assert "What the message says:" in with_fields and str(parsed) in with_fields


def test_a_diagnosis_stored_by_an_older_torchmem_reads_back() -> None:
    """The capture in tests/data was written before causes stored their score: it still reads and renders."""
    lines = (DATA / "captures" / "oom_cpu.jsonl").read_text().splitlines()
    stored = next(r["diagnosis"] for r in map(json.loads, lines) if r.get("type") == "oom")
    assert all("score" not in c for c in stored["causes"])
    d = OOMDiagnosis.from_dict(stored)
    assert d.is_oom and d.kinds == tuple(c["kind"] for c in stored["causes"])
    assert d.state is None
    assert d.to_dict()["causes"][0]["summary"] == stored["causes"][0]["summary"]
    assert str(d).startswith("Out of memory")


def test_a_damaged_record_is_a_result_format_error() -> None:
    d = diagnose(parse_oom_message(_body(DATA / "oom_messages" / "torch21_capacty_too_large.txt")))
    stored = _stored(d)
    for damage in (
        {"causes": "not a list"},
        {"parsed": {**stored["parsed"], "other_processes": [{"pid": 1}]}},
        {"fixes": [{"kind": "batch_size"}]},  # a fix without its text
    ):
        with pytest.raises(ResultFormatError):
            OOMDiagnosis.from_dict({**stored, **damage})
    with pytest.raises(ResultFormatError):
        AllocatorState.from_dict({"segments": [{"blocks": []}]})  # a segment without its size


def test_an_oom_recovery_round_trips_with_its_diagnosis() -> None:
    import torch

    import torchmem
    from torchmem.results.oom import OOMRecovery

    with (
        torchmem.cpu_tracking(),
        torchmem.limit(1 << 20, "cpu"),
        torchmem.oom_guard(reraise=False, quiet=True) as guard,
    ):
        torch.empty(4 << 20, dtype=torch.uint8)
    rec = guard.oom
    assert rec is not None and rec.diagnosis is not None
    assert OOMRecovery.from_dict(rec.to_dict()) == rec
    assert str(OOMRecovery.from_dict(rec.to_dict())) == str(rec)
