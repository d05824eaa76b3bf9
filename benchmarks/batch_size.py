"""Claim: torchmem.find_batch_size finds the largest batch size that fits within 5 % in <= 5 trials.

Same real step (a small transformer's training step), same memory limit (torchmem.limit: 4 GiB on CUDA,
64 MiB on the CPU), one run: torchmem.find_batch_size vs accelerate's find_executable_batch_size (x0.9 per
OOM from a generous start) vs Lightning's BatchSizeFinder binsearch algorithm (doubling from 2, then
bisection; re-implemented here because the real one needs a Trainer — its loop below follows
lightning/pytorch/tuner/batch_size_scaling.py `_run_binsearch_scaling`, and uses lightning's own
is_oom_error / garbage_collection_cuda where lightning is installed). The true maximum comes from an
exhaustive bisection with real OOMs.

Run: PYTHONPATH=src python3 benchmarks/batch_size.py  [--cpu]
"""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Callable
from typing import Any

import torch

from torchmem.actions.batch_size import find_batch_size, is_oom
from torchmem.actions.limit import limit


def make_step(dev: torch.device, cpu: bool) -> Callable[[int], None]:
    torch.manual_seed(0)
    d, layers, seq = (64, 2, 32) if cpu else (512, 6, 256)
    layer = torch.nn.TransformerEncoderLayer(d, 8, 4 * d, batch_first=True, dropout=0.0)
    model = torch.nn.Sequential(
        torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False), torch.nn.Linear(d, 10)
    )
    model = model.to(dev)
    opt = torch.optim.AdamW(model.parameters())

    def step(bs: int) -> None:
        x = torch.randn(bs, seq, d, device=dev)
        y = torch.randint(0, 10, (bs,), device=dev)
        loss = torch.nn.functional.cross_entropy(model(x).mean(1), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def cleanup(dev: torch.device) -> None:
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def runs(step: Callable[[int], None], dev: torch.device, bs: int) -> bool:
    try:
        step(bs)
        return True
    except Exception as e:
        if not is_oom(e):
            raise
        import traceback

        traceback.clear_frames(e.__traceback__)
        del e
        cleanup(dev)
        return False


def true_max(step: Callable[[int], None], dev: torch.device) -> int:
    lo, hi = 0, 1
    while runs(step, dev, hi):
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if runs(step, dev, mid):
            lo = mid
        else:
            hi = mid
    return lo


def accelerate_search(step: Callable[[int], None], dev: torch.device, start: int) -> tuple[int, int, str]:
    calls = [0]
    try:
        from accelerate.utils import find_executable_batch_size

        label = "accelerate find_executable_batch_size"

        @find_executable_batch_size(starting_batch_size=start)  # type: ignore[misc]
        def run(batch_size: int) -> int:
            calls[0] += 1
            step(batch_size)
            return batch_size

        return int(run()), calls[0], label
    except ImportError:  # not installed here: the same loop (x0.9 per OOM), re-implemented
        bs = start
        while bs > 0:
            calls[0] += 1
            if runs(step, dev, bs):
                return bs, calls[0], "accelerate-style x0.9 (re-implemented: not installed)"
            bs = int(bs * 0.9)
        return 0, calls[0], "accelerate-style x0.9 (re-implemented: not installed)"


def lightning_binsearch(
    step: Callable[[int], None],
    dev: torch.device,
    init_val: int = 2,
    max_trials: int = 25,
    margin: float = 0.05,
) -> tuple[int, int, str]:
    try:
        from lightning.pytorch.utilities.memory import garbage_collection_cuda, is_oom_error

        label = "Lightning binsearch (algorithm; lightning's OOM test)"
    except ImportError:
        is_oom_error, label = is_oom, "Lightning binsearch (algorithm; torchmem's OOM test)"

        def garbage_collection_cuda() -> None:
            cleanup(dev)

    steps_per_trial = 3  # BatchSizeFinder default: each trial runs 3 training steps
    new_size, low, high, count, calls, attempts = init_val, 1, None, 0, 0, 0
    last_ok = new_size
    while True:
        garbage_collection_cuda()
        attempts += 1
        try:
            for _ in range(steps_per_trial):
                calls += 1
                step(new_size)
            last_ok = new_size
            count += 1
            if count >= max_trials:
                new_size = last_ok
                break
            low = new_size
            if high:
                if high - low <= 1:
                    break
                new_size = (high + low) // 2
            else:
                new_size = int(new_size * 2.0)
        except RuntimeError as exception:
            if is_oom_error(exception):
                import traceback

                traceback.clear_frames(exception.__traceback__)
                del exception
                garbage_collection_cuda()
                high = new_size
                new_size = (high + low) // 2
                if high - low <= 1:
                    break
            else:
                raise
    if margin > 0:
        new_size = max(1, int(new_size * (1 - margin)))
    return new_size, attempts, label + f"; {calls} steps in all"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpu", action="store_true", help="run on the CPU even where CUDA is available")
    args = ap.parse_args()
    cpu = args.cpu or not torch.cuda.is_available()
    dev = torch.device("cpu") if cpu else torch.device("cuda", 0)
    cap = (64 << 20) if cpu else (4 << 30)
    rows: list[tuple[str, Any, float, int]] = []
    with limit(cap, dev):
        step = make_step(dev, cpu)
        step(2)  # optimizer state and workspaces exist, as in a real loop
        cleanup(dev)
        t = time.perf_counter()
        truth = true_max(step, dev)
        t_truth = time.perf_counter() - t

        cleanup(dev)
        t = time.perf_counter()
        r = find_batch_size(step, device=dev, margin=0.0)
        rows.append(
            ("torchmem.find_batch_size (margin=0)", len(r.trials), time.perf_counter() - t, r.batch_size)
        )
        cleanup(dev)
        t = time.perf_counter()
        r10 = find_batch_size(step, device=dev)
        rows.append(
            (
                "torchmem.find_batch_size (margin=0.1)",
                len(r10.trials),
                time.perf_counter() - t,
                r10.batch_size,
            )
        )

        cleanup(dev)
        t = time.perf_counter()
        start = 1 << max(1, (2 * truth).bit_length())  # a generous guess above the truth
        got, calls, label = accelerate_search(step, dev, start)
        rows.append((f"{label} (start {start})", calls, time.perf_counter() - t, got))

        cleanup(dev)
        t = time.perf_counter()
        got, trials, label = lightning_binsearch(step, dev)
        rows.append((label, trials, time.perf_counter() - t, got))

    print(f"device {dev}, limit {cap >> 20} MiB, step: transformer train step (AdamW)")
    print(f"true maximum (bisection with real OOMs): {truth}  ({t_truth:.2f} s)")
    print("| method | trials | wall s | chosen | chosen / true max |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, trials, secs, size in rows:
        print(f"| {name} | {trials} | {secs:.2f} | {size} | {size / truth:.3f} |")
    for name, res in (("margin=0", r), ("margin=0.1", r10)):
        print()
        print(f"torchmem.find_batch_size ({name}):")
        print(res)
        print(f"  band (reserved line, allocated line reach the budget): {res.extra.get('band')}")
        for t in res.trials:
            print(
                f"    {t.batch_size:>6}  ok={t.ok!s:<5} oom={t.oom!s:<5} peak={t.peak} "
                f"allocated_peak={t.allocated_peak}  {t.note}"
            )


if __name__ == "__main__":
    main()
