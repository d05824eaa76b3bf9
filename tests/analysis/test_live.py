"""live_tensors() on the CPU: sparse tensors are counted by their parts, unreadable ones are listed."""

from __future__ import annotations

import gc
import traceback
import warnings

import pytest
import torch

import torchmem
from torchmem.analysis.live import graph_tensors
from torchmem.results.live import render_live


def _parts_bytes(*ts: torch.Tensor) -> int:
    return sum(t.untyped_storage().nbytes() for t in ts)


def test_a_sparse_tensor_is_counted_and_reconciles_with_the_ledger() -> None:
    with torchmem.cpu_tracking() as cpu:
        indices = torch.tensor([[0, 1, 2, 3], [3, 2, 1, 0]])
        values = torch.randn(4)
        sp = torch.sparse_coo_tensor(indices, values, (4, 4), check_invariants=True)
        expected = _parts_bytes(indices, values)
        del indices, values  # only the sparse tensor holds them now
        report = torchmem.live_tensors("cpu")
        assert report.allocated == cpu.allocated == expected
        assert report.total >= cpu.allocated and report.unexplained is not None and report.unexplained <= 0
    parts = {t.part: t for t in report.tensors if t.layout == "sparse_coo"}
    assert set(parts) == {"indices", "values"}
    assert parts["indices"].bytes == 4 * 2 * 8 and parts["values"].bytes == 4 * 4
    assert parts["values"].shape == (4, 4) and parts["values"].dtype == "float32"
    assert parts["indices"].dtype == "int64"
    assert parts["values"].holder is not None and "sp" in parts["values"].holder
    assert parts["values"].name == "sparse_coo values"
    assert report.by_category["other"] >= expected
    assert "sparse_coo values" in render_live(report, top=len(report.tensors))
    del sp


def test_a_sparse_gradient_is_a_gradient_of_its_module() -> None:
    emb = torch.nn.Embedding(1000, 64, sparse=True)
    emb(torch.tensor([1, 2, 2, 7])).sum().backward()
    grad = emb.weight.grad
    assert grad is not None and grad.layout == torch.sparse_coo
    report = torchmem.live_tensors("cpu", holders=False)
    grads = [t for t in report.tensors if t.category == "gradient" and t.layout == "sparse_coo"]
    assert {t.part for t in grads} == {"indices", "values"}
    assert sum(t.bytes for t in grads) == _parts_bytes(grad._indices(), grad._values())
    assert all(t.name is not None and "weight.grad" in t.name for t in grads)
    module_bytes = sum(n for m, n in report.by_module.items() if "Embedding" in m or "emb" in m)
    assert module_bytes >= 1000 * 64 * 4 + sum(t.bytes for t in grads)


def test_compressed_sparse_layouts_are_counted_by_their_parts() -> None:
    dense = torch.eye(16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "sparse CSR support is in beta"
        csr = dense.to_sparse_csr()
        csc = dense.to_sparse_csc()
    report = torchmem.live_tensors("cpu", holders=False)
    csr_parts = {t.part: t.bytes for t in report.tensors if t.layout == "sparse_csr"}
    csc_parts = {t.part: t.bytes for t in report.tensors if t.layout == "sparse_csc"}
    assert csr_parts == {
        "crow_indices": csr.crow_indices().untyped_storage().nbytes(),
        "col_indices": csr.col_indices().untyped_storage().nbytes(),
        "values": csr.values().untyped_storage().nbytes(),
    }
    assert set(csc_parts) == {"ccol_indices", "row_indices", "values"}
    assert sum(csc_parts.values()) == _parts_bytes(csc.ccol_indices(), csc.row_indices(), csc.values())


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="needs MKL-DNN")
def test_tensors_whose_memory_cannot_be_read_are_listed_not_dropped() -> None:
    opaque = torch.randn(8, 8).to_mkldnn()
    report = torchmem.live_tensors("cpu", holders=False)
    assert any("_mkldnn" in line and "not counted" in line for line in report.unreadable)
    assert tuple(report.to_dict()["unreadable"]) == report.unreadable
    del opaque


def test_graph_tensors_finds_saved_tensors_and_leaves() -> None:
    w = torch.randn(4, 4, requires_grad=True)
    x = torch.randn(2, 4)
    out = (x @ w).relu().sum()
    found = list(graph_tensors([out, out]))  # each node once, even from two roots
    names = [n for n, _ in found]
    assert len(names) == len(set(names))
    assert any(n.startswith("MmBackward0._saved_self") and t is not None for n, t in found)
    assert any(n == "AccumulateGrad.variable" and t is w for n, t in found)
    saved_x = [t for n, t in found if n == "MmBackward0._saved_self"]
    assert saved_x and saved_x[0].untyped_storage()._cdata == x.untyped_storage()._cdata


