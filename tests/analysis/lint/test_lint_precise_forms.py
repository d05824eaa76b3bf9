"""The rule forms that joined the default output in issue 30's last round (docs/lint.md, "Default output"):
each is decided by data flow (where a value comes from, what a loop does, what a class empties), so each
has a test where the warning must be said and one where the look-alike must stay info (or silent). The
look-alikes are the shapes met on the held-out sets (docs/lint_corpus.md): DeBERTa's micro-batch outputs,
ColossalAI's model-zoo test, deepchem's Jacobian, lightning-thunder's stored comparison errors,
neural-compressor's input capture, mmaction's metadata keys, DGL's per-regulariser loss log, torch_xla's
KV cache, botorch's recorded call arguments."""

from __future__ import annotations

import textwrap

from torchmem.lint import lint_source

HEAD = "import torch\nimport torch.nn.functional as F\nfrom collections import defaultdict\n"


def found(src: str, path: str = "train.py") -> list[tuple[str, str, str]]:
    """(code, form, severity) of every finding."""
    return [(f.code, f.form, f.severity) for f in lint_source(HEAD + textwrap.dedent(src), path)]


# -- TM001 output-kept: shown when what keeps the outputs outlives an optimizer step ---------------------
MICRO = """
def train(model, loader, optimizer, parts):
    {outer}
    for batch in loader:
        {inner}
        for sub in batch.split(parts):
            output = model(sub)
            loss = output.mean()
            loss.backward()
            outputs.append(output)
        optimizer.step()
        optimizer.zero_grad()
    return outputs
"""


def test_outputs_kept_across_optimizer_steps_are_a_warning() -> None:
    src = MICRO.format(outer="outputs = []", inner="pass")
    assert found(src) == [("TM001", "output-kept", "warning")]


def test_outputs_kept_for_the_micro_batches_of_one_step_are_info() -> None:
    """DeBERTa's trainer (set K): the list is made afresh for every optimizer step and holds the
    micro-batches' outputs until the step: bounded, by design."""
    src = MICRO.format(outer="pass", inner="outputs = []")
    assert found(src) == [("TM001", "output-in-step", "info")]


def test_a_loop_without_an_optimizer_step_keeps_outputs_within_no_step() -> None:
    src = """
    outs = []
    for x in loader:
        out = model(x)
        loss = out.sum()
        loss.backward()
        outs.append(out)
    """
    assert found(src) == [("TM001", "output-in-step", "info")]
    stepped = src.replace("outs.append(out)", "opt.step()\n        outs.append(out)")
    assert found(stepped) == [("TM001", "output-kept", "warning")]


ACCUM = """
def train(model, loss_fn, optimizer, data_iter, rounds, total):
    {outer}
    for step in range(total):
        optimizer.zero_grad(set_to_none=True)
        {inner}
        for _ in range(rounds):
            x, y = next(data_iter)
            loss = loss_fn(model(x), y)
            loss_accum += loss / rounds
            loss.backward()
        print(loss_accum.item())
        {step}
    return loss_accum
"""


def test_a_loss_total_reset_by_the_loop_that_steps_is_kept_for_one_step_only() -> None:
    """Round X (modulus's corrdiff trainer): ``loss_accum = 0`` in the loop that steps the optimizer, ``+=``
    over its micro-batches: one step's losses, released at the next step: info, saying so."""
    src = ACCUM.format(outer="pass", inner="loss_accum = 0", step="optimizer.step()")
    assert found(src) == [("TM001", "backward-in-step", "info")]
    # read as a copy (`torch.tensor([total])`, modulus) or printed: still one step's
    copied = src.replace(
        "print(loss_accum.item())", "loss_sum = torch.tensor([loss_accum])\n        print(loss_sum)"
    )
    assert found(copied) == [("TM001", "backward-in-step", "info")]
    (finding,) = lint_source(HEAD + textwrap.dedent(src), "train.py")
    assert "one optimizer step's micro-batches" in finding.message


