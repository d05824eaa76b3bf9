"""The false positives of the held-out corpus of issue 30 (set A of docs/lint_corpus.md: NeMo, ParlAI,
torchrec, TTS, OpenNMT-py, yolov5, SlowFast, audiolm-pytorch, demucs), each reduced to its data flow, with
the twin that must still be flagged: the change that silences the look-alike must not silence the
anti-pattern next to it."""

from __future__ import annotations

import textwrap
from pathlib import Path

from torchmem.lint import lint_paths, lint_source

HEAD = "import torch\nimport torch.nn.functional as F\n"


def codes(src: str, path: str = "train.py") -> list[str]:
    return [f.code for f in lint_source(HEAD + textwrap.dedent(src), path)]


# -- a project's own no_grad wrapper (yolov5 `@smart_inference_mode()`, 4 false TM002/TM010) ------------
EVAL = """
{decorator}
def run(model, loader, criterion):
    model.eval()
    loss = 0
    for x, y in loader:
        y_hat = model(x)
        loss += criterion(y_hat, y)
    return loss
"""


def test_a_wrapper_named_after_inference_mode_turns_autograd_off() -> None:
    assert codes(EVAL.format(decorator="@smart_inference_mode()")) == []
    assert codes(EVAL.format(decorator="@torch_no_grad")) == []


def test_a_class_named_after_the_switch_turns_autograd_off_whatever_its_arguments() -> None:
    """physicsnemo's ``@StaticCaptureEvaluateNoGrad(model=model, logger=log, ...)`` on the function an
    evaluation loop calls (round X: an info TM010, false)."""
    src = """
    def evaluate(model, dataloader, log):
        @{decorator}(model=model, logger=log, use_amp=False)
        def forward_eval(invars):
            return model(invars)

        model.eval()
        result = []
        for batch in dataloader:
            result.append(forward_eval(batch))
        return torch.cat(result)
    """
    assert codes(src.format(decorator="StaticCaptureEvaluateNoGrad")) == []
    assert codes(src.format(decorator="StaticCaptureTraining")) == ["TM010"]


def test_a_wrapper_with_an_argument_may_turn_it_off_and_is_not_flagged() -> None:
    assert codes(EVAL.format(decorator="@maybe_no_grad(args.frozen)")) == []


def test_an_unrelated_decorator_leaves_the_eval_loop_flagged() -> None:
    assert codes(EVAL.format(decorator="@smart_cache()")) == ["TM010"]
    assert codes(EVAL.format(decorator="")) == ["TM010"]


def test_a_with_block_of_such_a_wrapper_counts_too() -> None:
    src = """
    def score(model, loader):
        model.eval()
        with smart_inference_mode():
            for x in loader:
                out = model(x)
    """
    assert codes(src) == []
    assert codes(src.replace("smart_inference_mode()", "smart_timer()")) == ["TM002"]


# -- kept outputs backwarded through a second container (torchrec's sharding tests, 4 false TM010) --------
KEPT = """
def check(unsharded_model, sharded_model, inputs, names):
    preds = []
    for rank in range(world_size):
        preds.append(unsharded_model(inputs[rank]))
    grads = []
    for rank in range(world_size):
        per_rank = preds[rank].to_dict()
        grads.extend([per_rank[n] for n in names])
    {tail}
"""


def test_outputs_that_reach_a_backward_through_another_container_are_not_kept_for_nothing() -> None:
    assert codes(KEPT.format(tail="torch.stack(grads).sum().backward()"), "tests/test_sharding.py") == []


def test_outputs_kept_while_another_value_is_backwarded_are_still_flagged() -> None:
    src = KEPT.format(tail="sharded_model(inputs[0]).sum().backward()")
    assert codes(src, "tests/test_sharding.py") == ["TM010"]


def test_a_loss_container_backwarded_after_the_loop_reaches_through_subscripts() -> None:
    src = """
    def check(unsharded_model, inputs, names):
        out = []
        for rank in range(world_size):
            out.append(unsharded_model(inputs[rank]))
        losses = []
        for rank in range(world_size):
            for n in names:
                losses.append(out[rank][n].values().view(-1))
        torch.cat(losses).sum().backward()
    """
    assert codes(src, "tests/test_sharding.py") == []
    assert codes(src.replace("torch.cat(losses)", "torch.cat(other)"), "tests/test_sharding.py") == ["TM010"]


# -- model.eval() in the other arm of an `if` (torchrec's zch benchmark, a false TM002) -------------------
BENCH = """
def main(model, batches, cuda):
    if cuda:
        for b in batches:
            out = model(b)
    else:
        model.eval()
        for b in batches:
            out = model(b)
"""


def test_eval_in_the_other_arm_does_not_make_this_loop_an_evaluation() -> None:
    found = lint_source(HEAD + textwrap.dedent(BENCH), "bench.py")
    assert [(f.code, f.line) for f in found] == [("TM002", 10)]  # the loop after eval(), not the first


def test_eval_before_the_if_applies_to_both_arms() -> None:
    src = """
    def main(model, batches, cuda):
        model.eval()
        if cuda:
            for b in batches:
                out = model(b.cuda())
        else:
            for b in batches:
                out = model(b)
    """
    found = lint_source(HEAD + textwrap.dedent(src), "bench.py")
    assert [(f.code, f.line) for f in found] == [("TM002", 7)]  # the first loop


def test_a_loop_with_eval_only_in_the_other_arm_is_silent() -> None:
    src = """
    def main(model, batches, cuda):
        if cuda:
            for b in batches:
                out = model(b)
        else:
            model.eval()
    """
    assert codes(src, "bench.py") == []


# -- state replaced at the start of each iteration (audiolm-pytorch's trainer, a false TM004) -------------
DISCR = """
def train(model, dl_iter, optim, steps):
    for i in range(steps):
        {fresh}
        wave = wave.to(device)
        losses = model(wave, return_discr_losses_separately=True)
        for name, loss in losses:
            loss.backward(retain_graph=True)
        optim.step()
"""


def test_a_name_rebound_from_fresh_data_each_iteration_carries_no_graph() -> None:
    assert codes(DISCR.format(fresh="wave, = next(dl_iter)")) == []
    assert codes(DISCR.format(fresh="wave = next(dl_iter)")) == []


def test_a_name_that_is_only_transformed_in_place_still_carries_the_graph() -> None:
    src = """
    def train(model, loader, optim, hidden):
        for x in loader:
            out, hidden = model(x, hidden)
            hidden = hidden.to(device)
            out.sum().backward(retain_graph=True)
            optim.step()
    """
    assert codes(src) == ["TM004"]


# -- zero_grad(set_to_none=False) on a rare path of a hook (NeMo's NaN guard, a false TM008) -------------
def test_zeroing_nan_gradients_in_a_hook_is_not_the_steps_zero_grad() -> None:
    src = """
    class Model(torch.nn.Module):
        def on_after_backward(self):
            valid = all(torch.isfinite(p.grad).all() for p in self.parameters() if p.grad is not None)
            if not valid:
                self.zero_grad(set_to_none=False)
    """
    assert codes(src) == []


def test_the_steps_own_zero_grad_is_still_flagged_under_an_if() -> None:
    src = """
    for i, (x, y) in enumerate(loader):
        F.cross_entropy(model(x), y).backward()
        if i % 4 == 3:
            optimizer.step()
            optimizer.zero_grad(set_to_none=False)
    """
    assert codes(src) == ["TM008"]


def test_an_override_of_the_zeroing_hook_is_still_flagged() -> None:
    src = """
    class Model(torch.nn.Module):
        def optimizer_zero_grad(self, epoch, batch_idx, optimizer):
            optimizer.zero_grad(set_to_none=False)
    """
    assert codes(src) == ["TM008"]


# -- a fixed handful of parse attempts (NeMo's k2 graph loader, a debatable TM011) ------------------------
PARSE = """
def load_graph(text):
    errors = []
    for parse in {attempts}:
        try:
            return parse(text)
        except (TypeError, ValueError) as e:
            errors.append(e)
    raise Exception(errors)
"""


def test_errors_of_a_fixed_list_of_attempts_are_not_a_growing_store() -> None:
    assert codes(PARSE.format(attempts="(from_openfst, from_str, from_json)")) == []
    assert codes(PARSE.format(attempts="[from_openfst, from_str]")) == []


def test_errors_of_a_loop_that_runs_no_model_hold_no_tensors() -> None:
    assert codes(PARSE.format(attempts="parsers")) == []  # fairseq2's union-member attempts, set C


def test_errors_kept_across_a_loop_that_runs_the_model_are_still_flagged() -> None:
    src = """
    def score_all(model, batches):
        errors = []
        for batch in batches:
            try:
                out = model(batch)
            except RuntimeError as e:
                errors.append(e)
        return errors
    """
    assert codes(src) == ["TM011"]


