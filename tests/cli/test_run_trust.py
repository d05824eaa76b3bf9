"""``torchmem run`` never destroys a file, runs a program exactly as ``python`` does, stays out of the user's
tracebacks and says why it saw nothing (issue 10). Each test reproduces a reported failure."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from torchmem.cli import main
from torchmem.cli.run import split_argv
from torchmem.run.launcher import run_session

SRC = str(Path(__file__).resolve().parents[2] / "src")
ENV = dict(os.environ, PYTHONPATH=SRC, PYTHONWARNINGS="ignore::UserWarning")

TRAIN = textwrap.dedent(
    """
    import sys, torch
    print("argv", sys.argv[1:])
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        model(torch.ones(2, 8)).sum().backward(); opt.step(); opt.zero_grad()
    """
)


def _write(p: Path, text: str) -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return p


def _torchmem(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "torchmem", *args],
        capture_output=True,
        text=True,
        env=ENV,
        cwd=cwd,
        check=False,
    )


def _python(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=ENV, cwd=cwd, check=False
    )


def _together(cwd: Path, *commands: list[str]) -> list[subprocess.CompletedProcess[str]]:
    """``python *command`` for each command, all started at once (independent runs, mostly interpreter
    start-up: they overlap on the machine's cores), each waited for; in order."""
    procs = [
        (
            cmd,
            subprocess.Popen(
                [sys.executable, *cmd],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=ENV,
                cwd=cwd,
            ),
        )
        for cmd in commands
    ]
    done = []
    for cmd, p in procs:
        out, err = p.communicate(timeout=300)
        done.append(subprocess.CompletedProcess(cmd, p.returncode, out, err))
    return done


# ---------------------------------------------------------------------------------------------------------
# data loss


def test_an_existing_file_that_is_not_a_capture_is_never_overwritten(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = _write(tmp_path / "train.py", TRAIN)
    notes = _write(tmp_path / "notes.txt", "my notes\n")
    for extra in ([], ["--force"]):
        assert main(["run", "-q", *extra, "-o", str(notes), str(script)]) == 3
        err = capsys.readouterr()
        assert "notes.txt" in err.err and "not a torchmem capture" in err.err
        assert "argv" not in err.out  # the program never ran
    assert notes.read_text() == "my notes\n"


def test_the_program_is_never_an_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = _write(tmp_path / "train.py", TRAIN)
    for opt in ("-o", "--html"):
        assert main(["run", "-q", "--force", opt, str(script), str(script)]) == 3
        assert "is the program being run" in capsys.readouterr().err
    assert script.read_text() == TRAIN


def test_an_earlier_capture_is_replaced_only_with_force(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = _write(tmp_path / "train.py", TRAIN)
    cap = tmp_path / "run.jsonl"
    assert main(["run", "-q", "-o", str(cap), str(script)]) == 0
    first = cap.read_text()
    assert main(["run", "-q", "-o", str(cap), str(script)]) == 3
    assert "--force" in capsys.readouterr().err
    assert cap.read_text() == first
    assert main(["run", "-q", "--force", "-o", str(cap), str(script), "again"]) == 0
    assert json.loads(cap.read_text().splitlines()[0])["argv"][-1] == "again"


def test_html_to_a_foreign_file_or_a_folder_fails_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = _write(tmp_path / "train.py", TRAIN)
    page = _write(tmp_path / "index.html", "<html>mine</html>")
    assert main(["run", "-q", "--html", str(page), "-o", str(tmp_path / "c.jsonl"), str(script)]) == 3
    assert main(["run", "-q", "--html", str(tmp_path), "-o", str(tmp_path / "d.jsonl"), str(script)]) == 3
    out = capsys.readouterr()
    assert "argv" not in out.out and "is a folder" in out.err
    assert page.read_text() == "<html>mine</html>"
    assert not (tmp_path / "c.jsonl").exists() and not (tmp_path / "d.jsonl").exists()


# TRAIN without its optimizer: the first optimizer imports torch._dynamo (about a second of CPU per process);
# what these runs check is only the names of the captures they write.
NO_OPTIMIZER = TRAIN.replace("opt = torch.optim.SGD(model.parameters(), lr=0.1)\n", "").replace(
    "; opt.step(); opt.zero_grad()", ""
)


def test_default_capture_names_are_unique_per_run_program_and_rank(tmp_path: Path) -> None:
    _write(tmp_path / "train.py", NO_OPTIMIZER)
    _write(tmp_path / "pkg" / "__init__.py", "")
    _write(tmp_path / "pkg" / "train.py", NO_OPTIMIZER)
    # All four at once (the same second, the same program): each gets a file of its own.
    runs = [
        subprocess.Popen(
            [sys.executable, "-m", "torchmem", "run", "-q", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=tmp_path,
        )
        for args, env in (
            (["train.py"], ENV),
            (["train.py"], ENV),
            (["-m", "pkg.train"], ENV),
            (["train.py"], dict(ENV, WORLD_SIZE="2", RANK="1")),
        )
    ]
    for p in runs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    caps = sorted(p.name for p in tmp_path.glob("torchmem-train-*.jsonl"))
    assert len(caps) == 4, caps  # four runs, four files: nothing overwritten
    assert len(list(tmp_path.glob("torchmem-train-*-rank1*.jsonl"))) == 1


def test_demo_leaves_nothing_in_the_working_tree(tmp_path: Path) -> None:
    r = _torchmem(["demo", "--steps", "12"], tmp_path)
    assert r.returncode == 0, r.stderr
    assert list(tmp_path.iterdir()) == []
    assert "report.html" in r.stderr


# ---------------------------------------------------------------------------------------------------------
# exactly like python


def test_options_after_the_program_belong_to_the_program() -> None:
    assert split_argv(["-q", "train.py", "--steps", "5", "-o", "x"]) == (
        ["-q"],
        ["train.py", "--steps", "5", "-o", "x"],
    )
    assert split_argv(["-o", "c.jsonl", "-m", "pkg.train", "--steps", "5"]) == (
        ["-o", "c.jsonl"],
        ["-m", "pkg.train", "--steps", "5"],
    )
    assert split_argv(["-mpkg.train", "-q"]) == ([], ["-m", "pkg.train", "-q"])
    assert split_argv(["--html=r.html", "--", "-weird.py", "a"]) == (["--html=r.html"], ["-weird.py", "a"])


def test_module_and_script_see_what_python_shows_them(tmp_path: Path) -> None:
    show = "import sys, os\nprint(sys.argv, sys.path[0], __name__, os.path.basename(__file__))\n"
    _write(tmp_path / "pkg" / "__init__.py", "")
    _write(tmp_path / "pkg" / "train.py", show)
    _write(tmp_path / "s.py", show)
    progs = (["-m", "pkg.train", "--steps", "5"], ["s.py", "--steps", "5", "-q"])
    runs = _together(
        tmp_path,
        *progs,
        *(
            ["-m", "torchmem", "run", "-q", "-o", str(tmp_path / f"{prog[-3]}.jsonl"), *prog]
            for prog in progs
        ),
    )
    for want, got in zip(runs[: len(progs)], runs[len(progs) :]):
        assert got.returncode == want.returncode == 0, got.stderr
        assert got.stdout == want.stdout


def _same_traceback(tmp_path: Path, name: str, code: str, *prefix: str) -> tuple[str, str]:
    _write(tmp_path / name, code)
    target = name.removesuffix(".py") if prefix else name
    want, got = _together(tmp_path, [*prefix, target], ["-m", "torchmem", "run", "-q", *prefix, target])
    assert got.returncode == want.returncode
    return want.stderr, got.stderr


def test_a_torch_error_shows_the_traceback_plain_python_shows(tmp_path: Path) -> None:
    code = textwrap.dedent(
        """
        import torch
        a, b = torch.randn(3, 4), torch.randn(5, 6)
        def f():
            return torch.nn.functional.linear(a @ a.T, b)
        f()
        """
    )
    want, got = _same_traceback(tmp_path, "mm.py", code)
    assert "torchmem" not in got and "_dynamo" not in got and "_ops.py" not in got
    assert got == want


def test_chained_and_plain_errors_match_python(tmp_path: Path) -> None:
    code = textwrap.dedent(
        """
        import torch
        try:
            torch.ones(2) + torch.ones(3)
        except RuntimeError as e:
            raise ValueError("wrapped") from e
        """
    )
    want, got = _same_traceback(tmp_path, "chain.py", code)
    assert got == want


def test_syntax_error_and_missing_module_print_as_python_and_write_no_capture(tmp_path: Path) -> None:
    _write(tmp_path / "bad.py", "x = 1\ndef (\n")
    _write(tmp_path / "pk" / "__init__.py", "")
    plain, bad, missing, package = _together(
        tmp_path,
        ["bad.py"],
        ["-m", "torchmem", "run", "-q", "bad.py"],
        ["-m", "torchmem", "run", "-q", "-m", "no_such_module_xyz"],
        ["-m", "torchmem", "run", "-q", "-m", "pk"],
    )
    assert bad.returncode == plain.returncode
    want, got = plain.stderr, bad.stderr
    assert got == want and got.startswith('  File "') and "SyntaxError" in got
    r = missing
    assert r.returncode == 1
    assert r.stderr == "torchmem run: No module named no_such_module_xyz\n"
    r = package
    assert r.returncode == 1 and "'pk' is a package and cannot be directly executed" in r.stderr
    assert not list(tmp_path.glob("*.jsonl"))  # runs that never started leave no capture


# ---------------------------------------------------------------------------------------------------------
# the status line and the program's output


def test_status_line_is_cleared_before_the_program_prints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = _write(
        tmp_path / "slow.py",
        "import time, torch\nm = torch.nn.Linear(8, 8)\no = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "keep = []\nfor i in range(14):\n    m(torch.ones(2, 8)).sum().backward(); o.step(); o.zero_grad()\n"
        "    keep.append(torch.ones(256 * 1024))\n    time.sleep(0.06)\n    print('progress', i)\n",
    )
    terminal = io.StringIO()  # stdout and stderr share one terminal
    monkeypatch.setattr(sys, "stdout", terminal)
    code, _ = run_session(
        str(script), [str(script)], capture=str(tmp_path / "a.jsonl"), status=True, err=terminal
    )
    assert sys.stdout is terminal  # the wrapper is gone after the run
    assert code == 0
    text = terminal.getvalue()
    assert "[torchmem] step" in text and "LEAK" in text
    for line in text.split("\n"):
        visible = line.rsplit("\r", 1)[-1]
        if "progress" in line:  # the program's line, never glued to the status text
            assert visible.startswith("progress"), repr(line)


# ---------------------------------------------------------------------------------------------------------
# silence that reads as "all clear"


def test_zero_steps_says_why_and_what_to_do(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # No loop at all: one model call, one tensor op. "No repeating step" and what to do, never a silent 0.
    script = _write(
        tmp_path / "infer.py",
        "import torch\nm = torch.nn.Linear(4, 4)\ny = m(torch.ones(1, 4))\nprint(float(y.detach().sum()))\n",
    )
    assert main(["run", "--no-status", "-o", str(tmp_path / "a.jsonl"), str(script)]) == 0
    err = capsys.readouterr().err
    assert "0 steps" in err and "no repeating step was found" in err and "--step-marker" in err
    assert "top-level module call: 1" in err  # what was seen
    notes = [json.loads(x) for x in (tmp_path / "a.jsonl").read_text().splitlines()[1:]]
    assert any(r["type"] == "note" and "no repeating step" in r["text"] for r in notes)
    assert [r for r in notes if r["type"] == "boundary"][-1]["kind"] in ("timeline", "none")


def test_an_inference_loop_without_optimizer_counts_model_calls(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = _write(
        tmp_path / "infer.py",
        "import torch\nm = torch.nn.Linear(4, 4)\nfor _ in range(12):\n    m(torch.ones(1, 4))\n",
    )
    assert main(["run", "--no-status", "-o", str(tmp_path / "a.jsonl"), str(script)]) == 0
    err = capsys.readouterr().err
    # a call is a boundary once it repeats; its first occurrence ended step 1 (replayed): 12 calls, 12 steps
    assert "torchmem: 12 steps" in err and "no leak verdict: 0 steps" not in err
    assert "one step = one top-level Linear() call" in err
    recs = [json.loads(x) for x in (tmp_path / "a.jsonl").read_text().splitlines()[1:]]
    final = [r for r in recs if r["type"] == "leak"][-1]["report"]
    assert final["boundary"] == "top-level Linear() call" and not final["leaking"]


def test_a_step_marker_that_never_matches_is_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = _write(tmp_path / "train.py", TRAIN)
    assert (
        main(
            [
                "run",
                "--no-status",
                "--step-marker",
                "loop.train_step",
                "-o",
                str(tmp_path / "a.jsonl"),
                str(script),
            ]
        )
        == 0
    )
    err = capsys.readouterr().err
    assert "no function named 'loop.train_step' returned" in err
    assert "'train_step'" in err and "2 optimizer steps did run" in err


def test_work_in_child_processes_is_named(tmp_path: Path) -> None:
    script = _write(
        tmp_path / "hog.py",
        textwrap.dedent(
            """
            import torch, torch.multiprocessing as mp
            def train(rank):
                m = torch.nn.Linear(4, 4); o = torch.optim.SGD(m.parameters(), lr=0.1)
                for _ in range(3):
                    m(torch.ones(2, 4)).sum().backward(); o.step()
            if __name__ == "__main__":
                mp.spawn(train, nprocs=2)
            """
        ),
    )
    r = _torchmem(["run", "--no-status", "-o", "h.jsonl", script.name], tmp_path)
    assert r.returncode == 0, r.stderr
    assert "0 steps" in r.stderr and "2 child processes" in r.stderr and "torchmem.watch()" in r.stderr


def test_report_outputs_are_never_clobbered(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = _write(tmp_path / "train.py", TRAIN)
    cap = tmp_path / "c.jsonl"
    assert main(["run", "-q", "-o", str(cap), str(script)]) == 0
    mine = _write(tmp_path / "r.html", "<html>my page</html>")
    assert main(["report", str(cap), "--html", str(mine)]) == 3
    assert main(["report", str(cap), "--html", str(mine), "--force"]) == 3
    assert mine.read_text() == "<html>my page</html>"
    assert main(["report", str(cap), "--html", str(cap), "--force"]) == 3  # never over its own input
    new = tmp_path / "new.html"
    assert main(["report", str(cap), "--html", str(new)]) == 0
    assert main(["report", str(cap), "--html", str(new)]) == 3  # an earlier report: --force replaces it
    assert main(["report", str(cap), "--html", str(new), "--force"]) == 0
    assert json.loads(cap.read_text().splitlines()[0])["format"] == "torchmem-capture"


def test_an_unknown_option_before_the_program_is_run_s_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = _write(tmp_path / "train.py", TRAIN)
    assert main(["run", "--nonsense", str(script)]) == 2
    out = capsys.readouterr()
    assert "argv" not in out.out  # the program never ran
    assert "usage: torchmem run" in out.err and "unrecognized arguments: --nonsense" in out.err
    assert not list(tmp_path.glob("*.jsonl"))
