"""Every warning torchmem issues points at the user's line: never torchmem's source, never torch's.

Each case runs a user function defined in this file and checks the recorded warning's file and line against
the line marked ``# <- HERE:<name>`` below, and that the printed warning quotes that line.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

import torchmem
from torchmem._warn import emit_warning
from torchmem.capture.watch import Watcher
from torchmem.devices import ledger

HERE = Path(__file__).resolve()
SOURCE = HERE.read_text().splitlines()
# torchmem's own files are those under the package's folder, wherever the checkout is: a clone in a folder
# named "torchmem" (what `git clone .../torchmem` makes) holds this test file too, and it is the user's.
PACKAGE = Path(torchmem.__file__).resolve().parent


def _line(name: str) -> int:
    """The line number of the line marked ``# <- HERE:<name>`` in this file."""
    (n,) = [i for i, text in enumerate(SOURCE, 1) if text.rstrip().endswith(f"# <- HERE:{name}")]
    return n


def _recorded(fn: Callable[[], object], category: type[Warning]) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        fn()
    return [w for w in seen if issubclass(w.category, category)]


def _assert_points_here(w: warnings.WarningMessage, name: str) -> None:
    assert Path(w.filename).resolve() == HERE, (w.filename, w.lineno, str(w.message)[:80])
    assert w.lineno == _line(name), (w.lineno, _line(name))
    printed = warnings.formatwarning(w.message, w.category, w.filename, w.lineno)
    assert f"# <- HERE:{name}" in printed  # the printed warning quotes the user's source line
    _assert_not_torchmems(w)


def _assert_not_torchmems(w: warnings.WarningMessage) -> None:
    """The warning's file is not one of torchmem's own (under the package's folder)."""
    assert PACKAGE not in Path(w.filename).resolve().parents, w.filename


def _leaky_batches(n: int) -> Iterator[torch.Tensor]:
    for _ in range(n):
        yield torch.randn(64, 64)


# -- the three forms of watch() ------------------------------------------------------------------


def _user_loop_iterable() -> None:
    kept = []
    for batch in torchmem.watch(_leaky_batches(12), device="cpu"):  # <- HERE:iter
        kept.append(torch.ones(256 * 1024) + batch.sum())  # 1 MiB per step


def _user_loop_step() -> None:
    kept = []
    w: Watcher[object] = torchmem.watch(device="cpu")
    with w:
        for _ in range(12):
            kept.append(torch.ones(256 * 1024))
            w.step()  # <- HERE:step


def _user_loop_optimizer() -> None:
    model = torch.nn.Linear(512, 512)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    kept = []
    with torchmem.watch(device="cpu", optimizer_steps=True):
        for _ in range(12):
            out = model(torch.randn(512, 512))
            kept.append(out)  # 1 MiB kept per step (its graph's saved tensors go with backward()): a leak
            out.sum().backward()
            opt.step()  # <- HERE:opt
            opt.zero_grad()


@pytest.mark.parametrize(
    ("fn", "name"),
    [(_user_loop_iterable, "iter"), (_user_loop_step, "step"), (_user_loop_optimizer, "opt")],
    ids=["iterable", "step", "optimizer_steps"],
)
def test_leak_warning_points_at_the_users_loop(fn: Callable[[], None], name: str) -> None:
    (w,) = _recorded(fn, torchmem.LeakWarning)
    _assert_points_here(w, name)


# -- a loop driven by a framework (an installed package) -----------------------------------------

_FRAMEWORK = """
import torchmem


def fit(loader, body):
    for batch in torchmem.watch(loader, device="cpu"):  # the framework's loop
        body(batch)
"""