# == set B of docs/lint_corpus.md (measured after the fixes above, then its own false positives) ==========
# -- a loss of predictions made under no_grad (optimum's GPTQ perplexity, a false TM010) ------------------
PERPLEXITY = """
def evaluate_perplexity(model, data, n_samples, seqlen):
    model.eval()
    nlls = []
    for i in range(n_samples):
        batch = data[:, i * seqlen:(i + 1) * seqlen]
        {grad}
            logits = model(batch).logits
        shift_logits = logits[:, :-1, :].contiguous().float()
        loss = loss_fct(shift_logits.view(-1, shift_logits.size(-1)), batch[:, 1:].reshape(-1))
        nlls.append(loss.float() * seqlen)
    return torch.exp(torch.stack(nlls).sum()).item()
"""


def test_a_loss_of_logits_made_under_no_grad_carries_no_graph() -> None:
    assert codes(PERPLEXITY.format(grad="with torch.no_grad():")) == []


def test_a_loss_of_logits_made_with_autograd_on_is_still_kept() -> None:
    assert codes(PERPLEXITY.format(grad="if True:")) == ["TM010"]


def test_a_slice_of_a_list_filled_with_outputs_is_not_taken_for_a_number() -> None:
    src = """
    losses = []
    for x, y in loader:
        outs = []
        outs.append(model(x))
        loss = criterion(outs[-1], y)
        loss.backward()
        optimizer.step()
        losses.append(loss)
    """
    assert codes(src) == ["TM001"]


# -- a bounded ring of recent values (pytorch3d's NeRF visuals cache, a false TM001) ----------------------
RING = """
def train(model, loader, optimizer, history_size):
    cache = {made}
    for batch in loader:
        out, metrics = model(batch)
        loss = metrics["mse"]
        loss.backward()
        optimizer.step()
        cache.append({{"rgb": out["rgb"], "bundle": out["bundle"]}})
"""


def test_a_deque_with_maxlen_is_a_ring_not_a_growing_store() -> None:
    assert codes(RING.format(made="collections.deque(maxlen=history_size)")) == []
    assert codes(RING.format(made="deque([], history_size)")) == []


def test_a_deque_without_maxlen_or_a_list_still_grows() -> None:
    assert codes(RING.format(made="collections.deque()")) == ["TM001"]
    assert codes(RING.format(made="deque(maxlen=None)")) == ["TM001"]
    assert codes(RING.format(made="[]")) == ["TM001"]


def test_a_ring_made_in_init_bounds_the_attribute() -> None:
    src = """
    class Trainer:
        def __init__(self, n):
            self.recent = {made}
        def fit(self, loader):
            for x, y in loader:
                loss = F.cross_entropy(self.model(x), y)
                loss.backward()
                self.optimizer.step()
                self.recent.append(loss)
    """
    assert codes(src.format(made="deque(maxlen=n)")) == []
    assert codes(src.format(made="[]")) == ["TM001"]


# -- a file of tests named `*_tests.py` (xformers' type-stub tests, a false TM002) ------------------------
STUB = """
def test_module_list():
    modules = nn.ModuleList([nn.AdaptiveAvgPool2d(0), nn.AdaptiveAvgPool2d(1)])
    for module in modules:
        y = module(x)
"""


def test_test_functions_in_a_file_of_tests_are_not_evaluations() -> None:
    assert codes(STUB, "stubs/torch_stub_tests.py") == []
    assert codes(STUB, "tests.py") == []


def test_the_same_function_in_a_script_is_still_an_evaluation() -> None:
    assert codes(STUB, "stubs/torch_stubs.py") == ["TM002"]
    assert codes(STUB, "test.py") == ["TM002"]  # a script named test.py evaluates


# -- gradients the program allocates itself (apex's NCCL-pool DDP example, a debatable TM008) -------------
POOL = """
{alloc}
for _ in range(10):
    optimizer.zero_grad(set_to_none=False)
    loss_fn(ddp_model(torch.randn(20, 10)), labels).backward()
    optimizer.step()
"""


def test_gradient_buffers_allocated_by_the_program_are_kept_on_purpose() -> None:
    alloc = "for param in ddp_model.parameters():\n    param.grad = torch.empty_like(param)"
    assert codes(POOL.format(alloc=alloc)) == []


def test_setting_grads_to_none_does_not_count_as_allocating_them() -> None:
    alloc = "for param in ddp_model.parameters():\n    param.grad = None"
    assert codes(POOL.format(alloc=alloc)) == ["TM008"]


# == set C of docs/lint_corpus.md (measured once after the fixes of A and B) ==============================
# -- a helper's parameter is not the forward's (torchao's OutputLogger storing `_detach(x)`, a false TM013)
LOGGER = """
def _detach(x):
    detached = None
    if isinstance(x, torch.Tensor):
        detached = x.detach()
    else:
        detached = x
    return detached


class OutputLogger(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.stats = []

    def forward(self, x):
        self.stats.append({kept})
        return x
"""


def test_a_helper_that_detaches_is_read_with_its_own_parameters() -> None:
    assert codes(LOGGER.format(kept="_detach(x)")) == []


def test_the_forward_keeping_its_input_itself_is_still_flagged() -> None:
    assert codes(LOGGER.format(kept="x * 2")) == ["TM013"]


# -- a recorder that hands out what it keeps (torchao's RecordingObserver, a debatable TM013) -------------
RECORDER = """
class RecordingObserver(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.tensor_val = []

    def forward(self, x):
        self.tensor_val.append(x.clone())
        return x
{getter}
"""


def test_a_module_that_returns_its_record_from_a_method_keeps_it_on_purpose() -> None:
    getter = "\n    def get_tensor_value(self):\n        return self.tensor_val\n"
    assert codes(RECORDER.format(getter=getter)) == []


def test_a_module_that_only_accumulates_is_still_flagged() -> None:
    assert codes(RECORDER.format(getter="")) == ["TM013"]


# -- one value per listed case (torchao's FSDP parity helper, 2 false TM001; xtuner's shape sweep, TM003) --
PARITY = """
def check_parity(ref_model, ref_optim, fsdp_model, fsdp_optim, inp):
    for it in range(10):
        losses = []
        for model, optim in {pairs}:
            optim.zero_grad()
            losses.append(model(inp).sum())
            losses[-1].backward()
            optim.step()
        assert losses[0] == losses[1]
"""


def test_values_kept_per_listed_case_are_not_kept_per_step() -> None:
    assert codes(PARITY.format(pairs="((ref_model, ref_optim), (fsdp_model, fsdp_optim))")) == []


def test_values_kept_per_item_of_a_runtime_list_are_still_flagged() -> None:
    assert codes(PARITY.format(pairs="pairs")) == ["TM001"]


SWEEP = """
def test_gemm():
    for dim0, dim1 in {shapes}:
        torch.cuda.empty_cache()
        x = torch.randn(64, dim0, requires_grad=True)
        out = gemm(x, dim1)
        out.mean().backward()
"""


def test_empty_cache_between_listed_shapes_is_not_per_step() -> None:
    assert codes(SWEEP.format(shapes="((768, 2048), (2048, 768))"), "test_gemm.py") == []


def test_empty_cache_on_every_step_of_a_data_loop_is_still_flagged() -> None:
    assert codes(SWEEP.format(shapes="loader"), "test_gemm.py") == ["TM003"]


# == set D of docs/lint_corpus.md (measured once after the fixes of A, B and C) ===========================
RANKED = """
import os
local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
rank = torch.distributed.get_rank()
"""


# -- one process loads (trlx, TransformerEngine and fairscale tests, 4 false TM006) -----------------------
def test_a_load_only_rank_zero_runs_is_not_per_rank() -> None:
    assert codes(RANKED + "if rank == 0:\n    ref = torch.load('ref.pt')\n") == []
    assert codes(RANKED + "if os.environ.get('RANK', '0') == '0':\n    ref = torch.load('ref.pt')\n") == []
    assert codes(RANKED + "if accelerator.is_main_process:\n    ref = torch.load('ref.pt')\n") == []
    # CodeXGLUE's scripts (rounds W and X: 10 info TM006): -1 is the one process, 0 the first of many
    assert codes(RANKED + "if args.local_rank in [-1, 0]:\n    ref = torch.load('r.pt')\n") == []
    src = (
        RANKED
        + "def check(fsdp, paths):\n    if fsdp.rank > 0:\n        return\n"
        + "    return [torch.load(p) for p in paths]\n"
    )
    assert codes(src) == []


