"""Round CC's false findings (docs/lint_corpus.md: 205 fresh repositories, 2.02 M lines), each reduced to its
data flow, with the twin that must still be flagged."""

from __future__ import annotations

import textwrap
from pathlib import Path

from lint_project import project

from torchmem.lint import lint_source


def codes(src: str, path: str = "extract.py") -> list[str]:
    return [f.code for f in lint_source(textwrap.dedent(src), path)]


# -- rl4co: a rollout buffer emptied by a method of its class at each outer step ----------------------------
BUFFER = """
import torch


class Memory:
    def __init__(self):
        self.logprobs = []
        self.rewards = []

    def clear_memory(self):
{body}


def train(policy, env, opt, td, n_step, total):
    memory = Memory()
    t = 0
    while t < total:
        memory.{call}()
        for i in range(n_step):
            out = policy(td, env)
            memory.logprobs.append(out["log_likelihood"].clone())
            memory.rewards.append(td["reward"].clone())
        t += n_step
        loss = -(torch.stack(memory.logprobs) * torch.stack(memory.rewards)).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


def test_a_buffer_a_method_of_its_class_empties_each_outer_step_keeps_nothing_across_steps() -> None:
    for body in (
        "        del self.logprobs[:]\n        del self.rewards[:]",
        "        self.logprobs.clear()\n        self.rewards.clear()",
        "        self.logprobs = []\n        self.rewards = list()",
    ):
        assert codes(BUFFER.format(body=body, call="clear_memory")) == [], body


def test_a_method_that_empties_something_else_or_is_not_called_leaves_the_buffer_flagged() -> None:
    """The twins: the method empties only `rewards`; a method of that name is never called (another one
    is); the buffer then keeps each step's log-likelihood with its graph."""
    assert "TM001" in codes(BUFFER.format(body="        del self.rewards[:]", call="clear_memory"))
    body = "        del self.logprobs[:]\n        del self.rewards[:]"
    assert "TM001" in codes(BUFFER.format(body=body, call="summary").replace("def clear_memory", "def reset"))


# -- anycost-gan: a meter imported from the project whose update detaches -------------------------------
TRAIN = """
from utils.meters import DistributedMeter


def train(loader, generator, discriminator, d_optim, d_loss_fn):
    meter = DistributedMeter("d_loss")
    for real, z in loader:
        d_loss = d_loss_fn(discriminator(real), discriminator(generator(z).detach()))
        meter.update(d_loss)
        discriminator.zero_grad()
        d_loss.backward()
        d_optim.step()
    return meter.avg
"""

METER = """
import torch


class DistributedMeter:
    def __init__(self, name):
        self.name = name
        self.sum = torch.tensor(0.0)
        self.n = 0

    def update(self, val):
{body}
        self.n += 1
"""


def test_an_imported_meter_whose_update_cuts_the_graph_is_not_flagged(tmp_path: Path) -> None:
    for i, body in enumerate(
        (
            "        self.sum += val.detach().cpu()",
            "        self.sum += float(val)",
            "        val = val.detach()\n        self.sum += val",
        )
    ):
        files = {"train.py": TRAIN, "utils/__init__.py": "", "utils/meters.py": METER.format(body=body)}
        assert project(tmp_path / str(i), files) == [], body


def test_an_imported_meter_that_adds_the_loss_itself_is_flagged(tmp_path: Path) -> None:
    """The twins: `update` adds the tensor itself (`.cpu()` keeps the graph), or appends it."""
    for i, body in enumerate(("        self.sum = self.sum + val.cpu()", "        self.items = [val]")):
        files = {"train.py": TRAIN, "utils/__init__.py": "", "utils/meters.py": METER.format(body=body)}
        assert "TM007" in project(tmp_path / str(i), files), body


# -- smoothquant: a calibration function whose only caller, in another file, runs under no_grad -----------
CALIBRATE = """
import torch


def get_act_scales(model, tokenizer, texts):
    model.eval()
    scales = {}
    for text in texts:
        ids = tokenizer(text, return_tensors="pt").input_ids
        out = model(ids)
        scales[text] = out.logits.abs().max().item()
    return scales
"""

ENTRY = """
import torch

from smoothquant.calibration import get_act_scales


{decorator}
def main(model, tokenizer, texts):
    torch.save(get_act_scales(model, tokenizer, texts), "scales.pt")
"""


def test_a_function_called_under_no_grad_from_another_file_of_the_project_is_not_flagged(
    tmp_path: Path,
) -> None:
    files = {
        "smoothquant/__init__.py": "",
        "smoothquant/calibration.py": CALIBRATE,
        "examples/generate.py": ENTRY.format(decorator="@torch.no_grad()"),
    }
    assert project(tmp_path, files) == []


