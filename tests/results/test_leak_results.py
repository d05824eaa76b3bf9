"""Leak results: ``to_dict()``/``from_dict()`` round trips on reports a real watch produced, the reports
captures stored by earlier versions, and the terminal text."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

import torchmem
from torchmem.analysis.holders import find_holders
from torchmem.analysis.leaks import attribute, detect_growth
from torchmem.results._dicts import ResultFormatError
from torchmem.results.leaks import Culprit, Growth, LeakReport, SiteGrowth

CAPTURES = Path(__file__).resolve().parents[1] / "data" / "captures"
MiB = 1 << 20


def _leaky_report() -> LeakReport:
    model = torch.nn.Linear(256, 256)
    losses = []
    w = torchmem.watch(range(14), device="cpu", warn=False, min_bytes_per_step=64 * 1024)
    for _ in w:
        losses.append(model(torch.randn(128, 256)).square().mean())
    return w.report()


def test_a_real_report_round_trips_and_renders_the_same() -> None:
    r = _leaky_report()
    assert r.leaking and r.culprits and r.culprits[0].kind == "retained_graph"
    again = LeakReport.from_dict(json.loads(json.dumps(r.to_dict())))
    assert again == r
    assert str(again) == str(r)
    c = r.culprits[0]
    assert Culprit.from_dict(c.to_dict()) == c


def test_the_report_text_lists_each_culprit_under_the_verdict() -> None:
    r = _leaky_report()
    lines = str(r).splitlines()
    assert lines[0].startswith("LEAK on cpu: +") and "(confidence " in lines[0]
    assert r.source == "heap" and lines[1].startswith("  heap figure: ")  # the CPU's default figure
    c = r.culprits[0]
    i = next(i for i, line in enumerate(lines) if line.startswith("  [1] "))
    first, *rest = str(c).splitlines()
    assert lines[i] == f"  [1] {first}" and first.startswith(f"{c.kind}: +") and f"born at {c.site}" in first
    assert lines[i + 1 : i + 1 + len(rest)] == [f"    {line}" for line in rest]
    assert lines[i + 1] == f"      held by {c.holder}" and f"      fix: {c.fix}" in lines


def _stored_reports() -> list[dict[str, Any]]:
    found = []
    for f in sorted(CAPTURES.glob("*.jsonl")):
        for line in f.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:  # the last line of a killed run's capture is cut short
                continue
            if isinstance(rec.get("report"), dict) and "culprits" in rec["report"]:
                found.append(rec["report"])
    return found


def test_reports_stored_by_earlier_versions_read() -> None:
    stored = _stored_reports()
    assert stored and all("verdict" not in d and "min_bytes_per_step" not in d for d in stored)
    with_culprits = 0
    for d in stored:
        r = LeakReport.from_dict(d)
        assert (r.verdict, r.trend_per_step, r.min_bytes_per_step) == ("", 0.0, 0)
        assert r.device == d["device"] and r.leaking is d["leaking"] and len(r.series) == len(d["series"])
        assert [c.holder for c in r.culprits] == [c["holder"] for c in d["culprits"]]
        with_culprits += bool(r.culprits)
        assert LeakReport.from_dict(r.to_dict()) == r
        assert str(r).startswith(("LEAK on cpu", "no leak on cpu"))
    assert with_culprits


def test_growth_and_site_growth_round_trip() -> None:
    g = detect_growth(range(12), [i * 64 * 1024 for i in range(12)])
    assert g.verdict == "below_threshold"
    assert Growth.from_dict(json.loads(json.dumps(g.to_dict()))) == g
    assert str(g).startswith("no leak (below_threshold): memory grows by 64.00 KiB/step")
    leak = detect_growth(range(8), [i * MiB for i in range(8)])
    assert str(leak).startswith("leak: +1.00 MiB/step (steady, confidence 1.00")
    history = [torch.zeros(1) for _ in range(4)]
    site = SiteGrowth("train.py:9", float(MiB), 4 * MiB, 4, 1.0, find_holders([history[3]]).paths[0])
    again = SiteGrowth.from_dict(json.loads(json.dumps(site.to_dict())))
    assert again == site and again.paths[0].kinds == site.paths[0].kinds
    assert "local 'history'[3]" in str(site)
    (c,) = attribute([again])
    assert c.kind == "device_accumulation" and c.holder == str(site.paths[0])


def test_bad_records_are_refused_with_the_field_named() -> None:
    stored = _stored_reports()[0]
    with pytest.raises(ResultFormatError, match="no 'source'"):
        LeakReport.from_dict({"device": "cpu"})
    with pytest.raises(ResultFormatError, match=r"LeakReport\.leaking"):
        LeakReport.from_dict({**stored, "leaking": "yes"})
    with pytest.raises(ResultFormatError, match=r"Culprit\.sites"):
        Culprit.from_dict({"kind": "cache", "sites": [{"site": "x.py:1"}]})
