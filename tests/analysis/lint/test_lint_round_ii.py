"""Round II's false default finding (docs/lint_corpus.md: 24 fresh repositories, 1.24 M lines), reduced to its
data flow, with the twins right next to it that must still be flagged by default."""

from __future__ import annotations

import textwrap

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