def test_a_loss_total_kept_across_optimizer_steps_stays_a_warning() -> None:
    # made once before the loop: it outlives every step
    src = ACCUM.format(outer="loss_accum = 0", inner="pass", step="optimizer.step()")
    assert found(src) == [("TM001", "backward-ran", "warning")]
    # reset in a loop that never steps an optimizer (nothing says the total is released at a step)
    src = ACCUM.format(outer="pass", inner="loss_accum = 0", step="pass")
    assert found(src) == [("TM001", "backward-ran", "warning")]
    # reset once per epoch, kept over the epoch's stepped batches
    epoch = """
    def train(model, loader, optimizer, epochs):
        for epoch in range(epochs):
            total = 0
            for x, y in loader:
                loss = F.cross_entropy(model(x), y)
                loss.backward()
                optimizer.step()
                total += loss
        return total
    """
    assert found(epoch) == [("TM001", "backward-ran", "warning")]
    # made afresh each step but handed on to what may keep it (once-for-all, round W: the mean of one
    # step's subnet losses goes to a running meter)
    src = ACCUM.format(outer="pass", inner="loss_accum = 0", step="meter.update(mean_of(loss_accum))")
    src = src.replace("print(loss_accum.item())", "optimizer.step()")
    assert found(src) == [("TM001", "backward-ran", "warning")]


# -- TM003: shown for a loop that steps an optimizer and trains one model --------------------------------
def test_empty_cache_in_a_stepping_loop_is_a_warning() -> None:
    src = """
    for x, y in loader:
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        torch.cuda.empty_cache()
    """
    assert found(src) == [("TM003", "optimizer-step", "warning")]


def test_empty_cache_between_the_models_of_a_zoo_is_info() -> None:
    """ColossalAI's `test_with_torch_ddp.py` (set H): each iteration builds another model, of another
    size; the cache of one does not fit the next."""
    src = """
    for name, model_fn in model_zoo.items():
        model = model_fn().cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loss = model(data).sum()
        loss.backward()
        opt.step()
        torch.cuda.empty_cache()
    """
    assert found(src) == [("TM003", "", "info")]
    assert found(src.replace("        opt.step()\n", "")) == [("TM003", "", "info")]  # backward only
    built_once = """
    model = net_fn().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for data in loader:
        loss = model(data).sum()
        loss.backward()
        opt.step()
        torch.cuda.empty_cache()
    """
    assert found(built_once) == [("TM003", "optimizer-step", "warning")]


# -- TM004: the carried state must reach the retained backward -------------------------------------------
def test_a_jacobian_built_row_by_row_is_not_tm004() -> None:
    """deepchem's `compute_saliency` (set J): `output = output.reshape(-1)` rebinds the outer loop's own
    target, and every row's backward reuses one graph on purpose: nothing carries one iteration's graph
    into the next."""
    src = """
    outputs = model(x)
    rows = []
    for output in outputs:
        output = output.reshape([-1])
        for i in range(output.shape[0]):
            grad_output = torch.zeros(output.shape[0])
            grad_output[i] = 1
            output.backward(grad_output, retain_graph=True)
            opt.step()
            rows.append(x.grad.clone())
    """
    assert [c for c, _, _ in found(src)] == []


def test_state_carried_outside_the_backward_is_not_tm004() -> None:
    """A running state chained through the iterations (`count = sigmoid(count + ...)`) that the retained
    backward does not run through links nothing to the next backward; once the loss uses it, every
    iteration's graph stays alive."""
    src = """
    count = torch.zeros(1)
    for x, y in loader:
        count = torch.sigmoid(count + model(x).mean())
        loss = F.cross_entropy(model(x), y)
        loss.backward(retain_graph=True)
        optimizer.step()
    """
    assert found(src) == []
    used = src.replace("loss = F.cross_entropy(model(x), y)", "loss = F.cross_entropy(model(x), y) * count")
    assert found(used) == [("TM004", "", "warning")]


# -- TM010: shown when the loop runs a model in eval() mode or a model this scope trains -----------------
TRAIN_THEN_EVAL = """
def run(model, train_loader, val_loader, optimizer):
    for x, y in train_loader:
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
    {mode}
    preds = []
    for x, y in val_loader:
        preds.append({callee}(x))
    return preds
"""


def test_eval_outputs_kept_in_a_training_function_are_warnings() -> None:
    src = TRAIN_THEN_EVAL.format(mode="model.eval()", callee="model")
    assert found(src) == [("TM010", "eval-mode", "warning")]
    src = TRAIN_THEN_EVAL.format(mode="pass", callee="model")  # no eval(): the trained model, graph on
    assert found(src) == [("TM010", "trained-model", "warning")]


