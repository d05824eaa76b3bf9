"""capture/gpus.GpuWatch on the CPU: the wrappers record the program's lines, return the program's results
untouched, survive their own errors, and are removed at the end."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from torchmem.capture import gpus as gpus_mod
from torchmem.capture.gpus import GpuWatch

HERE = Path(__file__).name


def _line(marker: str) -> int:
    text = Path(__file__).read_text().splitlines()
    (n,) = [i for i, t in enumerate(text, 1) if t.rstrip().endswith(f"# <- {marker}")]
    return n


def test_wrappers_record_the_program_lines_and_are_removed() -> None:
    errors: list[str] = []
    originals = (
        torch.load,
        torch.nn.Module.state_dict,
        torch.nn.DataParallel.__init__,
        subprocess.Popen.__init__,
    )
    w = GpuWatch(torch.device("cpu"), auto=False, on_error=errors.append).install()
    try:
        proc = subprocess.Popen([sys.executable, "-c", "pass"])  # <- popen
        proc.wait()
        m = torch.nn.Linear(2, 2)
        sd = m.state_dict()
        assert set(sd) == {"weight", "bias"} and sd["weight"] is not None
        # no GPU: no device ids, nothing to claim
        torch.nn.DataParallel(m)  # <- dp
    finally:
        w.remove()
    assert errors == []
    child = w._children[proc.pid]
    assert child["site"] == f"{HERE}:{_line('popen')}"
    assert child["command"].endswith("-c pass") and child["used"] == {}
    (dp,) = w.evidence["data_parallel"]
    assert dp["site"] == f"{HERE}:{_line('dp')}" and dp["module"] == "Linear"
    now = (torch.load, torch.nn.Module.state_dict, torch.nn.DataParallel.__init__, subprocess.Popen.__init__)
    assert now == originals
    # no GPU used: nothing in the report, no claim
    rep = w.report()
    assert rep.rows == () and rep.findings == () and rep.children == ()


def test_load_returns_the_program_s_result_and_an_error_inside_is_reported_once(
    tmp_path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "ckpt.pt"
    torch.save({"w": torch.arange(4.0)}, path)
    errors: list[str] = []
    w = GpuWatch(torch.device("cpu"), auto=False, on_error=errors.append).install()
    try:
        ok = torch.load(path)
        assert torch.equal(ok["w"], torch.arange(4.0))

        def broken(_obj: object) -> dict[int, int]:
            raise RuntimeError("boom")

        monkeypatch.setattr(gpus_mod, "_cuda_bytes", broken)
        for _ in range(3):
            again = torch.load(path)  # torchmem's part fails: the program's load still works
            assert torch.equal(again["w"], torch.arange(4.0))
    finally:
        w.remove()
    assert len(errors) == 1 and "boom" in errors[0]
    assert w.evidence["loads"] == []  # CPU storages: nothing restored to a GPU


def test_cuda_bytes_counts_each_storage_once_and_ignores_cpu_tensors() -> None:
    t = torch.zeros(8)
    assert gpus_mod._cuda_bytes({"a": t, "b": [t, t.view(2, 4)]}) == {}


def test_followed_children_and_workers_are_not_described_here() -> None:
    w = GpuWatch(torch.device("cpu"), auto=False, on_error=lambda _m: None)
    w.child_started(11, ["python3", "a.py"], "x.py:1")
    w.child_started(12, "python3 b.py --x", None)
    w.child_started(11, "ignored", None, followed=True)
    w.skip([13])
    assert set(w._children) == {12} and w._children[12]["script"] == "b.py"
    assert {11, 13} <= w._skip_pids


def test_a_function_bound_by_name_after_the_watch_starts_is_the_wrapped_one(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The post-import hook wraps a module's function before the program's ``from m import f`` binds it."""
    (tmp_path / "tm_after_import_probe.py").write_text("def f(x):\n    return x + 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen: list[str] = []

    def wrap(mod: object) -> None:
        original = mod.f  # type: ignore[attr-defined]

        def f(x: int) -> int:
            seen.append("called")
            return int(original(x))

        mod.f = f  # type: ignore[attr-defined]

    hook = gpus_mod._AfterImport("tm_after_import_probe", wrap, lambda e: seen.append(repr(e)))
    sys.meta_path.insert(0, hook)
    try:
        from tm_after_import_probe import f  # type: ignore[import-not-found]

        assert f(1) == 2 and seen == ["called"]
    finally:
        sys.meta_path.remove(hook)
        sys.modules.pop("tm_after_import_probe", None)


def test_dcp_state_dict_functions_are_wrapped_and_return_the_program_s_dict() -> None:
    w = GpuWatch(torch.device("cpu"), auto=False, on_error=lambda _m: None).install()
    try:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        m = torch.nn.Linear(3, 3)
        assert getattr(get_model_state_dict, "__wrapped__", None) is not None
        sd = get_model_state_dict(m)
        assert set(sd) == {"weight", "bias"} and torch.equal(sd["weight"], m.weight)
    finally:
        w.remove()
    import torch.distributed.checkpoint.state_dict as dcp_sd

    assert getattr(dcp_sd.get_model_state_dict, "__wrapped__", None) is None  # removed


def test_a_name_the_program_bound_before_the_watch_started_is_rebound_and_restored(
    tmp_path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """An mp.spawn child imports the main script (and its ``from ... import``) before its session starts."""
    (tmp_path / "tm_bound_early.py").write_text(
        "from torch.distributed.checkpoint.state_dict import get_model_state_dict\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import tm_bound_early  # type: ignore[import-not-found]

    original = tm_bound_early.get_model_state_dict
    w = GpuWatch(torch.device("cpu"), auto=False, on_error=lambda _m: None).install()
    try:
        assert tm_bound_early.get_model_state_dict.__wrapped__ is original
        sd = tm_bound_early.get_model_state_dict(torch.nn.Linear(2, 2))
        assert set(sd) == {"weight", "bias"}
    finally:
        w.remove()
        sys.modules.pop("tm_bound_early", None)
    assert tm_bound_early.get_model_state_dict is original
