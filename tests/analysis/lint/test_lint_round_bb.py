"""Round BB's false findings (docs/lint_corpus.md: 60 fresh repositories), each reduced to its data flow,
with the twin that must still be flagged."""

from __future__ import annotations

import textwrap

from torchmem.lint import lint_source


def codes(src: str, path: str = "extract.py") -> list[str]:
    return [f.code for f in lint_source(textwrap.dedent(src), path)]


# -- ATISS: `loss_meter += loss` into a meter of the file whose `__iadd__` keeps `.item()` ----------------
METER = """
import torch


class {cls}:
    def __init__(self):
        self._value = 0
        self._cnt = 0
{iadd}

def train(model, optimizer, loader, epochs):
    for e in range(epochs):
        loss_meter = {made}
        for x, y in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            loss_meter += loss
"""

IADD = """
    def __iadd__(self, x):
        self._value += x.sum().item()
        self._cnt += x.numel()
        return self
"""


def test_a_meter_of_the_file_with_its_own_iadd_is_not_a_kept_graph() -> None:
    assert codes(METER.format(cls="AverageMeter", iadd=IADD, made="AverageMeter()")) == []


def test_a_plain_running_total_of_the_loss_is_still_flagged() -> None:
    """The twins: a tensor total (`0` then `+= loss`), and a class of the file with no `__iadd__`."""
    assert "TM001" in codes(METER.format(cls="AverageMeter", iadd=IADD, made="0"))
    no_iadd = "\n    def value(self):\n        return self._value\n"
    assert "TM001" in codes(METER.format(cls="Box", iadd=no_iadd, made="torch.zeros(())"))


# -- qserve: `model = model.eval()`, a model whose forward runs under no_grad -------------------------------
EVAL_LOOP = """
import torch
import torch.nn as nn


class Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(64, 64)

{forward}


def generate(engine, steps=50):
    model = Decoder().cuda()
    {eval_line}
    for _ in range(steps):
        output = model(engine.step())
        engine.append(output.argmax(-1).tolist())
"""

DECORATED = """    @torch.no_grad()
    def forward(self, x):
        return self.layer(x)
"""

BODY_OFF = """    def forward(self, x):
        with torch.no_grad():
            h = self.layer(x)
            h = h.relu()
        return h
"""

PLAIN = """    def forward(self, x):
        return self.layer(x)
"""

BODY_AUTOCAST = """    def forward(self, x):
        with torch.autocast("cuda"):
            h = self.layer(x)
        return h
"""

BODY_THEN_HEAD = """    def forward(self, x):
        with torch.no_grad():
            h = self.layer(x)
        return self.layer(h)
"""


def test_rebinding_the_model_to_its_eval_keeps_its_class() -> None:
    assert codes(EVAL_LOOP.format(forward=DECORATED, eval_line="model = model.eval()")) == []
    assert codes(EVAL_LOOP.format(forward=DECORATED, eval_line="model = model.eval().half()")) == []
    # the twin: the same rebinding of a model whose forward records a graph
    assert "TM002" in codes(EVAL_LOOP.format(forward=PLAIN, eval_line="model = model.eval()"))


def test_a_forward_whose_work_all_runs_under_no_grad_records_nothing() -> None:
    assert codes(EVAL_LOOP.format(forward=BODY_OFF, eval_line="model.eval()")) == []
    assert codes(EVAL_LOOP.format(forward=BODY_OFF, eval_line="model = model.eval()")) == []
    # the twins: a block that is no switch, and a call after the block, record a graph
    assert "TM002" in codes(EVAL_LOOP.format(forward=BODY_AUTOCAST, eval_line="model.eval()"))
    assert "TM002" in codes(EVAL_LOOP.format(forward=BODY_THEN_HEAD, eval_line="model.eval()"))


# -- qserve: a causal LM whose decoder runs under no_grad, with only its head recording a graph -------------
HEADED = """
import torch
import torch.nn as nn


class Backbone(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(64, 64) for _ in range(8))

    def forward(self, x):
{backbone}
        return h


class CausalLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = Backbone()
        self.lm_head = nn.Linear(64, 100)

    def forward(self, x):
        h = self.model(x)
        return self.lm_head(h[:, -1])


def generate(engine, steps=50):
    model = CausalLM().cuda()
    model = model.eval()
    for _ in range(steps):
        output = model(engine.step())
        engine.append(output.argmax(-1).tolist())
"""

