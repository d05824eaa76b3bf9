"""``torchmem report``: the summary, JSON, PNG plot and HTML report of real captures, and bad input."""

from __future__ import annotations

import html
import importlib.util
import json
import os
import re
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from torchmem import cli
from torchmem.capture.file import CaptureWriter, read_capture
from torchmem.cli import report as report_cmd
from torchmem.report._output import OutputError, write_atomic
from torchmem.report.html import render_html, write_html
from torchmem.report.summary import render_summary

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "captures"


def _load_make_captures() -> ModuleType:
    spec = importlib.util.spec_from_file_location("make_captures", DATA / "make_captures.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(autouse=True)
def _report_registered(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``report`` is reachable through ``main()`` (a no-op once cli/__init__ registers it)."""
    monkeypatch.setitem(cli._COMMANDS, "report", report_cmd)
    yield


def main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def fresh_capture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A capture recorded now from a real CPU training run with a leak that ends in a real OOM."""
    mc = _load_make_captures()
    path = tmp_path_factory.mktemp("fresh") / "run.jsonl"
    return Path(mc.record_run(path, steps=12, leak=True, oom=True))


# ---------------------------------------------------------------------------------------------------------
# summary


def test_summary_of_a_leaky_run_names_site_holder_and_fix(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = main(["report", str(DATA / "leak_cpu.jsonl")], capsys)
    assert code == 0 and err == ""
    assert "program   train.py --steps 16 --leak" in out
    assert "16 steps" in out and "ended     exit (exit code 0)" in out
    assert "peak      allocated 19.51 MiB, reserved n/a" in out
    assert "LEAK on cpu: +1.00 MiB/step over 16 steps" in out
    assert "born at make_captures.py:" in out
    assert "held by make_captures.py:" in out and "local 'kept'[" in out and ".grad_fn" in out
    assert "fix: `kept` keeps one autograd graph per step" in out  # the stored capture's own text
    assert "Reconciliation at the end of the run:" in out and "live tensor storages (cpu_tracking)" in out
    assert "Per-module memory:" in out
    module_lines = [ln for ln in out.splitlines() if re.match(r"\s+(Sequential|\d)\s", ln)]
    assert [ln.split()[0] for ln in module_lines] == ["Sequential", "0", "2", "1"]  # largest first
    assert "WARNING" not in out


def test_summary_of_a_flat_run_says_no_leak() -> None:
    text = render_summary(read_capture(DATA / "flat_cpu.jsonl"))
    assert "no leak on cpu over 16 steps" in text and "LEAK" not in text


def test_summary_of_an_oom_run_gives_the_diagnosis(fresh_capture: Path) -> None:
    cap = read_capture(fresh_capture)
    text = str(cap)
    assert cap.end is not None and cap.end.reason == "oom" and cap.end.exit_code == 1
    assert "ended     oom (exit code 1)" in text
    assert "OOM at step 12" in text and "32.00 TiB requested" in text and "Fixes:" in text
    assert "LEAK on cpu" in text


def test_summary_of_a_killed_run_warns_where_it_stops(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = main(["report", str(DATA / "killed_cpu.jsonl")], capsys)
    assert code == 0
    cap = read_capture(DATA / "killed_cpu.jsonl")
    assert cap.truncated is not None
    assert out.splitlines()[1] == f"WARNING: {cap.truncated}; what follows is what was recorded before that."
    assert "not finished: no end record" in out
    assert out.rstrip().endswith(f"WARNING: {cap.truncated}.")


# ---------------------------------------------------------------------------------------------------------
# JSON


def test_json_is_the_capture_and_only_json_on_stdout(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out_html = tmp_path / "r.html"
    code, out, err = main(["report", str(DATA / "leak_cpu.jsonl"), "--json", "--html", str(out_html)], capsys)
    assert code == 0
    data = json.loads(out)
    cap = read_capture(DATA / "leak_cpu.jsonl")
    assert data == json.loads(json.dumps(cap.to_dict()))
    assert data["header"]["format"] == "torchmem-capture" and data["summary"]["steps"] == 16
    assert len(data["samples"]) == len(cap.samples) == 48
    assert data["leaks"][-1]["report"]["leaking"] is True
    assert data["modules"][0]["rows"][0]["module"] == "Sequential"
    assert f"HTML report: {out_html}" in err and out_html.is_file()


# ---------------------------------------------------------------------------------------------------------
# plot


def test_plot_writes_a_png(capsys: pytest.CaptureFixture[str], tmp_path: Path, fresh_capture: Path) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "t.png"
    code, out, _ = main(["report", str(fresh_capture), "--plot", str(png)], capsys)
    assert code == 0 and f"timeline plot: {png}" in out
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    w, h = struct.unpack(">II", data[16:24])
    assert (w, h) == (1000, 420)
    assert len(data) > 20_000  # lines, labels and markers, not an empty canvas
    assert [p.name for p in tmp_path.iterdir()] == ["t.png"]  # no temporary file left


def test_plot_without_matplotlib_says_how_to_install(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what Python does when it is not installed
    out_html = tmp_path / "r.html"
    code, out, err = main(
        ["report", str(DATA / "leak_cpu.jsonl"), "--plot", str(tmp_path / "t.png"), "--html", str(out_html)],
        capsys,
    )
    assert code == 1 and out == ""
    assert "--plot needs matplotlib" in err and "pip install 'torchmem[plot]'" in err
    assert list(tmp_path.iterdir()) == []  # checked before anything was written


# ---------------------------------------------------------------------------------------------------------
# HTML


def _external_refs(page: str) -> list[str]:
    refs = re.findall(r"""(?:src|href|xlink:href|action)\s*=\s*["']?([^"'\s>]+)""", page, flags=re.I)
    refs += re.findall(r"url\(([^)]*)\)", page) + re.findall(r"@import", page)
    return refs


def test_html_is_self_contained_and_has_every_section(tmp_path: Path, fresh_capture: Path) -> None:
    out = write_html(read_capture(fresh_capture), tmp_path / "r.html")
    page = out.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>")
    assert _external_refs(page) == []
    assert "<link" not in page and "<img" not in page and "<iframe" not in page
    # the only URL is the SVG namespace name, which is never fetched
    assert set(re.findall(r"https?://[^\s\"'<>]+", page)) == {"http://www.w3.org/2000/svg"}
    assert "default-src 'none'" in page  # the browser refuses any fetch
    for section in ("timeline-section", "leaks", "oom", "reconciliation", "modules"):
        assert f'<section id="{section}">' in page
    svg = page[page.index('<svg id="timeline"') : page.index("</svg>")]
    assert svg.count('class="series allocated"') == 1 and svg.count('class="series peak"') == 1
    assert 'class="series reserved"' not in svg  # the CPU has no reserved figure: no line, not zeros
    assert svg.count('class="step"') == 12
    assert 'class="oom-mark"' in svg and 'class="leak-mark"' in svg and "leak found (step 8)" in svg
    assert "LEAK</span>" in page and "OOM</span>" in page
    assert "32.00 TiB" in page and "DefaultCPUAllocator" in page
    assert '<table class="culprits">' in page and "retained graph" in page
    assert '<table class="modules">' in page and '<table class="reconcile">' in page


def test_html_escapes_everything_from_the_capture(tmp_path: Path) -> None:
    evil = "<script>alert('x')</script> & \"quoted\" <lambda>"
    p = tmp_path / "evil.jsonl"
    w = CaptureWriter(p, device="cuda:0", device_name=evil, source="allocator", argv=["a<b>.py", evil])
    w.sample(step=1, allocated=1 << 20, reserved=2 << 20, peak_allocated=1 << 20)
    w.step(1, allocated=1 << 20)
    leak: dict[str, Any] = dict(read_capture(DATA / "leak_cpu.jsonl").leaks[-1].report)
    sites = [{"site": "<stdin>:3", "bytes_per_step": 1.0}]
    leak["culprits"] = [dict(leak["culprits"][0], holder=evil, site="<stdin>:3", sites=sites, fix=evil)]
    leak["detected_at"] = 1
    w.leak(leak)
    w.modules([{"module": evil, "params": 1, "grads": 1, "optimizer_state": 1, "activations": 1,
                "forward_peak": 1, "backward_peak": 1}])  # fmt: skip
    w.note(evil)
    w.record("oom", diagnosis={"is_oom": True, "parsed": None, "causes": [], "fixes": [], "notes": [evil]})
    w.close()
    page = render_html(read_capture(p))
    assert "<script>alert" not in page and "<lambda>" not in page and "a<b>" not in page
    escaped = html.escape(evil, quote=True)
    assert page.count(escaped) >= 5  # argv, device name, holder, fix, module, note
    assert "&lt;stdin&gt;:3" in page
    assert page.count("<script") == 2  # the data block and the hover script, nothing else


def test_html_of_an_empty_run_and_a_killed_run(tmp_path: Path) -> None:
    p = tmp_path / "empty.jsonl"
    CaptureWriter(p, argv=["x.py"]).close(exit_code=3, reason="exception")
    page = render_html(read_capture(p))
    assert "no timeline samples in this capture" in page and "No leak verdict was recorded." in page
    assert "exception 3</span>" in page
    page = render_html(read_capture(DATA / "killed_cpu.jsonl"))
    assert 'id="truncated"' in page and "the file stops at line 57" in page
    assert "not finished</span>" in page and 'class="cut-mark"' in page


def test_long_timelines_are_thinned_keeping_the_peaks(tmp_path: Path) -> None:
    p = tmp_path / "long.jsonl"
    w = CaptureWriter(p, argv=[])
    for i in range(20_000):
        w.sample(t=i * 0.01, step=i // 100, allocated=(i % 100) * 1024 + (50 << 20 if i == 12_345 else 0))
    w.close()
    page = render_html(read_capture(p))
    line = re.search(r'class="series allocated" points="([^"]+)"', page)
    assert line is not None
    pts = [tuple(map(float, xy.split(","))) for xy in line.group(1).split()]
    assert 1000 <= len(pts) <= 2100
    assert min(y for _, y in pts) < 100  # the 50 MiB spike survives thinning (others lie near y=296)


# ---------------------------------------------------------------------------------------------------------
# bad input and outputs


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\x89PNG\r\n\x1a\n\x00\x00", "is not a torchmem capture file: it contains a PNG image"),
        (b'{"hello": 1}\n', "is not a torchmem capture file: its first line is a JSON object"),
        (b'{"format": "torchmem-capture", "version": 999}\n', "capture of version 999"),
        (b"", "is empty"),
    ],
)
def test_bad_captures_exit_3_with_a_message(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: bytes, message: str
) -> None:
    p = tmp_path / "bad.jsonl"
    p.write_bytes(content)
    code, out, err = main(["report", str(p), "--html", str(tmp_path / "r.html")], capsys)
    assert code == 3 and out == ""
    assert err.startswith("torchmem: error: ") and message in err and "hint: " in err
    assert "Traceback" not in err and not (tmp_path / "r.html").exists()


def test_missing_capture(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = main(["report", str(tmp_path / "none.jsonl")], capsys)
    assert code == 3 and "no capture file at" in err


def test_unwritable_outputs_fail_before_writing_anything(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    good = tmp_path / "ok.html"
    code, out, err = main(
        ["report", str(DATA / "leak_cpu.jsonl"), "--html", str(tmp_path / "missing" / "r.html")], capsys
    )
    assert code == 3 and out == "" and "does not exist" in err and "hint: create the folder" in err
    code, out, err = main(["report", str(DATA / "leak_cpu.jsonl"), "--html", str(tmp_path)], capsys)
    assert code == 3 and "is a folder" in err
    assert not good.exists() and list(tmp_path.iterdir()) == []


def test_atomic_write_leaves_nothing_when_rendering_fails(tmp_path: Path) -> None:
    target = tmp_path / "r.html"
    previous = '<html><head><meta name="generator" content="torchmem 0.1.0"></head>previous report'
    target.write_text(previous)

    def broken(f: Any) -> None:
        f.write(b"<html>half")
        raise RuntimeError("renderer failed")

    with pytest.raises(RuntimeError, match="renderer failed"):
        write_atomic(target, broken, force=True)
    assert target.read_text() == previous  # untouched
    assert [p.name for p in tmp_path.iterdir()] == ["r.html"]  # no temporary file left
    with pytest.raises(OutputError, match="does not exist"):
        write_atomic(tmp_path / "nope" / "x.html", lambda f: None)


def test_report_through_a_real_subprocess(tmp_path: Path) -> None:
    launcher = (
        "import sys; from torchmem import cli; from torchmem.cli import report; "
        "cli._COMMANDS.setdefault('report', report); sys.exit(cli.main(sys.argv[1:]))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out_html = tmp_path / "r.html"
    r = subprocess.run(
        [sys.executable, "-c", launcher, "report", str(DATA / "oom_cpu.jsonl"), "--html", str(out_html)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "OOM at step 10" in r.stdout and f"HTML report: {out_html}" in r.stdout
    assert out_html.read_text(encoding="utf-8").rstrip().endswith("</html>")
    r = subprocess.run(
        [sys.executable, "-c", launcher, "report", str(out_html)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 3 and "an HTML or XML document" in r.stderr
