"""Round GG's false default finding (docs/lint_corpus.md, "Round GG": 30 fresh repositories, 1.14 M
lines): `empty_cache()` once per configuration of a benchmark that builds, trains and deletes a model and its
optimizer in each iteration (spikingjelly's flexsn benchmark), reduced to its data flow, with the twins that
must still be flagged by default."""

from __future__ import annotations

import textwrap

from torchmem.lint import lint_source


def found(src: str, path: str = "bench.py") -> list[tuple[str, str, str]]:
    return [(f.code, f.form, f.severity) for f in lint_source(textwrap.dedent(src), path)]


PER_CONFIG = """
import gc
import time
import torch


def cuda_time_ms(fn, iters=30):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1000 / iters


def main(configs, x, target, criterion):
    for label, build_fn in configs:
        model = build_fn()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

        def step():
            optimizer.zero_grad(set_to_none=True)
            loss = criterion(model(x), target)
            loss.backward()
            optimizer.step()

        step()
        print(label, cuda_time_ms(step))
        del model, optimizer
        gc.collect()
        torch.cuda.empty_cache()
"""

# The same sweep written without the helper: each configuration trains in the loop body itself.
PER_CONFIG_INLINE = """
import torch


def main(configs, x, target, criterion):
    for label, build_fn in configs:
        model = build_fn()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        for _ in range(30):
            optimizer.zero_grad()
            criterion(model(x), target).backward()
            optimizer.step()
        del model, optimizer
        torch.cuda.empty_cache()
"""

# must say: the optimizer is made per configuration, but `empty_cache()` runs in its batch loop, on every step
PER_STEP_INSIDE = """
import torch


def train(configs, loader, criterion):
    for label, build_fn in configs:
        model = build_fn()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        for x, y in loader:
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            torch.cuda.empty_cache()
"""

# must say: one optimizer for the whole run, a helper stepping it, `empty_cache()` after every call
HELPER_ONE_OPTIMIZER = """
import torch


def main(model, loader, criterion):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(x, y):
        optimizer.zero_grad()
        criterion(model(x), y).backward()
        optimizer.step()

    for x, y in loader:
        step(x, y)
        torch.cuda.empty_cache()
"""


def test_empty_cache_once_per_configuration_that_makes_its_own_optimizer_is_not_the_default_finding() -> None:
    # the sweep is still there for --all (info): it was the default "optimizer-step" warning
    assert [f for f in found(PER_CONFIG) if f[0] == "TM003"] == [("TM003", "", "info")]
    # written inline, the loop around the call trains only in a nested loop: never a finding
    assert [f for f in found(PER_CONFIG_INLINE) if f[0] == "TM003"] == []


def test_empty_cache_in_the_steps_of_each_configuration_or_of_one_optimizer_is_still_flagged() -> None:
    assert ("TM003", "optimizer-step", "warning") in found(PER_STEP_INSIDE)
    assert ("TM003", "optimizer-step", "warning") in found(HELPER_ONE_OPTIMIZER)