def test_outputs_of_a_model_the_scope_does_not_train_are_info() -> None:
    """A model no backward of the scope runs through (a teacher, a pretrained encoder) may have no
    parameter that requires grad: the file does not show it, so the finding is info."""
    src = TRAIN_THEN_EVAL.format(mode="pass", callee="encoder")
    assert found(src) == [("TM010", "", "info")]
    frozen = src.replace("    pass\n", "    model.requires_grad_(False)\n").replace("encoder(x)", "model(x)")
    assert [c for c, _, _ in found(frozen)] == []  # a model frozen in the file records no graph


def test_a_teacher_run_under_no_grad_in_training_is_not_trained() -> None:
    """Distillation: the teacher's outputs enter the loss, but bound under `no_grad` they carry no graph;
    a later loop keeping the teacher's outputs is not the trained-model form. The student, whose outputs
    the backward runs through, is."""
    src = """
    def distil(student, encoder, train_loader, val_loader, optimizer):
        for x, y in train_loader:
            with torch.no_grad():
                t = encoder(x)
            loss = F.mse_loss(student(x), t)
            loss.backward()
            optimizer.step()
        kept = []
        for x, y in val_loader:
            kept.append({callee}(x))
        return kept
    """
    assert found(src.format(callee="encoder")) == [("TM010", "", "info")]
    assert found(src.format(callee="student")) == [("TM010", "trained-model", "warning")]
    with_graph = src.format(callee="encoder").replace(
        "            with torch.no_grad():\n                t = encoder(x)", "            t = encoder(x)"
    )
    assert found(with_graph) == [("TM010", "trained-model", "warning")]  # its outputs feed the backward


def test_the_eval_mode_form_needs_the_eval_before_the_loop() -> None:
    src = TRAIN_THEN_EVAL.format(mode="model.train()", callee="model")
    assert found(src) == [("TM010", "trained-model", "warning")]
    eval_mode = TRAIN_THEN_EVAL.format(mode="other.eval()", callee="encoder")  # eval() of another model
    assert found(eval_mode) == [("TM010", "", "info")]


def test_eval_outputs_kept_under_no_grad_are_not_flagged() -> None:
    loop = "    for x, y in val_loader:\n        preds"
    under = "    with torch.no_grad():\n      for x, y in val_loader:\n        preds"
    src = TRAIN_THEN_EVAL.format(mode="model.eval()", callee="model").replace(loop, under)
    assert [c for c, _, _ in found(src)] == []


def test_the_eval_mode_form_reads_the_loops_around_a_loop_over_outputs() -> None:
    """`for name, value in model(batch).items():` runs the model in the loop around it: that loop's
    eval() mode decides the form. Inside a loop that trains, the values kept are TM001's."""
    src = """
    def evaluate(model, loader):
        {mode}
        results = defaultdict(list)
        for batch in loader:
            for name, value in model(batch).items():
                results[name].append(value)
        return results
    """
    assert found(src.format(mode="model.eval()")) == [("TM010", "eval-mode", "warning")]  # (one finding)
    assert found(src.format(mode="pass")) == [("TM010", "", "info")]
    trains = src.format(mode="model.train()").replace(
        "results[name].append(value)", "results[name].append(value)\n            value.backward()"
    )
    assert found(trains) == [("TM001", "backward-ran", "warning")]  # kept after its backward: not TM010


# -- TM011: shown when the failed frames are a model's forward or backward -------------------------------
KEPT_ERRORS = """
errors = []
for x, y in loader:
    out = model(x)
    try:
        {body}
    except Exception as e:
        errors.append(e)
    out.sum().backward()
    optimizer.step()
"""


def test_exceptions_of_a_forward_or_backward_are_warnings() -> None:
    assert found(KEPT_ERRORS.format(body="model(y)")) == [("TM011", "model-frames", "warning")]
    assert found(KEPT_ERRORS.format(body="out.mean().backward()")) == [("TM011", "model-frames", "warning")]


def test_exceptions_of_a_comparison_are_info() -> None:
    """lightning-thunder's DDP tests (set H) keep `assert_close` failures to report them to the spawning
    process: the failed frames are the comparison's, not a forward's."""
    assert found(KEPT_ERRORS.format(body="assert_close(out, y)")) == [("TM011", "", "info")]
    assert found(KEPT_ERRORS.format(body="Net(4)")) == [("TM011", "", "info")]  # a class: builds a model


