"""Any repeating unit (issue 26): a loop with no step torchmem recognises gets its steps from the function
the loop calls again and again — found from the program's stack, wrapped, counted — and a leak in it is
judged and named per call; a function called once is never taken for a step."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import torch

from torchmem.capture.units import UnitFinder, candidate
from torchmem.run.session import Session


class Tracker:
    def __init__(self) -> None:
        self.rows: list[torch.Tensor] = []

    def update(self, x: torch.Tensor) -> None:
        time.sleep(0.004)
        self.rows.append(x * 2)  # kept, never reset


def _calls(n: int, fn: object) -> None:
    for i in range(n):
        fn(i)  # type: ignore[operator]


def test_the_candidate_is_the_call_the_loop_makes() -> None:
    got: list[object] = []
    started = threading.Event()

    def step(_i: int) -> None:
        started.set()
        time.sleep(0.01)

    def program() -> None:
        _calls(20, step)

    # The program runs on a thread of its own: its outermost frames are the standard library's thread
    # start-up, then this test's code (the main thread's outermost frames are the test runner's, which a
    # runner such as pytest-xdist's execnet serves from a module of its own).
    t = threading.Thread(target=program)
    t.start()
    started.wait(5)
    time.sleep(0.05)
    found = candidate(sys._current_frames()[t.ident], set())  # type: ignore[index]
    got.append(None if found is None else (found[0].f_code.co_name, found[1].f_code.co_name))
    t.join()
    # the outermost frame of this test's code calls _calls: the first level that may repeat
    assert got == [("program", "_calls")]


def test_a_function_called_once_is_tried_and_the_next_level_becomes_the_unit() -> None:
    steps: list[int] = []
    found: list[str] = []
    errors: list[str] = []
    f = UnitFinder(lambda: steps.append(1), found.append, errors.append, threading.get_ident())
    stop = threading.Event()

    def sampler() -> None:
        while not stop.wait(0.01):
            f.sample()

    t = threading.Thread(target=sampler)
    t.start()
    try:
        tracker = Tracker()
        # _calls runs once (tried, inert); the lambda is skipped; tracker.update repeats
        _calls(60, lambda i: tracker.update(torch.zeros(1)))
    finally:
        stop.set()
        t.join()
        f.remove()
    assert errors == [] and found == ["Tracker.update() call"], (found, errors)
    assert 30 <= len(steps) <= 58  # every return once found (the first 3 make it the unit)
    assert "update" not in Tracker.__dict__ or Tracker.__dict__["update"].__name__ == "update"
    assert not hasattr(Tracker.__dict__["update"], "__wrapped__")  # removed


def test_a_run_with_no_known_step_counts_the_calls_and_names_the_leak(tmp_path: Path) -> None:
    tracker = Tracker()
    s = Session(str(tmp_path / "run.jsonl"), device="cpu", status=False, interval=0.01).start()
    try:
        for i in range(150):
            tracker.update(torch.full((64, 1024), float(i)))  # 256 KiB kept per call
    finally:
        res = s.finish(0, "exit")
    assert res.boundary.startswith("Tracker.update() call"), res.boundary
    assert res.steps >= 100
    leak = res.leak
    assert leak is not None and leak.leaking and leak.unit == "step", str(leak)
    assert leak.culprits and "rows" in (leak.culprits[0].holder or ""), str(leak)


def test_the_standard_library_s_calls_are_never_the_unit() -> None:
    """A loop of ``time.sleep``/``join`` calls (a launcher waiting for its children) is no step."""
    steps: list[int] = []
    found: list[str] = []
    f = UnitFinder(lambda: steps.append(1), found.append, found.append, threading.get_ident())
    stop = threading.Event()

    def sampler() -> None:
        while not stop.wait(0.005):
            f.sample()

    t = threading.Thread(target=sampler)
    t.start()
    try:
        for _ in range(40):
            time.sleep(0.01)
    finally:
        stop.set()
        t.join()
        f.remove()
    assert found == [] and steps == []
