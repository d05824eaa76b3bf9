"""What each new rule and message says, checked on real tensors (CPU): the page's "Wrong" example keeps what
the message says it keeps, and its "Right" example does not."""

from __future__ import annotations

import gc
import re
import weakref
from typing import Any

import pytest
import torch

from torchmem.lint import explain_rule, lint_source


def _example(code: str, section: str) -> str:
    block = re.search(rf"## {section}\n\n```python\n(.*?)```", explain_rule(code), re.S)
    assert block is not None
    return block.group(1)


class _Net(torch.nn.Module):
    """A small model with the pages' `model.layer4`."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 8)
        self.layer4 = torch.nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer4(torch.relu(self.fc(x)))


def _run(code: str, section: str, **extra: Any) -> dict[str, Any]:
    torch.manual_seed(0)
    model = _Net()
    env: dict[str, Any] = {
        "torch": torch,
        "model": model,
        "loader": [(torch.randn(3, 4), torch.randint(0, 2, (3,))) for _ in range(4)],
        "criterion": torch.nn.CrossEntropyLoss(),
        "optimizer": torch.optim.SGD(model.parameters(), lr=0.1),
        **extra,
    }
    exec(_example(code, section), env)
    return env


def _saved_tensors_alive(t: torch.Tensor) -> bool:
    """Whether the graph node that made ``t`` still holds its saved tensors (freed by a backward)."""
    node = t.grad_fn
    assert node is not None
    names = [n for n in dir(node) if n.startswith("_saved_") and not n.endswith("_sym_argsize")]
    for n in names:
        try:
            value = getattr(node, n)
        except RuntimeError:  # "... after they have already been freed"
            return False
        if isinstance(value, torch.Tensor):
            return True
    raise AssertionError(f"{node.name()} saves no tensor")


def test_tm001_message_after_backward_activations_freed_nodes_kept() -> None:
    env = _run("TM001", "Wrong")
    kept = env["losses"]
    assert all(t.grad_fn is not None for t in kept)  # the autograd nodes stay, one graph per step
    model = env["model"]
    x = torch.randn(3, 4)
    out = model(x)
    assert _saved_tensors_alive(out)  # before a backward the activations are held...
    out.sum().backward()
    assert not _saved_tensors_alive(out)  # ...after it they are freed: what grows is the host-side nodes
    (finding,) = [f for f in lint_source(_example("TM001", "Wrong")) if "losses" in f.message]
    assert "saved activations are freed" in finding.message and "host" in finding.message


def test_tm001_message_without_backward_says_device_activations() -> None:
    src = _example("TM001", "Wrong").replace(
        "    losses.append(loss)      # TM001\n", "    aux.append(model(x))\n"
    )
    found = [f for f in lint_source("aux = []\n" + src) if "`aux`" in f.message]
    assert len(found) == 1 and "every saved activation on the device" in found[0].message
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU())
    assert _saved_tensors_alive(model(torch.randn(2, 4)))  # a forward never backwarded keeps them


def test_tm010_wrong_keeps_every_batchs_activations_right_keeps_none() -> None:
    wrong = _run("TM010", "Wrong")
    model, loader = wrong["model"], wrong["loader"]
    assert wrong["evaluate"](model, loader).grad_fn is not None
    outs = [model(x) for x, _ in loader]  # what the loop's `preds` holds before torch.cat
    assert all(_saved_tensors_alive(o) for o in outs)  # each batch's activations, kept
    right = _run("TM010", "Right")
    assert right["evaluate"](right["model"], right["loader"]).grad_fn is None


def test_tm011_a_kept_exception_keeps_the_failed_frames_tensors() -> None:
    def step(batch: torch.Tensor) -> None:
        activations = batch * 2  # noqa: F841 - a local of the failing frame
        raise RuntimeError("CUDA out of memory")

    def run(keep: Any) -> weakref.ref[torch.Tensor]:
        kept: list[Any] = []
        batch = torch.randn(1000)
        ref = weakref.ref(batch)
        try:
            step(batch)
        except RuntimeError as e:
            kept.append(keep(e))
        del batch
        gc.collect()
        run.kept = kept  # type: ignore[attr-defined]  # the container outlives the iteration
        return ref

    assert run(lambda e: e)() is not None  # the exception -> traceback -> frame -> `batch`
    assert run(str)() is None  # the text keeps nothing
    assert {f.code for f in lint_source(_example("TM011", "Wrong"))} == {"TM011"}


def test_tm012_each_step_adds_a_hook_and_right_adds_one() -> None:
    wrong = _run("TM012", "Wrong")
    assert len(wrong["model"].layer4._forward_hooks) == 4  # one per step of the 4-batch loader
    right = _run("TM012", "Right")
    assert len(right["model"].layer4._forward_hooks) == 1


def test_tm013_forward_keeps_every_calls_graph_on_the_module() -> None:
    wrong = _run("TM013", "Wrong")
    net = wrong["Net"]()
    for _ in range(3):
        net(torch.randn(2, 16)).sum().backward()
    assert len(net.outputs) == 3 and all(o.grad_fn is not None for o in net.outputs)
    right = _run("TM013", "Right")
    net = right["Net"]()
    for _ in range(3):
        net(torch.randn(2, 16)).sum().backward()
    assert net.last_output.grad_fn is None


METER = """
class AverageMeter:
    def __init__(self):
        self.sum, self.count = 0, 0
    def update(self, val, n=1):
        self.sum += val * n
        self.count += n
losses_meter = AverageMeter()
"""


@pytest.mark.parametrize("section", ["Wrong", "Right"])
def test_tm007_a_meter_given_the_loss_chains_every_steps_graph(section: str) -> None:
    env: dict[str, Any] = {}
    exec(METER, env)
    env = _run("TM007", section, losses_meter=env["losses_meter"])
    total = env["losses_meter"].sum
    if section == "Wrong":
        assert isinstance(total, torch.Tensor) and total.grad_fn is not None
        depth, node = 0, total.grad_fn
        while node is not None:  # one AddBackward per step, each pointing at the previous sum
            depth += node.name().startswith("AddBackward")
            node = next((f for f, _ in node.next_functions if f is not None and "Add" in f.name()), None)
        assert depth == 4
    else:
        assert isinstance(total, float)


def test_tm002_message_a_forward_with_autograd_holds_every_layers_activation() -> None:
    """TM002 says a forward with autograd on holds every activation a backward would need (a training-sized
    peak, several times the no_grad forward's): count the bytes autograd saves in an 8-layer forward."""
    layers: list[torch.nn.Module] = []
    for _ in range(8):
        layers += [torch.nn.Linear(64, 64), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers).eval()
    x = torch.randn(32, 64)
    saved: list[int] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t.numel() * t.element_size())
        # a detached alias: the tensor itself would make an output -> grad_fn -> packed output cycle that
        # gc cannot see, left alive for the rest of the test process
        return t.detach()

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x)
        activation = 32 * 64 * 4
        held_with_grad = sum(saved) - sum(p.numel() * 4 for p in model.parameters() if p.dim() == 2)
        saved.clear()
        with torch.no_grad():
            model(x)
    assert held_with_grad >= 8 * activation  # every layer's input (and ReLU output) kept for a backward
    assert saved == []  # under no_grad nothing is kept past its layer
