"""Distributed runs on the CPU with gloo: per-rank captures, the merged report, a leak on one rank, an OOM on
one rank with every rank's state, a rank killed under torchrun (the other stopped by torchrun's SIGTERM, its
capture complete), followed child processes, gather_stats, find_batch_size.

Each job is launched once (module fixtures) and shared by the assertions on it: spawning ranks is slow. The
three jobs start together and run side by side.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from torchmem.analysis.ranks import merge_captures
from torchmem.capture.file import read_capture
from torchmem.report.html import render_html
from torchmem.results.capture import run_facts

PROGRAMS = Path(__file__).parent / "programs"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    for k in list(env):  # a job started from inside a job must not inherit its launcher's identity
        if k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_PORT"):
            env.pop(k)
        if k.startswith(("TORCHELASTIC_", "TORCHMEM_")):
            env.pop(k)
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _run(args: list[str], cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout
    )


class _Job:
    """A job started now (``python *args`` in ``cwd``); :meth:`result` waits for it."""

    def __init__(self, args: list[str], cwd: Path) -> None:
        self.cwd = cwd
        self._args = [sys.executable, *args]
        self._proc = subprocess.Popen(
            self._args, cwd=cwd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self._done: subprocess.CompletedProcess[str] | None = None

    def result(self, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        if self._done is None:
            try:
                out, err = self._proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.communicate()
                raise
            self._done = subprocess.CompletedProcess(self._args, self._proc.returncode, out, err)
        return self._done


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, _Job]]:
    """The module's four jobs, started together when the first is needed: each is mostly interpreter and
    torch start-up in several processes, and they share nothing (their own folders, rendezvous ports and
    OOM flags), so they overlap instead of running one after the other."""
    ddp, oom, workers, killed = (tmp_path_factory.mktemp(n) for n in ("ddp", "oom", "workers", "killed"))
    started = {
        "ddp": _Job(
            [*_TORCHRUN_2, "-q", "-o", "run.jsonl", str(PROGRAMS / "ddp_job.py"), str(ddp / "result")], ddp
        ),
        "oom": _Job(
            ["-m", "torchmem", "run", "--nproc", "2", "-o", "job.jsonl", str(PROGRAMS / "oom_job.py")], oom
        ),
        "workers": _Job(
            ["-m", "torchmem", "run", "--no-status", "-o", "w.jsonl", str(PROGRAMS / "workers.py")], workers
        ),
        "killed": _Job([*_TORCHRUN_2, "-o", "k.jsonl", str(PROGRAMS / "killed_rank.py")], killed),
    }
    yield started
    for job in started.values():
        job.result()  # none is left running (a fixture that failed before waiting for its job)


# torchrun with two local ranks, each under `torchmem run` (options and the program follow)
_TORCHRUN_2 = [
    "-m",
    "torch.distributed.run",
    "--standalone",
    "--nproc_per_node=2",
    "-m",
    "torchmem",
    "run",
    "--no-status",
]


def _report(cwd: Path, *captures: str) -> str:
    r = _run(["-m", "torchmem", "report", *captures], cwd)
    assert r.returncode == 0, r.stderr
    return r.stdout


# -- a DDP job through torchrun: rank 1 leaks; gather_stats; find_batch_size ------------------------------
@pytest.fixture(scope="module")
def ddp_job(jobs: dict[str, _Job]) -> tuple[Path, subprocess.CompletedProcess[str]]:
    return jobs["ddp"].cwd, jobs["ddp"].result()


def test_each_rank_writes_its_own_capture_with_its_identity_in_the_header(ddp_job) -> None:  # type: ignore[no-untyped-def]
    d, r = ddp_job
    assert r.returncode == 0, r.stderr[-3000:]
    assert not (d / "run.jsonl").exists()  # -o run.jsonl: never one file for two ranks
    caps = [read_capture(d / f"run.rank{k}.jsonl") for k in range(2)]
    for k, cap in enumerate(caps):
        assert cap.finished and cap.truncated is None  # no interleaved or broken line
        assert cap.rank is not None
        assert (cap.rank["rank"], cap.rank["world_size"], cap.rank["local_rank"]) == (k, 2, k)
        assert cap.rank["launcher"] == "torchrun"
        assert cap.ranks and (cap.ranks[-1].rank, cap.ranks[-1].backend) == (k, "gloo")
        assert cap.step_count >= 97  # the 96 training steps, then the Adam warm-up and the search's steps
    assert caps[0].rank["job"] == caps[1].rank["job"] != ""  # type: ignore[index]


def test_the_merged_report_names_the_leak_of_rank_1_only(ddp_job) -> None:  # type: ignore[no-untyped-def]
    d, _ = ddp_job
    merged = merge_captures([read_capture(d / f"run.rank{k}.jsonl") for k in range(2)])
    rows = {r.label: r for r in merged.rows}
    assert set(rows) == {"rank 0", "rank 1"}
    assert rows["rank 1"].leaking and not rows["rank 0"].leaking
    assert 300_000 < rows["rank 1"].leak_per_step < 500_000  # 384 KiB/step
    assert "ddp_job.py:26" in rows["rank 1"].leak_text and "keep" in rows["rank 1"].leak_text
    assert merged.stopped == ()
    # find_batch_size's trials ran out of memory on purpose, and the program caught them
    assert merged.first_oom is None or merged.first_oom.caught
    assert any("leak on rank 1 only" in s for s in merged.imbalance)
    text = _report(d, "run.rank0.jsonl", "run.rank1.jsonl")
    assert "2 captures merged of a world of 2" in text
    assert "leak on rank 1 only" in text and "__main__.keep" in text


def test_gather_stats_reaches_rank_0_and_the_ranks_agree_on_a_batch_size(ddp_job) -> None:  # type: ignore[no-untyped-def]
    d, _ = ddp_job
    res = [json.loads((d / f"result.{k}.json").read_text()) for k in range(2)]
    gathered = res[0]["gathered"]
    assert gathered is not None and res[1]["gathered"] is None  # only the destination receives it
    assert [g["rank"] for g in gathered["ranks"]] == [0, 1]
    assert {g["pid"] for g in gathered["ranks"]} == {x["local"]["pid"] for x in res}
    assert "2 ranks:" in res[0]["text"]
    assert [x["local"]["world_size"] for x in res] == [2, 2]
    # find_batch_size agrees across ranks: both return the size of rank 1, whose cap is the smaller
    assert res[0]["batch"] == res[1]["batch"] > 1
    # the trials ran in DDP's no_sync() (rank 1 ran out of memory at sizes rank 0 still ran) and stepped
    # Adam with each rank's own gradients: afterwards every rank holds rank 0's parameters and state
    assert res[0]["replica"] == res[1]["replica"] and res[0]["replica"][-1] > 4
    assert "every rank took rank 0's parameters and buffers and optimizer state" in res[0]["note"]


# -- torchmem run --nproc: rank 1 runs out of memory, the launcher stops rank 0 --------------------------
@pytest.fixture(scope="module")
def oom_job(jobs: dict[str, _Job]) -> tuple[Path, subprocess.CompletedProcess[str]]:
    return jobs["oom"].cwd, jobs["oom"].result()


def test_an_oom_on_one_rank_comes_with_every_rank_s_state(oom_job) -> None:  # type: ignore[no-untyped-def]
    d, r = oom_job
    assert r.returncode == 1, r.stderr[-3000:]
    caps = [read_capture(d / f"job.rank{k}.jsonl") for k in range(2)]
    assert caps[1].ooms and caps[1].end is not None and caps[1].end.reason == "oom"
    # both ranks wrote their state when the flag went up: rank 1 (itself) and rank 0 (its sampler saw it)
    for cap in caps:
        assert len(cap.rank_states) == 1
        assert cap.rank_states[0].trigger["rank"] == 1
    assert caps[1].rank_states[0].step == 10  # the rank that ran out, at its own step
    # rank 0 runs in lockstep with rank 1 (DDP's all-reduce each step), free between two all-reduces: its
    # sampler may see the flag while it still finishes step 10's optimizer step (9 counted) or after (10)
    assert caps[0].rank_states[0].step in (9, 10)
    merged = merge_captures(caps)
    assert merged.first_oom is not None and merged.first_oom.label == "rank 1"
    assert merged.first_oom.site is not None and "oom_job.py:16" in merged.first_oom.site
    assert [s.how for s in merged.first_oom.states] == ["snapshot", "snapshot"]
    assert all(s.delay is not None and abs(s.delay) < 2.0 for s in merged.first_oom.states)
    # the launcher's merged report, on stderr, says it all
    assert "First OOM: rank 1 at step 10" in r.stderr
    assert "every rank at that moment" in r.stderr
    assert not list(d.glob(".torchmem-oom-*"))  # the launcher removed the flag


def test_the_rank_the_launcher_stopped_is_named(oom_job) -> None:  # type: ignore[no-untyped-def]
    d, _ = oom_job
    merged = merge_captures([read_capture(d / f"job.rank{k}.jsonl") for k in range(2)])
    rows = {r.label: r for r in merged.rows}
    # rank 0 fails in gloo ("connection closed") or torchrun's SIGTERM stops it: either way its capture is
    # complete, and the report says it stopped after rank 1, the first to stop
    assert rows["rank 0"].finished
    assert merged.first_stopped == "rank 1"
    assert (
        merged.stopped[0].startswith("rank 1 failed: oom") and "the first rank to stop" in merged.stopped[0]
    )
    assert merged.stopped[1].startswith(("rank 0 failed: exception", "rank 0 terminated by SIGTERM"))
    assert "after rank 1 failed" in merged.stopped[1]


# -- torchrun: rank 1 is killed (SIGKILL) mid-run, torchrun's agent stops rank 0 with SIGTERM ---------------
@pytest.fixture(scope="module")
def killed_job(jobs: dict[str, _Job]) -> tuple[Path, subprocess.CompletedProcess[str]]:
    return jobs["killed"].cwd, jobs["killed"].result(timeout=90)  # no hang: rank 0 is stopped, not left


def test_a_rank_killed_mid_run_the_other_s_capture_is_complete(killed_job) -> None:  # type: ignore[no-untyped-def]
    d, r = killed_job
    assert r.returncode == 1  # torchrun: a rank failed
    assert "exitcode  : -9" in r.stderr and "exitcode  : -15" in r.stderr  # each died of its signal
    rank0, rank1 = (read_capture(d / f"k.rank{k}.jsonl") for k in range(2))
    assert rank1.end is None and rank1.step_count == 8  # killed: what it wrote up to then is read
    assert rank0.end is not None and (rank0.end.reason, rank0.end.exit_code) == ("signal", -15)
    assert rank0.end.steps == 8 and rank0.truncated is None
    assert any(s.when == "end" for s in rank0.stats) and rank0.leaks  # the end reading and a leak verdict
    assert "ended by SIGTERM (exit code -15)" in r.stderr  # rank 0's summary
    assert "terminated by SIGTERM (exit code -15)" in run_facts(rank0).ended
    assert "terminated by SIGTERM -15" in render_html(rank0)  # the page's badge
    # as without torchmem: no exception raised into the program (its finally does not run)
    assert "rank 0 evaluates" in r.stdout and "finally" not in r.stdout


def test_the_merged_report_names_the_rank_that_stopped_first(killed_job) -> None:  # type: ignore[no-untyped-def]
    d, _ = killed_job
    merged = merge_captures([read_capture(d / f"k.rank{k}.jsonl") for k in range(2)])
    rows = {r.label: r for r in merged.rows}
    assert rows["rank 0"].ended == "terminated by SIGTERM" and not rows["rank 1"].finished
    assert merged.first_stopped == "rank 1"
    first, then = merged.stopped
    assert first.startswith("rank 1 stopped early at step 8 (killed: no end record")
    assert "the first rank to stop" in first
    assert then.startswith("rank 0 terminated by SIGTERM at step 8, ") and "after rank 1 stopped" in then
    text = _report(d, "k.rank0.jsonl", "k.rank1.jsonl")
    assert "STOPPED: rank 1 stopped early at step 8" in text
    assert "STOPPED: rank 0 terminated by SIGTERM" in text
    again = type(merged).from_dict(json.loads(json.dumps(merged.to_dict())))
    assert again == merged


# -- child processes: followed, each with its own capture; one is killed mid-run --------------------------
@pytest.fixture(scope="module")
def workers_job(jobs: dict[str, _Job]) -> tuple[Path, subprocess.CompletedProcess[str]]:
    return jobs["workers"].cwd, jobs["workers"].result()


def test_children_that_train_record_their_own_captures(workers_job) -> None:  # type: ignore[no-untyped-def]
    d, r = workers_job
    assert r.returncode == 0, r.stderr[-3000:]
    assert "exit codes [0, 0, -9]" in r.stdout and "terminated -15" in r.stdout
    assert sorted(p.name for p in d.glob("w*.jsonl")) == [
        "w.jsonl",
        "w.proc0.jsonl",
        "w.proc1.jsonl",
        "w.proc2.jsonl",
        "w.proc3.jsonl",
    ]
    # the parent's summary says where the work went, instead of "0 steps, peak 0 B" alone
    assert "each recorded its own capture" in r.stderr and "w.proc0.jsonl" in r.stderr
    kids = [read_capture(d / f"w.proc{k}.jsonl") for k in range(3)]
    assert [c.step_count for c in kids[:2]] == [15, 15]
    assert kids[0].rank is not None and kids[0].rank["launcher"] == "spawn"


def test_a_child_killed_mid_run_is_named_and_the_others_are_complete(workers_job) -> None:  # type: ignore[no-untyped-def]
    d, _ = workers_job
    names = ("w.jsonl", "w.proc0.jsonl", "w.proc1.jsonl", "w.proc2.jsonl", "w.proc3.jsonl")
    caps = [read_capture(d / n) for n in names]
    assert [c.finished for c in caps] == [True, True, True, False, True]
    # the child the program stopped with terminate() closed its capture first, then died of SIGTERM
    end = caps[4].end
    assert end is not None and (end.reason, end.exit_code) == ("signal", -15) and (end.steps or 0) >= 6
    merged = merge_captures(caps)
    assert [r.label for r in merged.rows] == ["main", "proc 0", "proc 1", "proc 2", "proc 3"]
    assert merged.stopped[0].startswith("proc 2 stopped early at step")
    assert merged.stopped[1].startswith("proc 3 terminated by SIGTERM at step")
    text = _report(d, *(c.path for c in caps))
    assert "STOPPED: proc 2 stopped early" in text


# -- fast checks without processes --------------------------------------------------------------------------
def test_rank_paths_and_identity_from_the_environment() -> None:
    from torchmem.capture.ranks import rank_info, rank_path

    assert rank_path("run.jsonl", 1) == "run.rank1.jsonl"
    assert rank_path("out/run", 2) == os.path.join("out", "run.rank2")
    assert rank_path("r-{rank}.jsonl", 3) == "r-3.jsonl"
    env = {"WORLD_SIZE": "4", "RANK": "3", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1"}
    info = rank_info(env)
    assert info is not None
    assert (info.rank, info.world_size, info.local_rank, info.node, info.launcher) == (3, 4, 1, 1, "torchrun")
    slurm = rank_info({"SLURM_NTASKS": "8", "SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_JOB_ID": "7"})
    assert slurm is not None and (slurm.rank, slurm.launcher) == (5, "slurm")
    assert rank_info({}) is None


def test_the_oom_flag_is_raised_once_and_seen_once(tmp_path: Path) -> None:
    from torchmem.capture.ranks import OOMFlag

    a, b = OOMFlag(str(tmp_path), "job1"), OOMFlag(str(tmp_path), "job1")
    assert b.check() is None
    assert a.raise_(1, site="x.py:3") is True
    assert b.raise_(0) is False  # the first rank's flag stands
    seen = b.check()
    assert seen is not None and seen["rank"] == 1 and seen["site"] == "x.py:3"
    assert b.check() is None  # once
    stale = OOMFlag(str(tmp_path), "job1", since=os.stat(a.path).st_mtime + 3600)
    assert stale.check() is None  # an earlier job's flag is ignored


def test_nccl_buffers_from_the_environment() -> None:
    from torchmem.results.ranks import estimate_nccl, nccl_note

    assert estimate_nccl({}, 0) is None
    e = estimate_nccl({}, 2)
    assert e is not None and e.bytes == 2 * 2 * 2 * (4 << 20) and not e.channels_from_env
    e8 = estimate_nccl({"NCCL_BUFFSIZE": "8388608", "NCCL_MIN_NCHANNELS": "4"}, 1)
    assert e8 is not None and e8.bytes == 4 * 2 * (8 << 20) and e8.channels_from_env
    note = nccl_note(64 << 20, e)
    assert note is not None and "NCCL" in note


def _write_rank(path: Path, rank: int, pid: int, others: list[int], peak: int, reserved: int) -> None:
    """A CUDA rank's capture written by the real writer (what a GPU run records, figures chosen)."""
    from torchmem.capture.file import CaptureWriter
    from torchmem.results.stats import MemoryStats, ProcessMemory

    st = MemoryStats(
        device="cuda:0" if rank == 0 else f"cuda:{rank}",
        platform="cuda",
        name="GPU",
        timestamp=0.0,
        allocated=peak // 2,
        reserved=reserved,
        peak_allocated=peak,
        peak_reserved=reserved,
        process_used=reserved + (500 << 20),
        other_processes=tuple(ProcessMemory(p, "python", 300 << 20) for p in others),
    )
    w = CaptureWriter(
        path,
        device=st.device,
        source="allocator",
        rank={
            "rank": rank,
            "world_size": 3,
            "local_rank": rank,
            "launcher": "torchrun",
            "host": "h",
            "job": "j",
        },
    )
    w.sample(step=1, allocated=peak, reserved=reserved, peak_allocated=peak, peak_reserved=reserved)
    w.stats("end", st.to_dict())
    w.close(steps=5)


