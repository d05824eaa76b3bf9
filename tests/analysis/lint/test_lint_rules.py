"""Each lint rule on code that must be flagged and on look-alikes that must not (precision over recall)."""

from __future__ import annotations

import textwrap

import pytest

from torchmem.lint import lint_source

TRAIN_HEAD = """
total = 0.0
losses = []
history = {}
for step, (x, y) in enumerate(loader):
    out = model(x)
    loss = criterion(out, y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
"""


def codes(src: str, path: str = "train.py") -> list[tuple[int, str]]:
    return [(f.line, f.code) for f in lint_source(textwrap.dedent(src), path)]


def in_loop(*lines: str) -> str:
    return TRAIN_HEAD + "".join(f"    {ln}\n" for ln in lines)


# -- TM001 ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "line",
    [
        "total += loss",
        "total = total + loss",
        "losses.append(loss)",
        "losses.append(out)",
        "history[step] = out",
        "losses.append({'loss': loss})",
        "losses.append(loss * 2)",
        "losses.append(loss.cpu())",
        "losses.extend([loss])",
        "self.running += loss",
        "losses.append(out.logits)",
        "total += criterion(model(x), y)",
        "losses.append(torch.stack([loss, loss]).sum())",
    ],
)
def test_tm001_flags_graph_kept_across_steps(line: str) -> None:
    assert codes(in_loop(line)) == [(11, "TM001")]


@pytest.mark.parametrize(
    "line",
    [
        "total += loss.item()",
        "total += float(loss)",
        "losses.append(loss.detach())",
        "losses.append(loss.detach().cpu())",
        "losses.append(out.cpu().numpy())",
        "losses.append(out.tolist())",
        "losses.append(loss.data)",
        "total += loss.item() * x.size(0)",
        "history['last'] = out",  # a fixed key: one step's graph, replaced each step
        "correct = (out.argmax(1) == y).sum()",
        "losses.append((out.argmax(1) == y).sum())",
        "total += x.size(0)",
        "losses.append(batch_stats)",  # unknown origin: not flagged
        "losses.append(f'{loss}')",
    ],
)
def test_tm001_look_alikes_are_not_flagged(line: str) -> None:
    assert codes(in_loop(line)) == []


def test_tm001_under_no_grad_is_not_flagged() -> None:
    src = in_loop(
        "with torch.no_grad():", "    total += loss", "    val = model(x)", "    losses.append(val)"
    )
    assert codes(src) == []


def test_tm001_reset_inside_the_loop_is_not_flagged() -> None:
    src = in_loop("losses.append(loss)", "if step % 10 == 0:", "    losses = []")
    assert codes(src) == []
    assert codes(in_loop("losses.append(loss)", "if len(losses) > 10:", "    losses.clear()")) == []


def test_tm001_gradient_accumulation_is_not_flagged() -> None:
    src = """
    acc = 0
    for i, (x, y) in enumerate(loader):
        acc += criterion(model(x), y)
        if i % 4 == 3:
            acc.backward()
            optimizer.step()
            acc = 0
    """
    assert codes(src) == []


def test_tm001_needs_a_training_loop() -> None:
    src = """
    outs = []
    for x in loader:
        outs.append(model(x))
    """
    assert codes(src) == []  # no backward, no optimizer step: that is TM002's business if it evaluates


def test_tm001_rebinding_to_a_number_ends_the_tensor() -> None:
    src = in_loop("loss = loss.item()", "total += loss")
    assert codes(src) == []


def test_tm001_outer_loop_keeps_last_graph_of_each_epoch() -> None:
    src = """
    per_epoch = []
    for epoch in range(10):
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            opt.step()
        per_epoch.append(loss)
    """
    assert codes(src) == [(8, "TM001")]


# -- TM002 ------------------------------------------------------------------------------------------------
EVAL = """import torch

def evaluate(model, loader):
    model.eval()
    correct = 0
    for x, y in loader:
        out = model(x)
        correct += (out.argmax(1) == y).sum().item()
    return correct
"""


def test_tm002_flags_an_eval_loop_without_no_grad() -> None:
    assert codes(EVAL) == [(6, "TM002")]
    (finding,) = lint_source(EVAL, "eval.py")
    assert "training-sized peak" in finding.message and "grows" in finding.message
    # a file that imports nothing of torch's world: `evaluate` and `model` mean something else
    assert codes(EVAL.replace("import torch", "import json")) == []


