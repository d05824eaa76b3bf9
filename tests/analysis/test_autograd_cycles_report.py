"""Cycles through autograd are reported as cycles: ``x.grad = g`` with ``g`` from ``create_graph=True``
makes ``x -> .grad -> g's graph -> x``. live_tensors(), holders() and the holder paths a leak's culprit shows
say the loop, the bytes it keeps and the fix; a plain ``.grad`` from ``backward()`` (or a detached one) is no
cycle. Real CPU tensors and graphs only."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
import torch

import torchmem
from torchmem.analysis.holders import holder_paths_of_storages
from torchmem.analysis.holders.autograd import grad_cycles

FIX_WORDS = ("x.grad = g.detach()", "create_graph=False", "x.grad = None")


def _break_cycles() -> None:
    """Break every cycle through autograd in the process, this module's and those earlier tests leaked (gc
    cannot free them): the reports below must see only their own. A leaf on such a cycle may be reachable
    only through autograd's graph (a parameter whose module is gone): the graphs of the live tensors are
    walked to their leaves too."""

    def unlink(t: object) -> None:
        g = t.grad if isinstance(t, torch.Tensor) and t.is_leaf else None
        if g is not None and g.grad_fn is not None:
            t.grad = None  # type: ignore[attr-defined]

    stack = []
    for o in gc.get_objects():
        try:
            if isinstance(o, torch.Tensor):
                unlink(o)
                if o.grad_fn is not None:
                    stack.append(o.grad_fn)
        except Exception:  # tensors without a .grad to set (subclasses, functional wrappers)
            continue
    seen: set[int] = set()
    while stack:
        fn = stack.pop()
        if id(fn) in seen:
            continue
        seen.add(id(fn))
        try:
            unlink(getattr(fn, "variable", None))
            stack.extend(nf for nf, _ in fn.next_functions if nf is not None)
        except Exception:
            continue
    del stack
    gc.collect()


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    _break_cycles()
    yield
    _break_cycles()


def _cycle(n: int = 256) -> torch.Tensor:
    x = torch.randn(n, 512, requires_grad=True)
    (g,) = torch.autograd.grad((x * x).sin().sum(), x, create_graph=True)
    x.grad = g
    return x


def _leak() -> int:
    """A cycle nothing in Python refers to once this returns; its tensor's data pointer."""
    return _cycle().data_ptr()


def _autograd(report: torchmem.LiveTensorReport) -> list[torchmem.results.live.TensorCycle]:
    return [c for c in report.cycles if c.kind == "autograd"]


def test_a_leaked_cycle_is_named_round_the_loop_with_its_bytes_and_fix() -> None:
    _leak()
    gc.collect()  # cannot free it: the cycle runs through autograd's C++ graph
    report = torchmem.live_tensors("cpu")
    (c,) = _autograd(report)
    assert not c.collectable and not c.held_by and c.cycles == 1
    # x, x.grad and what g's graph saved (x * x, its sin's input...): 256 x 512 float32 each
    assert c.bytes >= 3 * 256 * 512 * 4 and c.tensors >= 3, str(report)
    (loop,) = c.paths
    assert loop.startswith("<Tensor (256, 512) float32>.grad.grad_fn -> saved tensor of "), loop
    assert loop.endswith(" -> the same tensor"), loop
    assert all(w in c.fix for w in FIX_WORDS), c.fix
    text = str(report)
    assert "kept only by a reference cycle through autograd's graph (gc.collect() cannot free it)" in text
    assert f"    {loop}" in text
    mine = [t for t in report.tensors if t.shape == (256, 512)]
    assert mine and not any("held outside Python" in (t.holder or "") for t in mine)
    # the owners summary puts the whole cycle on one line
    owners = [g for g in report.owners if g.type == "cycle"]
    assert len(owners) == 1 and owners[0].bytes == c.bytes
    assert type(report).from_dict(report.to_dict()).cycles == report.cycles


