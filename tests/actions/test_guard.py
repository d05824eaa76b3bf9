"""oom_guard(), install() and the IPython hook on the CPU: real OOMs from a CPU limit, proved exactly."""

from __future__ import annotations

import gc
import io
import sys
from collections.abc import Iterator

import pytest
import torch

import torchmem
from torchmem.actions.guard import find_oom, oom_guard
from torchmem.actions.limit import limit
from torchmem.integrations.excepthook import install, uninstall

MiB = 1 << 20


def forward(n_layers: int) -> torch.Tensor:
    """Holds 4 MiB of activations per layer until the cap makes a layer fail."""
    w = torch.ones(8, 8)
    activations = []
    h = torch.ones(MiB)
    for _ in range(n_layers):
        h = h * 2
        activations.append(h)
    return torch.stack(activations).sum() + w.sum()


@pytest.fixture
def capped() -> Iterator[torchmem.CpuTracking]:
    with torchmem.cpu_tracking() as cpu, limit(30 * MiB, "cpu"):
        yield cpu


def test_plain_except_leaves_the_activations_pinned(capped: torchmem.CpuTracking) -> None:
    base = capped.allocated
    try:
        forward(20)
    except torch.OutOfMemoryError as e:
        err = e  # keeping the exception (a notebook, a logger, a retry loop) keeps its frames
    assert capped.allocated - base >= 24 * MiB
    del err
    gc.collect()


def test_guard_frees_the_frames_and_reraises(capped: torchmem.CpuTracking) -> None:
    base = capped.allocated
    out = io.StringIO()
    guard = oom_guard(file=out)
    with pytest.raises(torch.OutOfMemoryError) as info, guard:
        forward(20)
    # The exception is still alive (pytest holds it) but pins nothing any more.
    assert info.value is not None
    assert capped.allocated == base
    rec = guard.oom
    assert rec is not None and rec.reraised
    assert rec.freed_bytes >= 24 * MiB
    assert rec.devices == ("cpu",)
    assert rec.allocated_after == base
    assert rec.frames_cleared >= 1
    text = out.getvalue()
    assert "CPU out of memory" in text or "out of memory" in text.lower()
    assert "torchmem: freed" in text
    assert rec.to_dict()["freed_bytes"] == rec.freed_bytes


def test_guard_swallows_when_asked_and_decorator_returns_none(capped: torchmem.CpuTracking) -> None:
    base = capped.allocated
    with oom_guard(reraise=False, quiet=True) as guard:
        forward(20)
    assert guard.oom is not None and guard.oom.freed_bytes >= 24 * MiB
    assert capped.allocated == base

    guarded = oom_guard(reraise=False, quiet=True)(forward)
    assert guarded(20) is None
    assert capped.allocated == base
    assert float(guarded(2)) > 0  # no OOM: the result comes through


def test_oom_in_the_cause_chain_is_recognised(capped: torchmem.CpuTracking) -> None:
    base = capped.allocated

    def step() -> None:
        try:
            forward(20)
        except torch.OutOfMemoryError as e:
            raise ValueError("training step failed") from e

    with pytest.raises(ValueError), oom_guard(quiet=True) as guard:
        step()
    assert guard.oom is not None
    assert capped.allocated == base
    assert find_oom(ValueError("x")) is None


def test_other_exceptions_pass_through_untouched(capped: torchmem.CpuTracking) -> None:
    boom = KeyError("not memory")

    def fail() -> None:
        big = torch.ones(2 * MiB)
        raise boom if big.numel() else RuntimeError()

    with pytest.raises(KeyError) as info, oom_guard(quiet=True) as guard:
        fail()
    assert info.value is boom
    assert guard.oom is None
    frame_locals = info.tb.tb_next.tb_frame.f_locals if info.tb.tb_next is not None else {}
    assert "big" in frame_locals  # not cleared: the guard did not touch a non-OOM error


