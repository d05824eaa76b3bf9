"""find_batch_size() on real models on the CPU, with real out-of-memory errors from torchmem.limit()."""

from __future__ import annotations

import gc
import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import torchmem
from fresh_python import run_fresh
from torchmem.actions.batch_size import (
    BatchSizeError,
    BatchSizeResult,
    FitArgumentError,
    find_batch_size,
    is_oom,
)
from torchmem.actions.batch_size.model import BoundaryModel
from torchmem.actions.batch_size.trials import Outcome, TrialMeter, left_behind
from torchmem.actions.limit import limit
from torchmem.devices import ledger

CAP = 24 << 20


@pytest.fixture(autouse=True, scope="module")
def _imports_frozen() -> Iterator[None]:
    """The objects alive when this file's tests start (torch, torch._dynamo, pytest: ~300,000) frozen out
    of the garbage collector while they run. Every search collects garbage before its first trial (and after
    a trial that leaves bytes behind), and each of those full collections walked all of them (0.15 s; 33 of
    them were 5 of this file's 15 CPU-s). What the tests make is collected as before; gc.unfreeze() after."""
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()


def _mlp(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 512),
        torch.nn.ReLU(),
        torch.nn.Linear(512, 10),
    )


def _train_step(model: torch.nn.Module) -> Callable[[int], None]:
    opt = torch.optim.AdamW(model.parameters())

    def step(bs: int) -> None:
        x = torch.randn(bs, 64)
        loss = torch.nn.functional.cross_entropy(model(x), torch.randint(0, 10, (bs,)))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def _true_max(step: Callable[[int], None], hi: int = 1 << 15) -> int:
    """The largest size that runs, by bisection with real OOMs (the reference, many trials)."""

    def ok(b: int) -> bool:
        try:
            step(b)
            return True
        except torch.OutOfMemoryError:
            return False

    lo = 0
    top = 1
    while top <= hi and ok(top):
        lo, top = top, top * 2
    while top - lo > 1:
        mid = (lo + top) // 2
        if ok(mid):
            lo = mid
        else:
            top = mid
    return lo


def _fits(step: Callable[[int], None], b: int) -> bool:
    try:
        step(b)
        return True
    except torch.OutOfMemoryError:
        return False


def test_finds_the_true_maximum_within_5_percent_in_few_trials() -> None:
    step = _train_step(_mlp())
    with limit(CAP, "cpu"):
        step(4)  # optimizer state exists, as in a real loop
        r = find_batch_size(step, device="cpu", margin=0.0)
        truth = _true_max(step)
    assert isinstance(r, BatchSizeResult)
    assert truth > 100
    assert 0.95 * truth <= r.batch_size <= truth
    assert len(r.trials) <= 6
    assert r.trials[-1].batch_size in {t.batch_size for t in r.trials}
    assert all(t.peak is not None for t in r.trials if t.ok)
    assert r.capacity == CAP
    assert r.metric == "ledger"
    d = r.to_dict()
    assert d["batch_size"] == r.batch_size and d["num_trials"] == len(r.trials)
    text = str(r)
    assert f"batch size {r.batch_size}" in text and "trial" in text


def test_margin_keeps_the_peak_under_the_budget() -> None:
    step = _train_step(_mlp())
    with limit(CAP, "cpu"):
        step(4)
        r0 = find_batch_size(step, device="cpu", margin=0.0)
        r = find_batch_size(step, device="cpu", margin=0.2)
    chosen = [t for t in r.trials if t.batch_size == r.batch_size and t.ok]
    assert chosen and r.budget is not None and r.capacity is not None
    assert chosen[-1].peak is not None and chosen[-1].peak <= r.budget < r.capacity
    assert r.batch_size < r0.batch_size
    # within the search's tolerance of the largest size whose peak fits the budget
    assert r.batch_size >= 0.9 * r0.batch_size * (r.budget - r.baseline) / (r.capacity - r.baseline)  # type: ignore[operator]


def test_eval_step_is_searched_separately_and_fits_more() -> None:
    model = _mlp()
    train = _train_step(model)

    def evaluate(bs: int) -> None:
        with torch.no_grad():
            model(torch.randn(bs, 64)).argmax(1)

    with limit(CAP, "cpu"):
        train(4)
        rt = find_batch_size(train, device="cpu", margin=0.0)
        re = find_batch_size(evaluate, device="cpu", margin=0.0, max_size=1 << 18)
    assert re.batch_size > 1.5 * rt.batch_size