@pytest.fixture
def framework(tmp_path: Path) -> Iterator[ModuleType]:
    """A tiny training framework installed in a site-packages folder (as Lightning or Transformers are)."""
    path = tmp_path / "site-packages" / "tinyfw.py"
    path.parent.mkdir()
    path.write_text(_FRAMEWORK)
    spec = importlib.util.spec_from_file_location("tinyfw", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["tinyfw"] = mod
    spec.loader.exec_module(mod)
    yield mod
    del sys.modules["tinyfw"]


def test_a_framework_loop_points_at_the_users_call(framework: ModuleType) -> None:
    kept: list[torch.Tensor] = []

    def user() -> None:
        framework.fit(_leaky_batches(12), lambda b: kept.append(torch.ones(256 * 1024)))  # <- HERE:fit

    (w,) = _recorded(user, torchmem.LeakWarning)
    _assert_points_here(w, "fit")


def test_without_user_code_on_the_stack_it_points_at_the_framework(framework: ModuleType) -> None:
    kept: list[torch.Tensor] = []
    seen: list[warnings.WarningMessage] = []

    def body(b: torch.Tensor) -> None:
        kept.append(torch.ones(256 * 1024))

    def run() -> None:  # a thread whose stack is the framework, threading.py and torchmem only
        th = threading.Thread(target=framework.fit, args=(_leaky_batches(12), body))
        th.start()
        th.join()

    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        run()
        seen = [w for w in rec if issubclass(w.category, torchmem.LeakWarning)]
    # `body` is user code, but it returned before the step boundary: the framework's loop is the caller.
    (w,) = seen
    assert Path(w.filename).name == "tinyfw.py" and w.lineno == 6


# -- the other warnings torchmem issues ------------------------------------------------------------


class _NoStorage(torch.Tensor):
    """A real tensor subclass whose storage cannot be read: recording it in the ledger fails."""

    def untyped_storage(self):  # type: ignore[no-untyped-def,override]
        raise ValueError("no storage for you")


def test_ledger_error_points_at_the_users_op() -> None:
    reported = ledger()._reported.places
    saved = set(reported)
    reported.clear()
    try:

        def user() -> None:
            with torchmem.cpu_tracking():
                b = torch.ones(4).as_subclass(_NoStorage)
                b * 3  # <- HERE:op

        ws = [w for w in _recorded(user, RuntimeWarning) if "tensor accounting failed" in str(w.message)]
    finally:
        reported.clear()
        reported.update(saved)
    assert ws
    for w in ws:
        _assert_points_here(w, "op")


def test_oom_observer_warning_points_at_the_allocating_line() -> None:
    from torchmem.capture import oom

    reported = oom._registry["reported"]
    saved = set(reported)
    reported.clear()
    try:

        def user() -> None:
            # What torch calls after a failed CUDA allocation; on a CPU build capturing the state fails.
            oom._on_oom(0, 1 << 30, 1 << 34, 0)  # <- HERE:oom

        ws = [w for w in _recorded(user, RuntimeWarning) if "OOM observer failed" in str(w.message)]
    finally:
        reported.clear()
        reported.update(saved)
    (w,) = ws
    _assert_points_here(w, "oom")


def test_oom_observer_never_raises_a_warning_into_the_allocation() -> None:
    from torchmem.capture import oom

    reported = oom._registry["reported"]
    saved = set(reported)
    reported.clear()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            oom._on_oom(0, 1 << 30, 1 << 34, 0)  # torch would raise its OutOfMemoryError next, not this
    finally:
        reported.clear()
        reported.update(saved)


def test_capture_file_error_points_at_the_users_call(tmp_path: Path) -> None:
    from torchmem.capture.file import CaptureWriter

    class Unprintable:
        def __repr__(self) -> str:
            raise RuntimeError("unprintable")

        __str__ = __repr__

    writer = CaptureWriter(tmp_path / "c.jsonl")

    def user() -> None:
        writer.record("note", value=Unprintable())  # <- HERE:file

    (w,) = [w for w in _recorded(user, RuntimeWarning) if "capture file" in str(w.message)]
    writer.close()
    _assert_points_here(w, "file")


def test_profile_hook_error_points_at_the_users_step() -> None:
    from torchmem.capture.profile import Profiler

    armed = [False]

    class Broken(Profiler):
        def _observe_grads(self) -> None:
            if armed[0]:
                raise KeyError("grads")
            super()._observe_grads()

    model = torch.nn.Sequential(torch.nn.Linear(16, 16))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def user() -> None:
        with Broken(model, optimizer=opt):
            armed[0] = True
            model(torch.randn(4, 16)).sum().backward()  # <- HERE:backward
            opt.step()  # <- HERE:pre-step
            armed[0] = False

    ws = [w for w in _recorded(user, RuntimeWarning) if "hook failed" in str(w.message)]
    assert len(ws) == 2  # the end of backward, the optimizer's step pre-hook
    _assert_points_here(ws[0], "backward")
    _assert_points_here(ws[1], "pre-step")


# -- the warnings machinery keeps working ----------------------------------------------------------


def test_once_filters_use_the_users_registry() -> None:
    def user() -> None:
        for _ in range(3):
            emit_warning("torchmem: the same thing", log_level=logging.DEBUG)  # <- HERE:once

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("default")
        user()
    assert len(seen) == 1
    _assert_points_here(seen[0], "once")
    registry = globals()["__warningregistry__"]
    assert ("torchmem: the same thing", RuntimeWarning, _line("once")) in registry


def test_warnings_as_errors_are_returned_never_raised() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        err = emit_warning("torchmem: as an error", log_level=logging.DEBUG)
    assert isinstance(err, RuntimeWarning) and "as an error" in str(err)


# -- the user's files are the user's wherever they are: also in a folder named "torchmem" -------------------

_USER_SCRIPT = """
import torch
import torchmem

kept = []
for batch in torchmem.watch((torch.randn(64, 64) for _ in range(12)), device="cpu"):  # <- the loop
    kept.append(torch.ones(256 * 1024) + batch.sum())
"""


def test_a_script_in_a_folder_named_torchmem_is_the_users(tmp_path: Path) -> None:
    """``/home/u/torchmem/train.py`` (a clone of torchmem, or a project of that name) is user code: frames are
    torchmem's by the package's own folder, never by a path component's name."""
    import runpy

    script = tmp_path / "torchmem" / "train.py"
    script.parent.mkdir()
    script.write_text(_USER_SCRIPT)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        runpy.run_path(str(script), run_name="__main__")
    (w,) = [w for w in seen if issubclass(w.category, torchmem.LeakWarning)]
    assert Path(w.filename).resolve() == script.resolve()
    line = [i for i, t in enumerate(_USER_SCRIPT.splitlines(), 1) if t.endswith("# <- the loop")]
    assert [w.lineno] == line
    _assert_not_torchmems(w)  # checked by the package's folder: a path component named torchmem is fine


def test_frames_are_classified_by_the_package_folder_not_by_a_folder_name(tmp_path: Path) -> None:
    from torchmem import _warn

    home = tmp_path / "torchmem"  # a checkout named torchmem, with its own virtual environment
    assert _warn._origin(str(home / "train.py"), "__main__") == _warn._USER
    assert _warn._origin(str(home / "tests" / "test_x.py"), "test_x") == _warn._USER
    assert _warn._origin(str(home / "src" / "torchmem_tools" / "a.py"), "torchmem_tools.a") == _warn._USER
    lib = home / ".venv" / "lib" / "python3.11" / "site-packages" / "tinyfw" / "loop.py"
    assert _warn._origin(str(lib), "tinyfw.loop") == _warn._LIBRARY
    own = PACKAGE / "capture" / "watch.py"
    assert _warn._origin(str(own), "torchmem.capture.watch") == _warn._INTERNAL
    assert _warn._origin(str(PACKAGE / "_demo" / "train.py"), "__main__") == _warn._USER  # the bundled demo
