"""Host growth of every kind (issue 26): real programs run under ``torchmem run`` with no flag, their
``host_leak`` record checked, and the pure rules of ``analysis/host_state.py`` and the capture helpers on
plain data.

Said: numpy rows and a dict of lists named by type, holder, bytes and line; a profiler left recording and
anomaly mode with the losses kept named with their fix. Not said: the same states when nothing grows, or
when the growth is explained otherwise; the controls (a bounded deque and cache, a history of floats,
gradient accumulation) stay quiet."""

from __future__ import annotations

import collections
import dataclasses
import functools
import gc
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from scenarios.run_catalog import Expected, records, run_all, safety_failures
from torchmem.analysis.host import ChainHead, standalone_graphs
from torchmem.analysis.host_state import (
    ANOMALY,
    CUDNN_BENCHMARK,
    MEMORY_HISTORY,
    PROFILER,
    HostAccount,
    LineGrowth,
    ProcessState,
    StateEvidence,
    checked_note,
    closest_line,
    growing_lines,
    line_culprits,
    state_culprits,
    state_through,
)
from torchmem.capture.host import HostWatcher
from torchmem.capture.host_objects import (
    container_lengths,
    item_size,
    kept_entries,
    newest,
    still_growing,
    untracked_items,
)
from torchmem.capture.process_state import ShapeWindow, read_state, running_profilers
from torchmem.results.holders import HolderPath, HolderStep, StepKind
from torchmem.results.leaks import LeakReport

