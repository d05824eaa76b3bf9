"""The ``device`` and ``gpus`` records: written by the real writer, read back, shown by the summary, the HTML
page and --json; a followed child watches the GPU it uses unless the run was given one."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import torch

from torchmem.analysis.gpus import gpus_report
from torchmem.capture.file import CaptureWriter, read_capture
from torchmem.report.html import render_html
from torchmem.results.capture import Capture, render_summary, run_facts
from torchmem.results.gpus import GpuRow
from torchmem.run.session import Session

MiB = 1 << 20


def _capture(path: Path, *, several: bool) -> Capture:
    w = CaptureWriter(str(path), device="cuda:0", source="allocator")
    w.record("device", device="cuda:1", name="H100", previous="cuda:0", reason="the program works on cuda:1")
    rows = [GpuRow("cuda:1", "H100", 1, 2, 2048 * MiB, 2048 * MiB, 2600 * MiB, watched=True)]
    if several:
        rows.insert(0, GpuRow("cuda:0", "H100", 0, 2 * MiB, 512, 2 * MiB, 520 * MiB))
    ev = {"set_device": [{"site": "t.py:9", "index": 1, "contexts_before": [0]}]}
    w.record("gpus", report=gpus_report(rows, "cuda:1", ev).to_dict())
    w.close(steps=3)
    return read_capture(str(path))


def test_the_followed_device_and_every_gpu_are_read_back_and_shown(tmp_path: Path) -> None:
    cap = _capture(tmp_path / "a.jsonl", several=True)
    assert cap.device == "cuda:1" and cap.device_name == "H100"
    assert "followed from cuda:0" in run_facts(cap).device
    g = cap.gpus_report
    assert g is not None and [r.device for r in g.rows] == ["cuda:0", "cuda:1"]
    (f,) = g.findings
    assert f.kind == "stray_context" and "set_device(1) ran at t.py:9" in f.text
    text = render_summary(cap)
    assert "GPUs this process used (timeline of cuda:1):" in text and "set_device(1) ran at t.py:9" in text
    page = render_html(cap)
    assert 'id="gpus"' in page and "set_device(1) ran at t.py:9" in page
    d = json.loads(json.dumps(cap.to_dict()))
    assert d["gpus"][0]["report"]["watched"] == "cuda:1" and d["devices"][0]["device"] == "cuda:1"
    assert Capture.from_dict(d).gpus_report == g


def test_one_gpu_without_findings_shows_no_gpu_section(tmp_path: Path) -> None:
    cap = _capture(tmp_path / "b.jsonl", several=False)
    assert cap.gpus_report is not None and cap.gpus_report.findings == ()
    assert "GPUs this process used" not in render_summary(cap)
    assert 'id="gpus"' not in render_html(cap)


def _target() -> None:
    pass


def test_a_followed_child_watches_its_own_gpu_unless_the_run_was_given_one(tmp_path: Path) -> None:
    for device, expect in ((None, None), ("cpu", "cpu")):
        s = Session(str(tmp_path / f"r{expect}.jsonl"), device=device, status=False)
        proc = multiprocessing.Process(target=_target)
        s._before_process_start(proc)
        assert proc._target.options["device"] == expect  # type: ignore[attr-defined]
    assert torch.device("cpu") == Session(str(tmp_path / "x.jsonl"), status=False).device
