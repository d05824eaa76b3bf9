"""Leak scenarios and controls for ``torchmem.watch()``: real models, optimizers and autograd graphs.

Each scenario is a function ``run(steps, device)`` that trains or evaluates for every item of ``steps`` (a
``torchmem.watch`` wrapper). A leaking scenario states the culprit it must be reported with: its kind, the
holder a person would name, and the allocation site, marked in the source with a ``# SITE`` comment on the
line that allocates what leaks. Controls must never be reported. The same catalog runs on the CPU (CI, exact
accounting) and on CUDA (the device machine, allocator counters).
"""

from __future__ import annotations

import gc
import random
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

WIDTH = 512  # a (512, 512) float32 activation is 1 MiB
BATCH = 512


@dataclass(frozen=True)
class Scenario:
    name: str
    run: Callable[[Iterable[int], torch.device], None]
    leaks: bool
    kind: str | None = None  # expected culprit kind
    holder: str | None = None  # substring of the culprit's holder path
    about: str = ""


def _model(device: torch.device, depth: int = 2) -> torch.nn.Module:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(depth):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers).to(device)


def _batch(device: torch.device, n: int = BATCH) -> torch.Tensor:
    return torch.randn(n, WIDTH, device=device)


# ------------------------------------------------------------------------------------------------
# Leaks
# ------------------------------------------------------------------------------------------------
def eval_losses_with_graph(steps: Iterable[int], device: torch.device) -> None:
    """Validation without no_grad(), keeping each loss tensor: every step's graph stays alive."""
    model = _model(device)
    val_losses = []
    for _ in steps:
        out = model(_batch(device))  # SITE
        val_losses.append(out.square().mean())


def total_loss_chain(steps: Iterable[int], device: torch.device) -> None:
    """``total += loss`` without .item() in an eval loop: one growing graph chain."""
    model = _model(device)
    total = torch.zeros((), device=device)
    for _ in steps:
        out = model(_batch(device))  # SITE
        total = total + out.square().mean()


def outputs_dict_with_graph(steps: Iterable[int], device: torch.device) -> None:
    """A dict of outputs per step, stored with their graphs."""
    model = _model(device)
    outputs = {}
    for i in steps:
        logits = model(_batch(device))  # SITE
        outputs[i] = {"logits": logits}


class _DeviceMetric:
    """torchmetrics-style state kept on the device and never reset."""

    def __init__(self) -> None:
        self.preds: list[torch.Tensor] = []

    def update(self, pred: torch.Tensor) -> None:
        self.preds.append(pred.detach())


