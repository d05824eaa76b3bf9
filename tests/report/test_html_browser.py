"""The HTML report in a real headless Chromium: it loads, shows the timeline and tables, logs no errors.

Needs the ``chromium`` binary (Debian: ``apt-get install -y chromium``); skipped, with the reason, without.
Chromium prints every console message, uncaught exception and blocked fetch (the page's CSP forbids all)
as a ``CONSOLE`` line on stderr with ``--enable-logging=stderr``; a self-check proves such lines are seen.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from torchmem.capture.file import read_capture
from torchmem.report.html import render_html, write_html

DATA = Path(__file__).resolve().parents[1] / "data" / "captures"

_BROWSER = next(
    (b for b in (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")) if b), None
)
pytestmark = pytest.mark.skipif(
    _BROWSER is None, reason="no chromium binary (Debian: apt-get install -y chromium)"
)


def _chromium(url: str, *extra: str, tmp: Path) -> tuple[str, list[str]]:
    """Run headless Chromium on ``url``; return stdout and the console lines it logged."""
    assert _BROWSER is not None
    args = [
        _BROWSER,
        "--headless",
        "--disable-gpu",
        "--no-sandbox",
        "--no-first-run",
        "--disable-extensions",
        "--enable-logging=stderr",
        "--v=0",
        f"--user-data-dir={tmp / 'profile'}",
        *extra,
        url,
    ]
    env = {**os.environ, "HOME": str(tmp)}
    r = subprocess.run(args, capture_output=True, text=True, timeout=120, env=env, cwd=tmp)
    console = [ln for ln in r.stderr.splitlines() if ":CONSOLE" in ln]
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout, console


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The report of a capture recorded now from a real CPU run: a leak, then a real OOM."""
    spec = importlib.util.spec_from_file_location("make_captures", DATA / "make_captures.py")
    assert spec is not None and spec.loader is not None
    mc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mc)
    d = tmp_path_factory.mktemp("browser")
    cap = mc.record_run(d / "run.jsonl", steps=12, leak=True, oom=True)
    return write_html(read_capture(cap), d / "report.html")


def test_console_errors_are_seen(tmp_path: Path) -> None:
    """Self-check: the console lines this test relies on do appear for a broken page."""
    bad = tmp_path / "bad.html"
    bad.write_text(
        '<!DOCTYPE html><html><head><meta http-equiv="Content-Security-Policy" '
        "content=\"default-src 'none'; script-src 'unsafe-inline'\"></head>"
        "<body><script>undefinedFunction();</script>"
        '<img src="https://example.invalid/x.png"></body></html>'
    )
    _, console = _chromium(bad.as_uri(), "--dump-dom", tmp=tmp_path)
    assert any("undefinedFunction is not defined" in ln for ln in console), console
    assert any("Content Security Policy" in ln for ln in console), console


def test_report_loads_with_timeline_and_tables_and_no_console_errors(report: Path, tmp_path: Path) -> None:
    dom, console = _chromium(report.as_uri(), "--dump-dom", tmp=tmp_path)
    assert console == []
    assert "<title>torchmem report: run.jsonl</title>" in dom
    svg = dom[dom.index('<svg id="timeline"') : dom.index("</svg>")]
    assert re.search(r'<polyline class="series allocated" points="[\d.,\s]{200,}"', svg)
    assert svg.count('class="step"') == 12 and 'class="oom-mark"' in svg and 'class="leak-mark"' in svg
    for table in ("culprits", "reconcile", "modules"):
        assert f'<table class="{table}">' in dom
    rows = re.findall(r"<tr>", dom[dom.index('<table class="modules">') :].split("</table>")[0])
    assert len(rows) == 5  # header + Sequential and its three children
    assert "Leak on cpu" in dom and "32.00 TiB" in dom


def test_hover_script_runs_without_errors(report: Path, tmp_path: Path) -> None:
    """Drive the inline script: a pointer move over the timeline fills the read-out."""
    page = report.read_text(encoding="utf-8")
    driver = (
        "<script>(function(){var s=document.getElementById('timeline');var b=s.getBoundingClientRect();"
        "s.dispatchEvent(new MouseEvent('mousemove',{clientX:b.left+b.width*0.5,clientY:b.top+b.height*0.5,"
        "bubbles:true}));document.body.setAttribute('data-readout',"
        "document.getElementById('readout').textContent);"
        "document.body.setAttribute('data-cursor',document.getElementById('cursor')"
        ".getAttribute('visibility'));})();</script></body>"
    )
    driven = tmp_path / "driven.html"
    driven.write_text(page.replace("</body>", driver), encoding="utf-8")
    dom, console = _chromium(driven.as_uri(), "--dump-dom", tmp=tmp_path)
    assert console == []
    m = re.search(r'data-readout="([^"]*)"', dom)
    assert m is not None, dom[-3000:]
    assert re.fullmatch(r"\d+\.\d{3} s  step \d+  allocated \d+\.\d\d (KiB|MiB)  reserved n/a", m.group(1))
    assert 'data-cursor="visible"' in dom


def test_screenshot_is_not_blank(report: Path, tmp_path: Path) -> None:
    shot = tmp_path / "shot.png"
    _, console = _chromium(
        report.as_uri(), f"--screenshot={shot}", "--window-size=1200,1800", "--hide-scrollbars", tmp=tmp_path
    )
    assert console == []
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", data[16:24]) == (1200, 1800)
    assert len(data) > 60_000  # text, tables and the plot; a blank page compresses to a few KiB


def test_escaped_capture_runs_no_injected_script(tmp_path: Path) -> None:
    """Text from the capture that looks like markup stays text in the browser."""
    from torchmem.capture.file import CaptureWriter

    p = tmp_path / "evil.jsonl"
    w = CaptureWriter(p, argv=["x.py", "<img src=x onerror=console.error('pwned')>"])
    w.sample(step=1, allocated=1024)
    w.note("</script><script>console.error('pwned')</script>")
    w.close()
    out = tmp_path / "evil.html"
    out.write_text(render_html(read_capture(p)), encoding="utf-8")
    dom, console = _chromium(out.as_uri(), "--dump-dom", tmp=tmp_path)
    assert console == []
    assert "&lt;/script&gt;&lt;script&gt;console.error('pwned')&lt;/script&gt;" in dom
