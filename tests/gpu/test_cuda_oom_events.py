"""On the GPU: every CUDA OOM is an event at the moment it is raised, caught or not — a retry after the except
block, a retry inside it (pinned by the first attempt's frames), a caught fragmentation OOM — and watching
never initialises CUDA: the observer is attached when the program does.

Run: PYTHONPATH=src python3 -m pytest -m cuda -s tests/gpu/test_cuda_oom_events.py
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from torchmem.capture.oom import explain_oom, same_event, watch_ooms
from torchmem.results.oom import OOMEvent

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

MiB = 1 << 20
HERE = os.path.basename(__file__)
SRC = str(Path(__file__).resolve().parents[2] / "src")
LINES: dict[str, int] = {}


def _line() -> int:
    """The caller's line number plus one: the line below the call."""
    return sys._getframe(1).f_lineno + 1


def _clean() -> None:
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


@contextmanager
def capped(extra: int) -> Iterator[int]:
    """A per-process cap on cuda:0 of what the allocator reserves now plus ``extra`` bytes; lifted after."""
    _clean()
    total = torch.cuda.mem_get_info(0)[1]  # the total the allocator computes the fraction's cap from
    cap = torch.cuda.memory_reserved(0) + extra
    torch.cuda.set_per_process_memory_fraction(cap / total, 0)
    try:
        yield cap
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, 0)
        _clean()


def step(nbytes: int) -> torch.Tensor:
    LINES["step"] = _line()
    x = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    return x


def attempt(nbytes: int) -> tuple[torch.Tensor, torch.Tensor]:
    a = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    LINES["attempt"] = _line()
    b = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    return a, b


def test_a_caught_oom_retried_after_the_except_block_is_one_event() -> None:
    events: list[OOMEvent] = []
    with watch_ooms(events.append) as handle, capped(256 * MiB) as cap:
        big = (cap + 256 * MiB) // (2 * MiB) * (2 * MiB)  # over the cap even with nothing else allocated
        failed = False
        try:
            step(big)
        except torch.OutOfMemoryError as e:
            failed = True
            assert same_event(events[-1], e)
        if failed:
            out = step(64 * MiB)  # after the except block: fits
        del out
    assert handle.problem is None, handle.problem
    (ev,) = events
    print("\n" + str(ev))
    assert ev.device == "cuda:0" and ev.source == "allocator" and ev.detail == "full"
    assert ev.requested == big
    assert ev.site == f"{HERE}:{LINES['step']}" and ev.function == "step"
    assert ev.while_handling is None
    assert ev.kind == "too_large", str(ev.diagnosis)
    assert ev.diagnosis is not None and ev.diagnosis.state is not None
    assert ev.diagnosis.state.segments is not None  # read at the moment of the OOM
    allowed = ev.diagnosis.parsed.allowed if ev.diagnosis.parsed is not None else None
    assert allowed is not None and abs(allowed - cap) <= 1  # the fraction's cap, as the allocator rounds it


def test_a_retry_inside_the_except_block_is_pinned_by_the_first_attempt() -> None:
    events: list[OOMEvent] = []
    with watch_ooms(events.append), capped(256 * MiB):
        try:
            attempt(150 * MiB)  # a: 150 MiB, b: 150 MiB more -> over the cap; a stays in the frame
        except torch.OutOfMemoryError:
            try:
                attempt(100 * MiB)  # 100 MiB each: fits only without the first attempt's 150 MiB
            except torch.OutOfMemoryError as second:
                explained = explain_oom(second)
                assert same_event(events[-1], second)
                del second
    assert len(events) == 2, [str(e) for e in events]
    one, two = events
    print("\n" + str(two.diagnosis))
    assert one.site == two.site == f"{HERE}:{LINES['attempt']}"
    assert one.while_handling is None
    assert two.while_handling == "torch.OutOfMemoryError" and two.handling_index == one.index
    assert two.kind == "pinned_by_exception", str(two.diagnosis)
    assert two.diagnosis is not None
    cause = two.diagnosis.causes[0]
    assert cause.bytes == 150 * MiB
    assert any("attempt() local 'a': 150.00 MiB" in line for line in cause.evidence), cause.evidence
    assert any("after the except block" in f.text for f in two.diagnosis.fixes)
    assert explained.causes[0].kind == "pinned_by_exception"