def test_contexts_of_other_ranks_on_gpu_0_and_a_cache_skew_are_called_out(tmp_path: Path) -> None:
    gib = 1 << 30
    _write_rank(tmp_path / "r0.jsonl", 0, 100, [101, 102], 6 * gib, 6 * gib)
    _write_rank(tmp_path / "r1.jsonl", 1, 101, [], 4 * gib, 7 * gib)
    _write_rank(tmp_path / "r2.jsonl", 2, 102, [], 4 * gib, 4 * gib + (10 << 20))
    caps = [read_capture(tmp_path / f"r{k}.jsonl") for k in range(3)]
    # the writer's header pid is the test's; the ranks' pids are what each capture says
    caps = [dataclasses.replace(c, header={**c.header, "pid": 100 + k}) for k, c in enumerate(caps)]
    merged = merge_captures(caps)
    rows = {r.label: r for r in merged.rows}
    assert rows["rank 0"].contexts == 3 and rows["rank 0"].context_of == ("rank 1", "rank 2")
    assert rows["rank 1"].contexts == 1
    text = "\n".join(merged.imbalance)
    assert "cuda:0 (rank 0's) also holds CUDA contexts of rank 1, rank 2 (600.00 MiB)" in text
    assert "map_location" in text
    assert "rank 0 peaked at 6.00 GiB allocated" in text and "other ranks' contexts on cuda:0" in text
    assert "rank 1 reserves 3.00 GiB more than it allocates" in text
    again = type(merged).from_dict(json.loads(json.dumps(merged.to_dict())))
    assert again == merged


