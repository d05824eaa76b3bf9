"""Round II's false default finding (docs/lint_corpus.md: 24 fresh repositories, 1.24 M lines), reduced to its
data flow, with the twins right next to it that must still be flagged by default."""

from __future__ import annotations

import textwrap
from pathlib import Path

from lint_project import project

from torchmem.lint import lint_source


def found(src: str, path: str = "predict.py") -> list[tuple[str, str, str]]:
    return [(f.code, f.form, f.severity) for f in lint_source(textwrap.dedent(src), path)]


# -- granite-tsfm: a row of one batch's output clamped and written back into the same tensor ----------------
CLAMP = """
import torch


class ForecastWrapper:
    def __init__(self, model):
        self.model = model

    def predict(self, batches):
        self.model.eval()
        preds = []
        for batch in batches:
            pred = self.model(batch).transpose(-1, -2)
            positive = torch.all(batch >= 0, dim=0)
            for ix, make_pos in enumerate(positive):
                if make_pos:
                    pred[ix] = {value}
            preds.extend(p.detach().numpy() for p in pred)
        return preds
"""


def test_an_entry_rewritten_by_torchs_function_of_itself_is_not_kept() -> None:
    for value in (
        "torch.clamp(pred[ix], min=0.0)",
        "torch.clamp(pred[ix].float(), min=0.0)",
        "F.relu(pred[ix])",
    ):
        got = found(CLAMP.replace("{value}", value))
        assert not [f for f in got if f[0] == "TM010"], (value, got)
        # what stays: the loop runs the eval()-mode model with autograd on
        assert ("TM002", "eval-mode", "warning") in got, (value, got)


def test_an_entry_that_brings_in_another_output_or_the_programs_function_stays_a_finding() -> None:
    for value in (
        "torch.clamp(pred[ix] + self.model(batch)[0], min=0.0)",  # another forward's output
        "torch.maximum(pred[ix], self.model(batch)[ix])",
        "torch.clamp(pred[0], min=0.0)",  # the same entry on every pass: chained, not replaced
    ):
        got = found(CLAMP.replace("{value}", value))
        assert ("TM010", "eval-mode", "warning") in got, (value, got)


# -- ipex-llm (round HH): an evaluation method whose only caller, in another file, runs under no_grad --------
PPL = """
import torch


class PPL:
    def __init__(self, model):
        self.model = model

    def perplexity(self, encoded):
        self.model.eval()
        ppls = []
        for bid in range(len(encoded)):
            logits = self.model(encoded[bid : bid + 1]).logits
            ppls += torch.exp2(logits.mean(1)).tolist()
        return sum(ppls) / len(ppls)
"""

RUN = """
import torch

from bench.ppl import PPL


{decorator}
def main(model, encoded):
    return PPL(model).perplexity(encoded)
"""


def test_a_method_called_under_no_grad_from_another_file_of_the_project_is_not_flagged(
    tmp_path: Path,
) -> None:
    files = {"bench/__init__.py": "", "bench/ppl.py": PPL, "run.py": RUN.format(decorator="@torch.no_grad()")}
    assert project(tmp_path, files) == []


def test_a_method_its_other_files_call_with_autograd_on_is_flagged(tmp_path: Path) -> None:
    files = {"bench/__init__.py": "", "bench/ppl.py": PPL, "run.py": RUN.format(decorator="")}
    assert "TM002" in project(tmp_path / "a", files)
    # a file that imports another class of the same name from elsewhere decides nothing
    files["run.py"] = RUN.format(decorator="@torch.no_grad()").replace("bench.ppl", "other.ppl")
    files["other/__init__.py"] = ""
    files["other/ppl.py"] = "class PPL:\n    def perplexity(self, encoded):\n        return 0.0\n"
    assert "TM002" in project(tmp_path / "b", files)
