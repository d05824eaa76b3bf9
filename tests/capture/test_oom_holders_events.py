"""OOM events name the holders of the memory, found where the error reaches the program — never inside the
allocator's (or torchmem's cap's) callback, which only reads what must be read at the moment."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator

import pytest
import torch

import torchmem
from torchmem.capture import oom as oom_capture
from torchmem.capture.oom import explain_oom, watch_ooms
from torchmem.results.oom import OOMEvent

MiB = 1 << 20


@pytest.fixture(autouse=True)
def _budget() -> Iterator[None]:
    """A full holder-search budget (other tests' OOMs may have spent the process's)."""
    saved = list(oom_capture._registry["budget"])
    oom_capture._registry["budget"] = [None, 0.0]
    yield
    oom_capture._registry["budget"] = saved


def _attempt(n: int) -> torch.Tensor:
    kept = torch.ones(n, 1024)  # this frame's tensor, alive while the error travels
    return kept + torch.ones(2 * n, 1024)


@pytest.mark.usefixtures("unhurried_oom_holders")
def test_the_holders_complete_the_event_where_the_program_caught_the_oom() -> None:
    seen: list[tuple[OOMEvent, bool]] = []

    def on_event(e: OOMEvent) -> None:
        # at the moment of the OOM, inside the cap's check: only what the moment shows, no holder search
        seen.append((e, e.diagnosis is not None and e.diagnosis.holders is not None))

    with watch_ooms(on_event), torchmem.limit(10 * MiB, "cpu"):
        try:
            _attempt(1024)  # 4 MiB kept, 8 MiB more: over the cap
        except torch.OutOfMemoryError as e:
            ((event, searched),) = seen  # delivered before the program could catch it
            assert not searched
            sys.getrecursionlimit()  # any call: the interpreter runs pending calls when one returns
            d = event.diagnosis  # completed in place by now, by the pending call alone
            assert d is not None and d.holders is not None, str(event)
            explained = explain_oom(e)
    assert d.holders.when == "at the OOM" and d.holders.complete
    # `kept`, a local of the frame the error left (found while the error unwinds, or in the except block)
    kept = [h for h in d.holders.holders if "_attempt()" in h.label and h.label.endswith("local 'kept'")]
    assert kept and kept[0].bytes == 4 * MiB, d.holders
    assert explained.holders == d.holders  # explain_oom reuses the search made at the catch point


def test_an_oom_on_another_thread_is_delivered_at_once_without_a_holder_search() -> None:
    seen: list[OOMEvent] = []
    errors: list[BaseException] = []

    def work() -> None:
        with torchmem.limit(4 * MiB, "cpu"):
            try:
                torch.ones(2 * MiB)
            except torch.OutOfMemoryError as e:
                errors.append(e)

    with watch_ooms(seen.append):
        t = threading.Thread(target=work, name="loader")
        t.start()
        t.join()
    (event,) = seen
    assert errors and event.thread == "loader"
    assert event.diagnosis is not None and event.diagnosis.holders is None
    assert any("raised on another thread than the main one" in n for n in event.diagnosis.notes)


def test_no_holder_search_once_the_budget_is_spent() -> None:
    oom_capture._registry["budget"] = [0.0, float("inf")]  # spent, and no time to grow back
    seen: list[OOMEvent] = []
    with watch_ooms(seen.append), torchmem.limit(4 * MiB, "cpu"):
        try:
            torch.ones(2 * MiB)
        except torch.OutOfMemoryError as e:
            d = explain_oom(e)
            forced = explain_oom(e, holders=True)
    (event,) = seen
    assert event.diagnosis is not None and event.diagnosis.holders is None
    assert any("used up their time budget" in n for n in event.diagnosis.notes)
    assert d.holders is None and any("holders=True" in n for n in d.notes)
    assert forced.holders is not None