def test_the_running_frame_is_not_cleared(capped: torchmem.CpuTracking) -> None:
    mine = torch.ones(MiB)  # this function is still running: its variables are the program's
    with oom_guard(reraise=False, quiet=True):
        forward(20)
    assert mine.sum().item() == MiB


def test_excepthook_chains_recovers_and_uninstalls(capped: torchmem.CpuTracking) -> None:
    seen: list[type[BaseException]] = []

    def previous(t: type[BaseException], v: BaseException, tb: object) -> None:
        seen.append(t)

    original = sys.excepthook
    sys.excepthook = previous
    out = io.StringIO()
    try:
        install(file=out, ipython=False)
        install(file=out, ipython=False)  # idempotent
        hook = sys.excepthook
        base = capped.allocated
        try:
            forward(20)
        except torch.OutOfMemoryError as e:
            sys.last_value = e
            sys.last_traceback = e.__traceback__
            hook(type(e), e, e.__traceback__)
        assert capped.allocated == base
        assert seen == [torch.OutOfMemoryError]
        assert "torchmem: freed" in out.getvalue()
        hook(KeyError, KeyError("k"), None)  # not an OOM: only the previous hook
        assert seen == [torch.OutOfMemoryError, KeyError]
        uninstall()
        assert sys.excepthook is previous
        uninstall()
        assert sys.excepthook is previous
    finally:
        sys.excepthook = original
        sys.last_value = sys.last_traceback = None


def test_ipython_cell_oom_prints_the_diagnosis_and_gives_the_memory_back() -> None:
    InteractiveShell = pytest.importorskip("IPython.core.interactiveshell").InteractiveShell

    shell = InteractiveShell.instance()
    try:
        shell.user_ns["forward"] = forward
        with torchmem.cpu_tracking() as cpu, limit(30 * MiB, "cpu"):
            install(ipython=True)
            try:
                shell.run_cell("kept = forward(2)")  # a result held by the user: must survive
                shell.run_cell("kept")  # Out[2] holds it too
                base = cpu.allocated
                result = shell.run_cell("forward(20)")
                assert isinstance(result.error_in_exec, torch.OutOfMemoryError)
                assert cpu.allocated <= base
                assert shell.user_ns["kept"].item() > 0
                # A second OOM, and the pinned memory still comes back (no growth across failures).
                shell.run_cell("forward(20)")
                assert cpu.allocated <= base
            finally:
                uninstall()
            assert torch.OutOfMemoryError not in shell.custom_exceptions
    finally:
        shell.user_ns.clear()
        InteractiveShell.clear_instance()
        sys.last_value = sys.last_traceback = sys.last_type = None
        if hasattr(sys, "last_exc"):
            sys.last_exc = None
        gc.collect()


def test_ipython_without_install_keeps_the_memory_pinned() -> None:
    """The anchor: IPython's own handling keeps the failed cell's frames (sys.last_traceback)."""
    InteractiveShell = pytest.importorskip("IPython.core.interactiveshell").InteractiveShell

    shell = InteractiveShell.instance()
    try:
        shell.user_ns["forward"] = forward
        with torchmem.cpu_tracking() as cpu, limit(30 * MiB, "cpu"):
            base = cpu.allocated
            shell.run_cell("forward(20)")
            pinned = cpu.allocated - base
            sys.last_value = sys.last_traceback = sys.last_type = None
            if hasattr(sys, "last_exc"):
                sys.last_exc = None
            shell.user_ns.clear()
            gc.collect()
        assert pinned >= 24 * MiB
    finally:
        InteractiveShell.clear_instance()
        gc.collect()