def test_capacity_without_a_limit_counts_over_budget_trials_as_failures() -> None:
    step = _train_step(_mlp())
    step(4)
    r = find_batch_size(step, device="cpu", capacity=16 << 20, margin=0.0)
    assert r.true_max_upper_bound is None  # nothing ran out of memory: the budget decided
    fitting = [t for t in r.trials if t.ok]
    assert all(t.peak is not None and t.peak <= 16 << 20 for t in fitting)
    assert any(not t.ok and not t.oom for t in r.trials) or "model" in r.note


def test_oom_frames_are_cleared_between_trials() -> None:
    held: list[int] = []

    def step(bs: int) -> None:
        big = torch.ones(bs, 1024)  # alive in this frame when the next line runs out of memory
        more = torch.ones(bs, 2048)
        held.append(int(big.shape[0] + more.shape[0]))

    with limit(8 << 20, "cpu"):
        before = ledger().current("cpu")
        r = find_batch_size(step, device="cpu", margin=0.0, start=4096)
        assert ledger().current("cpu") == before
    assert r.true_max_upper_bound is not None
    assert any(t.oom for t in r.trials)
    assert 0.95 * (8 << 20) / (3 * 1024 * 4) <= r.batch_size <= (8 << 20) / (3 * 1024 * 4)


def test_a_search_ending_on_an_oom_in_backward_leaves_no_gradients_behind() -> None:
    # The GPU regression (4 MiB more allocated after a search with OOMs): the last call ran out of
    # memory in backward, after the last layer's gradients were accumulated; the step never reached its
    # zero_grad, so they stayed set (and would be added into the next real step's gradients).
    model = _mlp()
    step = _train_step(model)
    with limit(CAP, "cpu"):
        step(4)
        before = ledger().current("cpu")
        r = find_batch_size(step, device="cpu", margin=0.0, start=64, max_trials=4)
        after = ledger().current("cpu")
    searched = [t for t in r.trials if not t.note.startswith("closing run")]
    assert len(searched) == 4 and searched[-1].oom  # the scenario: the search's last call ran out
    assert [n for n, p in model.named_parameters() if p.grad is not None] == []
    assert after == before
    closing = r.trials[-1]
    assert closing.note.startswith("closing run") and closing.ok
    assert closing.batch_size == r.batch_size == max(t.batch_size for t in searched if t.ok)
    assert "closing run" in r.note and "max_trials=4" in r.note


def test_an_oom_before_any_gradient_needs_no_closing_run() -> None:
    train = _train_step(_mlp())

    def step(bs: int) -> None:
        if bs > 1000:
            torch.empty(bs, 1 << 16)  # runs out of memory before the step touches any gradient
        train(bs)

    with limit(CAP, "cpu"):
        train(4)
        before = ledger().current("cpu")
        r = find_batch_size(step, device="cpu", margin=0.0, start=64, max_trials=3)
        assert ledger().current("cpu") == before
    assert [t.ok for t in r.trials] == [True, True, False] and r.trials[-1].oom
    assert "closing run" not in r.note


@pytest.mark.parametrize("margin", [0.0, 0.1])
@pytest.mark.parametrize("start", [1, 4])
def test_size_one_running_out_in_backward_raises_whatever_the_margin(margin: float, start: int) -> None:
    # The GPU case: a Linear whose weight gradient alone cannot fit. The answer is only ever a size that
    # ran; here none did, so BatchSizeError (no closing run: nothing fit).
    model = torch.nn.Linear(1024, 1024)

    def step(bs: int) -> None:
        model(torch.randn(bs, 1024)).sum().backward()

    with limit(2 << 20, "cpu"), pytest.raises(BatchSizeError) as info:
        find_batch_size(step, device="cpu", start=start, margin=margin)
    e = info.value
    assert e.batch_size == 1 and all(t.oom and not t.ok for t in e.trials)
    assert len(e.trials) == start.bit_length()
    assert model.weight.grad is None


def test_other_errors_are_reraised_untouched_at_once() -> None:
    calls: list[int] = []
    err = KeyError("boom")

    def step(bs: int) -> None:
        calls.append(bs)
        raise err

    with pytest.raises(KeyError) as info:
        find_batch_size(step, device="cpu")
    assert info.value is err
    assert calls == [8]