def test_ranks_all_terminated_by_a_signal_have_no_first_rank(tmp_path: Path) -> None:
    """A job stopped from outside (SLURM's time limit: SIGTERM to every rank): no rank is named the cause."""
    from torchmem.capture.file import CaptureWriter

    for k in range(2):
        w = CaptureWriter(
            tmp_path / f"s{k}.jsonl",
            device="cpu",
            source="ledger",
            rank={"rank": k, "world_size": 2, "local_rank": k, "launcher": "slurm", "host": "h", "job": "j"},
        )
        w.sample(step=3, allocated=1 << 20, reserved=None, peak_allocated=1 << 20, peak_reserved=None)
        w.close(exit_code=-15, reason="signal", steps=3)
    merged = merge_captures([read_capture(tmp_path / f"s{k}.jsonl") for k in range(2)])
    assert merged.first_stopped is None
    assert merged.stopped == (
        "rank 0 terminated by SIGTERM at step 3",
        "rank 1 terminated by SIGTERM at step 3",
    )


def test_growth_below_the_leak_threshold_on_one_rank_is_named_as_the_imbalance_s_cause(
    tmp_path: Path,
) -> None:
    """A newcomer's eval loop keeping its losses on rank 1 only (203 KiB/step, under the 256 KiB/step
    threshold): the merged report said "no cause torchmem can see" for rank 1's higher peak."""
    from torchmem.capture.file import CaptureWriter
    from torchmem.results.leaks import LeakReport

    mib = 1 << 20
    for rank, (peak, trend) in enumerate(((119 * mib, 16.0), (184 * mib, 208_000.0))):
        w = CaptureWriter(
            tmp_path / f"r{rank}.jsonl",
            device="cpu",
            source="heap",
            rank={"rank": rank, "world_size": 2, "local_rank": rank, "launcher": "torchrun", "job": "j"},
        )
        for step in (1, 399):
            w.sample(step=step, allocated=peak, reserved=None, peak_allocated=peak, peak_reserved=None)
        report = LeakReport(
            "cpu", "heap", "light", 399, 3, False, 0.0, 0.0, None, None, "growth below the threshold", (),
            ((1, 0), (399, int(trend * 398))), verdict="below_threshold", trend_per_step=trend,
        )  # fmt: skip
        w.leak(report.to_dict())
        w.close(steps=399)
    merged = merge_captures([read_capture(tmp_path / f"r{k}.jsonl") for k in (0, 1)])
    said = [s for s in merged.imbalance if s.startswith("rank 1 peaked")]
    assert said and "rank 1's memory grows by 203.12 KiB/step, below its leak threshold" in said[0], said
    assert "min_bytes_per_step" in said[0] and "no cause torchmem can see" not in said[0]
    assert "`torchmem run --min-growth`" in said[0], said
