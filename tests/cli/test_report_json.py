"""``torchmem report --json`` gives every record a capture has (issue 28: it left out ``host_leak``,
``survivors``, ``overhead`` and ``boundary``, so a CI script reading the JSON never saw a host leak)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from torchmem.capture.file import CaptureWriter
from torchmem.cli import main

# What `report --json` gave before the record table: users' scripts read these keys, they stay.
OLD_KEYS = {
    "path", "header", "summary", "samples", "steps", "stats", "leaks", "ooms", "modules", "notes", "end",
    "truncated", "unknown", "lines",
}  # fmt: skip

TRAIN = textwrap.dedent(
    """
    import torch
    model = torch.nn.Linear(16, 16)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(12):
        model(torch.randn(8, 16)).square().mean().backward()
        opt.step(); opt.zero_grad()
    """
)


def _json(capsys: pytest.CaptureFixture[str], path: Path) -> dict[str, Any]:
    assert main(["report", str(path), "--json"]) == 0
    out = capsys.readouterr().out
    data = json.loads(out)  # nothing but JSON on stdout
    assert isinstance(data, dict)
    return data


def test_report_json_has_every_record_of_a_real_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    cap = tmp_path / "run.jsonl"
    assert main(["run", "-q", "--no-status", "-o", str(cap), str(script)]) == 0
    capsys.readouterr()
    lines = [json.loads(x) for x in cap.read_text().splitlines()[1:]]
    kinds = {str(r["type"]) for r in lines}
    assert {"host_leak", "overhead", "boundary", "end"} <= kinds  # what a plain run writes

    data = _json(capsys, cap)
    assert set(data) >= OLD_KEYS
    host = data["host_leaks"]
    assert isinstance(host, list) and len(host) == 1
    written = next(r for r in lines if r["type"] == "host_leak")
    assert host[0]["report"] == written["report"] and host[0]["final"] is True
    assert host[0]["report"]["device"] == "host"
    from torchmem.results.capture import RECORDS

    for kind in kinds:  # every record of the file is in the JSON, as many as were written
        r = RECORDS[kind]
        got = data[r.group] if r.many else [data[r.group]]
        assert len(got) == sum(1 for x in lines if x["type"] == kind), kind
    overhead = data["overheads"][0]
    assert set(overhead) >= {"wall_s", "own_s", "ratio", "parts", "detail", "sampler_ticks", "steps"}


def test_report_json_has_a_key_for_every_kind_even_when_empty(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p = tmp_path / "empty.jsonl"
    CaptureWriter(p, argv=["x.py"]).close()
    from torchmem.results.capture import RECORDS

    data = _json(capsys, p)
    for r in RECORDS.values():
        assert data[r.group] == ([] if r.many else data["end"]), r.kind
    assert data["end"] is not None and data["host_leaks"] == [] and data["survivors"] == []