def test_never_running_out_returns_max_size_with_a_note() -> None:
    step = _train_step(_mlp())
    with limit(1 << 30, "cpu"):
        r = find_batch_size(step, device="cpu", start=4, max_size=64, margin=0.0)
    assert r.batch_size == 64
    assert "max_size=64" in r.note
    assert r.true_max_upper_bound is None


def test_batch_size_one_running_out_is_a_clear_error() -> None:
    model = torch.nn.Linear(1024, 1024)

    def step(bs: int) -> None:
        model(torch.randn(bs, 1024)).sum().backward()

    with limit(1 << 20, "cpu"), pytest.raises(BatchSizeError) as info:
        find_batch_size(step, device="cpu", start=8)
    e = info.value
    assert "batch size 1" in str(e)
    assert e.batch_size == 1
    assert [t.batch_size for t in e.trials] == [8, 4, 2, 1]
    assert all(t.oom for t in e.trials)
    assert isinstance(e, torchmem.TorchmemError)


def test_a_search_that_runs_out_at_every_size_explains_the_oom() -> None:
    # Was always None: the diagnosis was looked up in torchmem.analysis.oom, where explain_oom is not.
    model = torch.nn.Linear(1024, 1024)

    def step(bs: int) -> None:
        model(torch.randn(bs, 1024)).sum().backward()  # the 4 MiB weight gradient passes the 1 MiB cap

    with limit(1 << 20, "cpu"), pytest.raises(BatchSizeError) as info:
        find_batch_size(step, device="cpu", start=4)
    d = info.value.diagnosis
    assert isinstance(d, torchmem.OOMDiagnosis)
    assert d.is_oom and d.parsed is not None and d.parsed.requested == 4 << 20
    assert d.kinds[0] == "too_large"
    cause = d.causes[0]
    assert cause.confidence == "high" and "torchmem.limit()" in cause.summary
    assert any(f.kind == "limit" for f in cause.fixes)
    assert model.weight.grad is None


def test_the_decorator_form_explains_the_oom_at_its_smallest_size() -> None:
    model = torch.nn.Linear(1024, 1024)

    @find_batch_size(starting_batch_size=1)
    def train(batch_size: int) -> None:
        model(torch.randn(batch_size, 1024)).sum().backward()

    with limit(1 << 20, "cpu"), pytest.raises(BatchSizeError) as info:
        train()
    e = info.value
    assert [t.batch_size for t in e.trials] == [1] and e.trials[0].oom
    assert isinstance(e.diagnosis, torchmem.OOMDiagnosis)
    assert e.diagnosis.kinds[0] == "too_large"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"start": 0},
        {"max_size": -1},
        {"start": 64, "max_size": 8},
        {"margin": 1.0},
        {"margin": -0.1},
        {"start": 2.5},
        {"max_trials": 0},
    ],
)
def test_bad_arguments(kwargs: dict[str, object]) -> None:
    with pytest.raises(FitArgumentError):
        find_batch_size(lambda bs: None, **kwargs)  # type: ignore[arg-type]


def test_no_function_is_a_clear_error() -> None:
    with pytest.raises(FitArgumentError):
        find_batch_size()


def test_is_oom_follows_the_cause_chain() -> None:
    try:
        try:
            with limit(1 << 10, "cpu"):
                torch.ones(1 << 12)
        except torch.OutOfMemoryError as e:
            raise RuntimeError("wrapped") from e
    except RuntimeError as outer:
        assert is_oom(outer)
    assert not is_oom(ValueError("not memory"))
    assert not is_oom(None)


def test_decorator_form_like_accelerate() -> None:
    sizes: list[int] = []

    @find_batch_size(starting_batch_size=8192)
    def train(batch_size: int, steps: int) -> int:
        sizes.append(batch_size)
        model = _mlp()
        opt = torch.optim.AdamW(model.parameters())
        for _ in range(steps):
            x = torch.randn(batch_size, 64)
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return batch_size

    with limit(CAP, "cpu"):
        got = train(3)
    assert sizes[0] == 8192
    assert got == sizes[-1] < 8192
    assert train.result is not None and train.result.batch_size == got  # type: ignore[attr-defined]
    with pytest.raises(FitArgumentError):
        train(64, 3)  # the batch size is the decorator's to pass