def test_no_event_after_detach() -> None:
    events: list[OOMEvent] = []
    handle = watch_ooms(events.append)
    handle.detach()
    with capped(64 * MiB), pytest.raises(torch.OutOfMemoryError):
        step(256 * MiB)
    assert events == []


def test_a_failing_callback_is_reported_once_and_the_oom_goes_on_unchanged() -> None:
    def broken(event: OOMEvent) -> None:
        raise KeyError("callback bug")

    seen: list[OOMEvent] = []
    firsts: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with watch_ooms(broken), watch_ooms(seen.append), capped(64 * MiB):
            for _ in range(3):
                try:
                    step(256 * MiB)
                except torch.OutOfMemoryError as e:
                    assert type(e) is torch.OutOfMemoryError
                    firsts.append(str(e).split(". ")[0] + ". " + str(e).split(". ")[1])
    reports = [w for w in caught if "OOM event callback failed" in str(w.message)]
    assert len(reports) == 1
    assert firsts == ["CUDA out of memory. Tried to allocate 256.00 MiB"] * 3
    assert len(seen) == 3


SCRIPT = """
import json, sys
import torch
from torchmem.capture.oom import watch_ooms

events = []
handle = watch_ooms(events.append)
initialised_by_watch = torch.cuda.is_initialized()
MiB = 1 << 20
# 30 blocks of 6 MiB: 3 per 20 MiB segment (the large pool's segment for requests under 10 MiB)
blocks = [torch.empty(6 * MiB, dtype=torch.uint8, device="cuda") for _ in range(30)]
reserved = torch.cuda.memory_reserved(0)
for i in range(0, 30, 3):  # free the first and the last block of each segment: 6 and 8 MiB free pieces
    blocks[i] = None
    blocks[i + 2] = None
total = torch.cuda.mem_get_info(0)[1]
torch.cuda.set_per_process_memory_fraction((reserved + 4 * MiB) / total, 0)  # no room for a new segment
caught = False
line = sys._getframe().f_lineno + 2
try:
    x = torch.empty(12 * MiB, dtype=torch.uint8, device="cuda")  # 140 MiB free, none of it 12 MiB in one
except torch.OutOfMemoryError:
    caught = True
torch.cuda.set_per_process_memory_fraction(1.0, 0)
print(json.dumps({
    "initialised_by_watch": initialised_by_watch, "caught": caught, "line": line,
    "reserved": reserved, "problem": handle.problem, "events": [e.to_dict() for e in events],
}))
"""


def test_a_caught_fragmentation_oom_and_the_observer_attached_at_the_programs_cuda_init(
    tmp_path: Path,
) -> None:
    script = tmp_path / "frag.py"
    script.write_text(textwrap.dedent(SCRIPT))
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)  # the default allocator: fixed segments
    env.pop("PYTORCH_ALLOC_CONF", None)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    print("\n" + json.dumps(out["events"][0]["diagnosis"]["causes"][0], indent=1)[:3000])
    assert out["initialised_by_watch"] is False  # watching did not initialise CUDA
    assert out["problem"] is None
    assert out["reserved"] == 200 * MiB, "the allocator did not lay the blocks out as expected"
    assert out["caught"] is True
    (ev,) = [OOMEvent.from_dict(e) for e in out["events"]]
    assert ev.site == f"frag.py:{out['line']}" and ev.function == "<module>"
    assert ev.requested == 12 * MiB and ev.device == "cuda:0"
    assert ev.kind == "fragmentation", str(ev.diagnosis)
    assert ev.diagnosis is not None and ev.diagnosis.fragmentation is not None
    assert ev.diagnosis.fragmentation.largest_free_in_pool == 8 * MiB
    assert ev.diagnosis.fragmentation.cached_free == 140 * MiB
    assert any(
        f.kind == "alloc_conf" and "expandable_segments" in (f.setting or "") for f in ev.diagnosis.fixes
    )


def test_later_events_are_brief_and_still_diagnosed() -> None:
    events: list[OOMEvent] = []
    with watch_ooms(events.append, full=1), capped(64 * MiB):
        for _ in range(3):
            try:
                step(256 * MiB)
            except torch.OutOfMemoryError:
                pass
    assert [e.detail for e in events] == ["full", "brief", "brief"]
    brief = events[-1].diagnosis
    assert brief is not None and brief.state is not None and brief.state.segments is None
    assert brief.state.stats is not None and "reserved_bytes.all.current" in brief.state.stats
    assert events[-1].kind == "too_large", str(brief)
