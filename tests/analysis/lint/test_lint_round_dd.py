"""Round DD's false findings (docs/lint_corpus.md: 27 fresh repositories, 1.01 M lines), each reduced to its
data flow, with the twins that must still be flagged."""

from __future__ import annotations

import textwrap

from torchmem.lint import lint_source


def codes(src: str, path: str = "train.py") -> list[tuple[str, int]]:
    return [(f.code, f.line) for f in lint_source(textwrap.dedent(src), path)]


# -- SimpleAICV (22 findings): the loss rebound after its backward to what a helper returns ------------------
REBOUND = """
class AverageMeter:
    def __init__(self):
        self.sum, self.count = 0, 0

    def update(self, val, n=1):
        self.sum += val * n
        self.count += n


def train(loader, model, criterion, optimizer, reduce_to_floats):
    losses = AverageMeter()
    for images, targets in loader:
        loss = criterion(model(images), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
{rebind}
        losses.update(loss, images.size(0))
    return losses.sum / losses.count
"""


def test_a_loss_rebound_after_its_backward_to_an_unknown_helpers_result_is_not_the_graph() -> None:
    # `[loss] = all_reduce_operation_in_group_for_variables(variables=[loss])`: the helper (another module)
    # makes each element `.item()`; nothing here says the new value is the tensor that was backwarded
    for rebind in (
        "        [loss] = reduce_to_floats([loss])",
        "        loss = reduce_to_floats(loss)",
        "        (loss,) = reduce_to_floats(loss)",
    ):
        assert codes(REBOUND.format(rebind=rebind)) == [], rebind


def test_the_backwarded_loss_itself_and_a_graph_op_on_it_stay_flagged() -> None:
    # must: no rebinding (the meter keeps the backwarded tensor), a tensor op on it, or a rebinding the
    # data flow knows to carry the graph
    for rebind in ("        pass", "        loss = loss * 2", "        loss = loss.mean()"):
        found = codes(REBOUND.format(rebind=rebind))
        assert [c for c, _ in found] == ["TM007"], (rebind, found)


def test_a_value_bound_from_an_unknown_call_then_backwarded_is_still_the_graph() -> None:
    # the backward comes after the binding: the value it runs on is the one the meter keeps
    src = """
    def train(loader, model, compute_loss, optimizer, meter):
        for batch in loader:
            loss = compute_loss(model, batch)
            loss.backward()
            optimizer.step()
            meter.update(loss)
    """
    assert [c for c, _ in codes(src)] == ["TM007"]
    # and a use before the backward, the same value
    src_before = src.replace(
        "            loss.backward()\n            optimizer.step()\n            meter.update(loss)",
        "            meter.update(loss)\n            loss.backward()\n            optimizer.step()",
    )
    assert [c for c, _ in codes(src_before)] == ["TM007"]


# -- iris: a field of what a loss function returned, read as if it were the loss ----------------------------
FIELDS = """
from collections import defaultdict


def train_component(component, optimizer, loader, steps):
    intermediate_losses = defaultdict(float)
    total = 0.0
    for batch in loader:
        optimizer.zero_grad()
        losses = component.compute_loss(batch)
        losses.loss_total.backward()
{use}
        optimizer.step()
    return intermediate_losses, total
"""


def test_a_field_of_a_loss_functions_result_is_not_taken_for_the_loss() -> None:
    # `LossWithIntermediateLosses.intermediate_losses = {k: v.item() ...}` (another module): unknown here
    use = (
        "        for name, value in losses.intermediate_losses.items():\n"
        "            intermediate_losses[name] += value / steps"
    )
    assert codes(FIELDS.format(use=use)) == []


def test_the_backwarded_field_the_result_itself_and_a_models_output_field_stay_flagged() -> None:
    for use in (
        "        total += losses.loss_total",  # the field backward() ran on
        "        total += losses",  # the result taken as the loss
    ):
        found = [c for c, _ in codes(FIELDS.format(use=use))]
        assert found == ["TM001"], (use, found)
    src = """
    def evaluate(model, loader):
        total = 0.0
        for batch in loader:
            out = model(**batch)
            total += out.loss
        return total
    """
    assert [c for c, _ in codes(src)] == ["TM010"]  # a model's output keeps its fields: `out.loss` is one