def test_a_cycle_the_program_still_reaches_says_dropping_the_reference_frees_nothing() -> None:
    x = _cycle(128)
    report = torchmem.live_tensors("cpu")
    (c,) = _autograd(report)
    assert c.held_by and c.held_by[0].endswith("local 'x'"), c.held_by
    (loop,) = c.paths
    assert loop.startswith(c.held_by[0] + ".grad.grad_fn -> ") and loop.endswith(" -> the same tensor")
    assert "dropping that reference will not free them" in str(report)
    assert "`x.grad = g.detach()`" in c.fix and "`x.grad = None`" in c.fix
    x.grad = None
    assert not _autograd(torchmem.live_tensors("cpu"))


def test_holders_names_the_loop_besides_the_variable() -> None:
    x = _cycle(64)
    paths = torchmem.holders(x)
    texts = [str(p) for p in paths]
    assert texts[0].endswith("local 'x'"), texts  # what the program holds comes first
    loops = [p for p in paths if p.root == "cycle"]
    assert len(loops) == 1, texts
    assert str(loops[0]).startswith("<reference cycle through autograd: Tensor (64, 512) float32>.grad")
    assert str(loops[0]).endswith(" -> the same tensor")
    assert not any("held outside Python" in t for t in texts), texts
    grad_paths = [str(p) for p in torchmem.holders(x.grad)]
    assert any(t.endswith("local 'x'.grad") for t in grad_paths), grad_paths
    assert any(t.startswith("<reference cycle through autograd:") for t in grad_paths), grad_paths


def test_the_leak_culprits_holder_paths_go_round_the_loop() -> None:
    ptr = _leak()
    gc.collect()
    (x,) = [o for o in gc.get_objects() if type(o) is torch.Tensor and o.data_ptr() == ptr and o.is_leaf]
    storage = x.untyped_storage()
    del x
    (paths,) = holder_paths_of_storages([storage], max_paths=4)
    del storage
    assert paths and all(p.root == "cycle" for p in paths), [str(p) for p in paths]
    assert any(".grad.grad_fn -> saved tensor of" in str(p) for p in paths), [str(p) for p in paths]
    assert not any("held outside Python" in str(p) for p in paths)


def test_a_gradient_penalty_over_a_model_is_one_cycle_named_by_the_parameter() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    loss = model(torch.randn(32, 64)).pow(2).sum()
    grads = torch.autograd.grad(loss, list(model.parameters()), create_graph=True)
    for p, g in zip(model.parameters(), grads):
        p.grad = g
    del grads, loss, g
    report = torchmem.live_tensors("cpu")
    (c,) = _autograd(report)
    assert c.cycles == 1 and c.held_by, str(report)  # one second-order graph, still reached from `model`
    assert "model" in c.held_by[0]
    assert "`model." in c.fix and ".grad = g.detach()`" in c.fix, c.fix
    model.zero_grad(set_to_none=True)  # the fix: the cycle is gone
    assert not _autograd(torchmem.live_tensors("cpu"))


def test_a_plain_gradient_is_no_cycle() -> None:
    model = torch.nn.Linear(256, 256)
    model(torch.randn(8, 256)).pow(2).sum().backward()
    x = torch.randn(128, 256, requires_grad=True)
    (x * x).sum().backward()
    # create_graph=True but stored detached: no graph on .grad, no cycle
    y = torch.randn(128, 256, requires_grad=True)
    (g,) = torch.autograd.grad((y * y).sin().sum(), y, create_graph=True)
    y.grad = g.detach()
    del g
    assert model.weight.grad is not None and x.grad is not None and y.grad is not None
    assert grad_cycles([model.weight, model.bias, x, y]) == []
    report = torchmem.live_tensors("cpu")
    assert not report.cycles, str(report)
    assert "reference cycle" not in str(report)
    assert not [p for p in torchmem.holders(x) if p.root == "cycle"]
    assert not [p for p in torchmem.holders(model.weight) if p.root == "cycle"]
