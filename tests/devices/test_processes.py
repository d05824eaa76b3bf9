"""Other processes on the device: which are this process's children (DataLoader workers) and which lost
their parent (orphans), read from /proc with real processes; how the breakdown says so (issue 13)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from stats_data import cuda_stats
from torchmem.devices._host import parent_pid, relation_to
from torchmem.results.stats import ProcessMemory

MiB = 1 << 20
pytestmark = pytest.mark.skipif(not os.path.exists(f"/proc/{os.getpid()}/stat"), reason="needs /proc")


def test_a_child_a_grandchild_an_orphan_and_an_unrelated_process() -> None:
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time; subprocess.Popen(['sleep', '5']); time.sleep(5)",
        ]
    )
    # An orphan: a shell starts `sleep` in the background and exits, so `sleep` is re-parented.
    shell = subprocess.Popen(["sh", "-c", "sleep 5 & echo $!"], stdout=subprocess.PIPE, text=True)
    assert shell.stdout is not None
    orphan = int(shell.stdout.readline())
    shell.wait()
    shell.stdout.close()
    try:
        deadline = time.time() + 5
        grandchild = None
        while grandchild is None and time.time() < deadline:
            kids = [int(p) for p in os.listdir("/proc") if p.isdigit() and parent_pid(int(p)) == child.pid]
            grandchild = kids[0] if kids else None
            time.sleep(0.05)
        assert relation_to(child.pid) == ("child", os.getpid())
        assert grandchild is not None and relation_to(grandchild) == ("descendant", child.pid)
        while parent_pid(orphan) == shell.pid and time.time() < deadline:
            time.sleep(0.05)
        rel, ppid = relation_to(orphan)
        assert ppid != shell.pid
        assert rel in ("orphan", ""), (rel, ppid)  # "" where a subreaper that is not init adopted it
        if ppid == 1:
            assert rel == "orphan"
        assert relation_to(os.getppid())[0] not in ("child", "descendant")  # our parent is not our child
        assert relation_to(2**22 + 12345) == ("", None)  # no such process
    finally:
        child.kill()
        child.wait()
        try:
            os.kill(orphan, 9)
        except OSError:
            pass


def test_the_breakdown_names_workers_and_orphans_with_the_fix() -> None:
    s = cuda_stats(
        device_used=1100 * MiB + 4 * 518 * MiB + 4608 * MiB,
        other_processes=(
            *(ProcessMemory(1600 + i, "pt_data_worker", 518 * MiB, "child", os.getpid()) for i in range(4)),
            ProcessMemory(777, "python3", 4608 * MiB, "orphan", 1),
        ),
    )
    b = s.breakdown()
    text = str(b)
    worker_lines = [x for x in text.splitlines() if "pt_data_worker" in x]
    assert len(worker_lines) == 4 and all("DataLoader worker of this process" in x for x in worker_lines)
    assert "process whose parent exited (an orphan)" in text
    assert "4 processes started by this one (1600, 1601, 1602, 1603) hold 2.02 GiB" in text, text
    assert "Build batches on the CPU in workers" in text
    assert "Process 777 (python3) holds 4.50 GiB on this device and its parent exited" in text
    assert "`kill 777`" in text
    again = type(b).from_dict(b.to_dict())
    assert again.other_processes == b.other_processes
