"""``torchmem lint`` as a linter: output formats, exit codes, noqa, select/ignore, configuration, --explain,
file discovery, bad input, and the pages that ship in the package."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from torchmem.cli import lint as lint_cmd
from torchmem.lint import RULES, LintConfigError, explain_rule, lint_paths, lint_source
from torchmem.lint._pages import PAGES
from torchmem.lint._rules import DEFAULT_FORMS

DOCS = Path(__file__).resolve().parents[3] / "docs"

BAD = """\
total = 0
for x, y in loader:
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
    total += loss
    optimizer.zero_grad(set_to_none=False)
"""


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="torchmem")
    sub = parser.add_subparsers(dest="command")
    lint_cmd.add_parser(sub)
    return lint_cmd.run(parser.parse_args(["lint", *argv]))


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(BAD)
    (tmp_path / "clean.py").write_text("x = 1\n")
    return tmp_path


def test_text_output_and_exit_1(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["--all", "train.py"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert re.fullmatch(r"train\.py:6:5: TM001 `total` accumulates `loss`.* \(fix: .*\.item\(\).*\)", out[0])
    assert out[1].startswith("train.py:7:5: TM008 ")
    assert out[2].startswith("Found 2 problems (TM001: 1, TM008: 1)")
    assert len(out) == 3


def test_default_output_hides_the_forms_of_lower_precision(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """TM001 on the loss backward ran on is a warning, shown; TM008 (0 of 4 true on held-out code) is
    info: counted under the findings, shown by --all or by naming its code."""
    assert run(["train.py"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("train.py:6:5: TM001 ")
    assert out[1].startswith("Found 1 problem (TM001: 1)")
    assert out[2] == (
        "1 more of lower measured precision not shown (TM008: 1): `torchmem lint --all` shows them."
    )
    (project / "only_info.py").write_text("optimizer.zero_grad(set_to_none=False)\n")
    assert run(["only_info.py"]) == 0  # nothing shown: nothing to fail CI on
    assert "1 more of lower measured precision not shown (TM008: 1)" in capsys.readouterr().out
    assert run(["-q", "only_info.py"]) == 0
    assert capsys.readouterr().out == ""
    assert run(["--all", "only_info.py"]) == 1
    assert run(["--select", "TM008", "-q", "only_info.py"]) == 1  # named: wanted
    assert capsys.readouterr().out.splitlines()[-1].split()[1] == "TM008"


def test_findings_carry_their_form_and_severity() -> None:
    (tm001, tm008) = lint_source(BAD)
    assert (tm001.code, tm001.form, tm001.severity) == ("TM001", "backward-ran", "warning")
    assert (tm008.code, tm008.form, tm008.severity) == ("TM008", "", "info")
    kept_output = BAD.replace("total += loss", "total += model(x)")  # no backward through it
    (tm001,) = [f for f in lint_source(kept_output) if f.code == "TM001"]
    assert (tm001.form, tm001.severity) == ("no-backward", "info")


def test_clean_file_exits_0(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["clean.py"]) == 0
    assert capsys.readouterr().out == ""


def test_json_format(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["--format", "json", "--all", "train.py"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert [(d["code"], d["line"], d["col"], d["name"], d["severity"]) for d in data] == [
        ("TM001", 6, 5, "graph-accumulated", "warning"),
        ("TM008", 7, 5, "zero-grad-keeps-buffers", "info"),
    ]
    assert data[0]["path"] == "train.py" and data[0]["fix"] and data[0]["explain"].endswith("TM001")
    assert data[0]["form"] == "backward-ran"
    assert run(["--format", "json", "train.py"]) == 1
    assert [d["code"] for d in json.loads(capsys.readouterr().out)] == ["TM001"]


def test_github_format(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["--format", "github", "train.py"]) == 1
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("::warning file=train.py,line=6,col=5,title=TM001 graph-accumulated::")
    assert run(["--format", "github", "--all", "train.py"]) == 1
    second = capsys.readouterr().out.splitlines()[1]
    assert second.startswith("::notice file=train.py,line=7,col=5,title=TM008 zero-grad-keeps-buffers::")


def test_select_and_ignore(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["--select", "TM008", "-q", "train.py"]) == 1
    assert [ln.split()[1] for ln in capsys.readouterr().out.splitlines()] == ["TM008"]
    assert run(["--ignore", "TM001,TM008", "train.py"]) == 0
    assert run(["--select", "TM00", "--ignore", "TM001", "-q", "train.py"]) == 0  # a prefix: TM008 hidden
    assert run(["--select", "TM00", "--ignore", "TM001", "--all", "-q", "train.py"]) == 1
    assert "TM001" not in capsys.readouterr().out
    assert run(["--select", "TM999", "train.py"]) == 2
    assert "unknown rule code 'TM999'" in capsys.readouterr().err


def test_noqa(tmp_path: Path) -> None:
    src = BAD.replace("total += loss", "total += loss  # noqa: TM001")
    assert [f.code for f in lint_source(src)] == ["TM008"]
    src = BAD.replace("total += loss", "total += loss  # noqa")
    assert [f.code for f in lint_source(src)] == ["TM008"]
    src = BAD.replace("total += loss", "total += loss  # noqa: E501")  # another tool's code
    assert [f.code for f in lint_source(src)] == ["TM001", "TM008"]
    src = BAD.replace("total += loss", "total += loss  # NOQA:TM008,TM001")
    assert [f.code for f in lint_source(src)] == ["TM008"]
    src = BAD.replace("total += loss", "total += loss; s = '# noqa'")  # inside a string: not a comment
    assert [f.code for f in lint_source(src)] == ["TM001", "TM008"]


def test_syntax_error_is_a_finding_line_and_exit_2(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (project / "broken.py").write_text("def f(:\n    pass\n")
    assert run(["."]) == 2
    out = capsys.readouterr().out
    assert re.search(r"^broken\.py:1:7: TM000 cannot parse: ", out, re.M)
    assert "train.py:6:5: TM001" in out  # the other files are still checked
    assert "Traceback" not in out


def test_undecodable_file_is_a_finding(tmp_path: Path) -> None:
    bad = tmp_path / "latin.py"
    bad.write_bytes(b"x = '\xff\xfe'\n")
    (finding,) = lint_paths([bad])
    assert finding.code == "TM000" and "cannot read" in finding.message


def test_missing_path_is_a_clear_error(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["nope.py", "train.py"]) == 2
    err = capsys.readouterr().err
    assert "torchmem: error: no such file or directory: nope.py" in err
    with pytest.raises(FileNotFoundError):
        lint_paths(["nope.py"])


def test_directories_are_walked_skipping_vcs_venvs_and_builds(tmp_path: Path) -> None:
    for rel in ("pkg/a.py", "pkg/sub/b.py", ".git/c.py", "build/d.py", "env/e.py", "pkg/__pycache__/f.py"):
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(BAD)
    (tmp_path / "env" / "pyvenv.cfg").write_text("home = /usr\n")
    (tmp_path / "pkg" / "notes.txt").write_text(BAD)
    found = sorted({Path(f.path).relative_to(tmp_path).as_posix() for f in lint_paths([tmp_path])})
    assert found == ["pkg/a.py", "pkg/sub/b.py"]
    # a file named explicitly is read even inside a skipped folder
    assert lint_paths([tmp_path / "build" / "d.py"])


def test_pyproject_configuration(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (project / "pyproject.toml").write_text(
        '[tool.torchmem.lint]\nignore = ["TM008"]\nexclude = ["generated/*"]\n'
    )
    (project / "generated").mkdir()
    (project / "generated" / "g.py").write_text(BAD)
    assert [f.code for f in lint_paths(["."])] == ["TM001"]
    assert [f.code for f in lint_paths(["."], config=False) if f.path.startswith("train")] == [
        "TM001",
        "TM008",
    ]
    assert run(["--no-config", "-q", "."]) == 1
    assert "generated/g.py" in capsys.readouterr().out
    # --select on the command line replaces the configuration's select; --ignore adds to its ignore
    assert [f.code for f in lint_paths(["."], select=["TM008"])] == []
    (project / "pyproject.toml").write_text('[tool.torchmem.lint]\nselect = ["TM008"]\n')
    assert [f.code for f in lint_paths(["train.py"])] == ["TM008"]
    assert [f.code for f in lint_paths(["train.py"], select=["TM001"])] == ["TM001"]


def test_nearest_pyproject_wins(project: Path) -> None:
    (project / "pyproject.toml").write_text('[tool.torchmem.lint]\nignore = ["TM001"]\n')
    sub = project / "sub"
    sub.mkdir()
    (sub / "train.py").write_text(BAD)
    (sub / "pyproject.toml").write_text('[tool.torchmem.lint]\nignore = ["TM008"]\n')
    found = {(Path(f.path).parent.name, f.code) for f in lint_paths(["."])}
    assert found == {("", "TM008"), ("sub", "TM001")}
    # a pyproject.toml without the table does not stop the search
    (sub / "pyproject.toml").write_text("[tool.ruff]\nline-length = 100\n")
    assert {f.code for f in lint_paths(["sub"])} == {"TM008"}


def test_bad_configuration_is_exit_2(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (project / "pyproject.toml").write_text('[tool.torchmem.lint]\nignore = ["TM777"]\n')
    with pytest.raises(LintConfigError):
        lint_paths(["."])
    assert run(["."]) == 2
    assert "TM777" in capsys.readouterr().err
    (project / "pyproject.toml").write_text('[tool.torchmem.lint]\nignore = "TM001"\nspeed = 3\n')
    assert run(["--all", "train.py"]) == 1
    assert "unknown key 'speed'" in capsys.readouterr().err


def test_explain_prints_the_page(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["--explain", "TM003"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# TM003 empty-cache-in-loop") and "## Wrong" in out and "## Right" in out
    assert run(["--explain", "tm001"]) == 0
    capsys.readouterr()
    assert run(["--explain", "TM123"]) == 2
    assert "no rule 'TM123'" in capsys.readouterr().err
    assert run(["--list-rules"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(RULES)
    for line in lines:  # every form shown by default is named on its rule's line (TM001 has two)
        code = line.split()[0]
        forms = [form for c, form in DEFAULT_FORMS if c == code and form]
        assert all(form in line for form in forms), line
        assert ("--all" in line) == (not any(c == code for c, _ in DEFAULT_FORMS)), line


@pytest.mark.parametrize("code", sorted(c for c in RULES if c != "TM000"))
def test_every_rule_has_a_page_whose_wrong_example_fires_and_right_example_does_not(code: str) -> None:
    page = explain_rule(code)
    assert page.startswith(f"# {code} {RULES[code].name}\n")
    for section in ("## Why", "## Wrong", "## Right", "## When it does not fire"):
        assert section in page
    wrong = re.search(r"## Wrong\n\n```python\n(.*?)```", page, re.S)
    right = re.search(r"## Right\n\n```python\n(.*?)```", page, re.S)
    assert wrong and right
    # TM010's example is an eval() loop: TM002 reports that loop too (TM010 is not shown by default)
    expected = {code}  # (a TM010 loop is not TM002 as well: one finding, round T)
    assert {f.code for f in lint_source(wrong.group(1), "example.py")} == expected
    assert lint_source(right.group(1), "example.py") == []


@pytest.mark.parametrize("code", sorted(PAGES))
def test_docs_pages_match_the_packaged_pages(code: str) -> None:
    assert (DOCS / "lint" / f"{code}.md").read_text() == PAGES[code]
    assert f"lint/{code}.md" in (DOCS / "lint.md").read_text()


def test_lint_imports_no_torch(project: Path) -> None:
    code = (
        "import sys\nfrom torchmem.lint import lint_paths\n"
        "assert [f.code for f in lint_paths(['train.py'])] == ['TM001', 'TM008']\n"
        "assert 'torch' not in sys.modules, 'lint imported torch'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=project, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_pre_commit_hook_definition() -> None:
    text = (DOCS.parent / ".pre-commit-hooks.yaml").read_text()
    assert "id: torchmem-lint" in text and "entry: torchmem lint" in text and "types: [python]" in text


def test_an_internal_error_on_one_file_is_said_for_it_and_the_others_are_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug of torchmem's own on one file (here a rule that raises on it) is a TM000 for that file, not a
    traceback that ends the run: the other files' findings are still given."""
    from torchmem.lint import _run

    (tmp_path / "bad.py").write_text("import torch\nx = 1\n")
    (tmp_path / "good.py").write_text(
        "import torch\nfor x, y in loader:\n    loss = f(model(x), y)\n"
        "    loss.backward()\n    total += loss\n"
    )
    check = _run.check_tree

    def flaky(tree: object, path: str) -> object:
        if path.endswith("bad.py"):
            raise KeyError("a rule's bug")
        return check(tree, path)  # type: ignore[arg-type]

    monkeypatch.setattr(_run, "check_tree", flaky)
    found = {(Path(f.path).name, f.code) for f in lint_paths([str(tmp_path)], config=False, jobs=1)}
    assert ("bad.py", "TM000") in found and ("good.py", "TM001") in found, found
    bad = next(f for f in lint_paths([str(tmp_path / "bad.py")], config=False, jobs=1))
    assert "internal error (KeyError" in bad.message


def test_deeply_nested_code_is_reported_not_raised() -> None:
    for n in (400, 5000):
        src = "for x in loader:\n    loss.backward()\n    y = x" + ".a(1)" * n + "\n"
        assert [f.code for f in lint_source(src)] in ([], ["TM000"])
