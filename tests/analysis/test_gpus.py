"""What the figures of every GPU a process touched show (analysis/gpus.py): each statement with a case where
it must be said and one where it must not."""

from __future__ import annotations

import json

from torchmem.analysis.gpus import choose_device, describe_child, gpus_report
from torchmem.results.gpus import GpuRow, GpusReport

MiB = 1 << 20
GiB = 1 << 30


def _rows(peaks: dict[int, int], watched: int, used: dict[int, int] | None = None) -> list[GpuRow]:
    return [
        GpuRow(
            f"cuda:{i}",
            "H100",
            allocated=p,
            reserved=p,
            peak_allocated=p,
            peak_reserved=p,
            process_used=(used or {}).get(i),
            watched=i == watched,
        )
        for i, p in peaks.items()
    ]


def test_the_device_with_the_memory_is_the_one_worked_on() -> None:
    assert choose_device([0, 1], 1, {0: 0, 1: 4096}) == 1
    assert choose_device([0, 1], 0, {0: 512, 1: 4096}) == 1  # set_device(1) after a stray .cuda() on 0
    assert choose_device([1], 1, {1: 0}) == 1  # mp.spawn's rank 1 before its first tensor
    assert choose_device([0, 1], 1, {0: 0, 1: 0}) == 1  # nothing allocated yet: the current device
    assert choose_device([0], None, {}) == 0
    assert choose_device([], 0, {}) is None  # no context anywhere: nothing is known


def test_a_context_with_no_tensors_before_set_device_is_named_with_both_lines() -> None:
    rows = _rows({0: 0, 1: 3 * GiB}, 1, used={0: 518 * MiB, 1: 4 * GiB})
    ev = {
        "cuda_init": {"site": "child.py:7", "device": 0},
        "set_device": [{"site": "child.py:9", "index": 1, "contexts_before": [0]}],
    }
    rep = gpus_report(rows, "cuda:1", ev)
    (f,) = rep.findings
    assert f.kind == "stray_context" and f.device == "cuda:0" and f.bytes == 518 * MiB
    assert "first CUDA call at child.py:7" in f.text and "set_device(1) ran at child.py:9" in f.text
    assert "set_device(1) before the first CUDA call" in f.fix
    assert "map_location" not in f.text  # no torch.load was seen: it is not blamed


def test_a_load_without_map_location_is_named_when_it_restored_to_the_other_gpu() -> None:
    rows = _rows({0: 300 * MiB, 1: 3 * GiB}, 1)
    ev = {"loads": [{"site": "train.py:20", "devices": [0], "bytes": 300 * MiB}]}
    (f,) = gpus_report(rows, "cuda:1", ev).findings
    assert "torch.load at train.py:20 restored 300.00 MiB of storages to cuda:0" in f.text
    assert 'map_location="cuda:1"' in f.fix


def test_no_stray_claim_for_one_gpu_model_parallel_or_data_parallel() -> None:
    assert gpus_report(_rows({0: 3 * GiB}, 0), "cuda:0").findings == ()
    # layers on two GPUs: real work on both, nothing stray
    assert gpus_report(_rows({0: 2 * GiB, 1: 3 * GiB}, 1), "cuda:1").findings == ()
    # DataParallel's second GPU holds replicas: not a stray context, and balanced: nothing at all
    ev = {"data_parallel": [{"site": "t.py:5", "device_ids": [0, 1], "output_device": 0, "module": "Net"}]}
    assert gpus_report(_rows({0: 2 * GiB, 1: 2 * GiB - 10 * MiB}, 0), "cuda:0", ev).findings == ()
    # the loaded checkpoint went to the GPU worked on: nothing to say
    ev2 = {"loads": [{"site": "t.py:3", "devices": [1], "bytes": GiB}]}
    assert (
        gpus_report(_rows({0: 0, 1: 3 * GiB}, 1), "cuda:1", ev2)
        .findings[0]
        .text.endswith("torchmem saw no such call of the program's own")
    )


