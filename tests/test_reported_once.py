"""One way to say an internal error once per place (``torchmem._warn.ReportedOnce``), used by the watcher, the
host watcher, the step boundaries, the survivors, the profiler and the tensor ledger: the first error of a
place is said, later ones are not, and saying it can never raise into the hook or step that met it."""

from __future__ import annotations

import warnings

import pytest
import torch

from torchmem._warn import ReportedOnce
from torchmem.capture.host import HostWatcher


def test_each_place_is_said_once_and_a_failing_sink_never_raises() -> None:
    said: list[str] = []
    once = ReportedOnce(said.append, "{where}: {error}")
    once("a", RuntimeError("x"))
    once("a", RuntimeError("y"))
    once("b", OSError("z"))
    assert said == ["a: RuntimeError: x", "b: OSError: z"]

    def broken(_: str) -> None:
        raise ValueError("the note list is gone")

    quiet = ReportedOnce(broken, "{where}")
    quiet("c", RuntimeError())  # must not raise
    assert quiet.seen("c")
    odd = ReportedOnce(said.append, "{where} {missing}")  # a wording that cannot be formatted
    odd("d", RuntimeError())
    assert said == ["a: RuntimeError: x", "b: OSError: z"]


def test_the_host_watcher_says_an_error_of_its_reading_once_and_the_loop_goes_on() -> None:
    w = HostWatcher(max_stride=1).start()

    calls = {"n": 0}

    def failing_read() -> int:
        calls["n"] += 1
        raise OSError("mallinfo2 is gone")

    w._read = failing_read  # the figure's reader fails at every step from now on
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning turned into an error must not reach the loop either
        for _ in range(30):
            torch.randn(8, 8).sum()
            w.step()
    w.stop()
    r = w.report()
    notes = [n for n in r.notes if "internal error in the host watcher's" in n]
    assert len(notes) == 1 and "OSError: mallinfo2 is gone" in notes[0], r.notes
    assert calls["n"] >= 20  # it kept trying at each step, and said it once


@pytest.mark.parametrize("where", ["the reading", "a scan"])
def test_places_are_independent(where: str) -> None:
    said: list[str] = []
    once = ReportedOnce(said.append, "{where}")
    once(where, RuntimeError())
    once("another place", RuntimeError())
    assert said == [where, "another place"]