@pytest.mark.parametrize(
    "variant",
    [
        EVAL.replace("def evaluate", "@torch.no_grad()\ndef evaluate").replace("\n", "\n", 1),
        EVAL.replace("def evaluate", "@torch.inference_mode()\ndef evaluate"),
        EVAL.replace("    for x, y in loader:\n", "    with torch.no_grad():\n      for x, y in loader:\n"),
        EVAL.replace(
            "    for x, y in loader:\n", "    with torch.inference_mode():\n      for x, y in loader:\n"
        ),
        EVAL.replace("    model.eval()\n", "    torch.set_grad_enabled(False)\n"),
        EVAL + "\nwith torch.no_grad():\n    evaluate(model, loader)\n",  # the caller turns autograd off
        EVAL.replace("correct += ", "loss = criterion(out, y)\n        loss.backward()\n        correct += "),
        EVAL.replace("out = model(x)", "out = 0"),  # no model call in the loop
    ],
)
def test_tm002_look_alikes_are_not_flagged(variant: str) -> None:
    assert [c for _, c in codes(variant)] == []


def test_tm002_by_name_without_eval_call() -> None:
    src = """
    from torch import nn
    def test(model, test_loader):
        for data, target in test_loader:
            output = model(data)
    """
    assert codes(src) == [(4, "TM002")]
    assert codes(src, "tests/test_model.py") == []  # a pytest file: test_* names are tests
    assert codes(src.replace("def test(", "def train(")) == []


def test_tm002_the_model_called_is_the_one_put_in_eval_mode() -> None:
    src = """
    import torch
    def check(base, decoder, batches):
        model = wrap(base).eval()
        for b in batches:
            model(b)
    """
    assert codes(src) == [(5, "TM002")]  # bound from `.eval()`: the model in eval mode, run with autograd
    other = src.replace("model = wrap(base).eval()", "model = wrap(base)\n        base.eval()")
    assert codes(other.replace("model(b)", "decoder(b)")) == []  # eval() on `base`, `decoder` is called


def test_tm002_methods_need_an_explicit_eval_call() -> None:
    src = """
    import torch
    class Pipeline:
        def sequential_inference(self, inputs):
            for i in range(3):
                out = self.model(inputs[i])
        def validate(self, loader):
            self.model.eval()
            for batch in loader:
                out = self.model(batch)
        def validation_step(self, batch, idx):
            self.model.eval()
            for b in batch:
                self.model(b)
    """
    assert codes(src) == [(9, "TM002")]


# -- TM003 ------------------------------------------------------------------------------------------------
def test_tm003_flags_empty_cache_every_step() -> None:
    assert codes(in_loop("torch.cuda.empty_cache()")) == [(11, "TM003")]
    assert codes(in_loop("if torch.cuda.is_available():", "    torch.cuda.empty_cache()")) == [(12, "TM003")]


@pytest.mark.parametrize(
    "lines",
    [
        ("if step % 100 == 0:", "    torch.cuda.empty_cache()"),
        ("try:", "    pass", "except torch.cuda.OutOfMemoryError:", "    torch.cuda.empty_cache()"),
        ("cache.empty_cache()",),
    ],
)
def test_tm003_look_alikes_are_not_flagged(lines: tuple[str, ...]) -> None:
    assert codes(in_loop(*lines)) == []


def test_tm003_once_per_epoch_or_outside_the_loop_is_fine() -> None:
    src = """
    for epoch in range(3):
        for x, y in loader:
            criterion(model(x), y).backward()
            opt.step()
        torch.cuda.empty_cache()
    torch.cuda.empty_cache()
    """
    assert codes(src) == []


# -- TM004 ------------------------------------------------------------------------------------------------
RNN = """
hidden = model.init_hidden(32)
for x, y in loader:
    out, hidden = model(x, hidden)
    loss = criterion(out, y)
    loss.backward(retain_graph=True)
    optimizer.step()
"""


def test_tm004_flags_retain_graph_with_state_carried_between_iterations() -> None:
    assert codes(RNN) == [(6, "TM004")]


@pytest.mark.parametrize(
    "variant",
    [
        RNN.replace("    out, hidden", "    hidden = hidden.detach()\n    out, hidden"),
        RNN.replace("    out, hidden", "    hidden = repackage_hidden(hidden)\n    out, hidden"),
        RNN.replace("retain_graph=True", "retain_graph=keep"),
        RNN.replace("retain_graph=True", "create_graph=True"),
        RNN.replace(
            "    optimizer.step()", "    other.backward()\n    optimizer.step()"
        ),  # a later backward frees it
        RNN.replace("out, hidden = model(x, hidden)", "out = model(x)"),  # nothing carried: not a leak
    ],
)
def test_tm004_look_alikes_are_not_flagged(variant: str) -> None:
    assert codes(variant) == []


