"""OOM events on the CPU: every OOM torchmem.limit()/budget(hard=True) raises is delivered at the moment it is
raised, caught by the program or not, with the user's line, the OOM being handled and the diagnosis."""

from __future__ import annotations

import json
import os
import sys
import traceback
import warnings

import pytest
import torch

import torchmem
from torchmem.actions.limit import BudgetExceededError, budget, limit
from torchmem.capture.oom import OOMInputError, explain_oom, match_event, same_event, watch_ooms
from torchmem.devices._allocator import on_cuda_init
from torchmem.results.oom import OOMEvent

MiB = 1 << 20
HERE = os.path.basename(__file__)


def _line() -> int:
    """The caller's line number plus one: the line below the call."""
    return sys._getframe(1).f_lineno + 1


LINES: dict[str, int] = {}


def step(batch: int) -> torch.Tensor:
    LINES["step"] = _line()
    x = torch.ones(batch, 256)  # batch KiB
    return (x * 2).sum()


def attempt(n: int) -> torch.Tensor:
    a = torch.ones(n)
    LINES["attempt"] = _line()
    b = torch.ones(n)
    return a + b


def test_an_oom_caught_and_retried_after_the_except_block_is_one_event() -> None:
    events: list[OOMEvent] = []
    with watch_ooms(events.append), limit(8 * MiB, "cpu"):
        failed = False
        try:
            step(16 * 1024)  # 16 MiB: over the 8 MiB cap
        except torch.OutOfMemoryError:
            failed = True
        if failed:
            out = step(1024)  # retried outside the except block: 1 MiB fits
    assert out.item() == 2 * 1024 * 256
    (e,) = events
    assert e.device == "cpu" and e.source == "torchmem_cap" and e.detail == "full"
    assert e.site == f"{HERE}:{LINES['step']}" and e.function == "step"
    assert e.filename == __file__
    assert e.requested == 16 * MiB
    assert e.while_handling is None and e.handling_index is None
    assert e.diagnosis is not None and e.diagnosis.is_oom
    assert e.kind == "too_large"  # 16 MiB can never fit under an 8 MiB cap
    assert e.thread == "MainThread" and e.timestamp is not None
    assert f"on cpu at {HERE}:{LINES['step']} in step(): 16.00 MiB requested" in str(e)