def test_a_load_every_rank_runs_is_still_flagged() -> None:
    assert codes(RANKED + "ref = torch.load('ref.pt')\n") == ["TM006"]
    assert codes(RANKED + "if args.local_rank in [-1, 1]:\n    ref = torch.load('r.pt')\n") == ["TM006"]
    assert codes(RANKED + "if args.local_rank not in [-1, 0]:\n    ref = torch.load('r.pt')\n") == ["TM006"]
    assert codes(RANKED + "if local_rank == -1:\n    raise RuntimeError\nref = torch.load('ref.pt')\n") == [
        "TM006"
    ]
    src = (
        RANKED
        + "def check(fsdp, paths):\n    if fsdp.rank > 0:\n        log('not main')\n"
        + "    return [torch.load(p) for p in paths]\n"
    )
    assert codes(src) == ["TM006"]


# -- a file this process saved a moment before, reached through a name (TransformerEngine, 2 false TM006) --
def test_a_load_of_what_was_just_saved_through_a_name_is_this_process_s() -> None:
    src = RANKED + (
        "def roundtrip(model):\n"
        "    with tempfile.NamedTemporaryFile(delete=False) as f:\n"
        "        torch.save(model.state_dict(), f.name)\n"
        "        path = f.name\n"
        "    return torch.load(path)\n"
    )
    assert codes(src) == []
    assert codes(src.replace("torch.save(model.state_dict(), f.name)", "write(f)")) == ["TM006"]


# -- values copied into a preallocated tensor under no_grad (open-instruct's reward model, a false TM001) --
METRICS = """
losses = torch.zeros((accum,), device=device)
kept = []
for i, batch in enumerate(loader):
    loss = F.cross_entropy(model(batch), batch.y)
    loss.backward()
    optimizer.step()
    with torch.no_grad():
        {store}
"""


def test_a_value_copied_into_a_torch_tensor_under_no_grad_is_not_kept() -> None:
    assert codes(METRICS.format(store="losses[i % accum] = loss")) == []


def test_a_value_stored_in_a_list_under_no_grad_is_still_kept() -> None:
    assert codes(METRICS.format(store="kept.append(loss)")) == ["TM001"]


# -- a collate_fn given only to loaders without workers (ReAgent's petastorm loaders, 2 false TM005) ------
COLLATE = """
def collate_fn(batch):
    return torch.stack(batch).cuda()
loader = DataLoader(reader, batch_size=8, collate_fn=collate_fn{workers})
"""


def test_a_collate_fn_that_runs_in_the_main_process_may_use_cuda() -> None:
    assert codes(COLLATE.format(workers="")) == []
    assert codes(COLLATE.format(workers=", num_workers=0")) == []


def test_a_collate_fn_given_to_workers_is_still_flagged() -> None:
    assert codes(COLLATE.format(workers=", num_workers=4")) == ["TM005"]


# -- `.numpy()` of the output proves no graph (seamless_communication's sinusoidal encoder, a false TM002) --
ENCODER = """
def test_positions_with_cache(seq):
    pos_encoder = SinusoidalPositionEncoder(1024, 55)
    pos_encoder.eval()
    for t in range(20):
        y_exp = pos_encoder(seq[:, t : t + 1, :], None){tail}
        check(y_exp)
"""


def test_a_forward_whose_output_is_numpy_ed_as_it_is_records_no_graph() -> None:
    assert codes(ENCODER.format(tail=".numpy()"), "check_unity.py") == []
    assert codes(ENCODER.format(tail=".cpu().numpy()"), "check_unity.py") == []


def test_a_forward_detached_before_numpy_may_still_record_one() -> None:
    assert codes(ENCODER.format(tail=".detach().numpy()"), "check_unity.py") == ["TM002"]
    assert codes(ENCODER.format(tail=""), "check_unity.py") == ["TM002"]


# == after set E: a model frozen in the file (the kind of E's EDM finding, frozen there in another file) ==
FROZEN = """
def sample(net, loader):
    {freeze}
    outs = []
    for x in loader:
        outs.append(net(x))
    return outs
"""


def test_a_model_frozen_in_the_function_records_no_graph_from_data() -> None:
    assert codes(FROZEN.format(freeze="net.eval().requires_grad_(False)")) == []
    loop = "for p in net.parameters():\n        p.requires_grad = False"
    assert codes(FROZEN.format(freeze=loop)) == []
    assert codes(FROZEN.format(freeze="net = build().requires_grad_(requires_grad=False)")) == []


def test_a_model_not_frozen_or_unfrozen_is_still_flagged() -> None:
    assert codes(FROZEN.format(freeze="net.eval()")) == ["TM010"]
    assert codes(FROZEN.format(freeze="net.eval().requires_grad_()")) == ["TM010"]
    assert codes(FROZEN.format(freeze="net.eval(); other.requires_grad_(False)")) == ["TM010"]


def test_a_frozen_model_on_a_graph_carrying_input_still_carries_the_graph() -> None:
    src = """
    discriminator.requires_grad_(False)
    kept = []
    for z in noise:
        fake = generator(z)
        loss = discriminator(fake).mean()
        loss.backward()
        opt_g.step()
        kept.append(loss)
    """
    assert codes(src) == ["TM001"]


# == set F of docs/lint_corpus.md (measured once with the final rules of set E, then these fixes) =========
# -- no_grad through a name (neural-compressor's DLRM example, a false TM010) -----------------------------
SCORED = """
def evaluate(model, loader):
    model.eval()
    ctx1 = {ctx}
    preds = []
    with ctx1:
        for x in loader:
            preds.append(torch.sigmoid(model(x)))
    return preds
"""


def test_a_no_grad_context_bound_to_a_name_turns_autograd_off() -> None:
    assert codes(SCORED.format(ctx="torch.no_grad()")) == []


def test_a_context_bound_to_a_name_that_is_not_no_grad_leaves_it_on() -> None:
    assert codes(SCORED.format(ctx="torch.autocast('cpu')")) == ["TM010"]


# -- a model of another runtime (nncf's and Olive's OpenVINO examples, 9 false TM002) ---------------------
OPENVINO = """
import openvino as ov
def validate(path, val_loader{annotation}):
    {made}
    correct = 0
    for images, target in val_loader:
        pred = compiled_model(images)
        correct += int(pred.argmax() == target)
    return correct
"""


def test_a_model_compiled_by_openvino_has_no_autograd() -> None:
    assert codes(OPENVINO.format(annotation="", made="compiled_model = ov.compile_model(path)")) == []
    ann = ", compiled_model: ov.CompiledModel = None"
    assert codes(OPENVINO.format(annotation=ann, made="pass")) == []


def test_a_torch_model_in_the_same_file_is_still_flagged() -> None:
    src = OPENVINO.format(annotation="", made="compiled_model = torch.compile(build())")
    assert codes(src) == ["TM002"]
    src = OPENVINO.format(annotation=", compiled_model: torch.nn.Module = None", made="pass")
    assert codes(src) == ["TM002"]


# -- a converter named like a model (Olive's `ir_model_to_olive_model`, opencompass' `model_abbr_from_cfg`)
def test_a_conversion_named_after_a_model_is_not_a_forward() -> None:
    src = """
    def evaluate(configs):
        out = []
        for cfg in configs:
            out.append({{"model": {call}(cfg)}})
        return out
    """
    assert codes(src.format(call="model_abbr_from_cfg")) == []
    assert codes(src.format(call="ir_model_to_olive_model")) == []
    assert codes(src.format(call="student_model")) == ["TM010"]


# == set G of docs/lint_corpus.md (the held-out set of the final rules; fixed after it was measured) ======
# -- a loop that puts the model in training mode itself (mmpretrain's backbone tests, 3 false TM002) -------
BACKBONES = """
def test_backbone():
    model = Net()
    model.eval()
    out = model(torch.randn(1, 3))
    for name in archs:
        model = Net(name)
        {mode}
        feat = model(torch.randn(1, 3))
        assert feat.shape[0] == 1
"""


def test_a_loop_that_calls_model_train_is_a_training_mode_forward() -> None:
    assert codes(BACKBONES.format(mode="model.train()"), "check_backbones.py") == []


def test_a_loop_that_calls_model_eval_is_still_an_evaluation() -> None:
    assert codes(BACKBONES.format(mode="model.eval()"), "check_backbones.py") == ["TM002"]
    assert codes(BACKBONES.format(mode="model.train(False)"), "check_backbones.py") == ["TM002"]


# -- a method of the file's own class named like a container's (mmagic's ImagePool.add, 2 false TM013) ----
POOL_LOSS = """
class ImagePool:
    def __init__(self, size):
        self.images = deque(maxlen=size)

    def add(self, images):
        for image in images.data:
            self.images.append(image)


class DiscLoss(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fake_pool = {pool}

    def forward(self, net, fake):
        pred_fake = net.forward(fake.detach())
        self.fake_pool.add(pred_fake)
        return pred_fake.mean()
"""