def metric_state_on_device(steps: Iterable[int], device: torch.device) -> None:
    """A metric accumulating predictions on the device."""
    model = _model(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    metric = _DeviceMetric()
    for _ in steps:
        pred = model(_batch(device))  # SITE
        pred.square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        metric.update(pred)


def growing_kv_cache(steps: Iterable[int], device: torch.device) -> None:
    """A key/value cache grown with torch.cat every step and never bounded."""
    proj = torch.nn.Linear(WIDTH, WIDTH).to(device)
    cache = torch.empty(0, WIDTH, device=device)
    with torch.no_grad():
        for _ in steps:
            kv = proj(_batch(device))
            cache = torch.cat([cache, kv])  # SITE


def retain_graph_hidden_state(steps: Iterable[int], device: torch.device) -> None:
    """A recurrent state carried across steps without detach, backward(retain_graph=True) to make it run."""
    torch.manual_seed(0)
    cell = torch.nn.Linear(WIDTH, WIDTH).to(device)
    opt = torch.optim.SGD(cell.parameters(), lr=1e-4)
    h = torch.zeros(BATCH, WIDTH, device=device)
    for _ in steps:
        h = torch.tanh(cell(h) + _batch(device))  # SITE
        h.square().mean().backward(retain_graph=True)
        opt.zero_grad(set_to_none=True)


def hook_closure(steps: Iterable[int], device: torch.device) -> None:
    """A forward hook whose closure keeps every output."""
    model = _model(device)
    acts: list[torch.Tensor] = []
    handle = model[0].register_forward_hook(lambda m, i, o: acts.append(o.detach()))
    try:
        with torch.no_grad():
            for _ in steps:
                model(_batch(device))  # SITE
    finally:
        handle.remove()


REGISTRY: dict[str, torch.Tensor] = {}


def global_registry(steps: Iterable[int], device: torch.device) -> None:
    """A module-level registry that collects features by name."""
    model = _model(device)
    REGISTRY.clear()
    try:
        with torch.no_grad():
            for i in steps:
                REGISTRY[f"features/{i}"] = model(_batch(device))  # SITE
    finally:
        REGISTRY.clear()


def exception_per_step(steps: Iterable[int], device: torch.device) -> None:
    """Each failing step's exception is stored; its traceback keeps the frame's activations."""
    model = _model(device)
    errors = []

    def failing_step() -> None:
        act = model(_batch(device))  # SITE
        raise ValueError(f"bad batch {act.shape}")

    for _ in steps:
        try:
            failing_step()
        except ValueError as e:
            errors.append(e)


class _Node:
    def __init__(self, value: torch.Tensor) -> None:
        self.value = value
        self.me = self  # a reference cycle: only the garbage collector frees it


def reference_cycle(steps: Iterable[int], device: torch.device) -> None:
    """Objects in a reference cycle holding device tensors, with the collector off (as in many loops)."""
    model = _model(device)
    was = gc.isenabled()
    gc.disable()
    try:
        with torch.no_grad():
            for _ in steps:
                _Node(model(_batch(device)))  # SITE
    finally:
        if was:
            gc.enable()
        gc.collect()


class _Trainer:
    def __init__(self) -> None:
        self.cache: dict[str, torch.Tensor] = {}


def cache_never_evicts(steps: Iterable[int], device: torch.device) -> None:
    """A memo cache keyed by batch name that never evicts."""
    model = _model(device)
    trainer = _Trainer()
    with torch.no_grad():
        for i in steps:
            trainer.cache[f"batch-{i}"] = model(_batch(device))  # SITE


def detached_history(steps: Iterable[int], device: torch.device) -> None:
    """Detached outputs kept on the device 'for later analysis'."""
    model = _model(device)
    history = []
    with torch.no_grad():
        for _ in steps:
            out = model(_batch(device))  # SITE
            history.append(out)


def inputs_kept_by_trainer(steps: Iterable[int], device: torch.device) -> None:
    """Every input batch kept by a trainer object (for 'debugging')."""
    model = _model(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)

    class Loop:
        seen: list[torch.Tensor]

    loop = Loop()
    loop.seen = []
    for _ in steps:
        x = torch.randn(BATCH, WIDTH, device=device)  # SITE
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loop.seen.append(x)


# ------------------------------------------------------------------------------------------------
# Controls
# ------------------------------------------------------------------------------------------------
class _Lazy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(WIDTH, WIDTH)
        self.table: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.table is None:  # built on first use, then constant
            self.table = torch.randn(2 * WIDTH, WIDTH, device=x.device)
        return self.lin(x) + self.table[: x.shape[1]].sum()


def control_warmup(steps: Iterable[int], device: torch.device) -> None:
    """Optimizer state at the first step and a lazily built buffer: one-time allocations."""
    torch.manual_seed(0)
    model = _Lazy().to(device)
    opt = torch.optim.AdamW(model.parameters())
    for _ in steps:
        model(_batch(device)).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def control_cache_growth(steps: Iterable[int], device: torch.device) -> None:
    """Temporaries that grow step after step but are freed inside the step (the allocator's cache grows)."""
    model = _model(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    for i in steps:
        scratch = torch.empty((i + 1) * 256 * 1024, device=device)
        scratch.zero_()
        model(_batch(device)).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del scratch


def control_dynamic_shapes(steps: Iterable[int], device: torch.device) -> None:
    """Batches of random size; the last step's output stays in a variable until the next step."""
    model = _model(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    rng = random.Random(0)
    for _ in steps:
        out = model(_batch(device, rng.randint(64, 1024)))
        out.square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del out


def control_periodic_eval(steps: Iterable[int], device: torch.device) -> None:
    """An evaluation every 4 steps whose results replace the previous evaluation's."""
    model = _model(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    last_eval: list[torch.Tensor] = []
    for i in steps:
        model(_batch(device)).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i % 4 == 3:
            with torch.no_grad():
                last_eval = [model(_batch(device)) for _ in range(3)]
    del last_eval


def control_grad_accumulation(steps: Iterable[int], device: torch.device) -> None:
    """Gradient accumulation over 4 micro-batches, each a step; AdamW state appears at the first update."""
    model = _model(device)
    opt = torch.optim.AdamW(model.parameters())
    for i in steps:
        (model(_batch(device)).square().mean() / 4).backward()
        if i % 4 == 3:
            opt.step()
            opt.zero_grad(set_to_none=True)


def control_bounded_cache(steps: Iterable[int], device: torch.device) -> None:
    """An LRU cache of at most 3 entries: it grows, then stays flat."""
    model = _model(device)
    cache: OrderedDict[int, torch.Tensor] = OrderedDict()
    with torch.no_grad():
        for i in steps:
            cache[i] = model(_batch(device))
            if len(cache) > 3:
                cache.popitem(last=False)


def control_item_logging(steps: Iterable[int], device: torch.device) -> None:
    """The fixed version of the losses leak: log loss.item()."""
    model = _model(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    losses = []
    for _ in steps:
        loss = model(_batch(device)).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())


LEAKS = [
    Scenario("eval_losses_with_graph", eval_losses_with_graph, True, "retained_graph", "val_losses"),
    Scenario("total_loss_chain", total_loss_chain, True, "graph_chain", "total"),
    Scenario("outputs_dict_with_graph", outputs_dict_with_graph, True, "retained_graph", "outputs"),
    Scenario("metric_state_on_device", metric_state_on_device, True, "device_accumulation", "metric"),
    Scenario("growing_kv_cache", growing_kv_cache, True, "growing_tensor", "cache"),
    Scenario("retain_graph_hidden_state", retain_graph_hidden_state, True, "graph_chain", "'h'"),
    Scenario("hook_closure", hook_closure, True, "hook", "acts"),
    Scenario("global_registry", global_registry, True, "global_registry", "REGISTRY"),
    Scenario("exception_per_step", exception_per_step, True, "exception", "errors"),
    Scenario("reference_cycle", reference_cycle, True, "cycle", "_Node"),
    Scenario("cache_never_evicts", cache_never_evicts, True, "cache", "trainer"),
    Scenario("detached_history", detached_history, True, "device_accumulation", "history"),
    Scenario("inputs_kept_by_trainer", inputs_kept_by_trainer, True, "device_accumulation", "loop"),
]

CONTROLS = [
    Scenario("control_warmup", control_warmup, False),
    Scenario("control_cache_growth", control_cache_growth, False),
    Scenario("control_dynamic_shapes", control_dynamic_shapes, False),
    Scenario("control_periodic_eval", control_periodic_eval, False),
    Scenario("control_grad_accumulation", control_grad_accumulation, False),
    Scenario("control_bounded_cache", control_bounded_cache, False),
    Scenario("control_item_logging", control_item_logging, False),
]

ALL = LEAKS + CONTROLS


def site_of(s: Scenario) -> str:
    """``file.py:LINE`` of the ``# SITE`` marker in a scenario's source."""
    import inspect
    import os

    lines, start = inspect.getsourcelines(s.run)
    for i, line in enumerate(lines):
        if "# SITE" in line:
            return f"{os.path.basename(inspect.getsourcefile(s.run) or '')}:{start + i}"
    raise AssertionError(f"{s.name} has no # SITE marker")
