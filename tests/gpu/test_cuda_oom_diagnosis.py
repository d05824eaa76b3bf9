"""Real CUDA OOMs, classified from the state the observer captured at the moment (run on the device).

Each scenario runs in its own process through tests/gpu/make_oom_fixtures.py (each fills the device).
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from torchmem.analysis.fragmentation import AllocatorState
from torchmem.analysis.oom import diagnose, parse_oom_message

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

MiB = 1 << 20
HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "make_oom_fixtures.py"
SRC = str(HERE.parent.parent / "src")


def record(name: str, out: Path, history: bool = False) -> dict[str, Any]:
    env = dict(os.environ)
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env.pop("PYTORCH_ALLOC_CONF", None)
    cmd = [sys.executable, str(SCRIPT), str(out), "--one", name] + (["--history"] if history else [])
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads((out / f"{name}.json").read_text())  # type: ignore[no-any-return]


def test_too_large(tmp_path: Path) -> None:
    data = record("too_large", tmp_path)
    parsed = parse_oom_message(data["message"])
    assert parsed is not None and parsed.source == "allocator"
    state = AllocatorState.from_dict(data["state"])
    d = diagnose(parsed, state, alloc_conf="")
    assert d.causes[0].kind == "too_large"
    total = torch.cuda.get_device_properties(0).total_memory
    assert state.device_total == total
    assert state.requested is not None and state.requested >= total + 1024 * MiB
    assert data["observer_calls"] == 1


def test_fragmentation(tmp_path: Path) -> None:
    data = record("fragmentation", tmp_path)
    state = AllocatorState.from_dict(data["state"])
    d = diagnose(parse_oom_message(data["message"]), state, alloc_conf="")
    top = d.causes[0]
    assert top.kind == "fragmentation", str(d)
    frag = d.fragmentation
    assert frag is not None
    assert frag.fits_now is False
    assert frag.largest_free_in_pool == 32 * MiB
    assert frag.cached_free >= data["k"] * 32 * MiB
    stats = state.stats
    assert stats is not None
    # the segment view agrees with the allocator's counters, to the byte, at the same moment
    assert state.reserved == stats["reserved_bytes.all.current"]
    assert state.allocated == stats["allocated_bytes.all.current"]
    assert frag.cached_free == stats["reserved_bytes.all.current"] - stats["active_bytes.all.current"]
    assert top.bytes == frag.cached_free
    assert any(f.setting == "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" for f in d.fixes)
    # the message's rounded figure agrees with the state within its printed precision
    parsed = parse_oom_message(data["message"])
    assert parsed is not None and parsed.reserved_unallocated is not None
    tol = parsed.precision["reserved_unallocated"]
    assert abs(parsed.reserved_unallocated - (state.reserved - state.allocated)) <= tol


def test_working_set(tmp_path: Path) -> None:
    data = record("working_set", tmp_path)
    state = AllocatorState.from_dict(data["state"])
    d = diagnose(parse_oom_message(data["message"]), state, alloc_conf="")
    assert d.causes[0].kind == "working_set", str(d)
    assert state.allocated is not None and state.allocated >= data["held"]


def test_history_snapshot_is_written_and_loads(tmp_path: Path) -> None:
    data = record("too_large", tmp_path, history=True)
    path = data["state"]["snapshot_file"]
    assert path and os.path.exists(path)
    with open(path, "rb") as f:
        snap = pickle.load(f)
    assert "segments" in snap and "device_traces" in snap
    actions = {e.get("action") for trace in snap["device_traces"] for e in trace}
    assert "oom" in actions


def test_explain_live_exception_uses_the_observer_state() -> None:
    from torchmem.capture.oom import attach_oom_observer, explain_oom, last_oom_state

    h = attach_oom_observer()
    assert h.problem is None
    total = torch.cuda.get_device_properties(0).total_memory
    try:
        torch.empty(total * 2, dtype=torch.uint8, device="cuda")
    except torch.OutOfMemoryError as e:
        d = explain_oom(e)
    h.detach()
    assert d.state is not None and d.state is last_oom_state(0)
    assert d.causes[0].kind == "too_large"
    assert d.state.segments is not None