def test_an_add_method_of_the_file_s_own_class_decides_what_it_keeps() -> None:
    assert codes(POOL_LOSS.format(pool="ImagePool(50)")) == []


def test_a_set_s_add_in_forward_is_still_a_store() -> None:
    assert codes(POOL_LOSS.format(pool="set()")) == ["TM013"]


def test_an_eval_after_the_loop_s_train_makes_the_next_forward_an_evaluation() -> None:
    """MONAI's test_segresnet_ds: train(), a forward, then eval() and a forward in the same iteration."""
    src = """
    def test_shapes():
        for cls in nets:
            net = cls()
            net.train()
            out = net(torch.randn(1, 3))
            net.eval()
            out = net(torch.randn(1, 3))
    """
    assert codes(src, "check_shapes.py") == ["TM002"]


# == round M of docs/lint_corpus.md (measured once, then its false positive) ===============================
# EasyOCR's trainer: `loss_avg = Averager()` (a class of the project's utils, imported), `loss_avg.add(cost)`
# after `cost.backward()`; its `add` keeps `v.data.sum()`, detached. TM001 took it for a set's add.
AVERAGER = """
{imports}

def train(model, loader, opt, criterion):
    loss_avg = {made}
    for x, y in loader:
        cost = criterion(model(x), y)
        model.zero_grad()
        cost.backward()
        opt.step()
        loss_avg.add(cost)
    return loss_avg
"""


def test_an_add_of_a_class_from_another_file_is_not_taken_for_a_set_s() -> None:
    assert codes(AVERAGER.format(imports="from utils import Averager", made="Averager()")) == []
    assert codes(AVERAGER.format(imports="import utils", made="utils.Averager()")) == []


def test_a_set_s_add_after_backward_is_still_flagged() -> None:
    assert codes(AVERAGER.format(imports="", made="set()")) == ["TM001"]
    assert codes(AVERAGER.format(imports="from weakref import WeakSet", made="WeakSet()")) == ["TM001"]


# qlib's `pytorch_add.py` (a miss of round M, not in its precision figure): `self.ADD_model.eval()` then the
# test set's forwards with autograd on. `ADD` is the network's name (an acronym), not the verb "add".
QLIB_EVAL = """
class Model:
    def test_epoch(self, loader):
        self.{name}.eval()
        losses = []
        for x, y in loader:
            pred = self.{name}(x)
            loss = F.mse_loss(pred, y)
            losses.append(loss.item())
        return losses
"""


def test_an_acronym_before_model_is_the_model_s_name_not_a_verb() -> None:
    assert codes(QLIB_EVAL.format(name="ADD_model"), "pytorch_add.py") == ["TM002"]
    assert codes(QLIB_EVAL.format(name="GAT_model"), "pytorch_gats.py") == ["TM002"]


def test_a_verb_before_model_still_names_a_function_that_uses_one() -> None:
    # (the name alone: an object the scope puts in eval() is a module whatever its name, round V below)
    other = QLIB_EVAL.replace("self.{name}.eval()", "self.net.eval()")
    assert codes(other.format(name="add_model"), "pytorch_add.py") == []
    assert codes(other.format(name="get_model"), "pytorch_add.py") == []


# muzic's MusicBERT evaluation (a miss of round V): `roberta.eval()`, then `roberta(source)` in a loop with
# autograd on. The name is no model's word, but the scope put the object in eval mode: a module.
EVAL_RECEIVER = """
import torch


def evaluate({name}, loader):
    {name}.eval()
    y_pred = []
    for x in loader:
        output = torch.sigmoid({call})
        y_pred.append(output.detach().cpu())
    return y_pred
"""


def test_an_object_put_in_eval_mode_and_called_in_a_loop_is_a_model_whatever_its_name() -> None:
    for name in ("roberta", "bert", "vae", "clf", "detector"):
        assert codes(EVAL_RECEIVER.format(name=name, call=f"{name}(x)")) == ["TM002"], name


def test_a_method_of_the_object_put_in_eval_mode_is_not_taken_for_its_forward() -> None:
    # must-not twins: `roberta.predict(...)` may turn autograd off inside (a hub's predict, a
    # `@torch.no_grad()` method elsewhere); another object called in the loop is not the one in eval mode
    assert codes(EVAL_RECEIVER.format(name="roberta", call="roberta.predict('head', x)")) == []
    assert codes(EVAL_RECEIVER.format(name="env", call="scorer(x)")) == []
    off = "    {name}.eval()\n    torch.set_grad_enabled(False)"
    under_no_grad = EVAL_RECEIVER.replace("    {name}.eval()", off)
    assert codes(under_no_grad.format(name="roberta", call="roberta(x)")) == []


# == round N of docs/lint_corpus.md (measured once, then its TM004 false positives) =======================
# StyleTTS2's train_second.py: `for epoch ...: for i, batch in enumerate(loader): batch = [...]` and a
# needless `retain_graph=True`: the inner loop rebinds `batch` at every iteration, so the epoch loop carries
# nothing into the next epoch's graph (flagged twice before, this file and its fine-tuning copy).
EPOCHS = """
def train(model, loader, opt, epochs, h0):
    {outer}
        {state}
        for i, batch in enumerate(loader):
            batch = [b.cuda() for b in batch[1:]]
            x, y = batch
            {step}
            opt.zero_grad()
            loss.backward(retain_graph=True)
            opt.step()
"""


def test_an_inner_loop_s_own_target_is_not_carried_by_the_epoch_loop() -> None:
    src = EPOCHS.format(outer="for epoch in range(epochs):", state="pass", step="loss = model(x).sum()")
    assert codes(src) == []


def test_state_carried_across_the_inner_loop_is_still_flagged() -> None:
    # the hidden state goes from one batch's graph into the next: every iteration's graph stays alive
    src = EPOCHS.format(
        outer="for epoch in range(epochs):",
        state="h = h0",
        step="out, h = model(x, h)\n            loss = out.sum()",
    )
    assert codes(src) == ["TM004"]


def test_a_per_sample_loop_that_trims_its_own_target_carries_nothing() -> None:
    """StyleTTS2's `for _s2s_pred, ... in zip(d, ...): _s2s_pred = _s2s_pred[:n]` inside the batch loop: the
    per-sample loop binds the name afresh at each iteration, so no loop around it carries the graph."""
    src = """
    def train(model, loader, opt, lengths):
        for epoch in range(3):
            for x in loader:
                d = model(x)
                loss_ce = 0
                for pred, n in zip(d, lengths):
                    pred = pred[:n]
                    loss_ce += pred.sum()
                opt.zero_grad()
                loss_ce.backward(retain_graph=True)
                opt.step()
    """
    assert codes(src) == []


# == round O of docs/lint_corpus.md (measured once, then its debatable TM002) ==============================
# DIG's threedgraph `val()`: `from torch.autograd import grad`, then `grad(outputs=out, inputs=batch.pos,
# create_graph=True)` on the evaluated model's output: the loop differentiates what it computes (forces from
# an energy), so `no_grad` would break it. The module form `torch.autograd.grad` was known; the bare name not.
FORCES = """
{imports}

def val(model, loader):
    model.eval()
    preds = []
    for batch in loader:
        out = model(batch)
        force = -grad(outputs=out, inputs=batch.pos, grad_outputs=torch.ones_like(out), create_graph=True)[0]
        preds.append(force.detach_())
    return preds
"""


def test_a_bare_grad_imported_from_torch_autograd_is_a_gradient_call() -> None:
    for imports in ("from torch.autograd import grad", "from torch.autograd import grad as grad"):
        assert codes(FORCES.format(imports=imports)) == [], imports


def test_a_grad_of_the_file_s_own_is_not_torch_s() -> None:
    # the same loop where `grad` is a helper of the file (a finite difference, no autograd): still flagged
    own = "def grad(outputs, inputs, grad_outputs, create_graph):\n    return [outputs * 0]"
    assert codes(FORCES.format(imports=own)) == ["TM002"]


# hi-ml's DeepMIL: `get_features` puts the frozen encoder in eval() and runs it chunk by chunk; `forward`
# calls it, and Lightning's training_step calls `forward`: a step of the forward pass, not an evaluation
# (flagged as TM002 and TM010 before). The same loop in a method no forward runs is still an evaluation.
MIL = """
class MIL(torch.nn.Module):
    def __init__(self, encoder, tune=False):
        super().__init__()
        self.encoder, self.tune = encoder, tune
        self.head = torch.nn.Linear(512, 1)

    def {name}(self, instances):
        if not self.tune:
            self.encoder.eval()
        feats = []
        for chunk in torch.split(instances, 64):
            feats.append(self.encoder(chunk))
        return torch.cat(feats)

    def forward(self, instances):
        return self.head({body}.mean(0))
"""