OFF = """        with torch.no_grad():
            h = x
            for layer in self.layers:
                h = layer(h)"""

ON = """        h = x
        for layer in self.layers:
            h = layer(h)"""


def test_a_head_on_a_backbone_that_records_nothing_is_no_eval_loop_with_a_graph() -> None:
    assert codes(HEADED.format(backbone=OFF)) == []
    # the twins: a backbone that records its graph, and a head that is a model of its own
    assert "TM002" in codes(HEADED.format(backbone=ON))
    assert "TM002" in codes(HEADED.format(backbone=OFF).replace("nn.Linear(64, 100)", "Decoder(64, 100)"))


# -- TM000 on syntax a later Python reads (rounds V-AA counted such files among the parse errors) ------------
def _tm000(src: str) -> list[str]:
    return [f.message + " | " + f.fix for f in lint_source(src, "newer.py") if f.code == "TM000"]


def test_syntax_of_a_later_python_is_said_as_such_not_as_invalid() -> None:
    import sys

    pep695 = "def first[T](xs: list[T]) -> T:\n    return xs[0]\n"
    alias = "type Pair[T] = tuple[T, T]\n"
    if sys.version_info >= (3, 12):
        assert _tm000(pep695) == [] and _tm000(alias) == []  # read: nothing to say
    else:
        (said,) = _tm000(pep695)
        assert "uses Python 3.12 syntax (type parameters)" in said and "with Python 3.12 or later" in said
        (said,) = _tm000(alias)
        assert "uses Python 3.12 syntax (a `type` alias)" in said
        # an f-string error may be PEP 701's or a real one: said as a condition, not a claim
        (said,) = _tm000('x = f"{"a"}"\n')
        assert said.startswith("cannot parse with Python 3.") and "if it is an f-string" in said
    # must not: a genuine syntax error says nothing of versions, on any Python
    (said,) = _tm000("def f(:\n    pass\n")
    assert said.startswith("cannot parse: ") and "Python 3." not in said, said
    (said,) = _tm000("type = [1, 2\n")
    assert "Python 3.12" not in said, said


# -- align-anything: `empty_cache()` after `self.train_step(batch)`, whose engine steps the model -----------
TRAINER = """
import torch


class SupervisedTrainer:
    def train_step(self, batch):
        loss = self.model(**batch)["loss"]
{step_body}
        return {{"train/loss": loss.item()}}

    def train(self):
        for epoch in range(self.epochs):
            self.model.train()
            for i, batch in enumerate(self.train_dataloader):
                info = self.train_step(batch)
{cache}
                self.logger.log(info)
"""

ENGINE = "        self.model.backward(loss)\n        self.model.step()"
OPTIMIZER = "        loss.backward()\n        self.optimizer.step()\n        self.optimizer.zero_grad()"
BACKWARD_ONLY = "        loss.backward()"
EVAL_ONLY = "        loss = loss.detach()"
EVERY = "                torch.cuda.empty_cache()"
PERIODIC = "                if i % 100 == 0:\n                    torch.cuda.empty_cache()"


def test_empty_cache_after_a_method_that_steps_the_model_is_flagged() -> None:
    assert codes(TRAINER.format(step_body=ENGINE, cache=EVERY)) == ["TM003"]
    assert codes(TRAINER.format(step_body=OPTIMIZER, cache=EVERY)) == ["TM003"]


def test_empty_cache_after_a_method_that_does_not_step_or_now_and_then_is_not() -> None:
    assert codes(TRAINER.format(step_body=BACKWARD_ONLY, cache=EVERY)) == []
    assert codes(TRAINER.format(step_body=EVAL_ONLY, cache=EVERY)) == []
    assert codes(TRAINER.format(step_body=ENGINE, cache=PERIODIC)) == []


EPOCH_LOOP = """
import torch


def train(loader, model, optimizer):
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def main(loader, model, optimizer, epochs):
    for epoch in range(epochs):
        train(loader, model, optimizer)
        torch.cuda.empty_cache()
"""


def test_empty_cache_after_a_whole_epoch_of_training_is_not_every_step() -> None:
    """Must not (rounds V-Z re-run): `train(...)` runs an epoch's loop: once per epoch is not every step."""
    assert codes(EPOCH_LOOP) == []