def test_reraise_false_swallows_only_the_oom_itself(capped: torchmem.CpuTracking) -> None:
    """An error raised while handling an OOM (a failed cleanup) is its own failure: it must propagate."""
    base = capped.allocated

    def step_with_failing_cleanup() -> None:
        try:
            forward(20)
        except torch.OutOfMemoryError:
            raise FileNotFoundError("checkpoint.pt") from None

    with pytest.raises(FileNotFoundError), oom_guard(reraise=False, quiet=True) as guard:
        step_with_failing_cleanup()
    assert guard.oom is not None and guard.oom.reraised  # recovered, and said so
    assert capped.allocated == base  # the OOM's frames were still freed

    guarded = oom_guard(reraise=False, quiet=True)(step_with_failing_cleanup)
    with pytest.raises(FileNotFoundError):
        guarded()


def test_ipython_oom_cell_shows_its_traceback_then_the_diagnosis(capsys: pytest.CaptureFixture[str]) -> None:
    """IPython ignores what a custom handler returns: torchmem's must display the traceback itself."""
    InteractiveShell = pytest.importorskip("IPython.core.interactiveshell").InteractiveShell

    shell = InteractiveShell.instance()
    try:
        shell.user_ns["forward"] = forward
        with torchmem.cpu_tracking() as cpu, limit(30 * MiB, "cpu"):
            install(ipython=True)
            try:
                capsys.readouterr()
                base = cpu.allocated
                shell.run_cell("forward(20)")
                out = capsys.readouterr().out
                assert cpu.allocated <= base
            finally:
                uninstall()
        assert "OutOfMemoryError" in out and "Traceback" in out  # the usual traceback
        assert "Causes, most likely first:" in out  # the diagnosis
        assert "torchmem: freed" in out
        assert out.index("Traceback") < out.index("Causes, most likely first:")
        assert out.count("torchmem: freed") == 1
    finally:
        shell.user_ns.clear()
        InteractiveShell.clear_instance()
        sys.last_value = sys.last_traceback = sys.last_type = None
        if hasattr(sys, "last_exc"):
            sys.last_exc = None
        gc.collect()


def test_ipython_previous_handler_still_gets_its_exceptions_subclasses_included(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """IPython matches custom exceptions by isinstance: a RuntimeError handler also gets its subclasses."""
    InteractiveShell = pytest.importorskip("IPython.core.interactiveshell").InteractiveShell

    shell = InteractiveShell.instance()
    seen: list[str] = []

    def previous(
        self: object, etype: type, value: BaseException, tb: object, tb_offset: object = None
    ) -> None:
        seen.append(etype.__name__)

    try:
        shell.set_custom_exc((RuntimeError,), previous)
        install(ipython=True)
        try:
            shell.run_cell("raise RuntimeError('plain')")
            shell.run_cell("raise NotImplementedError('subclass')")
            shell.run_cell("raise KeyError('not theirs')")
        finally:
            uninstall()
        assert seen == ["RuntimeError", "NotImplementedError"]
        assert "KeyError" in capsys.readouterr().out  # not theirs, not ours: IPython's usual traceback
        assert shell.custom_exceptions == (RuntimeError,)
    finally:
        InteractiveShell.clear_instance()
        sys.last_value = sys.last_traceback = sys.last_type = None
        if hasattr(sys, "last_exc"):
            sys.last_exc = None
        gc.collect()


def test_reinstall_under_a_wrapping_hook_does_not_recurse(capsys: pytest.CaptureFixture[str]) -> None:
    import sys

    saved = sys.excepthook
    try:
        torchmem.install(ipython=False)
        inner = sys.excepthook

        def wrapper(et: type[BaseException], ev: BaseException, tb: object) -> None:
            inner(et, ev, tb)  # type: ignore[arg-type]

        sys.excepthook = wrapper  # another library wraps torchmem's hook
        torchmem.uninstall()  # torchmem's stays in the chain, passing exceptions on
        torchmem.install(ipython=False)
        sys.excepthook(ValueError, ValueError("plain"), None)  # must not recurse
        assert "ValueError: plain" in capsys.readouterr().err
    finally:
        torchmem.uninstall()
        sys.excepthook = saved


# -- what the recovery line says (issue 25: "freed 0 B the failed call held" on the CPU) --------------------
def _graph_forward(model: torch.nn.Module, keep: list[torch.Tensor] | None = None) -> torch.Tensor:
    # The 8 layers' inputs (256 KiB each) are saved for backward: only out.grad_fn holds them.
    out = model(torch.ones(64, 1024))
    if keep is not None:
        keep.append(out)
    result: torch.Tensor = out + torch.ones(64 * MiB)  # over the cap
    return result


def _layers() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(8)])


