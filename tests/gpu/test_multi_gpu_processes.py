"""Issue 27: every GPU a process touches, every process that touches a GPU — on 2 GPUs, each program under
``torchmem run`` with no flag, as a newcomer runs it.

- mp.spawn with set_device(rank) (NCCL): each followed child watches its own GPU; no context or imbalance
  claim; NCCL measured on both.
- FSDP2 full state dict on every rank: named in each child's capture with the cpu_offload fix; the same job
  with cpu_offload=True: silent.
- nn.DataParallel: per-GPU peaks, the gathered outputs on cuda:0 named with the fix; the loss computed
  inside the module: no DataParallel claim.
- a subprocess child that touches GPU 0 before set_device(1): described by its command line and the line
  that started it, never as a DataLoader worker; the same script run directly: the stray context named with
  the first CUDA call's line and set_device's line; with a torch.load without map_location: the load named.
- a one-GPU program: no GPU table, no claim.

Needs 2 GPUs: ``PYTHONPATH=src python3 -m pytest -m cuda tests/gpu/test_multi_gpu_processes.py``. Figures
go to ``$TORCHMEM_FIGURES/<name>.json`` when set.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from torchmem.analysis.ranks import merge_captures
from torchmem.capture.file import read_capture

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs"
    ),
]

from multi_jobs import PROGRAMS, Job, figures, report  # noqa: E402 (tests/gpu is on sys.path)

_TM = ["-m", "torchmem", "run", "--no-status"]


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Job]]:
    names = ("spawn", "fsdp", "fsdp_off", "dp", "dp_in", "sub", "stray", "load", "one")
    d = {n: tmp_path_factory.mktemp(n) for n in names}
    p = PROGRAMS
    specs = {
        "spawn": ["-o", "sp.jsonl", str(p / "spawn_allreduce.py"), "29541"],
        "fsdp": ["-o", "fs.jsonl", str(p / "spawn_fsdp_state_dict.py"), "29542"],
        "fsdp_off": ["-o", "fs.jsonl", str(p / "spawn_fsdp_state_dict.py"), "29543", "offload"],
        "dp": ["-o", "dp.jsonl", str(p / "data_parallel.py")],
        "dp_in": ["-o", "dp.jsonl", str(p / "data_parallel.py"), "inside"],
        "sub": ["-o", "sub.jsonl", str(p / "launch_child.py")],
        "stray": ["-o", "st.jsonl", str(p / "child_stray.py")],
        "load": ["-o", "ld.jsonl", str(p / "child_stray.py"), "load"],
        "one": ["-o", "one.jsonl", str(p / "data_parallel.py")],
    }
    started: dict[str, Job] = {}
    for n in names:  # three at a time: they share the two GPUs
        started[n] = Job([*_TM, *specs[n]], d[n], {"CUDA_VISIBLE_DEVICES": "0"} if n == "one" else None)
        if len(started) % 3 == 0:
            for j in started.values():
                j.result()
    yield started
    for job in started.values():
        job.kill()


def test_spawn_children_watch_their_own_gpu_and_no_false_claim(jobs: dict[str, Job]) -> None:
    job = jobs["spawn"]
    r = job.result()
    assert r.returncode == 0, r.stderr[-4000:]
    caps = [read_capture(job.cwd / f"sp.proc{k}.jsonl") for k in (0, 1)]
    for k, cap in enumerate(caps):
        assert cap.device == f"cuda:{k}", (k, cap.device, cap.devices)
        assert (cap.peak_allocated or 0) > 64 << 20  # the child's own GPU, read for real
        g = cap.gpus_report
        assert g is not None and [x.device for x in g.rows] == [f"cuda:{k}"], g
        assert g.findings == ()
    merged = merge_captures(caps)
    text = "\n".join(merged.imbalance)
    assert (
        "also holds CUDA contexts" not in text and "map_location" not in text and "share one GPU" not in text
    )
    rows = {x.label: x for x in merged.rows}
    for row in rows.values():
        assert row.nccl_method == "measured", row
    text = report(job.cwd, "sp.proc0.jsonl", "sp.proc1.jsonl")
    figures("spawn", {"report": text, "rows": [x.to_dict() for x in merged.rows], "stderr": r.stderr[-3000:]})


def test_a_full_state_dict_on_every_rank_is_named_and_the_offloaded_one_is_not(jobs: dict[str, Job]) -> None:
    got: dict[str, Any] = {}
    for name, expect in (("fsdp", True), ("fsdp_off", False)):
        job = jobs[name]
        r = job.result()
        assert r.returncode == 0, r.stderr[-4000:]
        for k in (0, 1):
            cap = read_capture(job.cwd / f"fs.proc{k}.jsonl")
            assert cap.device == f"cuda:{k}"
            g = cap.gpus_report
            assert g is not None
            said = [f for f in g.findings if f.kind == "state_dict"]
            if expect:
                assert said and "get_model_state_dict() at spawn_fsdp_state_dict.py:" in said[0].text, g
                assert "cpu_offload=True" in said[0].fix and (said[0].bytes or 0) > 900 << 20
            else:
                assert not said, g
            got[f"{name}.proc{k}"] = g.to_dict()
    figures("fsdp_state_dict", got)


def test_data_parallel_per_gpu_peaks_and_the_gathered_outputs(jobs: dict[str, Job]) -> None:
    job = jobs["dp"]
    r = job.result()
    assert r.returncode == 0, r.stderr[-4000:]
    cap = read_capture(job.cwd / "dp.jsonl")
    g = cap.gpus_report
    assert g is not None and [x.device for x in g.rows] == ["cuda:0", "cuda:1"]
    printed = {f"cuda:{i}": int(line.split()[3]) for i, line in enumerate(
        x for x in r.stdout.splitlines() if "peak allocated" in x)}  # fmt: skip
    for row in g.rows:  # the allocator's own peaks, as the program printed them
        assert abs((row.peak_allocated or 0) / 2**20 - printed[row.device]) <= 1, (row, printed)
    (dp,) = [f for f in g.findings if f.kind == "data_parallel"]
    assert dp.device == "cuda:0" and "data_parallel.py:" in dp.text and "DistributedDataParallel" in dp.fix
    assert "cuda:1" in r.stderr and "DataParallel" in r.stderr  # the run's own summary says it
    inside = jobs["dp_in"].result()
    assert inside.returncode == 0, inside.stderr[-4000:]
    g2 = read_capture(jobs["dp_in"].cwd / "dp.jsonl").gpus_report
    assert g2 is not None and len(g2.rows) == 2
    assert all(f.kind != "data_parallel" for f in g2.findings), g2
    figures("data_parallel", {"loss_outside": g.to_dict(), "loss_inside": g2.to_dict(), "printed": printed})


def test_a_subprocess_child_is_described_by_its_command_never_as_a_dataloader_worker(
    jobs: dict[str, Job],
) -> None:
    job = jobs["sub"]
    r = job.result()
    assert r.returncode == 0, r.stderr[-4000:]
    said = r.stderr
    assert "worker pid" not in said and "collate_fn" not in said and "DataLoader(" not in said, said[-3000:]
    g = read_capture(job.cwd / "sub.jsonl").gpus_report
    assert g is not None and g.children, g
    assert "child_stray.py" in g.children[0] and "started at launch_child.py:" in g.children[0]
    (f,) = [f for f in g.findings if f.kind == "child_context"]
    assert f.device == "cuda:0" and "torchmem run" in f.fix
    figures("subprocess_child", {"report": g.to_dict(), "stderr": r.stderr[-3000:]})


def test_the_stray_context_is_named_with_the_lines_that_made_it(jobs: dict[str, Job]) -> None:
    out: dict[str, Any] = {}
    for name, needle in (
        ("stray", "set_device(1) ran at child_stray.py:"),
        ("load", "torch.load at child_stray.py:"),
    ):
        job = jobs[name]
        r = job.result()
        assert r.returncode == 0, r.stderr[-4000:]
        cap = read_capture(job.cwd / ("st.jsonl" if name == "stray" else "ld.jsonl"))
        assert cap.device == "cuda:1", (cap.device, cap.devices)
        g = cap.gpus_report
        assert g is not None
        (f,) = [f for f in g.findings if f.kind == "stray_context"]
        assert f.device == "cuda:0" and needle in f.text, f
        out[name] = g.to_dict()
    figures("stray_context", out)


def test_a_one_gpu_program_gets_no_gpu_table_and_no_claim(jobs: dict[str, Job]) -> None:
    # data_parallel.py with one visible GPU: DataParallel over one device is a plain one-GPU run
    job = jobs["one"]
    r = job.result()
    assert r.returncode == 0, r.stderr[-4000:]
    g = read_capture(job.cwd / "one.jsonl").gpus_report
    assert g is not None and [x.device for x in g.rows] == ["cuda:0"] and g.findings == () and not g.children
    assert "GPUs this process used" not in r.stderr
