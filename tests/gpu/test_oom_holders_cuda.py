"""On the GPU: CUDA OOM diagnoses name the holders of the memory and the situation behind them — an evaluation
that runs out of memory while the last training step's `out`/`loss` keep their graph, a retry inside
`except` whose failed attempt holds most of the memory, a model deleted while its optimizer holds the
parameters — from the observer's state of the moment (autograd's mode, what was allocated) and a holder
search made where the program caught the error, never inside the allocator's callback.

Each test caps the allocator at what it reserves plus a few GiB (``set_per_process_memory_fraction``), so it
runs in seconds on any GPU with 8 GiB free.

Run: PYTHONPATH=src python3 -m pytest -m cuda -s tests/gpu/test_oom_holders_cuda.py
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch

from torchmem.capture import oom as oom_capture
from torchmem.capture.oom import explain_oom, watch_ooms
from torchmem.results.oom import OOMDiagnosis, OOMEvent

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

MiB = 1 << 20
GiB = 1 << 30


@pytest.fixture(autouse=True)
def _budget() -> Iterator[None]:
    """A full holder-search budget for each test (earlier OOMs of the process may have spent it)."""
    oom_capture._registry["budget"] = [None, 0.0]
    yield


def _clean() -> None:
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


@contextmanager
def capped(extra: int) -> Iterator[int]:
    """A per-process cap on cuda:0 of what the allocator reserves now plus ``extra`` bytes; lifted after."""
    _clean()
    total = torch.cuda.mem_get_info(0)[1]
    cap = torch.cuda.memory_reserved(0) + extra
    torch.cuda.set_per_process_memory_fraction(cap / total, 0)
    try:
        yield cap
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, 0)
        _clean()


def _mlp(width: int, depth: int) -> torch.nn.Module:
    layers = [torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU()) for _ in range(depth)]
    return torch.nn.Sequential(*layers).cuda()


def _kinds(d: OOMDiagnosis) -> list[str]:
    return [c.kind for c in d.causes]


def _check_sums(d: OOMDiagnosis) -> None:
    h = d.holders
    assert h is not None and h.device == "cuda:0"
    assert h.allocated is not None  # the observer's figure at the moment
    assert h.named() + h.unnamed + (h.unaccounted or 0) >= h.allocated - 64 * MiB
    assert h.seconds < 5.0


# -- an evaluation OOM while the last training step's graph is alive ---------------------------------------


def _train_then_evaluate(drop: bool) -> tuple[OOMDiagnosis, list[OOMEvent], float]:
    events: list[OOMEvent] = []
    model = _mlp(4096, 8)  # 512 MiB of parameters
    with watch_ooms(events.append) as handle, capped(3 * GiB):
        assert handle.problem is None, handle.problem
        out = model(torch.randn(8192, 4096, device="cuda"))  # the graph saves ~2 GiB of activations
        loss = out.pow(2).mean()
        if drop:
            del out, loss
        model.eval()
        t0 = time.perf_counter()
        # with the graph alive the first 1 GiB batch does not fit; without it, a 1.5 GiB batch's forward
        # (input, a layer's output and its activation: 4.5 GiB) does not
        rows = 98304 if drop else 65536
        try:
            with torch.no_grad():
                for _ in range(4):
                    model(torch.randn(rows, 4096, device="cuda"))
        except torch.OutOfMemoryError as e:
            d = explain_oom(e)
            took = time.perf_counter() - t0
        else:  # pragma: no cover - the cap is set so that it fails
            raise AssertionError("no OOM")
    return d, events, took


def test_an_eval_oom_names_the_training_graph_that_out_and_loss_keep() -> None:
    d, events, took = _train_then_evaluate(drop=False)
    print("\n" + str(d) + f"\n(explained in {took:.2f} s)")
    assert d.causes[0].kind == "training_graph", str(d)
    cause = d.causes[0]
    assert "`out` and `loss`" in cause.summary and cause.confidence == "high"
    assert cause.bytes is not None and cause.bytes >= 1536 * MiB
    assert d.fixes[0].setting == "del out, loss"
    assert "with torch.inference_mode(): ..." not in [f.setting for f in d.fixes]  # eval ran under no_grad
    h = d.holders
    assert h is not None and h.grad_enabled is False  # read by the observer, at the moment
    assert any(x.label.endswith(".out") or x.label.endswith("'out'") for x in h.holders), h
    _check_sums(d)
    (event,) = events
    assert event.kind == "training_graph", str(event.diagnosis)  # the event's diagnosis, completed
    assert event.diagnosis is not None and event.diagnosis.holders is not None


def test_no_training_graph_once_out_and_loss_are_deleted() -> None:
    d, _, _ = _train_then_evaluate(drop=True)
    assert "training_graph" not in _kinds(d), str(d)
    assert d.holders is not None and not any(x.graph for x in d.holders.holders)


# -- a retry inside except --------------------------------------------------------------------------------


def _attempt(layers: int, extra: int) -> torch.Tensor:
    w = torch.randn(2048, 2048, device="cuda", requires_grad=True)  # 16 MiB
    h = torch.randn(16384, 2048, device="cuda")  # 128 MiB
    for _ in range(layers):
        h = (h @ w).relu()  # its graph keeps 128 MiB per layer
    return h.sum() + torch.empty(extra, dtype=torch.uint8, device="cuda").sum()


def test_a_retry_inside_except_ranks_the_failed_attempts_frames_first() -> None:
    events: list[OOMEvent] = []
    with watch_ooms(events.append), capped(2560 * MiB):
        try:
            _attempt(8, 2 * GiB)  # ~1.1 GiB of activations, then 2 GiB more: over the cap
        except torch.OutOfMemoryError:
            try:
                _attempt(0, 1536 * MiB)  # fits only without the first attempt's activations
            except torch.OutOfMemoryError as second:
                d = explain_oom(second)
                del second
    print("\n" + str(d))
    assert d.causes[0].kind == "pinned_by_exception", str(d)
    cause = d.causes[0]
    assert cause.bytes is not None and cause.bytes >= 1 * GiB and cause.confidence == "high"
    assert any("_attempt() local 'h'" in e for e in cause.evidence), cause.evidence
    working = [c for c in d.causes if c.kind == "working_set"]
    assert not working or working[0].score < cause.score
    _check_sums(d)
    assert events[-1].while_handling == "torch.OutOfMemoryError"
    assert events[-1].kind == "pinned_by_exception", str(events[-1].diagnosis)


# -- a model deleted while its optimizer holds the parameters ------------------------------------------------


def test_an_optimizer_of_a_deleted_model_is_named() -> None:
    with capped(3 * GiB):
        model = _mlp(4096, 4)  # 256 MiB of parameters
        opt = torch.optim.Adam(model.parameters())
        model(torch.randn(1024, 4096, device="cuda")).sum().backward()
        opt.step()  # + 256 MiB of gradients + 512 MiB of state
        del model
        try:
            torch.empty(int(2.5 * GiB), dtype=torch.uint8, device="cuda")  # fits only without the optimizer's
        except torch.OutOfMemoryError as e:
            d = explain_oom(e)
        assert opt.param_groups
    print("\n" + str(d))
    assert d.causes[0].kind == "orphaned_optimizer", str(d)
    assert "`opt` (Adam)" in d.causes[0].summary
    assert d.causes[0].bytes is not None and d.causes[0].bytes >= 1 * GiB
    assert d.fixes[0].setting == "del opt"
    _check_sums(d)