PROGRAMS = Path(__file__).resolve().parent / "host_kinds"
CPU_ENV = {"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}


@dataclasses.dataclass(frozen=True)
class _Program(Expected):
    @property
    def path(self) -> Path:
        return PROGRAMS / self.file


RUNS = (
    _Program("rows_and_profiler", "rows_and_profiler.py", "host_leak", "backward", "rows"),
    _Program("profiler_running", "profiler_running.py", "host_leak", "backward", "prof"),
    _Program("anomaly_kept", "anomaly_kept.py", "host_leak", "backward", "losses"),
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Each program once under ``torchmem run``, one at a time, forked from an interpreter that imported
    torch and torchmem (the scenario suite's fork server): one server (a second one costs its own import of
    torch, ~1.9 CPU-s, to save wall time on cores the other test workers use anyway)."""
    return run_all(RUNS, tmp_path_factory, workers=1, env=CPU_ENV, fork_server=True)


def _host(runs: dict[str, Any], name: str) -> LeakReport:
    r = runs[name]
    prog = next(p for p in RUNS if p.name == name)
    assert not safety_failures(prog, r), r.stderr[-3000:]
    reps = [rec for rec in records(r.capture) if rec.get("type") == "host_leak"]
    assert reps, f"no host_leak record\n{r.stderr[-3000:]}"
    return LeakReport.from_dict(reps[-1]["report"])


def _line(file: str, marker: str) -> str:
    lines = (PROGRAMS / file).read_text().splitlines()
    return f"{file}:{next(i for i, text in enumerate(lines, 1) if text.rstrip().endswith(marker))}"


def test_numpy_rows_and_a_dict_of_lists_are_named_and_the_profiler_is_not(runs: dict[str, Any]) -> None:
    r = _host(runs, "rows_and_profiler")
    # On the CPU the session leaves the verdict to the device report (the C heap is its figure too): the
    # host report keeps its culprits (see the report's notes); its own verdict was a leak.
    assert r.verdict == "leak", str(r)
    by_holder = {c.holder.split("[")[0] if c.holder else None: c for c in r.culprits}
    rows, log = by_holder.get("__main__.rows"), by_holder.get("__main__.log")
    assert rows is not None and log is not None, str(r)
    assert rows.kind == "python_objects" and rows.site == _line("rows_and_profiler.py", "# ROWS")
    assert 250 * 1024 <= rows.bytes_per_step <= 300 * 1024, str(r)  # a 256 x 128 float64 array a step
    assert rows.fix.startswith("`rows` keeps 1 new ndarray per step (+256."), rows.fix
    assert log.site == _line("rows_and_profiler.py", "# LOG") and "`log` keeps 1 new list" in log.fix
    assert 50 * 1024 <= log.bytes_per_step <= 80 * 1024, str(r)  # 2000 floats and their list
    # a dict that gc does not track (int keys, str values): found through what refers to it
    names = by_holder.get("__main__.names")
    assert names is not None and names.site == _line("rows_and_profiler.py", "# NAMES"), str(r)
    assert 30 * 1024 <= names.bytes_per_step <= 36 * 1024 and "new str per step" in names.fix, str(r)
    # the profiler records too, but its events are a small part of the growth: a note, not a cause
    assert not [c for c in r.culprits if c.kind == PROFILER], str(r)
    assert any(n.startswith("a torch.profiler is recording too, not named") for n in r.notes), r.notes
    assert any(n.startswith("tracemalloc traced Python allocations for") for n in r.notes), r.notes


def test_a_profiler_left_recording_is_named_with_its_holder_and_fix(runs: dict[str, Any]) -> None:
    r = _host(runs, "profiler_running")
    assert r.leaking, str(r)
    c = r.culprits[0]
    assert c.kind == PROFILER and c.holder == "__main__.prof", str(r)
    assert c.fix.startswith("the profiler `prof` is recording every op of every step"), c.fix
    assert "`prof.stop()`" in c.fix and "schedule=" in c.fix
    assert c.bytes_per_step >= 16 * 1024, str(r)
    assert [k.kind for k in r.culprits] == [PROFILER], str(r)  # nothing else is blamed
    assert "profiler_running: +" in str(r) and " from a torch.profiler that is recording" in str(r)


def test_anomaly_mode_with_the_losses_kept_is_named_with_its_holder(runs: dict[str, Any]) -> None:
    r = _host(runs, "anomaly_kept")
    assert r.leaking, str(r)
    c = r.culprits[0]
    assert c.kind == ANOMALY and c.holder is not None and c.holder.startswith("__main__.losses["), str(r)
    assert "`losses` keeps the graphs alive (+7 nodes/step" in c.fix, c.fix
    assert "set_detect_anomaly(False)" in c.fix and "loss.item()" in c.fix
    assert not [k for k in r.culprits if k.kind == "python_objects"], str(r)  # the stacks are not lines


def test_the_graph_of_the_step_in_progress_is_searched_last_for_who_keeps_the_anomaly_stacks() -> None:
    # A scan at a backward() boundary sees `loss` of the step in progress before `losses.append(loss)`: on a
    # two-step gap its graph tied with the one kept graph since the second scan, and the holder named was
    # `__main__.loss` (CI, session 26). The graphs since the first scan, oldest first, outvote it.
    first, second = 100, 120
    kept = [ChainHead(i, seq, "MeanBackward0", 7) for i, seq in enumerate((128, 114, 107))]
    seen_at_second = ChainHead(3, 107 - 7, "MeanBackward0", 0, (100,))  # not a graph since the first scan
    in_progress = ChainHead(4, 135, "MeanBackward0", 7)
    chain = ChainHead(5, 133, "AddBackward0", 3, (99,))  # grows on an older head: a chain, not a graph
    again = ChainHead(6, 112, "MeanBackward0", 0, (112,))  # the second scan's head, still alive
    heads = [in_progress, *kept, seen_at_second, chain, again]
    got = standalone_graphs(heads, since=first, until=1 << 63, limit=8)
    assert [h.seq for h in got] == [107, 112, 114, 128, 135]
    assert got[-1] is in_progress and second < got[-1].seq
    assert [h.seq for h in standalone_graphs(heads, since=first, until=1 << 63, limit=2)] == [107, 112]
    leaf = ChainHead(0, 1 << 63, "AccumulateGrad", 0)
    assert standalone_graphs([leaf], since=0, until=1 << 63, limit=8) == []


def test_controls_and_anomaly_mode_with_nothing_kept_stay_quiet() -> None:
    # In this process (nothing grows, so nothing is scanned): anomaly mode on with nothing kept, a
    # deque(maxlen=4) of numpy arrays, an lru_cache that fills in 12 steps and stops, a history of floats,
    # gradient accumulation over 4 micro-batches, a dict cache that evicts.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    recent: collections.deque[np.ndarray] = collections.deque(maxlen=4)
    history: list[float] = []
    cache: dict[int, np.ndarray] = {}

    @functools.lru_cache(maxsize=12)
    def table(k: int) -> np.ndarray:
        return np.random.rand(64, 128)

    w = HostWatcher(max_stride=1, holder_time_limit=30.0).start()
    with torch.autograd.set_detect_anomaly(True):
        for step in range(80):
            for _ in range(4):
                loss = model(torch.randn(8, 64)).square().mean() / 4
                loss.backward()
            opt.step()
            opt.zero_grad()
            recent.append(np.random.rand(64, 128))
            table(step % 12)
            history.append(loss.item())
            cache[step % 8] = np.random.rand(32, 32)
            w.step()
    w.stop()
    r = w.report()
    assert not r.leaking and r.culprits == (), str(r)
    assert r.verdict in ("flat", "noisy", "below_threshold", "shrinking", "stopped"), str(r)
    assert not w._scan_steps, str(r)  # nothing lasted long enough to be looked for
    assert not any(k in n for n in r.notes for k in ("anomaly", "profiler")), r.notes


# -- the pure rules ------------------------------------------------------------------------------------------
def _path(name: str, index: int = 3) -> HolderPath:
    return HolderPath.of(
        "module",
        (
            HolderStep(StepKind.ROOT, "__main__", "__main__"),
            HolderStep(StepKind.MODULE_GLOBAL, f".{name}", name),
            HolderStep(StepKind.ITEM, f"[{index}]", str(index), "list", "int"),
        ),
        2,
    )


def test_growing_lines_tell_lines_that_keep_from_lines_that_free() -> None:
    first = {"a.py:3": 4096, "a.py:9": 50_000, "a.py:12": 100}
    second = {"a.py:3": 8192, "a.py:9": 50_000, "a.py:12": 120}
    assert growing_lines(first, second, 1, 1) == [LineGrowth("a.py:3", 4096.0, 8192)]
    # a line that kept nothing in the first interval is a one-time allocation, not growth
    assert growing_lines({}, {"a.py:5": 8192}, 1, 1) == []
    lines = growing_lines(first, second, 1, 1)
    assert closest_line(lines, 5000.0) == "a.py:3" and closest_line(lines, 20_000.0) is None
    c = line_culprits(lines, (), min_bytes_per_step=1024)[0]
    assert c.site == "a.py:3" and c.holder is None and "traced by tracemalloc" in c.fix
    assert line_culprits(lines, ("a.py:3",), min_bytes_per_step=1024) == ()


def test_each_state_is_said_when_it_explains_the_growth_and_not_otherwise() -> None:
    native = HostAccount(heap=300_000.0, traced=0.0)
    ev = StateEvidence(profilers=(_path("prof"),), new_shapes=(3, 3, 7))
    for kind, state in (
        (PROFILER, ProcessState(profiler=True)),
        (MEMORY_HISTORY, ProcessState(memory_history=True)),
        (CUDNN_BENCHMARK, ProcessState(cudnn_benchmark=True)),
    ):
        said, notes = state_culprits(state, native, ev, min_bytes_per_step=4096, steps=10)
        assert [c.kind for c in said] == [kind] and said[0].bytes_per_step == 300_000.0, (kind, said)
        assert notes == ()
        # explained otherwise: Python objects with a holder make nearly all of the growth
        other = HostAccount(heap=1_000_000.0, traced=950_000.0, traced_heap=950_000.0, python_named=950_000.0)
        said, notes = state_culprits(state, other, ev, min_bytes_per_step=4096)
        assert said == () and "the growth is explained otherwise" in notes[0], notes
        # CPU tensors and autograd nodes are not native state either
        said, _ = state_culprits(
            state, HostAccount(heap=300_000.0, tensors=290_000.0), ev, min_bytes_per_step=4096
        )
        assert said == ()
    said, _ = state_culprits(ProcessState(profiler=True), native, ev, min_bytes_per_step=1)
    assert said[0].holder == "__main__.prof[3]" and "`prof.stop()`" in said[0].fix
    # cudnn.benchmark with no new shapes in the window, or shapes not watched: a note
    for shapes in ((3, 0, 2), None):
        said, notes = state_culprits(
            ProcessState(cudnn_benchmark=True),
            native,
            StateEvidence(new_shapes=shapes),
            min_bytes_per_step=4096,
        )
        assert said == () and notes and "cudnn.benchmark is on too" in notes[0]
    # anomaly mode explains Python objects nobody names, and only while graphs stay alive
    kept = HostAccount(heap=6000.0, traced=19_000.0, nodes_per_step=7.0)
    ev = StateEvidence(graph_paths=(_path("losses"),))
    said, _ = state_culprits(ProcessState(anomaly=True), kept, ev, min_bytes_per_step=4096)
    assert said[0].kind == ANOMALY and said[0].holder == "__main__.losses[3]", said
    free = dataclasses.replace(kept, nodes_per_step=0.0)
    said, notes = state_culprits(ProcessState(anomaly=True), free, ev, min_bytes_per_step=4096)
    assert said == () and "no autograd graph stays alive" in notes[0]
    # two native states share what is left, and say so
    said, _ = state_culprits(
        ProcessState(profiler=True, memory_history=True), native, ev, min_bytes_per_step=4096
    )
    assert len(said) == 2 and all("shared equally by 2 states" in c.fix for c in said)
    assert said[0].bytes_per_step == 150_000.0
    # nothing is on: nothing to say
    assert state_culprits(ProcessState(), native, ev, min_bytes_per_step=4096) == ((), ())
    assert state_through([ProcessState(profiler=True), ProcessState()]).on() == ()


def test_unexplained_growth_says_what_was_checked() -> None:
    text = checked_note(
        HostAccount(heap=65_536.0, traced=512.0, nodes_per_step=0.0),
        ProcessState(anomaly=True),
        types_counted=2500,
        containers=800,
    )
    assert text.startswith("nothing torchmem can see explains +64.00 KiB/step of host growth"), text
    for part in ("autograd chains", "2,500 Python types", "800 containers", "tracemalloc", "CPU tensor"):
        assert part in text, text
    assert "on: anomaly_mode" in text


# -- the capture helpers on real objects ---------------------------------------------------------------------
def test_containers_that_keep_growing_and_their_newest_untracked_entries() -> None:
    rows: list[np.ndarray] = []
    d: dict[str, str] = {}
    q: collections.deque[float] = collections.deque(maxlen=5)
    for i in range(6):
        rows.append(np.zeros((64, 64)))
        d[f"k{i}"] = "x" * (100 + i)
        q.append(float(i))
    objs = gc.get_objects()
    first = {k: (v,) for k, v in container_lengths(objs, own=[]).items()}
    assert first[id(rows)] == (6,) and first[id(d)] == (6,) and first[id(q)] == (5,)
    rows.append(np.zeros((64, 64)))
    d["k9"] = "y" * 300
    q.append(9.0)  # full: it does not grow
    grown, found = still_growing(gc.get_objects(), first)
    assert grown[id(rows)] == (6, 7) and grown[id(d)] == (6, 7) and id(q) not in grown
    assert found[id(rows)] is rows
    assert newest(d, 2) == [("k5", "x" * 105), ("k9", "y" * 300)] and newest(q, 1) == [(4, 9.0)]
    assert [k for k, _ in newest(rows, 2)] == [5, 6]
    entries = kept_entries([*newest(rows, 2), (7, None), (8, 7), (9, [1.5, 2.5]), (10, torch.zeros(2))])
    assert [k for k, _ in entries] == [5, 6, 9]  # not shared values or tensors (the device report's)
    assert len(untracked_items([v for _, v in entries])) == 2  # the arrays; the list is tracked
    assert item_size(rows[-1]) >= 64 * 64 * 8
    assert item_size([1.5, 2.5]) == sys.getsizeof([1.5, 2.5]) + 2 * sys.getsizeof(1.5)
    del objs


def test_the_process_state_is_read_and_a_recording_profiler_is_found() -> None:
    assert read_state().on() == ()
    with torch.autograd.set_detect_anomaly(True):
        assert read_state().anomaly
    prof = torch.profiler.profile()
    prof.start()
    try:
        torch.ones(2) + 1
        assert read_state().profiler
        found = running_profilers(gc.get_objects())
        assert found == [prof], found
    finally:
        prof.stop()
    assert not read_state().profiler and running_profilers(gc.get_objects()) == []
    # the shape window: the convolution modules' shapes, step by step (cuDNN's are on CUDA; here the CPU's)
    conv = torch.nn.Conv2d(1, 2, 3)
    for devices, sizes, expected in (
        (("cuda",), (5, 6, 7), (2, 0, 0)),  # on the CPU nothing is cuDNN's
        (("cpu",), (5, 6, 7), (2, 2, 3)),  # a new shape at every step after the first
        (("cpu",), (5, 5, 5), (2, 0, 1)),  # one shape: planned once
    ):
        w = ShapeWindow(devices)
        assert w.open()
        try:
            for size in sizes:
                conv(torch.randn(1, 1, size, size))
                torch.nn.functional.conv2d(torch.randn(1, 1, 9, 9), conv.weight)  # functional: not seen
                w.mark()
        finally:
            w.close()
        conv(torch.randn(1, 1, 11, 11))  # after close: not seen
        assert w.result() == expected, (devices, sizes, w.result())


def test_steps_that_end_inside_backward_leave_no_function_mode_behind() -> None:
    # A step boundary inside Tensor.backward() (torchmem run's "backward() call" step): a function mode
    # pushed there could not be removed at a later boundary (backward runs in the mode's handler, which
    # takes the mode off the stack meanwhile), so the line that extends a chain is not recorded; the chain
    # is still named.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    shadow = {n: p.detach().clone() for n, p in model.named_parameters()}
    w = HostWatcher(max_stride=1, holder_time_limit=30.0).start()
    for _ in range(60):
        loss = model(torch.randn(8, 16)).square().mean()
        loss.register_hook(lambda g: w.step())  # the step ends inside backward()
        loss.backward()
        for n, p in model.named_parameters():
            shadow[n].mul_(0.99).add_(p, alpha=0.01)  # p requires grad: a chain grows
            p.grad = None
    w.stop()
    r = w.report()
    assert torch._C._len_torch_function_stack() == 0
    assert r.leaking and r.culprits and r.culprits[0].kind == "autograd_chain", str(r)
    assert r.culprits[0].holder is not None and "'shadow'" in r.culprits[0].holder, str(r)
    assert any("when the steps end inside backward()" in n for n in r.notes), r.notes


def test_growth_nothing_explains_says_what_was_checked() -> None:
    # C memory that a library keeps (here malloc'd through ctypes and freed only after the watch): no Python
    # object, tensor, autograd node or process state explains it.
    import ctypes

    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    blocks: list[int] = []
    w = HostWatcher(max_stride=1, holder_time_limit=30.0).start()
    try:
        for _ in range(60):
            torch.randn(32, 32) @ torch.randn(32, 32)
            blocks.append(libc.malloc(64 * 1024))
            w.step()
        w.stop()
    finally:
        for b in blocks:
            libc.free(b)
    r = w.report()
    assert r.leaking and r.culprits == (), str(r)
    note = next((n for n in r.notes if n.startswith("nothing torchmem can see explains")), None)
    assert note is not None, r.notes
    for part in ("autograd chains", "containers", "tracemalloc", "CPU tensor storages", "all off"):
        assert part in note, note
