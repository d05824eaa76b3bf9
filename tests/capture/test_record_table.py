"""The capture's one table of record kinds (``results.capture.RECORDS``) as the writer and the reader use it:
the writer writes only its kinds (another is dropped and said once, never raised into the program), the
reader reads every kind through its type's ``from_dict()``, as leniently as the per-kind reader it replaced
(records of older captures, figures of odd shapes), and keeps kinds of later versions as unknown."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest

from torchmem.capture.file import CaptureWriter, read_capture
from torchmem.results.capture import FORMAT, RECORDS, Capture, End, OverheadRecord, RankStateRecord


def _capture(tmp_path: Path, *records: dict[str, Any]) -> Capture:
    p = tmp_path / "c.jsonl"
    head = {"format": FORMAT, "version": 1, "device": "cpu", "source": "heap"}
    p.write_text("".join(json.dumps(r) + "\n" for r in (head, *records)))
    return read_capture(p)


def test_the_writer_drops_a_kind_the_table_lacks_and_says_so_once(tmp_path: Path) -> None:
    p = tmp_path / "w.jsonl"
    w = CaptureWriter(p, argv=[])
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        w.record("host_leaks", report={})  # a typo of a kind: never written, never raised
        w.record("host_leaks", report={})
        w.note("still recording")
    w.close()
    said = [str(x.message) for x in got if "host_leaks" in str(x.message)]
    assert len(said) == 1 and "no such record" in said[0] and "host_leak," in said[0]
    cap = read_capture(p)
    assert w.recording is False and w.error is None
    assert not cap.unknown and [n.text for n in cap.notes] == ["still recording"] and cap.end is not None
    assert b"host_leaks" not in p.read_bytes()


def test_a_later_version_s_kind_is_kept_as_unknown(tmp_path: Path) -> None:
    cap = _capture(
        tmp_path, {"type": "future_type", "t": 0.5, "payload": [1, 2]}, {"type": "note", "t": 1, "text": "x"}
    )
    assert [u["type"] for u in cap.unknown] == ["future_type"] and cap.notes[0].text == "x"
    assert cap.truncated is None


def test_old_and_odd_records_read_as_the_per_kind_reader_read_them(tmp_path: Path) -> None:
    cap = _capture(
        tmp_path,
        {"type": "sample", "t": 0.1, "step": "x", "allocated": 3.0, "reserved": True, "peak_allocated": 5},
        {"type": "oom", "t": 0.2, "diagnosis": {}, "step": 1},  # before caught / site / event
        {
            "type": "overhead",
            "t": 0.3,
            "wall_s": 2,
            "own_s": 0.1,
            "ratio": 1.05,
            "parts": {"steps": 0.1, "x": "?"},
        },
        {"type": "rank_state", "t": 0.4, "trigger": None, "step": 2},
        {"type": "modules", "t": 0.5, "rows": [{"module": "fc"}]},
        {"type": "device", "t": 0.6, "device": "cuda:1", "name": 3},
        {"type": "leak", "t": 0.7, "report": {"leaking": False}},  # a verdict made as the run went
        {"type": "end", "t": 0.8, "exit_code": 0},  # no reason: an exit
    )
    s = cap.samples[0]
    assert (s.step, s.allocated, s.reserved, s.peak_allocated, s.peak_reserved) == (None, 3, None, 5, None)
    o = cap.ooms[0]
    assert (o.step, o.caught, o.site, o.event) == (1, None, None, None)
    assert cap.overheads == (OverheadRecord(0.3, 2.0, 0.1, 1.05, {"steps": 0.1}),)
    assert cap.rank_states == (RankStateRecord(0.4, {}, None, 2, None, None, None, None),)
    assert cap.modules[0].rows == ({"module": "fc"},) and cap.modules[0].notes == ()
    assert cap.devices[0].device == "cuda:1" and cap.devices[0].name is None and cap.devices[0].reason == ""
    assert cap.leaks[0].final is None
    assert cap.end == End(0.8, 0, "exit", None, None)
    assert cap.truncated is None and not cap.unknown


@pytest.mark.parametrize(
    "bad",
    [
        {"type": "step", "t": 1.0, "allocated": 5},  # a step without its number
        {"type": "leak", "t": 1.0},  # a verdict without its report
        {"type": "stats", "t": 1.0, "when": "end", "stats": [1]},  # an object that is not one
        {"type": "overhead", "t": 1.0, "wall_s": 1.0, "own_s": "?", "ratio": 1.0, "parts": {}},
        {"type": "modules", "t": 1.0, "rows": [1, 2]},
        {"type": "note", "text": "no time"},
    ],
)
def test_a_record_that_cannot_be_read_is_where_the_file_stops(tmp_path: Path, bad: dict[str, Any]) -> None:
    cap = _capture(
        tmp_path, {"type": "note", "t": 0.5, "text": "before"}, bad, {"type": "note", "t": 2, "text": "x"}
    )
    assert [n.text for n in cap.notes] == ["before"]
    assert cap.truncated is not None and "line 3" in cap.truncated


# The fields some kind cannot do without (every other one is null: unknown).
REQUIRED = {
    "t": 1.0, "step": 1, "report": {}, "diagnosis": {}, "stats": {}, "forecast": {}, "wall_s": 1.0,
    "own_s": 0.0, "ratio": 1.0, "parts": {}, "rows": [],
}  # fmt: skip


def test_every_record_type_round_trips_through_its_dict() -> None:
    for kind, r in RECORDS.items():
        rec = r.type.from_dict({**dict.fromkeys(r.type.__dataclass_fields__), **REQUIRED})
        assert r.type.from_dict(json.loads(json.dumps(rec.to_dict()))) == rec, kind
