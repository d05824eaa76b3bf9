"""estimate()'s activations on the CPU against a direct measurement (issue 10: "activations 0 B").

The direct measurement walks the autograd graph of a real forward: every ``_saved_*`` tensor of every node,
each storage once, the model's parameters and buffers excluded — the bytes saved for backward. It does not
use saved-tensor hooks, which is how ``estimate()`` measures, so the two are independent. The estimate is
exact at the measured batch sizes and, these activations being linear in the batch, at the extrapolated ones.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from torchmem import estimate
from torchmem.analysis.estimate import EstimateRow, MemoryEstimate


def _mlp() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(64, 256),
        torch.nn.ReLU(),
        torch.nn.Linear(256, 256),
        torch.nn.GELU(),
        torch.nn.Linear(256, 10),
    )


def _cnn() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),  # saves int64 indices too
        torch.nn.Conv2d(8, 16, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Flatten(),  # a view: its storage is the ReLU's, counted once
        torch.nn.Linear(16 * 8 * 8, 10),
    )


MODELS: dict[str, tuple[Callable[[], torch.nn.Module], Callable[[int], torch.Tensor]]] = {
    "mlp": (_mlp, lambda b: torch.randn(b, 64)),
    "cnn": (_cnn, lambda b: torch.randn(b, 3, 16, 16)),
}


def saved_for_backward(model: torch.nn.Module, x: torch.Tensor) -> int:
    """Bytes autograd saves for backward in one training forward (and the default loss), by walking
    ``grad_fn``: distinct storages, the model's own parameters and buffers excluded."""
    own = {t.untyped_storage()._cdata for t in [*model.parameters(), *model.buffers()]}
    model.train()
    loss = model(x).float().mean()  # estimate()'s default loss
    found: dict[int, int] = {}
    todo = [loss.grad_fn]
    seen: dict[int, object] = {}  # the nodes themselves: a freed wrapper's id may be reused (torch 2.11)
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen[id(node)] = node
        for name in dir(node):
            if not name.startswith("_saved_"):
                continue
            value = getattr(node, name)
            for t in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(t, torch.Tensor):
                    st = t.untyped_storage()
                    if st._cdata not in own:
                        found[st._cdata] = st.nbytes()
        todo.extend(fn for fn, _ in node.next_functions)
    del loss
    return sum(found.values())


def _training(e: MemoryEstimate) -> list[EstimateRow]:
    return [r for r in e.rows if r.mode == "training"]


@pytest.mark.parametrize(("name", "optimizer"), [("mlp", "adamw"), ("cnn", "sgd")])
def test_activations_equal_the_bytes_saved_for_backward(name: str, optimizer: str) -> None:
    make, data = MODELS[name]
    torch.manual_seed(0)
    model = make()
    sizes = [4, 8, 32]  # 4, 8 and (probing up to half the largest) 16 are measured, 32 extrapolated
    est = estimate(model, data(4), optimizer=optimizer, batch_sizes=sizes, device="cpu")
    rows = _training(est)
    assert [r.batch_size for r in rows] == sizes
    direct = {bs: saved_for_backward(make(), data(bs)) for bs in [*sizes, 16]}
    for r in rows:
        # exact: the same storages, counted once, at the measured sizes and (linear) at the extrapolated one
        assert r.activations == direct[r.batch_size], (name, optimizer, r, direct)
    assert [m.saved_for_backward for m in est.measurements] == [direct[4], direct[8], direct[16]]
    assert 0 < rows[0].activations < rows[1].activations < rows[2].activations  # they grow with the batch
    assert est.activations_per_sample == pytest.approx((direct[16] - direct[8]) / 8)
    for r in rows:
        fixed = r.parameters + r.gradients + r.optimizer_state + r.temporaries
        if r.activations_in_peak:
            assert fixed + r.activations == r.peak
        else:  # the optimizer step holds the peak: activations were freed in backward
            assert r.phase == "optimizer" and fixed == r.peak
        assert r.to_dict()["activations_in_peak"] == r.activations_in_peak


def test_the_reported_case_adamw_peak_in_the_optimizer_step_shows_the_activations() -> None:
    """The issue's case: a small MLP trained with AdamW peaks in the optimizer step at every size; the
    activations used to print as 0 B there."""
    torch.manual_seed(0)
    model = _mlp()
    est = estimate(model, torch.randn(8, 64), optimizer="adamw", batch_sizes=[8, 16])
    rows = _training(est)
    assert [r.phase for r in rows] == ["optimizer", "optimizer"]
    assert [r.activations for r in rows] == [saved_for_backward(_mlp(), torch.randn(b, 64)) for b in (8, 16)]
    text = str(est)
    assert "0 B*" not in text and "activations are freed before the optimizer step" in text
    # by hand: the input (8 x 64 floats), the ReLU's output, the GELU's input and output (8 x 256 floats each)
    assert rows[0].activations == 8 * 64 * 4 + 3 * 8 * 256 * 4


def test_without_saved_tensor_hooks_the_growth_over_forward_stands_in() -> None:
    torch.manual_seed(0)
    model = _mlp()
    with torch.autograd.graph.disable_saved_tensors_hooks("a library forbids them here"):
        est = estimate(model, torch.randn(8, 64), optimizer="sgd", batch_sizes=[8, 16])
    assert all(m.saved_for_backward is None for m in est.measurements)
    rows = _training(est)
    assert 0 < rows[0].activations < rows[1].activations
    m = est.measurements[0]
    assert m.after_forward is not None and m.before_forward is not None
    assert rows[0].activations == m.after_forward - m.before_forward