def test_a_function_its_other_files_call_with_autograd_on_is_flagged(tmp_path: Path) -> None:
    """The twins: the entry point has no no_grad; a file that imports another function of the same name
    from elsewhere decides nothing."""
    files = {
        "smoothquant/__init__.py": "",
        "smoothquant/calibration.py": CALIBRATE,
        "examples/generate.py": ENTRY.format(decorator=""),
    }
    assert "TM002" in project(tmp_path / "a", files)
    files["examples/generate.py"] = ENTRY.format(decorator="@torch.no_grad()").replace(
        "smoothquant.calibration", "other.calibration"
    )
    files["other/__init__.py"] = ""
    files["other/calibration.py"] = "def get_act_scales(model, tokenizer, texts):\n    return {}\n"
    assert "TM002" in project(tmp_path / "b", files)


# -- PickScore (pytorch-fid): a model class whose constructor freezes its parameters by default -------------
FID = """
import numpy as np
import torch.nn as nn


class InceptionV3(nn.Module):
    def __init__(self, blocks=(3,), resize_input=True, requires_grad=False):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU())
        for param in self.parameters():
            param.requires_grad = requires_grad

    def forward(self, x):
        return [self.net(x)]


def get_activations(images, model):
    model.eval()
    out = []
    for batch in images:
        pred = model(batch)[0]
        out.append(pred.cpu().data.numpy())
    return np.concatenate(out)


def calculate(images):
    model = {made}
    model.cuda()
    return get_activations(images, model)
"""


LOOP = "for param in self.parameters():\n            param.requires_grad = requires_grad"


def test_a_model_whose_constructor_freezes_its_parameters_records_no_graph() -> None:
    assert codes(FID.format(made="InceptionV3([3])")) == []
    frozen_here = FID.replace(LOOP, "self.requires_grad_(False)")
    assert codes(frozen_here.format(made="InceptionV3([3])")) == []


def test_a_frozen_model_passed_down_through_callers_parameters_records_no_graph() -> None:
    """pytorch-fid: `calculate_fid` makes the model, `statistics(images, model)` passes it on to
    `get_activations`; the twin passes a model built with requires_grad on."""
    chain = FID.replace(
        "    return get_activations(images, model)",
        "    return statistics(images, model)\n\n\ndef statistics(images, model):\n"
        "    return get_activations(images, model)",
    )
    assert codes(chain.format(made="InceptionV3([3])")) == []
    assert "TM002" in codes(chain.format(made="InceptionV3([3], requires_grad=True)"))


def test_a_model_built_with_its_parameters_requiring_grad_is_flagged() -> None:
    """The twins: the call turns requires_grad on (by keyword, by position); a class that freezes nothing."""
    assert "TM002" in codes(FID.format(made="InceptionV3([3], requires_grad=True)"))
    assert "TM002" in codes(FID.format(made="InceptionV3([3], True, True)"))
    plain = FID.replace(
        "for param in self.parameters():\n            param.requires_grad = requires_grad", "pass"
    )
    assert "TM002" in codes(plain.format(made="InceptionV3([3])"))


# -- MiniCPM-o (recall): `empty_cache()` in an HF Trainer subclass's `training_step` ------------------------
STEP = """
import torch
from {module} import {base}


class Tuned({base}):
    def training_step(self, model, inputs, num_items_in_batch=None):
        loss = self.compute_loss(model, inputs)
{cache}
        self.accelerator.backward(loss)
        return loss.detach()

    def validation_step(self, batch, batch_idx):
        torch.cuda.empty_cache()
        return self.model(batch).mean()
"""


def test_empty_cache_in_a_frameworks_training_step_is_flagged_as_every_step() -> None:
    for module, base in (("transformers", "Trainer"), ("lightning", "LightningModule")):
        src = STEP.format(module=module, base=base, cache="        torch.cuda.empty_cache()")
        found = [f for f in lint_source(textwrap.dedent(src), "trainer.py") if f.code == "TM003"]
        assert len(found) == 1 and "`training_step`, which the training framework calls" in found[0].message
        assert found[0].line == 9 and found[0].severity == "warning", found


def test_empty_cache_every_n_steps_on_recovery_or_in_a_class_of_no_framework_is_not() -> None:
    """The twins: under `if` (every 50 steps), in an `except` (out-of-memory recovery), in a class with no
    base (nothing calls it per step that the file shows), in `validation_step` (no optimizer step)."""
    guarded = "        if self.state.global_step % 50 == 0:\n            torch.cuda.empty_cache()"
    handler = (
        "        try:\n            pass\n        except RuntimeError:\n            torch.cuda.empty_cache()"
    )
    for cache in (guarded, handler):
        assert "TM003" not in codes(STEP.format(module="transformers", base="Trainer", cache=cache)), cache
    plain = STEP.format(module="transformers", base="Trainer", cache="        torch.cuda.empty_cache()")
    assert "TM003" not in codes(plain.replace("class Tuned(Trainer):", "class Tuned:"))
