"""Which rank state belongs to the job's first OOM, in captures written by hand: the OOM's moment is its
event's timestamp (when it was raised), not the time its record was written (once the program caught it or
ended, seconds later on a loaded machine), and a flag raised by the process that ran out is its own."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torchmem.analysis.ranks import merge_captures
from torchmem.capture.file import read_capture
from torchmem.results.capture import FORMAT, Capture

T0 = 1_800_000_000.0  # both ranks started at this wall-clock time


def _rank(tmp_path: Path, k: int, pid: int, *records: dict[str, Any]) -> Capture:
    p = tmp_path / f"job.rank{k}.jsonl"
    head = {
        "format": FORMAT,
        "version": 1,
        "device": "cpu",
        "source": "heap",
        "started": T0,
        "pid": pid,
        "rank": {"launcher": "torchrun", "rank": k, "world_size": 2, "local_rank": k, "job": "j"},
    }
    samples = [{"type": "sample", "t": 0.5 * i, "step": i, "allocated": 100 * i} for i in range(1, 21)]
    p.write_text("".join(json.dumps(r) + "\n" for r in (head, *samples, *records)))
    return read_capture(p)


def _oom(t: float, event_at: float | None) -> dict[str, Any]:
    ev = {"index": 1, "device": "cpu", "site": "job.py:16"}
    if event_at is not None:
        ev["timestamp"] = T0 + event_at
    return {
        "type": "oom",
        "t": t,
        "diagnosis": {},
        "step": 10,
        "caught": False,
        "site": "job.py:16",
        "event": ev,
    }


def _state(t: float, trigger: dict[str, Any], step: int) -> dict[str, Any]:
    return {"type": "rank_state", "t": t, "trigger": trigger, "wall": T0 + t, "step": step, "allocated": 7}


def test_a_record_written_seconds_after_the_oom_keeps_the_snapshots_taken_at_the_flag(tmp_path: Path) -> None:
    flag = {"rank": 1, "pid": 2001, "wall": T0 + 5.0, "step": 10}
    r0 = _rank(tmp_path, 0, 2000, _state(5.3, flag, 9))
    r1 = _rank(tmp_path, 1, 2001, _state(5.01, flag, 10), _oom(t=9.0, event_at=5.0))  # written 4 s later
    first = merge_captures([r0, r1]).first_oom
    assert first is not None and first.label == "rank 1"
    assert [s.how for s in first.states] == ["snapshot", "snapshot"]
    assert [s.step for s in first.states] == [9, 10]
    assert all(s.delay is not None and abs(s.delay) < 0.5 for s in first.states)


def test_an_older_capture_without_the_event_s_time_matches_by_the_pid_of_the_rank_that_ran_out(
    tmp_path: Path,
) -> None:
    flag = {"rank": 1, "pid": 2001, "wall": T0 + 5.0}
    r0 = _rank(tmp_path, 0, 2000, _state(5.3, flag, 9))
    r1 = _rank(tmp_path, 1, 2001, _state(5.01, flag, 10), _oom(t=9.0, event_at=None))
    first = merge_captures([r0, r1]).first_oom
    assert first is not None and [s.how for s in first.states] == ["snapshot", "snapshot"]


def test_a_flag_of_another_process_long_before_is_not_this_oom_s(tmp_path: Path) -> None:
    # rank 1's state was written for an OOM of an earlier process (another pid) 8 s before this one: the
    # merged report falls back to each rank's nearest sample
    old = {"rank": 1, "pid": 1500, "wall": T0 - 3.0}
    r0 = _rank(tmp_path, 0, 2000, _state(0.2, old, 0))
    r1 = _rank(tmp_path, 1, 2001, _state(0.2, old, 0), _oom(t=9.0, event_at=5.0))
    first = merge_captures([r0, r1]).first_oom
    assert first is not None and [s.how for s in first.states] == ["sample", "sample"]
    assert [s.step for s in first.states] == [10, 10]  # the samples at t = 5.0 s