def test_decorator_form_returns_at_once_when_the_start_fits() -> None:
    @find_batch_size(starting_batch_size=16)
    def run(batch_size: int) -> str:
        return f"ran {batch_size}"

    assert run() == "ran 16"


def test_only_the_call_that_creates_optimizer_state_is_a_warm_up() -> None:
    step = _train_step(_mlp())  # no step beforehand: the first trial creates AdamW's state
    with limit(CAP, "cpu"):
        r = find_batch_size(step, device="cpu", margin=0.0)
        truth = _true_max(step)
    assert [t.note for t in r.trials].count("warm-up") == 1
    assert r.trials[0].note == "warm-up"
    assert 0.95 * truth <= r.batch_size <= truth
    assert len(r.trials) <= 6


def test_the_meter_measures_state_on_live_tensors() -> None:
    model = _mlp()
    step = _train_step(model)
    meter = TrialMeter(torch.device("cpu"))
    first, second = meter.call(step, 16), meter.call(step, 16)
    assert first.status == second.status == "ok"
    n_params = sum(p.numel() * p.element_size() for p in model.parameters())
    assert left_behind(first) >= 2 * n_params  # exp_avg and exp_avg_sq
    assert left_behind(second) == 0


# -- the pure decision, fed with a real H100 run (torch 2.11, 4 GiB torchmem.limit, the transformer
# train step of tests/gpu/test_cuda_fit.py with AdamW, warmed up before the search) -----------------
MiB = 1 << 20
GPU_CAP = 4 << 30
GPU_BASELINE = 346 * MiB  # reserved after empty_cache, before the first trial
GPU_PEAK_8 = 744488960  # reserved peak of the trial at 8 ("706.00 MiB")
GPU_PEAK_41 = round(2.31 * (1 << 30))  # reserved peak of the trial at 41 ("2.31 GiB")
GPU_TRUE_MAX = 82  # bisection with real out-of-memory errors


def _gpu_search(left8: int = 0, left41: int = 0) -> BoundaryModel:
    s = BoundaryModel(start=8, max_size=1 << 16, min_size=1, tolerance=0.02)
    s.record(8, True, False, GPU_PEAK_8, left8)
    s.record(41, True, False, GPU_PEAK_41, left41)
    return s


def test_reserved_bytes_the_cache_kept_are_not_state() -> None:
    # The root cause of the GPU failure: after the trial at 41 the caching allocator still held the
    # step's freed segments (reserved ~346 MiB -> ~2.3 GiB) though no tensor survived; that retained
    # cache was counted as state, added to the peak, and doubled the fitted slope.
    alloc = 300 * MiB
    out = Outcome(
        "ok",
        GPU_PEAK_41,
        GPU_BASELINE,
        GPU_BASELINE + 2025 * MiB,
        0.05,
        allocated_peak=2200 * MiB,
        allocated_before=alloc,
        allocated_after=alloc,
    )
    assert left_behind(out) == 0
    warm = Outcome(
        "ok",
        GPU_PEAK_8,
        GPU_BASELINE,
        GPU_BASELINE,
        0.02,
        allocated_before=alloc,
        allocated_after=alloc + 152 * MiB,
    )
    assert left_behind(warm) == 152 * MiB
    assert left_behind(Outcome("oom", None, GPU_BASELINE, GPU_BASELINE, 0.1)) == 0


def test_real_gpu_trials_lead_up_towards_the_true_maximum() -> None:
    s = _gpu_search()
    nxt = s.next_size(GPU_CAP, GPU_BASELINE, None, enforce=False)
    assert nxt is not None and 0.85 * GPU_TRUE_MAX <= nxt <= GPU_TRUE_MAX  # was: stop at 41
    assert s.line is not None
    a, b = s.line  # the model runs through the measured points (was: 111.64 MiB/bs, -187 MiB)
    assert abs(a + 8 * b - GPU_PEAK_8) < MiB and abs(a + 41 * b - GPU_PEAK_41) < MiB
    assert 49 * MiB < b < 52 * MiB


def test_a_model_that_contradicts_a_size_that_ran_never_stops_the_search() -> None:
    # The numbers the old code fitted (the cache taken for state): the corrected line puts the largest
    # size at 38, below 41, which ran. The search must go on upwards, not stop.
    s = _gpu_search(left8=364 * MiB, left41=2025 * MiB)
    nxt = s.next_size(GPU_CAP, GPU_BASELINE, None, enforce=False)
    assert nxt is not None and nxt > 41