def test_a_retry_inside_the_except_block_is_pinned_by_the_first_attempt() -> None:
    events: list[OOMEvent] = []
    with watch_ooms(events.append), limit(10 * MiB, "cpu"):
        try:
            attempt(6 * MiB // 4)  # a: 6 MiB, b: 6 MiB more -> over the cap; a stays in the frame
        except torch.OutOfMemoryError as first:
            try:
                attempt(5 * MiB // 8)  # 2.5 MiB each: fits only without the first attempt's 6 MiB
            except torch.OutOfMemoryError as second:
                explained = explain_oom(second)  # what the session does with an uncaught one
                assert same_event(events[1], second) and not same_event(events[0], second)
                assert same_event(events[0], first) and not same_event(events[1], first)
            # the fix the diagnosis gives works (even though the event read the frames' locals)
            traceback.clear_frames(first.__traceback__)
            retried = attempt(5 * MiB // 8)
    assert retried.numel() == 5 * MiB // 8
    assert len(events) == 2
    one, two = events
    assert one.while_handling is None and one.site == two.site == f"{HERE}:{LINES['attempt']}"
    assert two.while_handling == "torch.OutOfMemoryError" and two.handling_index == one.index
    assert two.index == one.index + 1
    assert two.kind == "pinned_by_exception", str(two.diagnosis)
    assert two.diagnosis is not None
    cause = two.diagnosis.causes[0]
    assert cause.bytes == 6 * MiB  # the first attempt's `a`, kept alive by its traceback
    assert any("attempt() local 'a': 6.00 MiB" in line for line in cause.evidence), cause.evidence
    assert cause.confidence == "high"
    assert any("after the except block" in f.text for f in two.diagnosis.fixes)
    assert any(f.setting == "traceback.clear_frames(e.__traceback__)" for f in two.diagnosis.fixes)
    # explain_oom of the second exception reads the same from its __context__
    assert explained.causes[0].kind == "pinned_by_exception" and explained.causes[0].bytes == 6 * MiB


def test_no_event_after_detach() -> None:
    events: list[OOMEvent] = []
    handle = watch_ooms(events.append)
    handle.detach()
    handle.detach()  # idempotent
    with watch_ooms(events.append) as scoped:
        pass
    assert not handle.active and not scoped.active
    with limit(MiB, "cpu"), pytest.raises(torch.OutOfMemoryError):
        torch.ones(MiB)
    assert events == []


def test_a_failing_callback_is_reported_once_and_the_oom_goes_on_unchanged() -> None:
    def broken(event: OOMEvent) -> None:
        raise KeyError("callback bug")

    seen: list[OOMEvent] = []
    with limit(MiB, "cpu"), pytest.raises(torch.OutOfMemoryError) as plain:
        torch.ones(MiB)
    messages = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with watch_ooms(broken), watch_ooms(seen.append), limit(MiB, "cpu"):
            for _ in range(3):
                try:
                    torch.ones(MiB)
                except torch.OutOfMemoryError as e:  # the very error torch raises without a watcher
                    assert type(e) is torch.OutOfMemoryError
                    messages.append(str(e))
    reports = [w for w in caught if "OOM event callback failed" in str(w.message)]
    assert len(reports) == 1 and "KeyError" in str(reports[0].message)
    assert messages == [str(plain.value)] * 3
    assert len(seen) == 3  # the other watcher still gets every event


def test_warnings_as_errors_never_replace_the_oom() -> None:
    def broken(event: OOMEvent) -> None:
        raise RuntimeError("boom")

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with watch_ooms(broken), limit(MiB, "cpu"), pytest.raises(torch.OutOfMemoryError):
            torch.ones(MiB)


def test_the_uncaught_oom_is_told_from_the_caught_ones() -> None:
    events: list[OOMEvent] = []

    def train() -> None:
        for batch in (16 * 1024, 12 * 1024):  # both over the cap: the first is caught, the second ends it
            try:
                step(batch)
            except torch.OutOfMemoryError:
                if batch == 12 * 1024:
                    raise ValueError("training failed") from None
                continue

    with watch_ooms(events.append), limit(8 * MiB, "cpu"), pytest.raises(ValueError) as info:
        train()
    assert len(events) == 2
    ended = match_event(events, info.value)  # found through the wrapper's __context__
    assert ended is events[1]
    assert not same_event(events[0], info.value)
    assert not same_event(events[1], ValueError("not an OOM"))


def test_later_events_get_a_brief_diagnosis() -> None:
    events: list[OOMEvent] = []
    with watch_ooms(events.append, full=2), limit(MiB, "cpu"):
        for _ in range(5):
            try:
                torch.ones(MiB)
            except torch.OutOfMemoryError:
                pass
    assert [e.detail for e in events] == ["full", "full", "brief", "brief", "brief"]
    assert [e.index for e in events] == list(range(events[0].index, events[0].index + 5))
    last = events[-1].diagnosis
    assert last is not None and last.is_oom and last.causes
    assert any("Brief diagnosis" in n for n in last.notes)


def test_one_event_per_refused_op_under_nested_caps() -> None:
    events: list[OOMEvent] = []
    caps = (limit(16 * MiB, "cpu"), budget(4 * MiB, "cpu", hard=True))
    with watch_ooms(events.append), caps[0], pytest.raises(BudgetExceededError), caps[1]:
        try:
            torch.ones(8 * MiB)  # 32 MiB: over the budget and the limit at once
        except torch.OutOfMemoryError:
            pass
        torch.ones(2 * MiB)  # 8 MiB: over the budget only; leaves the block
    assert len(events) == 2, [str(e) for e in events]
    assert events[0].requested == 32 * MiB and events[1].requested == 8 * MiB
    assert events[0].diagnosis is not None and events[0].diagnosis.parsed is not None
    assert events[0].diagnosis.parsed.cap_owner == "torchmem.budget(4.00 MiB)"  # the tightest cap


def test_event_round_trips_through_json() -> None:
    events: list[OOMEvent] = []
    with watch_ooms(events.append), limit(MiB, "cpu"):
        try:
            torch.ones(MiB)
        except torch.OutOfMemoryError:
            pass
    (e,) = events
    back = OOMEvent.from_dict(json.loads(json.dumps(e.to_dict())))
    assert back == e
    assert back.kind == e.kind == "too_large"
    assert str(back) == str(e)


def test_watching_does_not_initialise_cuda_and_hooks_never_raise_into_torch() -> None:
    called: list[int] = []
    with watch_ooms(lambda e: None):
        pass
    if torch.cuda.is_initialized():  # a GPU run: the hook runs at once
        assert on_cuda_init(lambda: called.append(1)) is None
        assert called == [1]
        return
    queue = torch.cuda._queued_calls
    n = len(queue)
    assert on_cuda_init(lambda: called.append(1)) is None
    assert len(queue) == n + 1 and called == []  # waits for the program to initialise CUDA
    assert not torch.cuda.is_initialized()

    def broken() -> None:
        raise RuntimeError("hook bug")

    assert on_cuda_init(broken) is None
    run, _ = queue[-1]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run()  # what torch's _lazy_init does: an error here would be re-raised into the program's CUDA call
    assert any("CUDA start-up hook failed" in str(w.message) for w in caught)
    queue[:] = queue[:n]


def test_bad_callback_raises() -> None:
    with pytest.raises(OOMInputError):
        watch_ooms(42)  # type: ignore[arg-type]


def test_event_on_an_oom_inside_a_module_names_the_forward_line() -> None:
    class Net(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            LINES["forward"] = _line()
            return x.repeat(64, 1)

    events: list[OOMEvent] = []
    net = Net()
    with watch_ooms(events.append), limit(4 * MiB, "cpu"):
        try:
            net(torch.ones(16, 1024))  # 64 KiB in, 4 MiB out
        except torch.OutOfMemoryError:
            pass
    (e,) = events
    assert e.site == f"{HERE}:{LINES['forward']}" and e.function == "forward"
    assert torchmem.is_oom(e.diagnosis.parsed.text)  # type: ignore[union-attr]
