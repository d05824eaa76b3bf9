"""The ``torchmem`` command line through ``cli.main(argv)``, plus one real run of each entry point."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import torchmem
from torchmem.cli import main

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="expects a machine with no GPU")

_CPU_KEYS = {"device", "platform", "allocated", "process_used", "device_total", "device_free", "notes"}


def _check_cpu_entry(d: dict[str, Any]) -> None:
    assert set(d) >= _CPU_KEYS
    assert d["device"] == "cpu" and d["platform"] == "cpu"
    assert d["allocated"] is None  # no cpu_tracking in the CLI
    assert d["reserved"] is None
    assert isinstance(d["device_total"], int) and d["device_total"] > 0
    if sys.platform.startswith("linux"):
        assert isinstance(d["process_used"], int) and d["process_used"] > 0


def test_stats_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["stats"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert "No GPU is visible" in out
    assert "cpu" in out
    assert "this process (RSS)" in out
    assert "reconciliation" in out
    assert "note: CPU tensor bytes are counted only inside torchmem.cpu_tracking()" in " ".join(out.split())


def test_stats_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["stats", "--json"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    data = json.loads(out)  # nothing but JSON on stdout
    assert isinstance(data["devices"], list)
    assert [d["device"] for d in data["devices"]] == ["cpu"]
    _check_cpu_entry(data["devices"][0])


def test_stats_device_cpu_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["stats", "--device", "cpu", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["devices"]) == 1
    _check_cpu_entry(data["devices"][0])
    assert set(data["devices"][0]) == set(torchmem.stats("cpu").to_dict())


def test_stats_device_repeated(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["stats", "-d", "cpu", "-d", " CPU", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [d["device"] for d in data["devices"]] == ["cpu", "cpu"]


def test_stats_device_cpu_table_has_no_gpu_banner(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["stats", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "No GPU is visible" not in out
    assert "machine memory" in out


def test_stats_watch_json_lines(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["stats", "--watch", "0.01", "--count", "2", "--json"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    lines = out.strip().splitlines()
    assert len(lines) == 2
    readings = [json.loads(line) for line in lines]
    for r in readings:
        assert [d["device"] for d in r["devices"]] == ["cpu"]
        _check_cpu_entry(r["devices"][0])
    assert readings[0]["devices"][0]["timestamp"] < readings[1]["devices"][0]["timestamp"]


def test_stats_watch_table_not_a_tty(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["stats", "--device", "cpu", "--watch", "0.01", "--count", "2"]) == 0
    out = capsys.readouterr().out
    assert out.count("reconciliation") == 2


@pytest.mark.parametrize(
    ("device", "fragment"),
    [("cuda", "CPU-only build"), ("cuda:0", "CPU-only build"), ("nonsense", "'nonsense'"), ("meta", "meta")],
)
def test_stats_bad_device_exits_2_with_error_and_hint(
    capsys: pytest.CaptureFixture[str], device: str, fragment: str
) -> None:
    if device.startswith("cuda") and torch.cuda.is_available():
        pytest.skip("a CUDA device is visible")
    if device.startswith("cuda") and torch.version.cuda is not None:
        fragment = "No CUDA device is visible"  # a CUDA build on a machine without a GPU
    assert main(["stats", "--device", device]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.strip().splitlines()
    assert lines[0].startswith("torchmem: error: ")
    assert fragment in lines[0]
    assert lines[1].startswith("hint: ") and len(lines[1]) > len("hint: ")


@pytest.mark.parametrize("argv", [["--watch", "0"], ["--watch", "-1"], ["--watch", "1", "--count", "0"]])
def test_stats_bad_watch_or_count_exits_2(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    assert main(["stats", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert "error" in err


def test_bad_usage_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["stats", "--watch", "soon"]) == 2
    assert "argument --watch: expected a number, not 'soon'" in capsys.readouterr().err
    assert main(["no-such-command"]) == 2


def test_no_command_prints_help_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: torchmem")
    assert "stats" in out


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    assert "usage: torchmem" in capsys.readouterr().out
    assert main(["stats", "--help"]) == 0
    assert "--watch" in capsys.readouterr().out


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"torchmem {torchmem.__version__}"


# -- real processes ------------------------------------------------------------------------------------


def _run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("TORCHMEM_NO_NVML", None)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, check=False)


def test_python_dash_m_torchmem_stats_json() -> None:
    proc = _run([sys.executable, "-m", "torchmem", "stats", "--json"])
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert [d["device"] for d in data["devices"]] == ["cpu"]
    _check_cpu_entry(data["devices"][0])


def test_console_script_stats_json() -> None:
    script = Path(sys.executable).parent / ("torchmem.exe" if os.name == "nt" else "torchmem")
    assert script.is_file(), f"console script not installed next to {sys.executable}"
    proc = _run([str(script), "stats", "--json"])
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert [d["device"] for d in data["devices"]] == ["cpu"]
    _check_cpu_entry(data["devices"][0])