def shown(src: str) -> list[str]:
    """The codes of the default output (TM010's forms without a precise form are shown by `--all` only)."""
    return [f.code for f in lint_source(HEAD + textwrap.dedent(src), "model.py") if f.severity == "warning"]


def test_a_loop_a_module_s_forward_runs_is_not_an_evaluation() -> None:
    assert shown(MIL.format(name="get_features", body="self.get_features(instances)")) == []
    # through another method of the class
    src = MIL.format(name="get_features", body="self._features(instances)") + (
        "\n    def _features(self, x):\n        return self.get_features(x)\n"
    )
    assert shown(src) == []


def test_the_same_loop_outside_the_forward_pass_is_still_flagged() -> None:
    src = MIL.format(name="embed_all", body="self.encoder(instances)")
    assert shown(src) == ["TM010"]


# == round P of docs/lint_corpus.md (measured once, then its false positives) ===============================
# FedML's MXNet trainer: `from mxnet import autograd`, `total_loss += loss.mean()` after `loss.backward()`
# inside `autograd.record()`: MXNet's arrays, no torch graph (TM001 before).
MXNET = """
import mxnet as mx
from mxnet import autograd, gluon
{torch}

def train(model, train_data, epochs):
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    trainer = gluon.Trainer(model.collect_params(), "sgd", {{"learning_rate": 0.1}})
    for epoch in range(epochs):
        total_loss = 0.0
        for x, labels in train_data:
            with autograd.record():
                output = model(x)
                loss = loss_fn(output, labels)
                loss.backward()
                total_loss += loss.mean()
            trainer.step(x.shape[0])
        print(epoch, total_loss / len(train_data))
"""


def _bare(src: str) -> list[str]:
    return [f.code for f in lint_source(textwrap.dedent(src), "trainer.py")]


def test_a_file_of_another_framework_keeps_no_torch_graph() -> None:
    assert _bare(MXNET.format(torch="")) == []


def test_the_same_loop_in_a_torch_file_is_still_flagged() -> None:
    assert _bare(MXNET.format(torch="import torch")) == ["TM001"]


# AutoTinyBERT's pre-training: `student_model = DDP(student_model)` once in the epoch loop, a
# `retain_graph=True` per sample: the "carried" name is the model, a module whose parameters are leaves.
DISTIL = """
from torch.nn.parallel import DistributedDataParallel as DDP

def train(student_model, optimizer, loader, epochs, wrap, h0):
    {state}
    for epoch in range(epochs):
        if epoch == 0 and wrap:
            student_model = DDP(student_model)
        student_model.train()
        for input_ids, labels in loader:
            for sample in range(2):
                {step}
                loss.backward(retain_graph=True)
            optimizer.step()
            optimizer.zero_grad()
"""


def test_a_model_rebound_by_its_wrapper_carries_no_graph() -> None:
    step = "loss = F.cross_entropy(student_model(input_ids), labels)"
    assert codes(DISTIL.format(state="pass", step=step)) == []


def test_a_hidden_state_carried_beside_the_rebound_model_is_still_flagged() -> None:
    step = "out, h = student_model(input_ids, h)\n                loss = F.cross_entropy(out, labels)"
    assert codes(DISTIL.format(state="h = h0", step=step)) == ["TM004"]


# == round Q of docs/lint_corpus.md (measured once, then its false positives) ===============================
# deepmd-kit's energy models: `coord.requires_grad_(True)` handed to a model in eval() mode, whose forward
# takes the forces as -dE/dcoord with torch.autograd.grad: autograd must be on (no_grad breaks it).
FORCE_FIELD = """
def compare(md, frames, atype, box):
    md.eval()
    energies = []
    for c in frames:
        {coord}
        out = md.forward(coord, atype, box=box)
        energies.append(float(out["energy"]))
    return energies
"""


def test_an_input_made_to_require_grad_wants_autograd_in_the_eval_loop() -> None:
    assert shown(FORCE_FIELD.format(coord="coord = torch.tensor(c).requires_grad_(True)")) == []
    assert shown(FORCE_FIELD.format(coord="coord = torch.tensor(c, requires_grad=True)")) == []
    two = "coord = torch.tensor(c)\n        coord.requires_grad_()"
    assert shown(FORCE_FIELD.format(coord=two)) == []
    attr = "coord = torch.tensor(c)\n        coord.requires_grad = True"
    assert shown(FORCE_FIELD.format(coord=attr)) == []


def test_an_input_left_without_grad_or_frozen_is_still_flagged() -> None:
    assert shown(FORCE_FIELD.format(coord="coord = torch.tensor(c)")) == ["TM002"]
    assert shown(FORCE_FIELD.format(coord="coord = torch.tensor(c).requires_grad_(False)")) == ["TM002"]
    # a grad input the loop does not hand to the model: its gradients are not this forward's
    other = "coord = torch.tensor(c)\n        w = torch.zeros(3, requires_grad=True)"
    assert shown(FORCE_FIELD.format(coord=other)) == ["TM002"]


# super-gradients' and fairseq's model tests: a `test_*` function of a test file runs models in eval()
# mode and compares outputs (the TM002 page: test functions of test files are not flagged).
TEST_FN = """
def {name}(model, batches):
    model.eval()
    for x in batches:
        out = model(x)
        assert out.shape[0] == x.shape[0]
"""


def test_a_test_function_of_a_test_file_is_not_an_evaluation() -> None:
    def in_file(name: str, path: str) -> list[str]:
        src = HEAD + textwrap.dedent(TEST_FN.format(name=name))
        return [f.code for f in lint_source(src, path) if f.severity == "warning"]

    assert in_file("test_heads", "tests/test_heads.py") == []
    assert in_file("test_heads", "tests/heads_test.py") == []
    # the must-say twins: the same loop in a helper of the test file, or in a `test_*` function elsewhere
    assert in_file("run_heads", "tests/test_heads.py") == ["TM002"]
    assert in_file("test_heads", "bench/heads.py") == ["TM002"]


# == round R of docs/lint_corpus.md =======================================================================
# ReMoS's robustness evaluation: an eval loop that also runs an advertorch attack (its `perturb` backwards a
# loss to the input). The forwards do record graphs (debatable, kept), but `no_grad` around the loop would
# make the attack raise: the finding says so and its fix is `no_grad` around the model's calls.
ATTACK_LOOP = """
{imports}

def advtest(model, loader, adversary):
    model.eval()
    correct = 0
    for x, y in loader:
        out = model(x)
        {attack}
        correct += int(out.argmax(1).eq(y).sum().item())
    return correct
"""


def _tm002(imports: str, attack: str) -> list[tuple[str, str, str]]:
    src = "import torch\n" + textwrap.dedent(ATTACK_LOOP.format(imports=imports, attack=attack))
    found = lint_source(src, "eval_robustness.py")
    return [(f.code, f.message, f.fix) for f in found if f.severity == "warning"]


def test_an_attack_in_the_eval_loop_asks_for_no_grad_around_the_model_calls_only() -> None:
    for imports, attack in (
        ("from advertorch.attacks import LinfPGDAttack", "adv = adversary.perturb(x, y)"),
        ("from art.attacks.evasion import FastGradientMethod", "adv = adversary.generate(x=x)"),
        ("import torchattacks", "adv = torchattacks.PGD(model, eps=0.03)(x, y)"),
        ("import torchattacks\natk = None", "atk = torchattacks.PGD(model)\n        adv = atk(x, y)"),
    ):
        found = _tm002(imports, attack)
        assert [c for c, _m, _f in found] == ["TM002"], (imports, attack)
        _code, message, fix = found[0]
        assert "adversarial attack" in message, attack
        assert "inside the loop, not the whole loop" in fix and "`model`" in fix, fix


def test_the_same_loop_without_an_attack_library_keeps_the_plain_fix() -> None:
    # must-not twins: the same shape with an `adversary` parameter but no attack run (ReMoS's advtest_fast,
    # true), and a `.generate(...)` in a file that imports no attack library (a language model's generate)
    for imports, attack in (
        ("from advertorch.attacks import LinfPGDAttack", "adv = x.clone()"),
        ("", "adv = adversary.perturb(x, y)"),
        ("import transformers", "adv = lm.generate(x)"),
    ):
        found = _tm002(imports, attack)
        assert [c for c, _m, _f in found] == ["TM002"], (imports, attack)
        _code, message, fix = found[0]
        assert "adversarial attack" not in message and "wrap the loop" in fix, (imports, attack, fix)