def test_activations_held_only_through_the_graph_are_counted_on_the_cpu() -> None:
    model = _layers()  # parameters made before the cap: the graph's leaves, never counted as freed
    out = io.StringIO()
    with torchmem.cpu_tracking() as cpu, limit(30 * MiB, "cpu"):
        base = cpu.allocated
        with oom_guard(reraise=False, file=out) as guard:
            _graph_forward(model)
        assert cpu.allocated == base
    rec = guard.oom
    assert rec is not None and rec.frames_cleared == 1
    # The output (256 KiB) and the 8 saved inputs (256 KiB each), reached only through out.grad_fn.
    assert rec.freed_bytes == 9 * 256 * 1024, rec.freed_bytes
    line = out.getvalue().rstrip().splitlines()[-1]
    assert line.startswith(
        "torchmem: freed 2.25 MiB on cpu: tensor storages the finished frames of the error"
    )
    assert "(each followed by a weak reference)" in line and "torchmem's CPU tensor ledger" in line
    assert "allocated" not in line and "the failed call held" not in line


def test_a_graph_kept_elsewhere_is_not_counted_as_freed() -> None:
    model = _layers()
    kept: list[torch.Tensor] = []
    with torchmem.cpu_tracking(), limit(30 * MiB, "cpu"), oom_guard(reraise=False, quiet=True) as guard:
        _graph_forward(model, kept)
    rec = guard.oom
    assert rec is not None and rec.freed_bytes == 0 and rec.frames_cleared == 1
    assert rec.summary().startswith(
        "torchmem: freed nothing on cpu: the 1 finished frame of the error held no tensor that nothing else "
        "holds"
    )
    assert "0 B" not in rec.summary().split("(")[0]
    del kept


def test_an_oom_in_the_guarded_frame_says_nothing_could_be_freed(capped: torchmem.CpuTracking) -> None:
    with oom_guard(reraise=False, quiet=True) as guard:
        y = torch.ones(16 * MiB)  # raised here, in this running frame: nothing finished to clear
        del y
    rec = guard.oom
    assert rec is not None and rec.freed_bytes == 0 and rec.frames_cleared == 0  # torchmem's own not counted
    text = rec.summary()
    assert text.startswith("torchmem: freed nothing on cpu: the error was raised in a frame still running")
    assert "freed 0 B" not in text and "the failed call held" not in text


def test_the_guards_diagnosis_names_the_holders_before_freeing_them(capped: torchmem.CpuTracking) -> None:
    from torchmem.capture import oom as oom_capture

    oom_capture._registry["budget"] = [None, 0.0]  # a full holder-search budget
    out = io.StringIO()
    guard = oom_guard(file=out, reraise=False)
    with guard:
        forward(20)
    rec = guard.oom
    assert rec is not None and rec.diagnosis is not None
    h = rec.diagnosis.holders
    assert h is not None  # read while the failed call's frames still held the activations
    acts = [x for x in h.holders if "forward()" in x.label and "'activations'" in x.label]
    assert acts and acts[0].bytes >= 24 * MiB and acts[0].kind == "exception", h
    assert "Who holds the memory on cpu" in out.getvalue()
    quiet = oom_guard(file=io.StringIO(), reraise=False, diagnose=False)
    with quiet:
        forward(20)
    assert quiet.oom is not None and quiet.oom.diagnosis is None  # no diagnosis, no holder search
