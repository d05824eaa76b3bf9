"""Issue 18: a job of two ranks on two GPUs, NCCL between them, each rank under ``torchmem run``.

- a DDP job whose rank 1 leaks: per-rank captures, the merged report (the leak on rank 1 only, NCCL seen);
- the GPU-0 imbalance: every rank ``torch.load``s a checkpoint saved from cuda:0 without ``map_location``, so
  rank 1 also holds a context on GPU 0: the merged report names it, with the fix;
- an out-of-memory error on rank 1 only: both ranks' state at that moment, and the job ends (no hang);
- the NCCL row: what NCCL allocates outside the caching allocator, against NVML's per-process figure;
- FSDP2 with 2 ranks: the device-free per-rank estimate against the measured per-rank peak, and the full
  state-dict gather's peak;
- ``find_batch_size`` under DDP: both ranks search under different caps and return the same size.

The jobs start together (each is mostly start-up; they share the two GPUs with plenty of room) and the tests
read their results. Figures go to ``$TORCHMEM_FIGURES/<test>.json`` when that variable is set (the lead
copies them into docs/benchmarks.md). Needs 2 GPUs: ``PYTHONPATH=src python3 -m pytest -m cuda
tests/gpu/test_multi_gpu.py``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from torchmem.analysis.ranks import merge_captures
from torchmem.capture.file import read_capture

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.device_count() < 2,
        reason="needs 2 CUDA GPUs",
    ),
]

from multi_jobs import PROGRAMS, Job, figures, report  # noqa: E402 (tests/gpu is on sys.path)

_TORCHRUN = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
_TM = ["-m", "torchmem", "run", "--no-status"]


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Job]]:
    d = {n: tmp_path_factory.mktemp(n) for n in ("ddp", "imb", "oom", "probe", "probe2", "fsdp", "est", "bs")}
    started = {
        "ddp": Job([*_TORCHRUN, *_TM, "-o", "run.jsonl", str(PROGRAMS / "ddp_train.py"), "t",
                     "--steps", "150", "--leak"], d["ddp"]),
        "imb": Job([*_TORCHRUN, *_TM, "-o", "imb.jsonl", str(PROGRAMS / "ddp_imbalance.py"),
                     str(d["imb"] / "ckpt.pt")], d["imb"]),
        "oom": Job(["-m", "torchmem", "run", "--nproc", "2", "-o", "job.jsonl",
                     str(PROGRAMS / "ddp_oom_rank1.py")], d["oom"]),
        "probe": Job([*_TORCHRUN, *_TM, "-o", "p.jsonl", str(PROGRAMS / "nccl_probe.py"), str(d["probe"]),
                       "cuda-first"], d["probe"]),
        "probe2": Job([*_TORCHRUN, *_TM, "-o", "p.jsonl", str(PROGRAMS / "nccl_probe.py"), str(d["probe2"]),
                        "init-first"], d["probe2"]),
        "fsdp": Job([*_TORCHRUN, str(PROGRAMS / "fsdp2_ranks.py"), str(d["fsdp"] / "m")], d["fsdp"]),
        "est": Job([str(PROGRAMS / "fsdp2_estimate.py"), str(d["est"] / "est.json")], d["est"]),
        "bs": Job([*_TORCHRUN, str(PROGRAMS / "ddp_batch_size.py"), str(d["bs"] / "bs")], d["bs"]),
    }  # fmt: skip
    yield started
    for job in started.values():
        job.kill()


def test_ddp_on_nccl_per_rank_captures_and_the_mergedreport(jobs: dict[str, Job]) -> None:
    job = jobs["ddp"]
    r = job.result()
    assert r.returncode == 0, r.stderr[-4000:]
    caps = [read_capture(job.cwd / f"run.rank{k}.jsonl") for k in (0, 1)]
    for k, cap in enumerate(caps):
        assert cap.finished and cap.device == f"cuda:{k}" and cap.source == "allocator"
        assert cap.rank is not None and (cap.rank["rank"], cap.rank["world_size"]) == (k, 2)
        assert cap.ranks and cap.ranks[-1].backend == "nccl"
        assert cap.step_count == 170
    merged = merge_captures(caps)
    rows = {x.label: x for x in merged.rows}
    assert rows["rank 1"].leaking and not rows["rank 0"].leaking
    assert 1.8e6 < rows["rank 1"].leak_per_step < 2.4e6  # 2 MiB per step
    assert "ddp_train.py" in rows["rank 1"].leak_text and "kept" in rows["rank 1"].leak_text
    assert rows["rank 0"].contexts == 1 and rows["rank 1"].contexts == 1  # each rank on its own GPU only
    for row in rows.values():  # DDP's constructor created the communicator: measured there
        assert row.nccl_method == "measured" and (row.nccl_measured or 0) > 64 << 20, row
    text = report(job.cwd, "run.rank0.jsonl", "run.rank1.jsonl")
    assert "no leak on cuda:0" in text and rows["rank 1"].leak_text.splitlines()[0] in text
    figures("ddp", {"report": text, "rows": [x.to_dict() for x in merged.rows], "seconds": job.seconds})


def test_a_context_on_gpu_0_from_torch_load_is_named_with_its_fix(jobs: dict[str, Job]) -> None:
    job = jobs["imb"]
    r = job.result()
    assert r.returncode == 0, r.stderr[-4000:]
    caps = [read_capture(job.cwd / f"imb.rank{k}.jsonl") for k in (0, 1)]
    merged = merge_captures(caps)
    rows = {x.label: x for x in merged.rows}
    assert rows["rank 0"].contexts == 2 and rows["rank 0"].context_of == ("rank 1",)
    assert rows["rank 1"].contexts == 1
    text = report(job.cwd, "imb.rank0.jsonl", "imb.rank1.jsonl")
    said = [s for s in merged.imbalance if "contexts of rank 1" in s]
    assert said and "map_location" in said[0], merged.imbalance
    figures("imbalance", {"report": text, "imbalance": list(merged.imbalance)})


def test_an_oom_on_rank_1_records_every_rank_s_state_and_the_job_ends(jobs: dict[str, Job]) -> None:
    job = jobs["oom"]
    r = job.result()
    assert r.returncode != 0
    caps = [read_capture(job.cwd / f"job.rank{k}.jsonl") for k in (0, 1)]
    assert caps[1].ooms and caps[1].end is not None and caps[1].end.reason == "oom"
    for cap in caps:
        assert len(cap.rank_states) == 1 and cap.rank_states[0].trigger["rank"] == 1
    assert caps[1].rank_states[0].step == 10
    merged = merge_captures(caps)
    assert merged.first_oom is not None and merged.first_oom.label == "rank 1"
    assert [s.how for s in merged.first_oom.states] == ["snapshot", "snapshot"]
    assert "First OOM: rank 1 at step 10" in r.stderr
    # rank 0 waits in the step's all-reduce (NCCL: a C call that never returns) when torchrun's SIGTERM
    # comes: the wake-up helper finishes its capture and it dies of the signal, without waiting for SIGKILL
    assert caps[0].end is not None and caps[0].end.reason == "signal", caps[0].end
    figures(
        "oom",
        {
            "seconds": job.seconds,
            "stderr_tail": r.stderr[-6000:],
            "rank0_end": None if caps[0].end is None else caps[0].end.reason,
            "states": [s.step for c in caps for s in c.rank_states],
        },
    )
    assert job.seconds < 60  # torchrun stops rank 0; nothing waits for its SIGKILL or NCCL's timeout


def _outside(row: dict[str, Any]) -> int:
    return int(row["nvml"]) - int(row["reserved"])


@pytest.mark.parametrize("which", ["probe", "probe2"])
def test_nccl_memory_is_measured_within_10_percent_of_nvml(jobs: dict[str, Job], which: str) -> None:
    """The breakdown's NCCL share against NVML: the growth of the process's memory outside the allocator
    across the first all-reduce (and across every collective up to a second group's), read by the program
    itself through NVML, and what torchmem.stats() attributes to NCCL at those moments."""
    job = jobs[which]
    r = job.result()
    assert r.returncode == 0, r.stderr[-4000:]
    mode = "cuda-first" if which == "probe" else "init-first"
    probes = [json.loads((job.cwd / f"probe.{mode}.{k}.json").read_text()) for k in (0, 1)]
    figures = []
    for p in probes:
        rows = {x["stage"]: x for x in p["rows"]}
        first = _outside(rows["allreduce_small"]) - _outside(rows["init_pg"])  # the default group's
        second = _outside(rows["second_group"]) - _outside(rows["ddp_step"])  # the new group's
        for stage, nvml in (
            ("allreduce_small", first),
            ("ddp_step", first),
            ("second_group", first + second),
        ):
            how, comms = rows[stage]["tm_method"], rows[stage]["tm_comms"]
            figures.append(
                {"rank": p["rank"], "stage": stage, "nvml": nvml, "torchmem": rows[stage]["tm_nccl"],
                 "method": how, "comms": comms}
            )  # fmt: skip
    figures(f"nccl_{mode}", {"figures": figures, "probes": probes, "stdout": r.stdout[-4000:]})
    for f in figures:
        assert f["method"] == "measured", f
        assert abs(f["torchmem"] - f["nvml"]) <= 0.10 * f["nvml"], f
    caps = [read_capture(job.cwd / f"p.rank{k}.jsonl") for k in (0, 1)]
    for cap in caps:  # the reading taken before destroy_process_group, communicators alive
        assert any(s.when == "destroy_process_group" for s in cap.stats)
    merged = merge_captures(caps)
    for row in merged.rows:
        assert row.nccl_measured is not None and row.nccl_communicators == 2
    assert "measured through NVML around the calls that created them" in str(merged)


def test_fsdp2_per_rank_estimate_against_the_measured_peak(jobs: dict[str, Job]) -> None:
    fs, es = jobs["fsdp"], jobs["est"]
    r = fs.result()
    assert r.returncode == 0, r.stderr[-4000:]
    e = es.result()
    assert e.returncode == 0, e.stderr[-4000:]
    ranks = [json.loads((fs.cwd / f"m.{k}.json").read_text()) for k in (0, 1)]
    est = json.loads((es.cwd / "est.json").read_text())
    figures("fsdp", {"ranks": ranks, "estimate": est})
    assert any(n.startswith("FSDP2 ran") for n in est["notes"]), est["notes"]
    for rk in ranks:
        measured = rk["step_peaks"][-1]
        assert abs(est["allocated_peak"] - measured) <= 0.10 * measured, (est["allocated_peak"], measured)
    # the full state dict's gather, as the estimate's note puts it: the whole model on every rank on the
    # GPU, the largest parameter at a time with cpu_offload
    note = next(n for n in est["notes"] if n.startswith("a full state dict"))
    full, largest = est["full_parameters"], est["largest_parameter"]
    for rk in ranks:
        on_gpu, offload = rk["gathers"]["on_gpu"], rk["gathers"]["cpu_offload"]
        assert abs((on_gpu["peak"] - on_gpu["before"]) - full) <= 0.05 * full, (on_gpu, full, note)
        assert abs((offload["peak"] - offload["before"]) - largest) <= 0.05 * largest, (offload, largest)


def test_find_batch_size_under_ddp_both_ranks_agree(jobs: dict[str, Job]) -> None:
    job = jobs["bs"]
    r = job.result()
    assert r.returncode == 0, r.stderr[-4000:]
    res = [json.loads((job.cwd / f"bs.{k}.json").read_text()) for k in (0, 1)]
    figures("batch_size", {"ranks": res, "seconds": job.seconds})
    assert res[0]["batch"] == res[1]["batch"] > 8
    assert all(x["ok"] for x in res)
    assert res[0]["replica"] == res[1]["replica"] and len(res[0]["replica"]) > 6  # rank 0's, on both ranks
    assert "every rank took rank 0's parameters and buffers and optimizer state" in res[0]["text"]