# == round S of docs/lint_corpus.md =======================================================================
# labml_nn: `tracker.add({...: loss})` of `from labml import tracker` (a package's logging API, cleared by
# `tracker.save()` each iteration) was read as a set's add (TM001, 3 false).
TRACKER = """
{imports}

def train(model, loader, opt):
    {local}
    for x, y in loader:
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        tracker.add({{"loss.train": loss}})
"""


def test_an_imported_module_s_add_is_its_api_not_a_container() -> None:
    assert shown(TRACKER.format(imports="from labml import tracker", local="")) == []
    assert shown(TRACKER.format(imports="import labml.tracker as tracker", local="")) == []


# the same in a training step the loop calls (labml_nn's cycle GAN: `self.optimize_generators(...)` logs its
# losses with `tracker.add`)
STEP_TRACKER = """
{imports}
{module_level}

class Trainer:
    def run(self, loader):
        for x, y in loader:
            self.step(x, y)

    def step(self, x, y):
        loss = F.cross_entropy(self.model(x), y)
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        tracker.add({{"loss": loss}})
"""


def test_an_imported_module_s_add_in_the_step_the_loop_calls_is_its_api() -> None:
    assert shown(STEP_TRACKER.format(imports="from labml import tracker", module_level="")) == []
    # must-say twin: a module-level set of the file, filled by the same step
    assert shown(STEP_TRACKER.format(imports="", module_level="tracker = set()")) == ["TM001"]


def test_a_set_of_the_function_with_the_same_name_is_still_flagged() -> None:
    # must-say twins: the name rebound here to a set (the import shadowed), and a module-level set
    assert shown(TRACKER.format(imports="from labml import tracker", local="tracker = set()")) == ["TM001"]
    assert shown("tracker = set()\n" + TRACKER.format(imports="", local="")) == ["TM001"]


# second.pytorch's metric modules: `forward` adds counts into [1]-shaped buffers in place, `clear()` zeroes
# them in place (`self.count.zero_()`): the class manages its store (TM013, 3 false).
METRIC = """
class Accuracy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("total", torch.zeros(1))
        self.register_buffer("count", torch.zeros(1))

    def forward(self, labels, preds, weights):
        self.count += torch.clamp(torch.sum(weights.float()), min=1.0)
        self.total += torch.sum((preds.argmax(1) == labels).float())
        return (self.total / self.count).cpu()
{reset}
"""


def test_a_module_that_zeroes_its_counters_in_place_manages_them() -> None:
    for reset in (
        "self.total.zero_()\n        self.count.zero_()",
        "self.total.fill_(0)\n        self.count.fill_(0)",
    ):
        assert shown(METRIC.format(reset=f"\n    def clear(self):\n        {reset}\n")) == [], reset


def test_the_same_module_without_a_reset_is_still_flagged() -> None:
    assert shown(METRIC.format(reset="")) == ["TM013"]
    # a reset of another attribute does not count for these
    assert shown(METRIC.format(reset="\n    def clear(self):\n        self.other.zero_()\n")) == ["TM013"]


# DeepRobust's defenses: the evaluation loop runs the attack one call away, in a method of the same class
# (`self.adv_data(...)` builds DeepRobust's own PGD and calls its `generate`): round R's attack fix applies.
DEFENSE = """
from deeprobust.image.attack.pgd import PGD


class PGDtraining:
    def test(self, model, loader):
        model.eval()
        correct = 0
        for data, target in loader:
            output = model(data)
            correct += output.argmax(1).eq(target).sum().item()
            _, out_adv = self.{method}(data, target)
        return correct

    def adv_data(self, data, target):
        adversary = PGD(self.model)
        data_adv = adversary.generate(data, target.flatten(), epsilon=0.3, num_steps=10)
        return data_adv, self.model(data_adv)

    def plain(self, data, target):
        return data, self.model(data)
"""


def test_an_attack_one_call_away_in_the_same_class_is_seen() -> None:
    def found(method: str) -> list[tuple[str, str]]:
        src = "import torch\n" + textwrap.dedent(DEFENSE.format(method=method))
        return [(f.code, f.fix) for f in lint_source(src, "defense.py") if f.severity == "warning"]

    ((code, fix),) = found("adv_data")
    assert code == "TM002" and "not the whole loop" in fix
    ((code, fix),) = found("plain")  # must-not: a method of the class that runs no attack
    assert code == "TM002" and "wrap the loop" in fix


# DeepRobust's mettack: `hidden = features` at the top of each iteration, then updated by a loop over the
# layers; the backward with retain_graph=True is in the loop around: the state of the inner loop is not
# carried into the outer loop's next iteration (TM004, false).
LAYERS = """
def inner_train(features, adj_norm, weights, labels, opt, adj_changes, iters):
    grad_sum = torch.zeros_like(adj_changes)
    {before}
    for _ in range(iters):
        {top}
        for w in weights:
            hidden = F.relu(adj_norm @ hidden @ w)
        loss = F.nll_loss(F.log_softmax(hidden, 1), labels)
        opt.zero_grad()
        loss.backward(retain_graph=True)
        grad_sum += torch.autograd.grad(loss, adj_changes, retain_graph=True)[0]
        opt.step()
    return grad_sum
"""


def test_state_an_inner_loop_updates_from_a_fresh_start_is_not_carried_by_the_outer_loop() -> None:
    assert "TM004" not in codes(LAYERS.format(before="", top="hidden = features"))


def test_state_the_outer_loop_carries_into_its_next_iteration_is_still_flagged() -> None:
    # must-say twin: `hidden` starts once, before the outer loop: each iteration's graph feeds the next
    assert "TM004" in codes(LAYERS.format(before="hidden = features", top="pass"))


# DeepRobust's deepfool: `r_tot` (NumPy) carried across iterations, the next graph started from a fresh leaf
# (`.detach().requires_grad_(True)`); several backwards per iteration through one output keep retain_graph
# (TM004, 2 false).
DEEPFOOL = """
import numpy as np


def deepfool(model, image, k_classes, max_iter):
    x = image.clone().requires_grad_(True)
    r_tot = np.zeros(image.shape)
    fs = model(x)
    for _ in range(max_iter):
        for k in range(k_classes):
            fs[0, k].backward(retain_graph=True)
        {update}
        {next_x}
        fs = model(x)
    return r_tot
"""
NUMPY_STEP = "r_i = x.grad * 0.01\n        r_tot = np.float32(r_tot + r_i)"
FRESH_LEAF = "x = (image + torch.from_numpy(r_tot)).detach().requires_grad_(True)"


def test_a_numpy_value_carried_between_iterations_carries_no_graph() -> None:
    assert "TM004" not in codes(DEEPFOOL.format(update=NUMPY_STEP, next_x=FRESH_LEAF))


def test_a_tensor_carried_between_iterations_is_still_flagged() -> None:
    # must-say twins: the state made by a torch function and fed to the next forward as it is; and a NumPy
    # call inside the update (a constant) does not make the value a NumPy array
    assert "TM004" in codes(DEEPFOOL.format(update="r_tot = torch.tanh(r_tot)", next_x="x = image + r_tot"))
    scaled = "r_tot = r_tot * np.float32(0.9)"
    assert "TM004" in codes(DEEPFOOL.format(update=scaled, next_x="x = image + r_tot"))


# -- round T -------------------------------------------------------------------------------------------------
# pyod's MO-GAAL: the name stored was a tensor earlier in the iteration (backwarded), but the statement just
# before the store rebinds it to a NumPy value of `.item()` floats (TM001, 1 false).
REBOUND = """
import numpy as np


def fit(gens, opts, disc, criterion, loader, history):
    for batch in loader:
        losses = {{}}
        for i, (g, opt) in enumerate(zip(gens, opts)):
            opt.zero_grad()
            g_loss = criterion(disc(g(batch)), torch.ones(len(batch), 1))
            g_loss.backward()
            opt.step()
            losses[i] = g_loss.item()
        {rebind}
        history["g_loss"].append(g_loss)
"""


def test_a_name_rebound_by_a_numpy_call_before_it_is_kept_carries_no_graph() -> None:
    assert "TM001" not in codes(REBOUND.format(rebind="g_loss = np.mean([losses[i] for i in losses])"))
    assert "TM001" not in codes(REBOUND.format(rebind="g_loss = numpy.float32(g_loss.item())"))


def test_a_name_still_the_backwarded_tensor_or_rebound_by_torch_is_still_flagged() -> None:
    # must-say twins: kept as it was backwarded; rebound by a torch expression; a NumPy factor in a torch
    # expression does not make it an array
    assert "TM001" in codes(REBOUND.format(rebind="pass"))
    assert "TM001" in codes(REBOUND.format(rebind="g_loss = torch.stack([g_loss, g_loss]).mean()"))
    assert "TM001" in codes(REBOUND.format(rebind="g_loss = g_loss * np.float32(0.5)"))