def test_fake_tensors_hold_no_memory_and_are_not_counted() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with torchmem.cpu_tracking():
        with FakeTensorMode():
            fake = torch.empty(4096, 4096)  # 64 MiB described, nothing allocated
        real = torch.ones(1024)
        r = torchmem.live_tensors("cpu", holders=False)
    assert not any(t.shape == (4096, 4096) for t in r.tensors)
    assert any(t.bytes == real.untyped_storage().nbytes() for t in r.tensors)
    del fake


def _create_graph_cycle(n: int) -> list[int]:
    """``n`` parameters whose ``.grad`` is a gradient made with ``create_graph=True``: each keeps itself,
    its gradient and the second-order graph alive, and nothing in Python refers to any of them."""
    ptrs = []
    for _ in range(n):
        x = torch.randn(256, 1024, requires_grad=True)
        (g,) = torch.autograd.grad((x * x).sum(), x, create_graph=True)
        x.grad = g
        ptrs.append(x.data_ptr())
    return ptrs


class _Node:
    def __init__(self, t: torch.Tensor) -> None:
        self.t = t
        self.me = self


def test_a_create_graph_gradient_stored_in_grad_is_reported_as_an_autograd_cycle() -> None:
    import gc

    gc.collect()
    _create_graph_cycle(3)
    gc.collect()  # the garbage collector cannot free it: the cycle runs through autograd's C++ graph
    report = torchmem.live_tensors("cpu")
    cycles = [c for c in report.cycles if c.kind == "autograd"]
    assert len(cycles) == 1, str(report)
    c = cycles[0]
    assert not c.collectable and c.tensors >= 6 and c.bytes >= 6 * 256 * 1024 * 4, str(report)
    # round the loop, from each tensor (nothing else holds it) back to itself
    assert c.paths and all(p.startswith("<Tensor (256, 1024) float32>.grad.grad_fn -> ") for p in c.paths)
    assert all(p.endswith(" -> the same tensor") for p in c.paths) and not c.held_by
    assert "create_graph=True" in c.fix and ".grad = None" in c.fix
    big = [t for t in report.tensors if t.bytes == 256 * 1024 * 4]
    assert len(big) >= 6 and all(t.holder is not None and "reference cycle" in t.holder for t in big)
    text = str(report)
    assert c.cycles == 3  # three separate second-order graphs, one entry
    assert "kept only by 3 reference cycles through autograd's graph (gc.collect() cannot free it)" in text
    again = type(report).from_dict(report.to_dict())
    assert again.cycles == report.cycles
    # The fix works: dropping .grad frees them.
    for o in gc.get_objects():
        if type(o) is torch.Tensor and o.is_leaf and o.grad is not None and o.grad.grad_fn is not None:
            o.grad = None
    gc.collect()
    assert not [c for c in torchmem.live_tensors("cpu", holders=True).cycles if c.kind == "autograd"]


def test_a_python_reference_cycle_is_reported_as_collectable() -> None:
    import gc

    gc.collect()
    gc.disable()  # the collector must not run before the report
    try:
        _Node(torch.randn(512, 1024))
        report = torchmem.live_tensors("cpu")
    finally:
        gc.enable()
    cycles = [c for c in report.cycles if c.kind == "python"]
    assert len(cycles) == 1 and cycles[0].collectable and cycles[0].bytes >= 512 * 1024 * 4, str(report)
    assert "_Node" in cycles[0].paths[0] and "gc.collect()" in cycles[0].fix
    gc.collect()
    assert not torchmem.live_tensors("cpu").cycles


