"""``lint_paths(jobs=...)``: the files checked in several processes give the same findings as in one."""

from __future__ import annotations

import gc
import threading
from pathlib import Path

import pytest

from torchmem.lint import _run, lint_paths
from torchmem.lint._run import _jobs

WRONG = """
import torch
total = 0
for x, y in loader:
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()
    total += loss
"""


def _tree(root: Path, n: int) -> None:
    for i in range(n):
        sub = root / f"pkg{i % 7}"
        sub.mkdir(exist_ok=True)
        (sub / f"m{i}.py").write_text(WRONG if i % 3 == 0 else "x = 1\n")


def test_several_processes_find_the_same_as_one(tmp_path: Path) -> None:
    _tree(tmp_path, 90)
    one = lint_paths([tmp_path], config=False, jobs=1)
    two = lint_paths([tmp_path], config=False, jobs=2)
    assert len(one) == 30 and {f.code for f in one} == {"TM001"}
    assert one == two  # same findings, same order


def test_automatic_jobs_only_for_big_trees_without_threads() -> None:
    assert _jobs(None, 10) == 1  # a fork costs more than a few files
    assert _jobs(3, 2) == 2  # never more processes than files
    assert _jobs(0, 100) == 1
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        assert _jobs(None, 10_000) == 1  # forking a process that runs threads is unsafe
    finally:
        stop.set()
        t.join()


def test_the_cyclic_collector_is_restored_as_it_was(tmp_path: Path) -> None:
    """The collector is off while files are checked (they make no reference cycles); the caller's
    setting comes back whatever it was, and a failure inside cannot leave it off."""
    (tmp_path / "a.py").write_text("for x, y in loader:\n    total += criterion(model(x), y)\n")
    assert gc.isenabled()
    lint_paths([tmp_path], config=False, jobs=1)
    assert gc.isenabled()
    gc.disable()
    try:
        lint_paths([tmp_path], config=False, jobs=1)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_failure_inside_the_check_does_not_leave_the_collector_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(*_args: object) -> list[object]:
        raise RuntimeError("boom")

    monkeypatch.setattr(_run, "lint_file", boom)
    with pytest.raises(RuntimeError):
        _run._check_chunk([(tmp_path / "a.py", None, ())])
    assert gc.isenabled()