# aihwkit's examples: one loop both calls the eval-mode model with autograd on (TM002) and keeps its outputs
# (TM010): one finding with its fix, not two; over a module-level list of listed cases (six drift times),
# what it keeps cannot grow with a run (TM010, TM002: 5 debatable).
ONE_LOOP = """
model = build()
model.eval()
outs = []
for x in {over}:
    y = model(x)
    outs.append(y)
"""


def test_a_loop_that_keeps_eval_outputs_is_reported_once_as_tm010() -> None:
    got = codes(ONE_LOOP.format(over="loader"))
    assert got.count("TM010") == 1 and "TM002" not in got, got


def test_an_eval_loop_that_keeps_nothing_is_still_tm002() -> None:
    got = codes(ONE_LOOP.format(over="loader").replace("    outs.append(y)\n", "    print(y.sum().item())\n"))
    assert got == ["TM002"], got


LISTED = """
TIMES = {times}
{later}

model = build()
model.eval()
outs = []
for t in {over}:
    y = model(torch.full((1, 8), t))
    outs.append(y)
"""


def test_a_loop_over_a_module_constant_list_of_cases_keeps_one_output_per_case() -> None:
    # what it keeps cannot grow with a run (no TM010); each forward still records its graph in eval()
    # mode (TM002's claim, per forward, whatever the number of cases)
    assert codes(LISTED.format(times="[1.0, 60.0, 60 * 60, 24 * 3600]", later="", over="TIMES")) == ["TM002"]
    as_dict = LISTED.format(times='{"1 s": 1, "1 min": 60}', later="", over="TIMES.values()")
    assert codes(as_dict) == ["TM002"]


def test_a_loop_over_a_name_that_is_not_a_fixed_list_of_cases_is_still_flagged() -> None:
    # must-say twins: the list grows elsewhere in the file; it is rebound; it holds something else than
    # constants (a loader's batches); a name from a call
    appended = LISTED.format(times="[1.0, 60.0]", later="TIMES.append(3600.0)", over="TIMES")
    assert "TM010" in codes(appended)
    rebound = LISTED.format(times="[1.0, 60.0]", later="TIMES = load_times()", over="TIMES")
    assert "TM010" in codes(rebound)
    batches = LISTED.format(times="[b for b in loader]", later="", over="TIMES")
    assert "TM010" in codes(batches)
    assert "TM010" in codes(LISTED.format(times="get_times()", later="", over="TIMES"))


# -- round U -------------------------------------------------------------------------------------------------
# PyCIL's PODNet: `flat_losses += flat_loss.item() if task else flat_loss`: the arm that keeps the name as it
# is runs only while it is the float 0.0 (the idiom of a value that is a tensor or already a number: TM001,
# 1 false).
TENSOR_OR_NUMBER = """
def train(model, opt, loader, old_model):
    total = 0.0
    for x, y in loader:
        loss = F.cross_entropy(model(x), y)
        extra = 0.0
        if old_model is not None:
            extra = F.mse_loss(model(x), old_model(x))
        (loss + extra).backward()
        opt.step()
        total += {kept}
    return total
"""


def test_a_value_made_a_number_where_it_is_a_tensor_is_not_kept_with_its_graph() -> None:
    assert "TM001" not in codes(
        TENSOR_OR_NUMBER.format(kept="extra.item() if old_model is not None else extra")
    )
    assert "TM001" not in codes(
        TENSOR_OR_NUMBER.format(kept="extra if isinstance(extra, float) else float(extra)")
    )


def test_a_conditional_that_keeps_a_tensor_in_either_arm_is_still_flagged() -> None:
    # must-say twins: the plain tensor kept; an arm that converts another name than the one kept as it is;
    # both arms tensors
    assert "TM001" in codes(TENSOR_OR_NUMBER.format(kept="extra"))
    assert "TM001" in codes(TENSOR_OR_NUMBER.format(kept="loss.item() if old_model is None else extra"))
    assert "TM001" in codes(TENSOR_OR_NUMBER.format(kept="loss if old_model is None else extra"))


# ppq's quantization API takes its own `collate_fn=`, applied to each calibration batch in the main process
# (TM005, info: 60 false in one repository).
CALIBRATION = """
def collate_fn(batch):
    return batch.to("cuda")


{call}
"""


def test_a_collate_fn_given_to_another_api_than_a_loader_runs_in_the_main_process() -> None:
    quantize = "qmodel = quantize_torch_model(model, calib_dataloader=data, collate_fn=collate_fn)"
    assert "TM005" not in codes(CALIBRATION.format(call=quantize))
    lam = 'analyse(graph, dataloader=data, collate_fn=lambda b: b.to("cuda"))'
    assert "TM005" not in codes(CALIBRATION.format(call=lam).replace("def collate_fn", "def prepare"))


def test_a_collate_fn_given_to_a_loader_with_workers_is_still_flagged() -> None:
    # must-say twins: torch's DataLoader, a project's loader builder, a lambda, a name through partial
    loader = "loader = torch.utils.data.DataLoader(data, num_workers=4, collate_fn=collate_fn)"
    assert "TM005" in codes(CALIBRATION.format(call=loader))
    built = "loader = build_dataloader(data, workers=4, collate_fn=collate_fn)"
    assert "TM005" in codes(CALIBRATION.format(call=built))
    lam = 'loader = DataLoader(data, num_workers=2, collate_fn=lambda b: b.to("cuda"))'
    assert "TM005" in codes(CALIBRATION.format(call=lam).replace("def collate_fn", "def prepare"))
    part = "loader = DataLoader(data, num_workers=2, collate_fn=functools.partial(collate_fn))"
    assert "TM005" in codes(CALIBRATION.format(call=part))


# home-robot's keypoint rollout (round V): a state reset under `if t == 0:` and threaded through the model at
# every other step is one forward spread over the loop; what the loop accumulates adds nothing to what the
# state keeps. The rebinding under the `if` is no fresh binding of every iteration.
ROLLOUT = """
import torch
import torch.nn.functional as F


def show_validation(model, loader):
    model.eval()
    for batch in loader:
        total = 0
        for t in range(batch["n"]):
            if t == 0:
                hidden = torch.zeros(2, 8)
            {call}
            total += F.mse_loss(out, batch["y"][t])
        print(f"loss: {{total / 3}}")
"""


def test_a_state_reset_under_an_if_and_threaded_through_the_model_is_carried() -> None:
    found = codes(ROLLOUT.format(call='out, hidden = model(batch["x"], hidden)'))
    assert "TM010" not in found
    assert "TM002" in found  # what is wrong there: the evaluation records its graphs (no no_grad)


def test_a_state_the_model_only_reads_carries_nothing_and_the_sum_is_still_flagged() -> None:
    # must-say twin: `hidden` is read, never rebound from the model: each iteration's graph is the sum's
    assert "TM010" in codes(ROLLOUT.format(call='out = model(batch["x"], hidden)'))


TBPTT = """
import torch
import torch.nn.functional as F


def train(model, loader, opt):
    for step, (x, y) in enumerate(loader):
        {reset}
        out, h = model(x, h)
        loss = F.mse_loss(out, y)
        opt.zero_grad()
        loss.backward(retain_graph=True)
        opt.step()
"""


def test_a_state_reset_only_now_and_then_links_the_iterations_between() -> None:
    # must-say: reset every 100 steps, the graph grows over the 99 between (TM004); must-not: reset at
    # every step, nothing is carried
    assert "TM004" in codes(TBPTT.format(reset="if step % 100 == 0:\n            h = torch.zeros(2, 8)"))
    assert "TM004" not in codes(TBPTT.format(reset="h = torch.zeros(2, 8)"))


# home-robot's `show_validation` (a miss of round V): a method of the module puts itself in eval() mode and
# runs its own `forward` over the validation set with autograd on. The class's forward is the model, not a
# helper function of the file.
OWN_FORWARD = """
import torch
import torch.nn as nn


class Policy({base}):
    def forward(self, x, hidden):
        return self.head(x), hidden

    def show_validation(self, loader):
        self.eval()
        for batch in loader:
            hidden = torch.zeros(2, 8)
            out, hidden = self.forward(batch["x"], hidden)
            print(out.sum().item())
"""


def test_a_module_evaluating_itself_through_its_own_forward_is_flagged() -> None:
    assert codes(OWN_FORWARD.format(base="nn.Module")) == ["TM002"]
    assert codes(OWN_FORWARD.format(base="torch.nn.Module")) == ["TM002"]