def test_an_optimizer_keeps_parameters_of_a_deleted_model_named_and_categorised() -> None:
    # The model is gone; a scheduler still holds the optimizer, which holds the parameters, their
    # gradients and its state: all named from the optimizer, grouped under it, categorised as such.
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 256))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(8, 256)).sum().backward()
    opt.step()
    sched = torch.optim.lr_scheduler.StepLR(opt, 10)
    del model, opt
    r = torchmem.live_tensors("cpu")
    weights = [t for t in r.tensors if t.shape == (256, 256)]
    by_cat = {
        c: [t for t in weights if t.category == c] for c in ("parameter", "gradient", "optimizer state")
    }
    assert len(by_cat["parameter"]) == 2 and len(by_cat["gradient"]) == 2, str(r)
    assert len(by_cat["optimizer state"]) == 4, str(r)
    names = sorted(str(t.name) for t in by_cat["parameter"])
    assert all("'sched'" in n and ".optimizer.param_groups[0]['params'][" in n for n in names), names
    assert any(str(t.name).endswith(".grad") for t in by_cat["gradient"])
    state = sorted(str(t.name) for t in by_cat["optimizer state"])
    assert all(".optimizer.state[param_groups[0]['params'][" in n for n in state), state
    # (tensors earlier tests left alive may own more; ours is the only Adam)
    top = next(g for g in r.owners if g.type == "Adam")
    assert "'sched'" in top.owner and top.owner.endswith(".optimizer") and top.type == "Adam", r.owners
    assert top.counts["parameter"] == 4 and top.counts["gradient"] == 4, top  # weights and biases
    text = str(r)
    assert "held by:" in text and f"largest {min(10, len(r.tensors))} of {len(r.tensors)}:" in text
    assert text.index("held by:") < text.index("largest")
    assert "(Adam): 4 parameters, 4 gradients, " in text
    assert type(r).from_dict(r.to_dict()).owners == r.owners
    del sched


def test_hundreds_of_small_tensors_in_one_object_are_one_summary_line() -> None:
    class Meter:
        def __init__(self) -> None:
            self.values: list[torch.Tensor] = []

    meter = Meter()
    for _ in range(300):
        meter.values.append(torch.randn(64))
    r = torchmem.live_tensors("cpu")
    mine = [g for g in r.owners if g.type == "Meter"]
    assert len(mine) == 1 and mine[0].counts == {"other": 300} and mine[0].bytes == 300 * 256, r.owners
    assert "'meter'" in mine[0].owner
    assert len(str(r).splitlines()) < 60  # capped: the 300 tensors are one line of the summary
    del meter