def test_tm004_gan_two_losses_in_one_step_is_fine() -> None:
    src = """
    for real in loader:
        fake = netG(noise)
        errD = criterion(netD(fake), zeros)
        errD.backward(retain_graph=True)
        errG = criterion(netD(fake), ones)
        errG.backward()
        optG.step()
    """
    assert codes(src) == []


# -- TM005 ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("src", "line"),
    [
        ("class Images(Dataset):\n    def __getitem__(self, i):\n        return self.x[i].cuda()\n", 3),
        (
            "class S(torch.utils.data.IterableDataset):\n"
            "    def __iter__(self):\n        yield t.to('cuda:0')\n",
            3,
        ),
        ("def my_collate(batch):\n    return torch.stack(batch).to('cuda')\n", 2),
        (
            "def pad(batch):\n    return torch.tensor(batch, device='cuda')\n"
            "DataLoader(ds, collate_fn=pad, num_workers=2)\n",
            2,
        ),
        ("def init(i):\n    torch.zeros(1).cuda()\nDataLoader(ds, worker_init_fn=init)\n", 2),
        (
            "device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\n"
            "class D(Dataset):\n    def __getitem__(self, i):\n        return self.x[i].to(device)\n",
            4,
        ),
        ("DataLoader(ds, collate_fn=lambda b: torch.stack(b).cuda(), num_workers=2)\n", 1),
    ],
)
def test_tm005_flags_cuda_in_the_data_pipeline(src: str, line: int) -> None:
    assert codes(src) == [(line, "TM005")]


@pytest.mark.parametrize(
    "src",
    [
        "class Images(Dataset):\n    def __getitem__(self, i):\n        return self.x[i].to(self.device)\n",
        "class Images(Dataset):\n    def __getitem__(self, i):\n        return self.x[i].to('cpu')\n",
        "class Images(Dataset):\n    def __getitem__(self, i):\n        return self.x[i].pin_memory()\n",
        "class Cache:\n    def __getitem__(self, i):\n        return self.x[i].cuda()\n",
        "def train(batch):\n    return batch.cuda()\n",
        "def my_collate(batch):\n    return torch.stack(batch)\nfor b in loader:\n    b = b.cuda()\n",
    ],
)
def test_tm005_look_alikes_are_not_flagged(src: str) -> None:
    assert codes(src) == []


# -- TM006 ------------------------------------------------------------------------------------------------
DIST = """
import os, torch
local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
state = torch.load("ckpt.pt")
"""


def test_tm006_flags_load_without_map_location_per_rank() -> None:
    assert codes(DIST) == [(5, "TM006")]
    assert codes(
        DIST.replace('int(os.environ["LOCAL_RANK"])', "0") + "dist.init_process_group('nccl')\n"
    ) == [(5, "TM006")]
    assert codes(DIST.replace("torch.load(", "torch.load(f=").replace("\n", "\n", 1)) == [(5, "TM006")]


@pytest.mark.parametrize(
    "variant",
    [
        DIST.replace('torch.load("ckpt.pt")', 'torch.load("ckpt.pt", map_location="cpu")'),
        DIST.replace('torch.load("ckpt.pt")', 'torch.load("ckpt.pt", f"cuda:{local_rank}")'),
        DIST.replace('torch.load("ckpt.pt")', 'torch.load("ckpt.pt", **kw)'),
        DIST.replace('torch.load("ckpt.pt")', "torch.load(io.BytesIO(blob))"),
        DIST.replace('torch.load("ckpt.pt")', "json.load(f)"),
        # no per-rank device in this file
        'import torch\ntorch.cuda.set_device(args.gpu)\nstate = torch.load("ckpt.pt")\n',
        'os.environ["LOCAL_RANK"] = "0"\nstate = torch.load("ckpt.pt")\n',
        # saved by this process a moment before
        DIST.replace('state = torch.load("ckpt.pt")', "torch.save(m, path)\nstate = torch.load(path)"),
    ],
)
def test_tm006_look_alikes_are_not_flagged(variant: str) -> None:
    assert codes(variant) == []


# -- TM007 ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "line",
    [
        "loss_meter.update(loss, x.size(0))",
        "avg_loss.update(val=loss)",
        "train_meter.update(out.mean())",
    ],
)
def test_tm007_flags_tensors_given_to_meters(line: str) -> None:
    assert codes(in_loop(line)) == [(11, "TM007")]


