"""Rounds DD and EE's false default findings (docs/lint_corpus.md: 27 and 32 fresh repositories, 1.01 M and
1.40 M lines), each reduced to its data flow, with the twins that must still be flagged."""

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
    # as iris writes it: the loss object divided by the accumulation steps (the class's `__truediv__`)
    scaled = FIELDS.replace("component.compute_loss(batch)", "component.compute_loss(batch) / steps")
    assert codes(scaled.format(use=use)) == []


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


# -- round EE, modulus-sym: a total made afresh by each call of a function that steps no optimizer ----------
PER_CALL = """
import torch


class Trainer:
    def __init__(self, model, optimizer, grad_agg_freq=2):
        self.model = model
        self.optimizer = optimizer
        self.grad_agg_freq = grad_agg_freq
        self.seen = 0

    def apply_gradients(self):
        self.optimizer.step()

    def compute_gradients(self, batches):
{init}
        for agg_step in range(self.grad_agg_freq):
            x, y = batches[agg_step]
            loss_minibatch = torch.nn.functional.mse_loss(self.model(x), y) / self.grad_agg_freq
{accumulate}
            loss_minibatch.backward()
{step}
        return loss

    def train(self, loader, steps):
        for step in range(steps):
            self.optimizer.zero_grad(set_to_none=True)
            loss = self.compute_gradients(next(loader))
            self.apply_gradients()
"""


def _per_call(init: str, accumulate: str, step: str = "") -> list[tuple[str, str]]:
    src = PER_CALL.format(init=init, accumulate=accumulate, step=step)
    return [(f.code, f.form) for f in lint_source(textwrap.dedent(src), "trainer.py")]


def test_a_total_made_afresh_by_each_call_of_a_function_that_steps_no_optimizer_is_one_steps() -> None:
    # one optimizer step's micro-batches (the caller steps): TM001's --all-only "backward-in-step" form
    found = _per_call("        loss = 0", "            loss += loss_minibatch")
    assert found == [("TM001", "backward-in-step")], found


def test_a_total_the_function_keeps_across_its_own_steps_or_beyond_its_call_stays_flagged() -> None:
    # the function steps the optimizer inside the loop (directly, or through a method of this file)
    for step in ("            self.optimizer.step()", "            self.apply_gradients()"):
        found = _per_call("        loss = 0", "            loss += loss_minibatch", step)
        assert found == [("TM001", "backward-ran")], (step, found)
    # a total that outlives the call: an attribute of the trainer, a module-level name
    found = _per_call("        loss = 0", "            self.seen += loss_minibatch")
    assert ("TM001", "backward-ran") in found, found
    # no caller of this file steps per call: the loop may be a whole dataset's backward (no optimizer)
    src = PER_CALL.format(init="        loss = 0", accumulate="            loss += loss_minibatch", step="")
    src = src.replace("            self.apply_gradients()\n", "")
    found = [(f.code, f.form) for f in lint_source(textwrap.dedent(src), "trainer.py")]
    assert found == [("TM001", "backward-ran")], found
