"""A CPU OOM is judged against the machine's memory (issue 10): the CPU allocator's message gives only the
request, so torchmem reads the total RAM (and a container's cgroup limit) itself.

The figures are checked against a direct read of ``/proc/meminfo``; the cgroup reader runs on cgroup trees
written to a temporary directory (the files the kernel exposes, not a fake of torch).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch

import torchmem
from torchmem._format import fmt_bytes
from torchmem.analysis.oom import MachineMemory, diagnose, parse_oom_message
from torchmem.cli import explain as explain_cli
from torchmem.devices._host import cgroup_memory_limit, host_memory, meminfo

GiB = 1 << 30


def _memtotal() -> int | None:
    """MemTotal read straight from /proc/meminfo, in bytes (the direct measurement)."""
    try:
        text = Path("/proc/meminfo").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("MemTotal:"):
            value, unit = line.split()[1:3]
            assert unit == "kB"
            return int(value) * 1024
    return None


def _cpu_oom() -> RuntimeError:
    """The real error of a ~37 TiB request on the CPU (a RuntimeError, or torch.OutOfMemoryError)."""
    try:
        torch.empty(10**13)
    except RuntimeError as e:
        return e
    pytest.skip("this machine allocated 37 TiB")


def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="torchmem")
    explain_cli.add_parser(parser.add_subparsers(dest="command"))
    return explain_cli.run(parser.parse_args(["explain", *argv]))


def _answer(d: torchmem.OOMDiagnosis) -> tuple[object, ...]:
    data = d.to_dict()
    return (data["causes"], data["fixes"], data["machine"]["total"] if data["machine"] else None)


@pytest.mark.skipif(_memtotal() is None, reason="needs Linux /proc/meminfo")
def test_host_memory_reads_the_same_total_as_proc_meminfo() -> None:
    h = host_memory()
    assert h.physical == _memtotal()
    assert h.physical_source == "MemTotal in /proc/meminfo"
    assert meminfo()["MemTotal"] == h.physical
    m = MachineMemory(h.physical, h.physical_source, h.cgroup_limit, h.cgroup_source, h.available)
    assert m.total is not None and m.total <= h.physical


def test_a_cpu_request_larger_than_the_ram_is_too_large_and_nothing_else() -> None:
    err = _cpu_oom()
    d = torchmem.explain_oom(err)
    assert d.is_oom and d.parsed is not None and d.parsed.source == "cpu_allocator"
    assert d.parsed.requested == 4 * 10**13
    assert d.machine is not None and d.machine.total is not None
    assert d.machine.total < 4 * 10**13
    assert d.kinds == ("too_large",)  # no working set, leak or freeing cause for a request that never fits
    c = d.causes[0]
    assert c.confidence == "high"
    assert c.bytes == 4 * 10**13 - d.machine.total
    assert "larger than the" in c.summary
    if d.machine.limited_by_cgroup:
        assert "container's memory limit" in c.summary
        assert any(str(d.machine.cgroup_limit) in e and "memory" in e for e in c.evidence)
    else:
        assert "machine's memory (total RAM)" in c.summary
    total = _memtotal()
    if total is not None:  # the printed figure is /proc/meminfo's, exactly
        assert d.machine.physical == total
        assert f"total RAM: {fmt_bytes(total)} ({total} bytes, MemTotal in /proc/meminfo)" in c.evidence
    assert {f.kind for f in d.fixes}.isdisjoint({"no_grad", "zero_grad", "release", "item"})
    assert "only the request size" not in str(d)


def test_the_message_text_and_the_cli_give_the_same_answer(capsys: pytest.CaptureFixture[str]) -> None:
    err = _cpu_oom()
    live = torchmem.explain_oom(err)
    text = torchmem.explain_oom(str(err))
    assert _answer(text) == _answer(live)
    assert text.kinds == ("too_large",)
    assert any("read on this machine" in n for n in text.notes)  # a pasted message may come from elsewhere
    assert _cli(["--json", f"RuntimeError: {err}"]) == 0
    cli = json.loads(capsys.readouterr().out)
    assert (cli["causes"], cli["fixes"], cli["machine"]["total"]) == _answer(live)
    assert _cli([str(err)]) == 0
    out = capsys.readouterr().out
    assert "request too large" in out and "working set" not in out
    assert fmt_bytes(live.machine.total if live.machine else 0) in out


def test_a_cpu_request_that_fits_in_the_ram_is_not_too_large() -> None:
    msg = (
        "RuntimeError: [enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: not enough "
        "memory: you tried to allocate 1073741824 bytes. Error code 12 (Cannot allocate memory)"
    )
    machine = MachineMemory(64 * GiB, "MemTotal in /proc/meminfo")
    d = diagnose(parse_oom_message(msg), machine=machine)
    assert d.kinds == ("working_set",)
    assert any(e.startswith("total RAM: 64.00 GiB") for e in d.causes[0].evidence)
    # unknown machine memory: the old, graceful answer (a note says why no ceiling is judged)
    unknown = diagnose(parse_oom_message(msg))
    assert unknown.kinds == ("working_set",) and unknown.machine is None
    assert any("not known" in n for n in unknown.notes)


def test_a_container_limit_below_the_ram_is_the_ceiling() -> None:
    msg = "DefaultCPUAllocator: can't allocate memory: you tried to allocate 12884901888 bytes."
    machine = MachineMemory(
        64 * GiB, "MemTotal in /proc/meminfo", 8 * GiB, "/sys/fs/cgroup/memory.max", available=7 * GiB
    )
    d = diagnose(parse_oom_message(msg), machine=machine)
    assert d.kinds == ("too_large",)
    c = d.causes[0]
    assert "container's memory limit (cgroup), 8.00 GiB" in c.summary
    assert any("/sys/fs/cgroup/memory.max" in e and "below the RAM" in e for e in c.evidence)
    assert d.fixes[0].kind == "limit" and "container" in d.fixes[0].text  # 12 GiB fits in the 64 GiB of RAM
    # a limit above the RAM does not bind
    loose = MachineMemory(10 * GiB, "MemTotal in /proc/meminfo", 32 * GiB, "/sys/fs/cgroup/memory.max")
    d2 = diagnose(parse_oom_message(msg), machine=loose)
    assert d2.kinds == ("too_large",)
    assert loose.total == 10 * GiB and "total RAM" in d2.causes[0].summary
    assert any("the RAM is the ceiling" in e for e in d2.causes[0].evidence)
    assert all(f.kind != "limit" for f in d2.fixes)
    assert d2.to_dict()["machine"]["total"] == 10 * GiB


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return tmp_path


def test_cgroup_v2_limit_is_the_tightest_of_the_cgroup_and_its_ancestors(tmp_path: Path) -> None:
    root = _tree(
        tmp_path / "cg",
        {
            "cgroup.controllers": "cpu memory\n",
            "kube/memory.max": "4294967296\n",
            "kube/pod/memory.max": "max\n",
            "kube/pod/ctr/memory.max": "8589934592\n",
        },
    )
    proc = _tree(tmp_path / "proc", {"cgroup": "0::/kube/pod/ctr\n"}) / "cgroup"
    limit, where = cgroup_memory_limit(str(root), str(proc)) or (None, None)
    assert limit == 4 * GiB and where == str(root / "kube" / "memory.max")
    meminfo_file = _tree(tmp_path / "p2", {"meminfo": "MemTotal:       16384 kB\nMemAvailable:    8192 kB\n"})
    h = host_memory(str(meminfo_file / "meminfo"), str(root), str(proc))
    assert h.physical == 16384 * 1024 and h.available == 8192 * 1024
    m = MachineMemory(
        physical=h.physical,
        physical_source=h.physical_source,
        cgroup_limit=h.cgroup_limit,
        cgroup_source=h.cgroup_source,
        available=h.available,
    )
    assert m.total == 16384 * 1024 and not m.limited_by_cgroup  # 16 MiB of RAM < the 4 GiB limit


def test_cgroup_v1_and_namespaced_paths(tmp_path: Path) -> None:
    # cgroup v1; the path in /proc/self/cgroup is not visible in this mount (no cgroup namespace): the
    # mount's root is the container's cgroup
    root = _tree(tmp_path / "cg", {"memory/memory.limit_in_bytes": "2147483648\n"})
    proc = _tree(tmp_path / "proc", {"cgroup": "4:memory:/docker/abc\n0::/\n"}) / "cgroup"
    assert cgroup_memory_limit(str(root), str(proc)) == (
        2 * GiB,
        str(root / "memory" / "memory.limit_in_bytes"),
    )
    # v1's "no limit" is PAGE_COUNTER_MAX pages
    (root / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert cgroup_memory_limit(str(root), str(proc)) is None
    # no cgroups at all (not Linux): None, and the total RAM still comes from somewhere or is None
    assert cgroup_memory_limit(str(tmp_path / "none"), str(tmp_path / "none")) is None
    h = host_memory(str(tmp_path / "none"), str(tmp_path / "none"), str(tmp_path / "none"))
    assert h.cgroup_limit is None and h.available is None
    assert h.physical is None or h.physical_source == "sysconf(SC_PHYS_PAGES) x sysconf(SC_PAGE_SIZE)"