@pytest.mark.parametrize(
    "line",
    [
        # trackers convert at once (accelerate's listify: .detach().cpu(); tensorboard's make_np; mlflow's
        # float()): they keep no graph, so they are not flagged
        "wandb.log({'train/loss': loss})",
        "writer.add_scalar('loss', loss, step)",
        "accelerator.log({'loss': loss}, step=step)",
        "self.logger.log_metrics({'loss': loss})",
        "mlflow.log_metric('loss', loss)",
    ],
)
def test_tm007_trackers_that_convert_at_once_are_not_flagged(line: str) -> None:
    assert codes(in_loop(line)) == []


METER = """
class AverageMeter:
    def __init__(self):
        self.sum, self.count = 0, 0
    def update(self, val, n=1):
        self.sum += val * n
        self.count += n
"""


def test_tm007_decides_by_the_meter_class_of_the_file() -> None:
    keeps = METER + "stat = AverageMeter()\n" + in_loop("stat.update(loss)")
    assert [c for _, c in codes(keeps)] == ["TM007"]  # not named like a meter, but its class sums
    drops = METER.replace("self.sum += val * n", "self.last = n") + "loss_meter = AverageMeter()\n"
    assert codes(drops + in_loop("loss_meter.update(loss)")) == []  # named like one, but keeps nothing


def test_tm007_message_says_what_grows() -> None:
    (finding,) = lint_source(textwrap.dedent(in_loop("loss_meter.update(loss)")), "t.py")
    assert "running sum" in finding.message
    assert (
        "saved activations are freed" in finding.message
        and "autograd nodes stay on the host" in finding.message
    )


@pytest.mark.parametrize(
    "line",
    [
        "loss_meter.update(loss.item(), x.size(0))",
        "wandb.log({'train/loss': loss.item()})",
        "writer.add_scalar('loss', float(loss), step)",
        "self.log('train_loss', loss)",  # Lightning detaches it itself
        "logger.info('loss %s', loss)",
        "print(loss)",
        "metric.update(out, y)",  # torchmetrics takes tensors by design
        "config.update(loss)",
    ],
)
def test_tm007_look_alikes_are_not_flagged(line: str) -> None:
    assert codes(in_loop(line)) == []


def test_tm007_outside_a_training_loop_is_not_flagged() -> None:
    assert codes("for x in loader:\n    out = model(x)\n    wandb.log({'o': out})\n") == []


# -- TM008 ------------------------------------------------------------------------------------------------
def test_tm008_flags_set_to_none_false() -> None:
    assert codes("optimizer.zero_grad(set_to_none=False)\n") == [(1, "TM008")]
    assert codes("model.zero_grad(set_to_none=False)\n") == [(1, "TM008")]


@pytest.mark.parametrize(
    "src",
    [
        "optimizer.zero_grad()\n",
        "optimizer.zero_grad(set_to_none=True)\n",
        "optimizer.zero_grad(set_to_none=flag)\n",
        # in-place gradient sums need the buffers
        "for p, g in zip(params, grads):\n    p.grad += g\noptimizer.zero_grad(set_to_none=False)\n",
        # CUDA graphs need them at a fixed address
        "g = torch.cuda.CUDAGraph()\noptimizer.zero_grad(set_to_none=False)\n",
    ],
)
def test_tm008_look_alikes_are_not_flagged(src: str) -> None:
    assert codes(src) == []


# -- TM009 ------------------------------------------------------------------------------------------------
FORK = """
x = torch.randn(100, 8).cuda()
y = torch.randint(0, 2, (100,), device="cuda")
ds = TensorDataset(x, y)
loader = DataLoader(ds, batch_size=8, num_workers=4)
"""


def test_tm009_flags_forked_workers_over_a_cuda_dataset() -> None:
    assert codes(FORK) == [(5, "TM009")]
    assert codes("import multiprocessing as mp\nmp.set_start_method('fork')\n" + FORK) == [(7, "TM009")]
    cls = (
        "class D(Dataset):\n    def __init__(self):\n        self.x = torch.load('x.pt').cuda()\n"
        "loader = DataLoader(D(), num_workers=2)\n"
    )
    assert codes(cls) == [(4, "TM009")]


@pytest.mark.parametrize(
    "variant",
    [
        FORK.replace("num_workers=4", "num_workers=0"),
        FORK.replace(", num_workers=4", ""),
        FORK.replace("num_workers=4", "num_workers=4, multiprocessing_context='spawn'"),
        "import torch.multiprocessing as mp\nmp.set_start_method('spawn')\n" + FORK,
        FORK.replace(".cuda()", "").replace(', device="cuda"', ""),
        # CUDA initialised first, but the workers only read CPU data: fine
        "model = Net().cuda()\nds = TensorDataset(torch.randn(10, 2))\n"
        "loader = DataLoader(ds, num_workers=4)\n",
    ],
)
def test_tm009_look_alikes_are_not_flagged(variant: str) -> None:
    assert codes(variant) == []