# -- TM013: shown when forward computes the value and the store grows with every call --------------------
MODULE = """
class Probe(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)
        self.kept = []
        self.log = {{}}
    def forward(self, x, metas, start):
        h = self.proj(x)
        {store}
        return h
"""


def test_a_computed_value_appended_on_every_call_is_a_warning() -> None:
    assert found(MODULE.format(store="self.kept.append(h)")) == [("TM013", "grows", "warning")]
    assert found(MODULE.format(store="self.log[len(self.log)] = h")) == [("TM013", "grows", "warning")]


def test_an_input_kept_as_it_came_is_info() -> None:
    """neural-compressor's input capture (set F) keeps the calibration inputs (data, no graph); mmaction's
    head (set H) keeps a metadata key of its input."""
    assert found(MODULE.format(store="self.kept.append(x)")) == [("TM013", "", "info")]
    assert found(MODULE.format(store="self.kept.append(metas[0]['img_key'])")) == [("TM013", "", "info")]


def test_a_slot_written_again_is_info_and_a_slice_written_in_place_is_not_reported() -> None:
    """DGL's diffpool (set I) writes one slot per regulariser name: info. torch_xla's Llama (set I) and
    llm-awq's fused attention (round X, 5 info findings, all false) copy into a slice of a preallocated
    KV cache: nothing is added, nothing reported."""
    assert found(MODULE.format(store="self.log[type(self).__name__] = h")) == [("TM013", "", "info")]
    assert found(MODULE.format(store="self.cache[:, start] = h")) == []
    assert found(MODULE.format(store="self.cache[:, start : start + 4] = h")) == []
    assert found(MODULE.format(store="self.cache[:, start] += h")) == []


def test_a_value_rebound_only_under_an_if_may_be_the_input() -> None:
    """botorch's test model (the earlier corpus) transforms `x` only when training, then records it: on
    the other path the raw input is kept. A value computed on every path is still a warning (peft's
    xlora classifier: reshaped, then perhaps softmaxed)."""
    maybe = "if self.training:\n            x = self.proj(x)\n        self.kept.append(x)"
    assert found(MODULE.format(store=maybe)) == [("TM013", "", "info")]
    always = "\n        ".join(
        ["h = h.reshape(-1)", "if self.training:", "    h = h.softmax(-1)", "self.kept.append(h)"]
    )
    assert found(MODULE.format(store=always)) == [("TM013", "grows", "warning")]


def test_an_attribute_emptied_elsewhere_in_the_file_is_info() -> None:
    src = MODULE.format(store="self.kept.append(h)") + textwrap.dedent(
        """
        probe = Probe()
        for x in loader:
            probe(x, None, 0).sum().backward()
            probe.kept.clear()
        """
    )
    assert found(src) == [("TM013", "", "info")]


def test_a_plain_object_recording_copies_of_its_arguments_is_info() -> None:
    """lmdeploy's `_RecordingCacheBlockCopy` (set L, first look: false): a test double without a base
    class whose method is named `forward`, keeping `.clone()`s of the block offsets it is given. Both the
    missing module base and the copied (not computed) value make it info; a module computing the value is
    still a warning."""
    recorder = """
    class Recorder:
        def __init__(self):
            self.calls = []
        def forward(self, src, dst):
            self.calls.append((src.clone(), dst.clone()))
    """
    assert found(recorder) == [("TM013", "", "info")]
    as_module = recorder.replace("class Recorder:", "class Recorder(torch.nn.Module):")
    assert found(as_module) == [("TM013", "", "info")]  # copies of the inputs: still the inputs
    computed = as_module.replace("(src.clone(), dst.clone())", "(src * 2, dst.clone())")
    assert found(computed) == [("TM013", "grows", "warning")]
    plain_computed = computed.replace("class Recorder(torch.nn.Module):", "class Recorder:")
    assert found(plain_computed) == [("TM013", "", "info")]
    base = "class Base(torch.nn.Module):\n        pass\n    class Recorder(Base):"
    via_local_base = computed.replace("class Recorder(torch.nn.Module):", base)
    assert found(via_local_base) == [("TM013", "grows", "warning")]
