"""The default output of ``torchmem lint``: which rule forms are warnings (shown) and which are info (shown by
``--all``), decided by their precision on held-out code (docs/lint.md, "Default output"), and what the
default output still catches of the written table of anti-pattern forms (``test_lint_forms.FORMS``)."""

from __future__ import annotations

import textwrap

import pytest
from test_lint_forms import FORMS, HEAD

from torchmem.lint import lint_source
from torchmem.lint._rules import DEFAULT_FORMS, RULES

#: The forms of the written table that only ``--all`` finds: their rules (or forms) are info, and no
#: warning fires on them. docs/lint.md lists the same rows.
DEFAULT_MISSED = {
    "validation losses stacked after the loop",
    ".cuda() in Dataset.__getitem__",
    "torch.load without map_location per rank",
    "zero_grad(set_to_none=False)",
}


def _findings(src: str, path: str = "train.py") -> list[tuple[str, str, str]]:
    return [(f.code, f.form, f.severity) for f in lint_source(HEAD + textwrap.dedent(src), path)]


def _warnings(src: str) -> list[str]:
    return [f.code for f in lint_source(HEAD + textwrap.dedent(src), "train.py") if f.severity == "warning"]


@pytest.mark.parametrize(
    ("form", "code", "wrong"), [(f, c, w) for f, c, w, _ in FORMS], ids=[f for f, *_ in FORMS]
)
def test_default_output_on_the_table_of_forms(form: str, code: str, wrong: str) -> None:
    """Every form is caught by a warning (its own rule's, or TM002's on the same eval-mode loop), except
    the forms listed in DEFAULT_MISSED, which only --all finds (and does: test_lint_forms)."""
    if form in DEFAULT_MISSED:
        assert _warnings(wrong) == [], form
        assert code in [c for c, _, _ in _findings(wrong)], form
    else:
        assert set(_warnings(wrong)) & {code, "TM002"}, form


def test_default_recall_figure() -> None:
    """The figure docs/lint.md gives: the default output catches 56 of the 60 forms (93.3 %)."""
    assert {f for f, *_ in FORMS} >= DEFAULT_MISSED
    assert (len(FORMS) - len(DEFAULT_MISSED), len(FORMS)) == (56, 60)


def test_tm002_eval_mode_is_shown_and_by_name_is_info() -> None:
    by_name = """
    def evaluate(model, loader):
        for x in loader:
            model(x)
    """
    assert _findings(by_name) == [("TM002", "by-name", "info")]
    # the same function putting the called model in eval() mode: the eval-mode form, whatever its name
    eval_mode = by_name.replace("    for x in loader:", "    model.eval()\n        for x in loader:")
    assert _findings(eval_mode) == [("TM002", "eval-mode", "warning")]
    helper = eval_mode.replace("model.eval()", "other.eval()")  # eval() on another module: by name only
    assert _findings(helper) == [("TM002", "by-name", "info")]


def test_tm002_needs_the_eval_before_the_loop() -> None:
    """NeMo's test_conformer_encoder.py runs the model in train() mode first, then eval(): only the loop
    after the eval() is an evaluation (the first is a training-mode forward)."""
    src = """
    def check_dropout(model, x):
        model.train()
        outputs = [None] * 5
        for i in range(5):
            outputs[i] = model(x)[0]
        model.eval()
        for i in range(5):
            outputs[i] = model(x)[0]
    """
    shown = [f for f in lint_source(HEAD + textwrap.dedent(src), "train.py") if f.severity == "warning"]
    # the loop after eval() keeps its outputs: one finding, TM010's (TM002's eval-mode form is the same loop)
    assert [(f.code, f.line, f.form) for f in shown] == [("TM010", 12, "eval-mode")]
    only_first = src.split("    model.eval()")[0]  # the training-mode loop alone: no finding
    assert _findings(only_first) == []
    eval_after = only_first.replace("model.train()", "pass") + "    model.eval()\n"  # eval() only after it
    assert "TM002" not in [c for c, _, _ in _findings(eval_after)]


def test_an_eval_loop_that_keeps_its_outputs_is_one_tm010_warning() -> None:
    """The eval-mode loop that keeps its outputs is one warning, TM010's (the growth; the fix, no_grad, is
    TM002's too: round T's aihwkit loops gave two findings each); without the eval() only the function's
    name says it evaluates: both rules' info forms, which the default output does not show."""
    src = """
    def predict(model, loader):
        model.eval()
        preds = []
        for x in loader:
            preds.append(model(x))
        return preds
    """
    assert _findings(src) == [("TM010", "eval-mode", "warning")]
    assert _findings(src.replace("model.eval()", "pass")) == [("TM010", "", "info")]


def test_tm001_forms_by_what_backward_ran_on() -> None:
    loop = """
    kept = []
    for x, y in loader:
        out = model(x)
        loss = F.cross_entropy(out, y)
        loss.backward()
        optimizer.step()
        kept.append({value})
    """
    assert _findings(loop.format(value="loss")) == [("TM001", "backward-ran", "warning")]
    assert _findings(loop.format(value="out")) == [("TM001", "output-kept", "warning")]
    assert _findings(loop.format(value="model(x)")) == [("TM001", "no-backward", "info")]
    assert _findings(loop.format(value="loss.item()")) == []


def test_every_rule_is_shown_by_default_or_only_on_request() -> None:
    """DEFAULT_FORMS names only real rules; rules absent from it give info findings."""
    assert {code for code, _ in DEFAULT_FORMS} <= set(RULES)
    tm006 = """
    import os
    rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(rank)
    state = torch.load("ckpt.pt")
    """
    assert _findings(tm006) == [("TM006", "", "info")]
    tm012 = """
    for x, y in loader:
        model.register_forward_hook(lambda m, i, o: None)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
    """
    assert _findings(tm012) == [("TM012", "", "warning")]


def test_tm002_a_model_prepared_from_an_eval_model_is_in_eval_mode() -> None:
    """TorchServe's IPEX handler calibrates `prepared = prepare(user_model.eval(), qconfig)` with autograd
    on: the wrapper returns the model it is given, in eval() mode. The same wrapper given a model that
    was never put in eval() mode is not an evaluation."""
    src = """
    def calibrate(user_model, loader, qconfig):
        prepared_model = prepare({model}, qconfig)
        for x in loader:
            prepared_model(x)
    """
    assert _findings(src.format(model="user_model.eval()")) == [("TM002", "eval-mode", "warning")]
    assert _findings(src.format(model="user_model")) == []
    assert _findings(src.format(model="user_model.train()")) == []


def test_tm002_a_helper_that_differentiates_the_loss_uses_the_graph() -> None:
    """DomainBed's Neumann series (set J): `hvp(loss, w, v)`, a nested function of the file, takes
    `autograd.grad` of the loss the eval()-mode loop computes: the graph is used. The same loop calling a
    helper that does not differentiate its argument is still an evaluation with autograd on."""
    src = """
    def neumann(v, model, batch):
        def hvp(y, w, v):
            return {body}
        model.eval()
        for i in range(10):
            loss = F.cross_entropy(model(batch[0]), batch[1])
            v = v - hvp(loss, model.weight, v)
    """
    grads = "torch.autograd.grad(y, w, create_graph=True)[0] @ v"
    assert _findings(src.format(body=grads)) == []
    assert _findings(src.format(body="y * v")) == [("TM002", "eval-mode", "warning")]