# -- the whole ----------------------------------------------------------------------------------------------
def test_a_clean_training_script_has_no_findings() -> None:
    src = """
    import torch
    from torch.utils.data import DataLoader

    def train(model, loader, opt, criterion, device):
        model.train()
        total = 0.0
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            opt.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            opt.step()
            total += loss.item()
        return total / len(loader)

    @torch.no_grad()
    def evaluate(model, loader, device):
        model.eval()
        preds = []
        for x, _ in loader:
            preds.append(model(x.to(device)).argmax(1).cpu())
        return torch.cat(preds)
    """
    assert codes(src) == []


def test_columns_are_characters_and_one_based() -> None:
    src = in_loop("é = 1; total += loss")
    (finding,) = lint_source(textwrap.dedent(src), "t.py")
    assert finding.col == len("    é = 1; ") + 1


# -- the premises, on real tensors ---------------------------------------------------------------------------
def _run_page_example(code: str, section: str) -> dict[str, object]:
    import re

    import torch

    from torchmem.lint import explain_rule

    block = re.search(rf"## {section}\n\n```python\n(.*?)```", explain_rule(code), re.S)
    assert block is not None
    model = torch.nn.Linear(4, 2)
    loader = [(torch.randn(3, 4), torch.randint(0, 2, (3,))) for _ in range(3)]
    env: dict[str, object] = {
        "torch": torch,
        "model": model,
        "loader": loader,
        "criterion": torch.nn.CrossEntropyLoss(),
        "optimizer": torch.optim.SGD(model.parameters(), lr=0.1),
    }
    exec(block.group(1), env)
    return env


def test_tm001_premise_the_flagged_total_holds_every_steps_graph() -> None:
    import torch

    wrong = _run_page_example("TM001", "Wrong")
    total = wrong["total"]
    assert isinstance(total, torch.Tensor) and total.grad_fn is not None
    depth, node = 0, total.grad_fn
    while node is not None:  # one AddBackward per step, chained through the previous total
        depth += node.name().startswith("AddBackward")
        node = next((f for f, _ in node.next_functions if f is not None and "Add" in f.name()), None)
    assert depth == 3
    assert all(t.grad_fn is not None for t in wrong["losses"])  # type: ignore[attr-defined]
    right = _run_page_example("TM001", "Right")
    assert isinstance(right["total"], float)
    assert all(t.grad_fn is None for t in right["losses"])  # type: ignore[attr-defined]


# -- what the TM001 message says, by the shape found --------------------------------------------------------
HELPER = """
def train(model, loader, optimizer):
    total = 0.0
    def accumulate(value):
        nonlocal total
        total = total + value
    for x, y in loader:
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        accumulate(loss)
"""


def test_tm001_through_a_helper_names_the_container_and_how_it_outlives_the_call() -> None:
    (finding,) = lint_source(textwrap.dedent(HELPER), "t.py")
    assert finding.code == "TM001" and finding.line == 11
    assert "`total` (declared nonlocal/global in `accumulate`, line 6)" in finding.message
    assert "autograd nodes stay on the host" in finding.message
    assert lint_source(HELPER.replace("accumulate(loss)", "accumulate(loss.item())"), "t.py") == []
    # a helper that keeps nothing beyond the call is not a leak
    local = HELPER.replace(
        "        nonlocal total\n        total = total + value\n", "        t = value * 2\n"
    )
    assert lint_source(local, "t.py") == []


def test_tm001_shapes_after_backward_never_backwarded_and_unknown() -> None:
    after = lint_source(textwrap.dedent(in_loop("losses.append(out)")), "t.py")[0].message
    assert "the output tensor itself on its device" in after and "autograd nodes on the host" in after
    never = lint_source(textwrap.dedent(in_loop("aux = teacher_model(x)", "losses.append(aux)")), "t.py")
    assert "every saved activation on the device" in never[0].message
    closure = "for x in loader:\n    out = model(x)\n    optimizer.step(closure)\n    outs.append(out)\n"
    unknown = lint_source(closure, "t.py")[0].message  # no backward in sight: both halves said
    assert "until a backward runs through it" in unknown and "autograd nodes on the host after" in unknown