def test_data_parallel_imbalance_is_named_with_the_fix_and_what_it_saves() -> None:
    ev = {"data_parallel": [{"site": "dp.py:30", "device_ids": [0, 1], "output_device": 0, "module": "Net"}]}
    rows = _rows({0: 3168 * MiB, 1: 1379 * MiB}, 0)
    (f,) = gpus_report(rows, "cuda:0", ev).findings
    assert f.kind == "data_parallel" and f.device == "cuda:0" and f.bytes == (3168 - 1379) * MiB
    assert "nn.DataParallel(Net) at dp.py:30 over cuda:0, cuda:1" in f.text
    assert "gathered on cuda:0" in f.text
    assert "DistributedDataParallel" in f.fix and "up to 1.75 GiB less on cuda:0" in f.fix
    # the same imbalance without a DataParallel: no DataParallel claim
    assert all(x.kind != "data_parallel" for x in gpus_report(rows, "cuda:0").findings)


def test_a_full_state_dict_gathered_on_the_gpu_is_named_and_a_small_one_is_not() -> None:
    ev = {
        "state_dicts": [
            {"site": "fsdp.py:40", "call": "get_model_state_dict", "device": 1, "grew": 1024 * MiB},
            {"site": "fsdp.py:40", "call": "get_model_state_dict", "device": 1, "grew": 1020 * MiB},
            {"site": "fsdp.py:44", "call": "state_dict", "device": 1, "grew": 2 * MiB},
        ]
    }
    (f,) = gpus_report(_rows({1: 4 * GiB}, 1), "cuda:1", ev).findings
    assert (
        f.kind == "state_dict"
        and "get_model_state_dict() at fsdp.py:40 grew cuda:1's memory by 1.00 GiB" in f.text
    )
    assert "(2 calls)" in f.text and "cpu_offload=True" in f.fix


def test_a_child_is_described_by_its_command_and_line_and_a_stray_context_only_with_evidence() -> None:
    child = {
        "pid": 812,
        "command": "python3 child.py --rank 1",
        "site": "launch.py:14",
        "script": "child.py",
        "used": {"cuda:0": 518 * MiB, "cuda:1": 3 * GiB},
    }
    rep = gpus_report([], "cuda:0", {}, [child], context_bytes=518 * MiB)
    assert rep.children == (
        "pid 812 (python3 child.py --rank 1, started at launch.py:14): cuda:0 518.00 MiB, cuda:1 3.00 GiB",
    )
    (f,) = rep.findings
    assert f.kind == "child_context" and f.device == "cuda:0"
    assert "DataLoader" not in f.text and "DataLoader" not in f.fix and "torchmem run child.py" in f.fix
    # a child that works on one GPU only, or on two for real: described, nothing claimed
    one = {**child, "used": {"cuda:1": 3 * GiB}}
    two = {**child, "used": {"cuda:0": 2 * GiB, "cuda:1": 3 * GiB}}
    for c in (one, two):
        r = gpus_report([], "cuda:0", {}, [c], context_bytes=518 * MiB)
        assert r.findings == () and len(r.children) == 1
    assert describe_child({"pid": 5, "command": "x"}) == "pid 5 (x)"


def test_the_report_round_trips_and_renders_every_gpu() -> None:
    ev = {"data_parallel": [{"site": "dp.py:30", "device_ids": [0, 1], "output_device": 0, "module": "Net"}]}
    rep = gpus_report(_rows({1: 1379 * MiB, 0: 3168 * MiB}, 0), "cuda:0", ev)
    assert [r.device for r in rep.rows] == ["cuda:0", "cuda:1"]
    again = GpusReport.from_dict(json.loads(json.dumps(rep.to_dict())))
    assert again == rep
    text = str(rep)
    assert "cuda:0 (watched)" in text and "cuda:1" in text and "peak 3.09 GiB" in text
