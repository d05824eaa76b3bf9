"""Round Z's false findings (docs/lint_corpus.md: 59 fresh repositories, 7 false of 12), each reduced to
its data flow, with the twin that must still be flagged."""

from __future__ import annotations

import textwrap
from pathlib import Path

from torchmem.lint import lint_paths, lint_source


def codes(src: str, path: str = "extract.py") -> list[str]:
    return [f.code for f in lint_source(textwrap.dedent(src), path)]


# -- OmniDrive: `engine.eval()` of a TensorRT wrapper, a class of the file that is no nn.Module --------
WRAPPER = """
import torch


class InferTrt(object):
    def __init__(self, engine):
        self.engine = engine
        self.bindings = {{}}

    def eval(self):
        self.bindings["out"] = torch.zeros(4, device="cuda")

    def __call__(self, img):
        return self.forward(torch.from_numpy(img).cuda())

    def forward(self, img):
        {forward}
        return self.bindings["out"]


def main(engine_obj, samples):
    engine = InferTrt(engine_obj)
    engine.eval()
    results = []
    for sample in samples:
        results.append(engine(sample).detach().cpu().numpy())
    return results
"""


def test_a_class_that_is_no_module_with_its_own_eval_is_not_a_model() -> None:
    assert codes(WRAPPER.format(forward="self.engine.execute(self.bindings)")) == []


def test_a_plain_class_wrapping_a_model_it_calls_is_still_a_model() -> None:
    """``self.model(img)`` in the wrapper's ``forward`` (reached through ``__call__``): autograd records."""
    assert codes(WRAPPER.format(forward="self.bindings['out'] = self.model(img)")) == ["TM002"]


# -- LLaMA-VID: a vision tower whose forward is decorated with @torch.no_grad() ---------------------------
TOWER = """
import torch
import torch.nn as nn


class Tower(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(16, 16)

    {decorator}
    def forward(self, images):
        return self.proj(images)


def main(batches):
    tower = Tower().cuda()
    tower.eval()
    feats = []
    for batch in batches:
        feats.append(tower(batch).cpu())
    return feats
"""


def test_a_model_whose_forward_is_decorated_no_grad_records_no_graph() -> None:
    assert codes(TOWER.format(decorator="@torch.no_grad()")) == []
    assert codes(TOWER.format(decorator="@torch.inference_mode()")) == []


def test_the_same_model_without_the_decorator_is_flagged() -> None:
    assert codes(TOWER.format(decorator="")) == ["TM002"]


def test_an_imported_model_whose_forward_is_decorated_no_grad(tmp_path: Path) -> None:
    (tmp_path / "towers").mkdir()
    (tmp_path / "towers" / "__init__.py").write_text("from .eva import Tower\n")
    src = textwrap.dedent(TOWER)
    cls = src[src.index("class Tower") : src.index("def main")]
    body = src[src.index("def main") :]
    for decorator, expected in (("@torch.no_grad()", []), ("", ["TM002"])):
        (tmp_path / "towers" / "eva.py").write_text(
            "import torch\nimport torch.nn as nn\n\n" + cls.format(decorator=decorator)
        )
        script = tmp_path / "extract.py"
        script.write_text("import torch\nfrom towers import Tower\n\n" + body)
        assert [f.code for f in lint_paths([script], config=False)] == expected, decorator


# -- large_concept_model: a count kept from a loss record whose `.value` is what backward ran on ---------
RECORD = """
def train_step(self, batches):
    num_targets = 0
    for batch in batches:
        loss = self.criterion(batch)
        {backward}
        num_targets += loss.{field}
    self.optimizer.step()
    return num_targets
"""


def test_another_field_of_a_loss_record_is_not_the_loss() -> None:
    assert codes(RECORD.format(backward="loss.value.backward()", field="num_target_elements"), "t.py") == []
    assert codes(RECORD.format(backward="self.scaler.backward(loss.value)", field="n"), "t.py") == []


def test_the_field_backward_ran_on_or_the_loss_itself_is_still_flagged() -> None:
    assert codes(RECORD.format(backward="loss.value.backward()", field="value"), "t.py") == ["TM001"]
    src = RECORD.format(backward="loss.backward()", field="detach()").replace("loss.detach()", "loss")
    assert codes(src, "t.py") == ["TM001"]


# -- TRELLIS: `torch.set_grad_enabled(False)` as a statement, at the top of the script or of a function -
EXTRACT = """
import torch
{top}

def main(batches):
    {inner}
    model = torch.hub.load("facebookresearch/dinov2", "dinov2_vitl14_reg")
    model.eval().cuda()
    feats = []
    for views in batches:
        feats.append(model(views.cuda())["x_prenorm"])
    return torch.cat(feats)
"""


def test_autograd_turned_off_by_a_statement_is_off_for_what_follows() -> None:
    assert codes(EXTRACT.format(top="torch.set_grad_enabled(False)", inner="pass")) == []
    assert codes(EXTRACT.format(top="", inner="torch.set_grad_enabled(False)")) == []


def test_autograd_turned_on_again_or_never_off_is_flagged() -> None:
    assert codes(EXTRACT.format(top="", inner="pass")) == ["TM010"]
    # turned off at the top, but the file turns it on again somewhere: not known to be off in main
    on_again = EXTRACT.format(top="torch.set_grad_enabled(False)", inner="pass") + (
        "\ndef train():\n    torch.set_grad_enabled(True)\n"
    )
    assert codes(on_again) == ["TM010"]
    # off, then on again before the loop in the same function
    assert codes(
        EXTRACT.format(top="", inner="torch.set_grad_enabled(False); torch.set_grad_enabled(True)")
    ) == ["TM010"]


