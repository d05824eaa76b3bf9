"""The training steps of the cost benchmarks (issue 29), shared by ``watch_cost.py`` and
the ``programs/`` that ``run_cost.py`` runs: each ``make_step(name, device)`` returns ``(step, what)``, a
closure that runs one training step and its description.

- ``tiny``: a few small element-wise ops, a backward and an SGD update on a 32-wide layer (a few tens of µs
  on a CPU core): 100,000 steps in seconds, for the cost at 1k/10k/100k steps.
- ``mlp``: issue 12's host-bound step, 4 x (Linear(64) + ReLU), SGD, batch 32 (about 1.2 ms on an H100 host).
- ``resnet18``: a ResNet-18 (written here: no torchvision needed) on 32x32 images, batch 32 on CUDA (8 on
  the CPU), SGD with momentum: launch-bound on a GPU.
- ``gpt2``: ``transformers.GPT2LMHeadModel`` built from a ``GPT2Config`` (no download), AdamW; CUDA: GPT-2
  small (12 layers, 768 wide) on 256 tokens, batch 8, bf16 autocast; CPU: 2 layers, 128 wide, 64 tokens.
  Without ``transformers``: ``nn.TransformerEncoderLayer`` blocks of the same sizes (said in ``what``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

MODELS = ("tiny", "mlp", "resnet18", "gpt2")


def make_step(name: str, device: torch.device) -> tuple[Callable[[], None], str]:
    torch.manual_seed(0)
    if name == "tiny":
        return _tiny(device)
    if name == "mlp":
        return _mlp(device)
    if name == "resnet18":
        return _resnet(device)
    if name == "gpt2":
        return _gpt2(device)
    raise ValueError(f"unknown model {name!r}; known: {MODELS}")


def _tiny(device: torch.device) -> tuple[Callable[[], None], str]:
    lin = nn.Linear(32, 32).to(device)
    opt = torch.optim.SGD(lin.parameters(), lr=1e-3)
    x = torch.randn(4, 32, device=device)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        lin(x).relu().sum().backward()
        opt.step()

    return step, "Linear(32) + ReLU, batch 4, SGD"


def _mlp(device: torch.device) -> tuple[Callable[[], None], str]:
    layers: list[nn.Module] = []
    for _ in range(4):
        layers += [nn.Linear(64, 64), nn.ReLU()]
    model = nn.Sequential(*layers).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(32, 64, device=device)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        model(x).square().mean().backward()
        opt.step()

    return step, "4 x (Linear(64) + ReLU), batch 32, SGD"


class _Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.down(x))


class ResNet18(nn.Module):
    """torchvision's ResNet-18 layout (BasicBlock x [2, 2, 2, 2], 64..512 channels), 10 classes."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)
        )
        blocks: list[nn.Module] = []
        cin = 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            blocks += [_Block(cin, cout, stride), _Block(cout, cout, 1)]
            cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(512, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.stem(x))
        return self.head(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def _resnet(device: torch.device) -> tuple[Callable[[], None], str]:
    model = ResNet18().to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    batch = 32 if device.type == "cuda" else 8
    x = torch.randn(batch, 3, 32, 32, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    loss_fn = nn.CrossEntropyLoss()

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        opt.step()

    return step, f"ResNet-18, 32x32 images, batch {batch}, SGD momentum"


def _gpt2(device: torch.device) -> tuple[Callable[[], None], str]:
    cuda = device.type == "cuda"
    n_layer, n_embd, n_head, seq, vocab = (12, 768, 12, 256, 50257) if cuda else (2, 128, 4, 64, 2048)
    batch = 8
    try:
        from transformers import GPT2Config, GPT2LMHeadModel  # type: ignore[import-not-found,unused-ignore]

        cfg = GPT2Config(vocab_size=vocab, n_positions=seq, n_embd=n_embd, n_layer=n_layer, n_head=n_head)
        model: nn.Module = GPT2LMHeadModel(cfg).to(device)
        what = f"GPT2LMHeadModel ({n_layer} layers, {n_embd} wide, {seq} tokens, batch {batch})"
        hf = True
    except ImportError:
        layer = nn.TransformerEncoderLayer(n_embd, n_head, 4 * n_embd, batch_first=True, norm_first=True)
        model = nn.Sequential(nn.Embedding(vocab, n_embd), nn.TransformerEncoder(layer, n_layer)).to(device)
        head = nn.Linear(n_embd, vocab).to(device)
        model.add_module("head", head)
        what = f"TransformerEncoder stand-in (no transformers; {n_layer} layers, {n_embd} wide)"
        hf = False
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, vocab, (batch, seq), device=device)
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else None

    def loss() -> torch.Tensor:
        if hf:
            return model(input_ids=ids, labels=ids).loss  # type: ignore[no-any-return]
        logits = model(ids)
        return nn.functional.cross_entropy(logits.flatten(0, 1), ids.flatten())

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        if amp is not None:
            with amp:
                value = loss()
        else:
            value = loss()
        value.backward()
        opt.step()

    return step, what + (", bf16 autocast" if cuda else "") + ", AdamW"