def test_a_frozen_heap_still_names_every_holder() -> None:
    # Servers and torch's async checkpointing call gc.freeze(): module namespaces then leave gc's view, and
    # the search reads them from sys.modules (one map for all of them: thousands of modules, one pass).
    import json
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(
        """
        import gc, json, torch, torchmem
        gc.freeze()
        kept = {i: torch.randn(256, 256) for i in range(20)}
        r = torchmem.live_tensors("cpu")
        mine = [t for t in r.tensors if t.shape == (256, 256)]
        print(json.dumps([gc.get_freeze_count() > 0, len(mine), sorted({str(t.holder)[:14] for t in mine})]))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    frozen, n, heads = json.loads(out.stdout.strip().splitlines()[-1])
    assert frozen and n == 20 and heads == ["__main__.kept["], out.stdout + out.stderr


def test_the_report_is_one_moment_even_when_the_walk_would_trigger_a_collection() -> None:
    """The allocator's figure and the walk are read with the cyclic collector paused: a collection that the
    walk's own allocations would trigger cannot free garbage between the two (memory the report counts as
    held and the allocated figure disagree)."""
    in_walk: list[int] = []

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and any(f.name == "census" for f in traceback.extract_stack()):
            in_walk.append(info["generation"])

    live = torchmem.live_tensors  # imported (lazily) before the threshold makes every allocation collect
    old = gc.get_threshold()
    with torchmem.cpu_tracking() as cpu:
        node: dict[str, object] = {"t": torch.ones(256 * 1024)}  # 1 MiB only a garbage cycle keeps
        node["self"] = node
        del node
        gc.callbacks.append(seen)
        gc.set_threshold(1, 1, 1)  # any allocation would start a collection
        try:
            report = live("cpu", holders=False)
        finally:
            gc.set_threshold(*old)
            gc.callbacks.remove(seen)
        assert in_walk == []  # no collection while the report was made
        assert gc.isenabled()  # and the collector is on again
        assert report.allocated == cpu.allocated  # the figure and the tensors are of the same moment


def test_objects_frozen_by_gc_freeze_are_said_to_be_out_of_the_walk_s_reach() -> None:
    """``gc.get_objects()`` lists no frozen object: after ``gc.freeze()`` the program's tensors vanish from
    the walk. The report says how many objects it cannot see, and why, rather than a silent empty list."""
    kept = [torch.zeros(4096)]  # made before the freeze: frozen with everything else
    # (CPython 3.12 freezes 375 of its own objects at start-up: those are not the program's and not said)
    r = torchmem.live_tensors("cpu")
    assert r.frozen == 0 and "gc.freeze()" not in str(r)
    assert any(t.bytes == kept[0].nbytes for t in r.tensors)
    gc.freeze()
    try:
        r = torchmem.live_tensors("cpu")
    finally:
        gc.unfreeze()
    assert r.frozen > 0, r.frozen
    assert "frozen by gc.freeze()" in str(r) and "gc.unfreeze()" in str(r), str(r)
    assert type(r).from_dict(r.to_dict()).frozen == r.frozen


def _lines_of(report: torchmem.LiveTensorReport, ts: list[torch.Tensor]) -> list[str]:
    """The printed entry of each storage of ``ts`` (its line and the 'held by' line under it, if any)."""
    text = render_live(report, top=len(report.tensors)).splitlines()
    want = {t.untyped_storage().nbytes() for t in ts}
    out = []
    for i, line in enumerate(text):
        if any(t.name and line.rstrip().endswith(t.name) and t.bytes in want for t in report.tensors):
            nxt = text[i + 1] if i + 1 < len(text) else ""
            out.append(line + ("\n" + nxt if nxt.strip().startswith("held by") else ""))
    return out


def test_a_parameter_of_a_reachable_model_is_not_said_held_by_a_kept_loss_graph() -> None:
    """The holder search's shortest path to a parameter can be a kept loss's graph leaf or the optimizer's
    state keys: printed under ``model.0.weight`` as 'held by loss.grad_fn' it reads as if deleting the loss
    would free the weight. A named tensor of a module or optimizer the program reaches is held by its name."""
    model = torch.nn.Sequential(torch.nn.Linear(96, 80), torch.nn.ReLU(), torch.nn.Linear(80, 72))
    opt = torch.optim.Adam(model.parameters())
    for _ in range(2):
        loss = model(torch.randn(4, 96)).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    report = torchmem.live_tensors("cpu")
    w = model[0].weight
    mine = [t for t in report.tensors if t.bytes == w.untyped_storage().nbytes() and t.name]
    assert {t.category for t in mine} >= {"parameter", "gradient", "optimizer state"}, mine
    for t in mine:
        assert t.holder == t.name, t
        assert "grad_fn" not in (t.holder or "") and "state key" not in (t.holder or ""), t
    printed = _lines_of(report, [w])
    assert printed and not any("held by" in p for p in printed), printed
    del loss, opt


def test_a_parameter_only_a_kept_loss_graph_holds_is_said_held_by_it() -> None:
    """The same weight after ``del model, opt``: the kept loss's graph is what holds it, and is said."""
    model = torch.nn.Linear(88, 76)
    loss = model(torch.randn(4, 88)).sum()
    nbytes = model.weight.untyped_storage().nbytes()
    del model
    gc.collect()
    report = torchmem.live_tensors("cpu")
    mine = [t for t in report.tensors if t.bytes == nbytes and t.category == "parameter"]
    assert len(mine) == 1 and mine[0].holder is not None and "loss" in mine[0].holder, mine
    assert "grad_fn" in mine[0].holder, mine
    del loss


def test_optimizer_state_of_a_function_s_locals_is_named_without_the_frame_twice() -> None:
    """A training loop in ``def main()``: the state is ``main() ..., local 'opt'.state[model.0.weight]...``,
    not the frame's label written again inside the brackets."""
    model = torch.nn.Sequential(torch.nn.Linear(40, 36))
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 40)).sum().backward()
    opt.step()
    report = torchmem.live_tensors("cpu")
    nbytes = model[0].weight.untyped_storage().nbytes()
    state = [t for t in report.tensors if t.category == "optimizer state" and t.bytes == nbytes]
    assert len(state) == 2, state
    for t in state:
        assert t.name is not None and ", local 'opt'.state[0.weight]" not in t.name, t.name
        assert t.name.count(", local '") == 1 and ".state[model.0.weight]['exp_avg" in t.name, t.name
    del opt


def test_the_scope_an_optimizer_state_name_shares_is_dropped_only_when_it_is_the_same() -> None:
    from torchmem.analysis.live import _same_scope

    a, b = "main() in train.py, local 'opt'", "main() in train.py, local 'model'.0.weight"
    assert _same_scope(a, b) == "model.0.weight"
    other = "evaluate() in train.py, local 'model'.0.weight"  # another frame's local: kept whole
    assert _same_scope(a, other) == other
    assert _same_scope("__main__.opt", "__main__.model.0.weight") == "model.0.weight"
    assert _same_scope("pkg.trainer.opt", "__main__.model.0.weight") == "__main__.model.0.weight"