def test_with_a_margin_the_real_gpu_trials_aim_at_the_budget() -> None:
    budget = int(GPU_CAP - 0.1 * (GPU_CAP - GPU_BASELINE))
    s = _gpu_search()
    nxt = s.next_size(budget, GPU_BASELINE, None, enforce=True)
    a, b = s.line  # type: ignore[misc]
    best = (budget - a) / b  # where the measured line reaches the budget
    assert nxt is not None and 0.95 * best <= nxt <= best


def _decide(
    reserved: Callable[[int], float],
    allocated: Callable[[int], float],
    runs: Callable[[int], bool],
    trials: int,
) -> list[tuple[int, bool]]:
    """The search's own decisions over given curves of peaks (the pure decision logic only)."""
    s = BoundaryModel(start=8, max_size=1 << 16, min_size=1, tolerance=0.02)
    size: int | None = 8
    seen: list[tuple[int, bool]] = []
    while size is not None and len(seen) < trials:
        ok = runs(size)
        peak = min(int(reserved(size)), GPU_CAP) if ok else None  # reserved never passes the cap
        s.record(size, ok, not ok, peak, 0, int(allocated(size)) if ok else None)
        seen.append((size, ok))
        size = s.next_size(GPU_CAP, GPU_BASELINE, 230 * MiB, enforce=False)
    return seen


@pytest.mark.parametrize("share", [0.0, 0.3, 0.7])
def test_decisions_reach_5_percent_of_the_maximum_in_5_trials(share: float) -> None:
    # Reserved from an empty cache: the line through the two real points. Allocated: a little less per
    # sample. What a size needs under the cap lies between the two (``share`` of the way up).
    slope = (GPU_PEAK_41 - GPU_PEAK_8) / 33

    def reserved(n: int) -> float:
        return GPU_PEAK_8 + (n - 8) * slope

    def allocated(n: int) -> float:
        return 230 * MiB + 0.88 * slope * n

    def runs(n: int) -> bool:
        return allocated(n) + share * (reserved(n) - allocated(n)) <= GPU_CAP

    truth = max(n for n in range(1, 200) if runs(n))
    seen = _decide(reserved, allocated, runs, 12)
    best_in_5 = max(n for n, ok in seen[:5] if ok)
    assert 0.95 * truth <= best_in_5 <= truth
    assert max(n for n, ok in seen if ok) >= 0.97 * truth
    assert len(seen) <= 8


# -- torch.distributed: two CPU ranks with different limits agree ------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank(rank: int, world: int, port: int, caps: list[int], out: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.set_num_threads(1)
        step = _train_step(_mlp())
        with limit(caps[rank], "cpu"):
            step(4)
            r = find_batch_size(step, device="cpu", margin=0.0)
            # within 5 % of this rank's own maximum: it runs here, and 5 % more does not
            within = _fits(step, r.batch_size) and not _fits(step, int(r.batch_size / 0.95) + 1)
        Path(f"{out}.{rank}").write_text(f"{r.batch_size} {int(within)} {r.world_size}")
    finally:
        dist.destroy_process_group()


# The two ranks are forked from a fresh interpreter that imported torch, torchmem, this file and
# torch._dynamo (which the first optimizer imports) once: each spawned rank imported them again. That
# interpreter has started no thread and no process group before the ranks' init_process_group. Each rank
# writes its answer to a file.
_RANKS = """
import sys
sys.path.insert(0, sys.argv[1])
import torch._dynamo
import torch.multiprocessing as mp
import test_batch_size as t
mp.start_processes(t._rank, args=(2, t._free_port(), [32 << 20, 16 << 20], sys.argv[2]), nprocs=2,
                   start_method="fork")
"""


def test_ranks_with_different_limits_agree_on_the_smaller_size(tmp_path: Path) -> None:
    out = tmp_path / "rank"
    proc = run_fresh("-c", _RANKS, str(Path(__file__).parent), str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = [[int(v) for v in (tmp_path / f"rank.{r}").read_text().split()] for r in (0, 1)]
    (b0, within0, w0), (b1, within1, w1) = res
    assert w0 == w1 == 2
    assert b0 == b1  # every rank returns the same size
    assert within1 == 1  # ... within 5 % of the maximum of rank 1, which has the smaller limit
    assert within0 == 0  # ... which is well below what rank 0 alone could run