# -- robustlearn: a learning-rate scheduler's step is not an optimizer step ------------------------------
EPOCHS = """
import torch


def train(self, num_epochs):
    for epoch in range(num_epochs):
        torch.cuda.empty_cache()
        for inputs, labels in self.loader:
            self.loss = self.criterion(self.model(inputs), labels)
            self.batch_backward()
        self.{name}.step()
"""


def test_a_scheduler_named_after_the_optimizer_does_not_make_the_epoch_loop_a_step_loop() -> None:
    assert codes(EPOCHS.format(name="model_optimizer_scheduler"), "run.py") == []
    assert codes(EPOCHS.format(name="lr_scheduler"), "run.py") == []


def test_an_optimizer_step_in_the_loop_with_empty_cache_is_still_flagged() -> None:
    assert codes(EPOCHS.format(name="model_optimizer"), "run.py") == ["TM003"]


# -- pytorch/translate: an evaluation two calls below the only `with torch.no_grad():` -------------------
GENERATOR = """
import torch


class SequenceGenerator(torch.nn.Module):
    def __init__(self, models):
        super().__init__()
        self.models = models

    def generate(self, encoder_inputs):
        {generate}

    def _generate(self, encoder_inputs):
        return self._encode(encoder_inputs)

    def _encode(self, encoder_inputs):
        outs = []
        for model in self.models:
            model.eval()
            outs.append(model.encoder(*encoder_inputs))
        return outs
"""


def test_a_helper_called_two_levels_below_no_grad_runs_under_it() -> None:
    src = GENERATOR.format(
        generate="with torch.no_grad():\n            return self._generate(encoder_inputs)"
    )
    assert codes(src, "gen.py") == []


def test_the_same_helpers_called_with_autograd_on_are_flagged() -> None:
    assert codes(GENERATOR.format(generate="return self._generate(encoder_inputs)"), "gen.py") == ["TM010"]


# -- session 21: the per-step methods a framework calls with autograd on, read like a forward (TM013) ----
HF_TRAINER = """
import torch
from transformers import Trainer


class MyTrainer(Trainer):
    kept_logits = []

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        outputs = model(**inputs)
        self.kept_logits.append({kept})
        return outputs.loss
"""

LIGHTNING = """
import torch
import lightning as L


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(8, 1)
        self.losses = []

    def {method}(self, batch, batch_idx):
        loss = self.net(batch).square().mean()
        self.losses.append({kept})
        return loss
{more}
"""


def test_a_trainer_that_keeps_each_steps_logits_is_flagged() -> None:
    assert codes(HF_TRAINER.format(kept="outputs.logits"), "train.py") == ["TM013"]
    found = lint_source(textwrap.dedent(HF_TRAINER.format(kept="outputs.logits")), "train.py")[0]
    assert (
        "`MyTrainer.compute_loss` stores `outputs.logits`" in found.message and "forward" not in found.message
    )


def test_a_lightning_training_step_that_keeps_its_loss_is_flagged() -> None:
    assert codes(LIGHTNING.format(method="training_step", kept="loss", more=""), "m.py") == ["TM013"]


def test_kept_numbers_detached_tensors_cleared_lists_and_validation_steps_are_not() -> None:
    assert codes(HF_TRAINER.format(kept="outputs.logits.detach().cpu()"), "train.py") == []
    assert codes(LIGHTNING.format(method="training_step", kept="loss.item()", more=""), "m.py") == []
    assert codes(LIGHTNING.format(method="training_step", kept="loss.detach()", more=""), "m.py") == []
    cleared = "\n    def on_train_epoch_end(self):\n        self.losses.clear()\n"
    assert codes(LIGHTNING.format(method="training_step", kept="loss", more=cleared), "m.py") == []
    # Lightning runs validation_step under no_grad: what it keeps has no graph
    assert codes(LIGHTNING.format(method="validation_step", kept="loss", more=""), "m.py") == []
    # a plain class whose method is only named so
    plain = LIGHTNING.format(method="training_step", kept="loss", more="").replace(
        "class Model(L.LightningModule):", "class Model:"
    )
    assert codes(plain, "m.py") == []


# -- round AA (Marigold's trainers, a recall miss): empty_cache() in the `if` that steps the optimizer -----
ACCUMULATE = """
import torch


def train(model, loader, optimizer, n):
    acc = 0
    for batch in loader:
        loss = model(batch).mean() / n
        loss.backward()
        acc += 1
        if {test}:
            {step}
            optimizer.zero_grad()
            acc = 0
            torch.cuda.empty_cache()
"""


def test_empty_cache_in_the_if_that_steps_the_optimizer_runs_every_optimizer_step() -> None:
    assert codes(ACCUMULATE.format(test="acc >= n", step="optimizer.step()"), "t.py") == ["TM003"]
    assert codes(ACCUMULATE.format(test="acc >= n", step="scaler.step(optimizer)"), "t.py") == ["TM003"]


def test_empty_cache_in_an_if_that_steps_no_optimizer_is_periodic_and_not_flagged() -> None:
    """`if i % 100 == 0: empty_cache()` beside a step made elsewhere: now and then, not every step."""
    src = ACCUMULATE.format(test="acc >= n", step="lr_scheduler.step()").replace(
        "        loss.backward()\n", "        loss.backward()\n        optimizer.step()\n"
    )
    assert codes(src, "t.py") == []
