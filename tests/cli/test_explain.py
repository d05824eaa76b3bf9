"""``torchmem explain`` through its own add_parser/run (registered in cli/__init__ by the lead)."""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path

import pytest

from torchmem.cli import explain

CORPUS = Path(__file__).resolve().parent.parent / "data" / "oom_messages"


def body(name: str) -> str:
    return "\n".join(ln for ln in (CORPUS / name).read_text().splitlines() if not ln.startswith("# "))


def run(argv: list[str], stdin: str | None = None, monkeypatch: pytest.MonkeyPatch | None = None) -> int:
    parser = argparse.ArgumentParser(prog="torchmem")
    sub = parser.add_subparsers(dest="command")
    explain.add_parser(sub)
    args = parser.parse_args(["explain", *argv])
    if stdin is not None and monkeypatch is not None:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    return explain.run(args)


def test_explain_message_argument(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    assert run([body("torch21_capacty_fragmentation.txt")]) == 0
    out = capsys.readouterr().out
    assert "What the message says:" in out
    assert "reserved, unallocated" in out and "2.30 GiB" in out
    assert "1. [high] fragmentation" in out
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in out


def test_setting_in_effect_is_not_suggested(capsys: pytest.CaptureFixture[str]) -> None:
    assert run([body("torch21_capacty_fragmentation.txt"), "--alloc-conf", "expandable_segments:True"]) == 0
    out = capsys.readouterr().out
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n" not in out
    assert "Allocator settings in effect: expandable_segments:True" in out


def test_explain_stdin_and_json(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    assert run(["--json"], stdin=body("torch21_capacty_too_large.txt"), monkeypatch=monkeypatch) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["is_oom"] is True
    assert data["causes"][0]["kind"] == "too_large"
    assert data["parsed"]["requested"] == round(55.57 * (1 << 30))
    assert run(["-"], stdin=body("mps_gb.txt"), monkeypatch=monkeypatch) == 0
    assert "MPS allocator" in capsys.readouterr().out


def test_explain_file_finds_the_oom_in_a_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "train.log"
    log.write_text(
        "step 1 loss 0.3\nstep 2 loss 0.2\n" + body("torch1_other_processes.txt") + "\nshutting down\n"
    )
    assert run(["--file", str(log), "--batch-size", "16"]) == 0
    out = capsys.readouterr().out
    assert "1. [medium] other processes" in out
    assert "shutting down" not in out


def test_no_oom_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    assert run([body("not_oom_shape_error.txt")]) == explain.NO_OOM
    err = capsys.readouterr().err
    assert "holds no out-of-memory error" in err
    assert run([body("not_oom_nccl_invalid_argument.txt"), "--json"]) == explain.NO_OOM
    assert json.loads(capsys.readouterr().out)["is_oom"] is False


def test_missing_file_and_bad_batch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from torchmem.cli import main

    assert main(["explain", "--file", str(tmp_path / "nope.log")]) == 2
    err = capsys.readouterr().err
    assert "--file" in err and "cannot read" in err
    assert main(["explain", "x", "--batch-size", "0"]) == 2
    assert "argument --batch-size: must be a positive integer, not 0" in capsys.readouterr().err


def test_library_oom_is_explained_as_outside_the_allocator(capsys: pytest.CaptureFixture[str]) -> None:
    assert run([body("cublas_alloc_failed.txt")]) == 0
    out = capsys.readouterr().out
    assert "outside PyTorch's allocator" in out
    assert "CUBLAS_STATUS_ALLOC_FAILED" in out


def test_torchmem_cpu_cap_message_is_explained(capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    import torchmem

    with torchmem.cpu_tracking(), torchmem.limit(1 << 20, "cpu"):
        try:
            torch.ones(1 << 19)
        except torch.OutOfMemoryError as e:
            text = f"torch.OutOfMemoryError: {e}"
    assert run([text]) == 0
    out = capsys.readouterr().out
    assert "caching allocator" not in out
    assert "torchmem.limit(None, 'cpu')" in out
    assert run(["--json", text]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["parsed"]["source"] == "torchmem_cap"
    assert data["parsed"]["allowed"] == 1 << 20 and data["parsed"]["requested"] == 2 << 20
