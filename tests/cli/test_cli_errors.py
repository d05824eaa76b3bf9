"""The command line's errors: a bad value exits 2 naming its option, one exit code per kind of failure in
every command, messages that say what is wrong, commands torchmem suggests that can be pasted into a shell,
captures of different jobs never merged into one report, and ``--version``/``--help`` without torch."""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import torchmem
from torchmem.cli import HELP, main

SRC = str(Path(torchmem.__file__).resolve().parents[1])  # the torchmem these tests import


def _capture(path: Path, *, rank: dict[str, Any] | None = None, steps: int = 3) -> Path:
    """A capture written by the real writer (a single run, or a rank when ``rank`` is its header)."""
    from torchmem.capture.file import CaptureWriter

    w = CaptureWriter(
        path, device="cpu", source="heap", argv=["train.py"], **({"rank": rank} if rank else {})
    )
    for step in range(1, steps + 1):
        w.sample(step=step, allocated=1 << 20, reserved=None, peak_allocated=1 << 20, peak_reserved=None)
    w.close(steps=steps)
    return path


def _rank(k: int, job: str = "j1", world: int = 2) -> dict[str, Any]:
    return {"rank": k, "world_size": world, "local_rank": k, "launcher": "torchrun", "host": "h", "job": job}


# -- bad values: exit 2, the option's own name -------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["run", "--warmup", "-5", "train.py"], "argument --warmup: must be 0 or more, not -5"),
        (["run", "--interval", "0", "train.py"], "argument --interval: must be a positive number, not 0"),
        (["run", "--nproc", "0", "train.py"], "argument --nproc: must be a positive integer, not 0"),
        (
            ["estimate", "torchvision:resnet18", "--batch", "0"],
            "argument --batch: must be a positive integer",
        ),
        (["estimate", "m:f", "--grad-accum", "0"], "argument --grad-accum: must be a positive integer"),
        (["estimate", "m:f", "--fsdp", "-2"], "argument --fsdp: must be a positive integer, not -2"),
        (["estimate", "m:f", "--generate", "-1", "--inference"], "argument --generate: must be 0 or more"),
        (["stats", "--watch", "1", "--count", "0"], "argument --count: must be a positive integer, not 0"),
        (["stats", "--watch", "-1"], "argument --watch: must be a positive number, not -1"),
        (["stats", "--serve", "70000"], "argument --serve: needs a port number (0-65535), not 70000"),
        (["explain", "x", "--batch-size", "0"], "argument --batch-size: must be a positive integer, not 0"),
        (["demo", "--steps", "5"], "--steps must be 12 or more, not 5"),
    ],
)
def test_a_bad_value_exits_2_naming_its_option(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert said in err and out == ""
    # the API's parameter names never reach the command line's user
    assert "batch_sizes" not in err and "grad_accum" not in err and "warmup must be" not in err


def test_options_that_do_not_go_together_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = (
        _capture(tmp_path / "a.rank0.jsonl", rank=_rank(0)),
        _capture(tmp_path / "a.rank1.jsonl", rank=_rank(1)),
    )
    # several captures are merged as text: --html was an OutputError (exit 3) for a wrong command line
    assert main(["report", str(a), str(b), "--html", str(tmp_path / "r.html")]) == 2
    assert "--html takes one capture; 2 were given" in capsys.readouterr().err
    assert main(["report", str(a), "--html", str(tmp_path / "r"), "--plot", str(tmp_path / "r")]) == 2
    assert "--html and --plot are the same file" in capsys.readouterr().err
    assert main(["stats", "--host", "0.0.0.0"]) == 2
    assert "--host goes with --serve" in capsys.readouterr().err
    assert main(["stats", "--count", "3"]) == 2
    assert "--count goes with --watch" in capsys.readouterr().err


def test_an_argument_error_of_the_api_exits_2_through_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    """estimate's model or target that cannot be used (FitArgumentError, exit code 1 of its own)."""
    assert main(["estimate", "torchvision_typo:resnet18"]) == 2
    assert "cannot import 'torchvision_typo'" in capsys.readouterr().err


def test_a_missing_extra_exits_1_as_plot_does(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # as if not installed: importing it fails
    monkeypatch.delitem(sys.modules, "torchmem.integrations.prometheus", raising=False)
    assert main(["stats", "--serve", "0", "--device", "cpu"]) == 1
    assert "pip install 'torchmem[prometheus]'" in capsys.readouterr().err


def test_the_exit_codes_are_documented() -> None:
    text = (Path(__file__).resolve().parents[2] / "docs" / "report.md").read_text()
    section = text[text.index("## Exit codes") :]
    for code in ("`0`", "`1`", "`2`", "`3`", "`130`"):
        assert code in section
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert "docs/report.md#exit-codes" in readme


# -- messages that say what is wrong ------------------------------------------------------------------------


def test_a_report_over_its_own_capture_says_it_would_overwrite_the_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cap = _capture(tmp_path / "x.jsonl")
    before = cap.read_bytes()
    for option in ("--html", "--plot"):
        assert main(["report", str(cap), option, str(cap), "--force"]) == 3
        err = capsys.readouterr().err
        assert f"{option} {str(cap)!r} is the capture being read" in err
        assert "would overwrite the input capture" in err
        assert "program being run" not in err
    assert cap.read_bytes() == before


def test_memory_viz_without_cuda_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA records the allocator's history here")
    script = tmp_path / "t.py"
    script.write_text("import torch\nx = torch.ones(10)\n")
    pickle = tmp_path / "m.pickle"
    code = main(
        [
            "run",
            "-q",
            "--no-status",
            "--memory-viz",
            str(pickle),
            "-o",
            str(tmp_path / "c.jsonl"),
            str(script),
        ]
    )
    assert code == 0
    err = capsys.readouterr().err
    assert (
        "--memory-viz" in err and "memory history needs CUDA" in err and "no snapshot will be written" in err
    )
    assert not pickle.exists()


# -- commands torchmem suggests can be pasted ---------------------------------------------------------------


def _pasted(line: str) -> list[str]:
    """The words a shell makes of the last command in ``line`` (from its "torchmem report")."""
    return shlex.split(line[line.rindex("torchmem report") :])


def test_suggested_commands_are_shell_quoted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "my runs"
    folder.mkdir()
    a = _capture(folder / "job one.rank0.jsonl", rank=_rank(0))
    b = _capture(folder / "job one.rank1.jsonl", rank=_rank(1))
    assert main(["report", str(a), str(b), "--html", str(folder / "my report.html")]) == 2
    hint = capsys.readouterr().err.splitlines()[-1]
    assert _pasted(hint) == ["torchmem", "report", str(a), "--html", str(folder / "my report.html")]
    assert main(["report", str(a), "--html", str(a)]) == 3
    hint = capsys.readouterr().err.splitlines()[-1]
    assert _pasted(hint) == ["torchmem", "report", str(a), "--html", "report.html"]


def test_the_run_summary_suggests_a_quoted_report_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "my runs"
    folder.mkdir()
    script = folder / "t.py"
    script.write_text("x = 1\n")
    cap = folder / "a capture.jsonl"
    assert main(["run", "--no-status", "-o", str(cap), str(script)]) == 0
    line = [x for x in capsys.readouterr().err.splitlines() if x.startswith("capture: ")][-1]
    assert _pasted(line.rstrip(")")) == ["torchmem", "report", str(cap), "--html", "report.html"]


# -- captures of different jobs are not one job's report ----------------------------------------------------


def test_a_single_run_and_a_jobs_ranks_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was "3 captures merged of a world of 2"."""
    from torchmem.analysis.ranks import MergeError, merge_captures
    from torchmem.capture.file import read_capture

    single = _capture(tmp_path / "single.jsonl")
    ranks = [_capture(tmp_path / f"job.rank{k}.jsonl", rank=_rank(k)) for k in range(2)]
    with pytest.raises(MergeError, match="not of one job"):
        merge_captures([read_capture(p) for p in (single, *ranks)])
    assert main(["report", str(single), *map(str, ranks)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "merged" not in err
    assert f"{single} (a single-process run of train.py)" in err
    assert f"{ranks[0]}, {ranks[1]} (ranks 0, 1 of a job of 2, torchrun job j1)" in err
    hint = err.splitlines()[-1]
    assert hint.startswith("hint: report them apart: ")
    first, second = hint.removeprefix("hint: report them apart: ").split("; ")
    assert shlex.split(first) == ["torchmem", "report", str(single)]
    assert shlex.split(second) == ["torchmem", "report", *map(str, ranks)]


def test_ranks_of_two_jobs_and_two_runs_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = _capture(tmp_path / "a.rank0.jsonl", rank=_rank(0, job="j1"))
    b = _capture(tmp_path / "b.rank1.jsonl", rank=_rank(1, job="j2"))
    assert main(["report", str(a), str(b)]) == 2
    assert "not of one job" in capsys.readouterr().err
    one, two = _capture(tmp_path / "one.jsonl"), _capture(tmp_path / "two.jsonl")
    assert main(["report", str(one), str(two)]) == 2
    assert "not of one job" in capsys.readouterr().err


def test_one_jobs_ranks_and_a_run_with_its_children_are_merged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ranks = [_capture(tmp_path / f"job.rank{k}.jsonl", rank=_rank(k)) for k in range(2)]
    assert main(["report", *map(str, ranks)]) == 0
    assert "2 captures merged of a world of 2" in capsys.readouterr().out
    # a run and the child processes it started (their captures begin while it runs; the run has no job key,
    # its children the one it gave them)
    from torchmem.capture.file import CaptureWriter

    parent = CaptureWriter(tmp_path / "w.jsonl", device="cpu", source="heap", argv=["w.py"])
    kids = []
    for k in range(2):
        head = {"rank": k, "world_size": 0, "launcher": "spawn", "host": "h", "job": "40f4b4fe0481"}
        kid = CaptureWriter(tmp_path / f"w.proc{k}.jsonl", device="cpu", source="heap", rank=head)
        kid.close(steps=0)
        kids.append(kid.path)
    parent.close(steps=0)
    assert main(["report", str(parent.path), *map(str, kids)]) == 0
    assert "3 captures merged" in capsys.readouterr().out


def test_children_that_did_not_run_during_the_run_are_refused(tmp_path: Path) -> None:
    import dataclasses

    from torchmem.analysis.ranks import MergeError, merge_captures
    from torchmem.capture.file import read_capture

    parent = read_capture(_capture(tmp_path / "w.jsonl"))
    head = {"rank": 0, "world_size": 0, "launcher": "spawn", "host": "h", "job": ""}
    kid = read_capture(_capture(tmp_path / "w.proc0.jsonl", rank=head))
    assert len(merge_captures([parent, kid]).rows) == 2
    later = dataclasses.replace(kid, header={**kid.header, "started": (parent.started or 0.0) + 3600})
    with pytest.raises(MergeError, match="child process a program started"):
        merge_captures([parent, later])
    # children of two runs (two keys), without their runs
    other = dataclasses.replace(kid, header={**kid.header, "rank": {**head, "job": "k2"}})
    with pytest.raises(MergeError, match="not of one job"):
        merge_captures(
            [dataclasses.replace(kid, header={**kid.header, "rank": {**head, "job": "k1"}}), other]
        )


# -- --version and --help: no command module, no torch ------------------------------------------------------


@pytest.mark.parametrize("argv", [["--version"], ["--help"], []])
def test_version_and_help_import_no_torch(argv: list[str]) -> None:
    code = textwrap.dedent(
        f"""
        import sys
        from torchmem.cli import main
        try:
            main({argv!r})
        except SystemExit:
            pass
        print("torch imported:", "torch" in sys.modules, "commands imported:",
              sorted(m for m in sys.modules if m.startswith("torchmem.cli.")))
        """
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env={"PYTHONPATH": SRC}
    )
    assert r.returncode == 0, r.stderr
    assert "torch imported: False commands imported: []" in r.stdout
    if argv != ["--version"]:
        for name, text in HELP.items():  # every command is listed with its line
            assert name in r.stdout and " ".join(text.split()[:4]) in " ".join(r.stdout.split())


def test_the_help_table_is_each_commands_own_help() -> None:
    from torchmem import cli

    for name in HELP:
        p = argparse.ArgumentParser(prog="torchmem")
        sub = p.add_subparsers()
        cli._command(name).add_parser(sub)
        (action,) = [a for a in sub._choices_actions if a.dest == name]
        assert action.help == HELP[name], name