def test_a_forward_of_a_class_that_is_no_module_is_a_function_of_the_file() -> None:
    # must-not twins: a runner whose `forward` is its own helper (it may set no_grad itself); the module's
    # loop under no_grad
    assert codes(OWN_FORWARD.format(base="Runner")) == []
    off = "        torch.set_grad_enabled(False)\n        for batch"
    under = OWN_FORWARD.replace("        for batch", off)
    assert codes(under.format(base="nn.Module")) == []


# ModelCenter's test (round W, 2 false TM012): a hook registered inside `for i in range(1):` runs once.
ONE_PASS = """
import torch


def main(model, x, labels, steps):
    emb = model.embeddings
    for i in {loop}:
        grads = {{}}

        def backward_hook(module, grad_input, grad_output):
            grads["m"] = grad_output[0]

        emb.register_full_backward_hook(backward_hook)
        loss = torch.nn.functional.cross_entropy(model(x), labels)
        loss.backward()
"""


def test_a_hook_registered_in_a_loop_of_one_iteration_is_registered_once() -> None:
    assert "TM012" not in codes(ONE_PASS.format(loop="range(1)"))


def test_a_hook_registered_in_a_loop_of_steps_is_still_flagged() -> None:
    # must-say twins: a run's steps, and two iterations (two hooks where one was meant)
    assert "TM012" in codes(ONE_PASS.format(loop="range(steps)"))
    assert "TM012" in codes(ONE_PASS.format(loop="range(2)"))


# once-for-all's training loop (a miss of round W): `losses = AverageMeter()`, the class imported from the
# project's utils, then `losses.update(loss, n)`: the meter's running sum chains every step's graph.
IMPORTED_METER = """
import torch
from ofa.utils import {cls}


def train_one_epoch(net, loader, criterion, optimizer):
    losses = {cls}()
    for images, labels in loader:
        loss = criterion(net(images), labels)
        loss.backward()
        optimizer.step()
        losses.update({value}, images.size(0))
    return losses.avg
"""


def test_an_imported_meter_given_a_loss_with_its_graph_is_flagged() -> None:
    assert "TM007" in codes(IMPORTED_METER.format(cls="AverageMeter", value="loss"))
    assert "TM007" in codes(IMPORTED_METER.format(cls="AvgMeter", value="loss"))


def test_an_imported_meter_given_a_number_or_another_class_is_not_flagged() -> None:
    # must-not twins: the number of the loss; an imported class not named like a meter (a tracker that may
    # convert what it is given)
    assert "TM007" not in codes(IMPORTED_METER.format(cls="AverageMeter", value="loss.item()"))
    assert "TM007" not in codes(IMPORTED_METER.format(cls="Tracker", value="loss"))


# == round X (docs/lint_corpus.md) =========================================================================
# Bringing-Old-Photos-Back-to-Life's test script (a false TM002): `model(data, mode="inference")` on a model
# class of the project whose forward runs that branch under `torch.no_grad()` — read from the class's file.
PIX2PIX = """
import torch


class Pix2PixModel(torch.nn.Module):
    def forward(self, data, mode):
        if mode == "generator":
            return self.compute_generator_loss(data)
        elif mode == "inference":
            {inference}
        raise ValueError(mode)
"""
TEST_FACE = """
import torchvision.utils as vutils
from {module} import Pix2PixModel


def main(opt, dataloader):
    model = Pix2PixModel(opt)
    model.eval()
    for i, data_i in enumerate(dataloader):
        generated = model(data_i, mode="{mode}")
        vutils.save_image(generated, f"{{i}}.png")
"""
OFF = "with torch.no_grad():\n                fake = self.generate_fake(data)\n            return fake"


def _project(tmp_path: Path, inference: str, mode: str, module: str = "models.pix2pix_model") -> list[str]:
    (tmp_path / "models").mkdir(exist_ok=True)
    (tmp_path / "models" / "__init__.py").write_text("")
    (tmp_path / "models" / "pix2pix_model.py").write_text(PIX2PIX.format(inference=inference))
    (tmp_path / "scripts").mkdir(exist_ok=True)
    script = tmp_path / "scripts" / "test_face.py"
    script.write_text(TEST_FACE.format(module=module, mode=mode))
    return [f.code for f in lint_paths([script], config=False)]


def test_a_forward_branch_its_class_runs_under_no_grad_records_no_graph(tmp_path: Path) -> None:
    assert _project(tmp_path, OFF, "inference") == []


def test_a_branch_with_autograd_on_or_another_mode_is_still_flagged(tmp_path: Path) -> None:
    assert _project(tmp_path, OFF, "generator") == ["TM002"]
    assert _project(tmp_path, "return self.generate_fake(data)", "inference") == ["TM002"]
    # the branch computes outside the no_grad block too
    both = "with torch.no_grad():\n                fake = self.generate(data)\n            return self.g(x)"
    assert _project(tmp_path, both, "inference") == ["TM002"]
    # the class's file is not found (a package of another project): nothing read, the finding stays
    assert _project(tmp_path, OFF, "inference", module="other_project.models") == ["TM002"]


# == round Y (docs/lint_corpus.md) =========================================================================
# xcit's training loop (a false TM002): `model.module.patch_embed.eval()` freezes a part's BatchNorm in a loop
# that trains through timm's `loss_scaler(loss, optimizer, ...)` (backward and step inside).
XCIT = """
def train_one_epoch(model, criterion, data_loader, optimizer, loss_scaler, device):
    model.train(True)
    {freeze}
    for samples, targets in data_loader:
        outputs = model(samples.to(device))
        loss = criterion(outputs, targets.to(device))
        optimizer.zero_grad()
        {update}
"""


def test_a_part_put_in_eval_mode_is_not_the_model_in_eval_mode() -> None:
    src = XCIT.format(
        freeze="model.module.patch_embed.eval()", update="loss.backward()\n        optimizer.step()"
    )
    assert codes(src) == []
    # the whole model, or the model a DDP wrapper holds, put in eval() mode in a loop that does not train
    assert codes(XCIT.format(freeze="model.eval()", update="log(loss.item())")) == ["TM002"]
    assert codes(XCIT.format(freeze="model.module.eval()", update="log(loss.item())")) == ["TM002"]
    # a part of the model put in eval() mode, then that part called
    part = XCIT.format(freeze="model.encoder.eval()", update="log(loss.item())")
    assert codes(part.replace("outputs = model(", "outputs = model.encoder(")) == ["TM002"]


def test_a_loss_scaler_given_the_loss_and_the_optimizer_trains() -> None:
    scaler = "loss_scaler(loss, optimizer, parameters=model.parameters())"
    assert codes(XCIT.format(freeze="model.eval()", update=scaler)) == []
    # a class made from the optimizer (a scheduler), or a call given the loss's number, does not train
    assert codes(XCIT.format(freeze="model.eval()", update="sched = LambdaLR(optimizer, f)")) == ["TM002"]
    assert codes(XCIT.format(freeze="model.eval()", update="log_step(loss.item(), optimizer)")) == ["TM002"]


# StudioGAN's k-nearest-neighbour check (a debatable TM002): `with torch.no_grad() if not requires_grad else
# dummy_context_mgr():` turns autograd off on one arm: perhaps, like a wrapper given an argument.
KNN = """
def run_knn(generator, num_classes, requires_grad, sample, net):
    with {cm}:
        net.eval()
        for c in range(num_classes):
            feats = net(sample(generator, c))
            print(feats.mean().item())
"""


def test_a_conditional_no_grad_context_may_turn_autograd_off() -> None:
    assert codes(KNN.format(cm="torch.no_grad() if not requires_grad else dummy_context_mgr()")) == []
    assert codes(KNN.format(cm="torch.no_grad()")) == []
    assert codes(KNN.format(cm="timer() if not requires_grad else dummy_context_mgr()")) == ["TM002"]


# mttl's per-example loss (a false TM001): only the last iteration keeps its loss with the graph, for the
# caller's backward; the others are backwarded and detached.
LAST = """
def mc_loss(model, input_ids, labels, batch_size):
    kept = []
    for i in range(batch_size):
        loss = F.cross_entropy(model(input_ids[[i]]), labels[[i]]) / batch_size
        if {test}:
            kept += [loss]
        else:
            loss.backward()
            kept += [loss.detach()]
    return torch.stack(kept).sum()
"""


def test_a_value_kept_on_one_iteration_only_is_not_kept_across_iterations() -> None:
    assert codes(LAST.format(test="(i + 1) == batch_size")) == []
    assert codes(LAST.format(test="i == 0")) == []
    # every tenth iteration, or every iteration but the last: kept across the loop
    assert codes(LAST.format(test="i % 10 == 0")) == ["TM001"]
    assert codes(LAST.format(test="(i + 1) != batch_size")) == ["TM001"]
