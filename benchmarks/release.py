"""Benchmark: freeing a training run's memory — torchmem.release vs accelerate vs del/gc/empty_cache.

Each method runs in a fresh process on the same scenario: an 8×Linear(2048) model, AdamW with state, an LR
scheduler, gradients, a dict of outputs that still holds its autograd graph, and a caught exception whose
frames hold 1 GiB of activations — all still referenced by the caller, as in a notebook. Printed: allocated,
reserved and NVML process usage after, bytes freed, wall time. Then the time of ``release()`` against one
``gc.collect()`` of a heap of 1M Python objects (target: <= 1.5x).

    PYTHONPATH=src python3 benchmarks/release.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

SCENARIO = textwrap.dedent(
    """
    import gc, json, os, sys, time, torch
    sys.path.insert(0, os.environ["TORCHMEM_SRC"])
    import torchmem
    method = sys.argv[1]
    dev = torch.device("cuda", 0)
    torch.cuda.init(); torch.cuda.synchronize()
    def proc():
        s = torchmem.stats(dev)
        return s.process_used
    base_alloc = torch.cuda.memory_allocated(dev)
    base_proc = proc()

    model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(8)]).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, 10)
    for _ in range(2):
        loss = model(torch.randn(256, 2048, device=dev)).square().mean()
        loss.backward(); opt.step(); sched.step()
    outputs = {"logits": model(torch.randn(256, 2048, device=dev)), "loss": loss}
    def failing_step():
        activations = torch.empty(1 << 30, dtype=torch.uint8, device=dev)
        raise RuntimeError("simulated failure")
    try:
        failing_step()
    except RuntimeError as e:
        err = e
    torch.cuda.synchronize()
    before_alloc = torch.cuda.memory_allocated(dev)
    before_res = torch.cuda.memory_reserved(dev)
    t0 = time.perf_counter()
    if method == "torchmem.release":
        report = torchmem.release(model, opt, sched, outputs, err)
    elif method == "accelerate.release_memory":
        from accelerate.utils import release_memory
        release_memory(model, opt, sched, outputs, err)   # returns Nones; the caller still holds its names
    elif method == "gc + empty_cache":
        gc.collect(); torch.cuda.empty_cache()
    elif method == "del all + gc + empty_cache":
        del model, opt, sched, outputs, err, loss
        gc.collect(); torch.cuda.empty_cache()
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    print("RESULT " + json.dumps({
        "method": method, "seconds": dt,
        "before_alloc": before_alloc - base_alloc, "before_reserved": before_res,
        "after_alloc": torch.cuda.memory_allocated(dev) - base_alloc,
        "after_reserved": torch.cuda.memory_reserved(dev),
        "proc_before_model": base_proc, "proc_after": proc(),
    }))
    """
)

GC_VS_RELEASE = textwrap.dedent(
    """
    import gc, json, os, sys, time, torch
    sys.path.insert(0, os.environ["TORCHMEM_SRC"])
    import torchmem
    dev = torch.device(sys.argv[1])
    heap = [{"k": [i, str(i)], "o": object()} for i in range(250_000)]  # ~1M Python objects
    def build():
        m = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(8)]).to(dev)
        o = torch.optim.AdamW(m.parameters()); m(torch.randn(8, 512, device=dev)).sum().backward(); o.step()
        return m, o
    m, o = build()
    torchmem.release(build()[0])  # warm: backends, NVML
    gcs, rels = [], []
    for _ in range(5):  # interleaved, same heap state before each: a fresh model + optimizer
        m, o = build()
        t0 = time.perf_counter(); gc.collect(); gcs.append(time.perf_counter() - t0)
        m, o = build()
        t0 = time.perf_counter(); torchmem.release(m, o); rels.append(time.perf_counter() - t0)
    med = lambda xs: sorted(xs)[len(xs) // 2]
    print("RESULT " + json.dumps({"objects": len(gc.get_objects()), "gc": med(gcs), "release": med(rels)}))
    """
)


def _run(code: str, *args: str) -> dict[str, float | str]:
    env = dict(os.environ)
    env["TORCHMEM_SRC"] = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
    out = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, check=False
    )
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])  # type: ignore[no-any-return]
    raise RuntimeError(f"{args}: no result\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")


def mib(n: float | str | None) -> str:
    return "n/a" if n is None or isinstance(n, str) else f"{n / 2**20:9.1f}"


def main() -> int:
    import torch

    rows = []
    if torch.cuda.is_available():
        methods = [
            "torchmem.release",
            "accelerate.release_memory",
            "gc + empty_cache",
            "del all + gc + empty_cache",
        ]
        for m in methods:
            rows.append(_run(SCENARIO, m))
        print(
            f"release — {torch.cuda.get_device_name(0)}, torch {torch.__version__}; "
            "MiB, the caller keeps its names"
        )
        print(
            f"{'method':<28} {'held':>9} {'alloc after':>11} {'freed':>9} {'reserved':>9} "
            f"{'proc before':>11} {'proc after':>10} {'ms':>8}"
        )
        for r in rows:
            freed = float(r["before_alloc"]) - float(r["after_alloc"])
            print(
                f"{r['method']!s:<28} {mib(r['before_alloc'])} {mib(r['after_alloc']):>11} {mib(freed)} "
                f"{mib(r['after_reserved'])} {mib(r['proc_before_model']):>11} {mib(r['proc_after']):>10} "
                f"{float(r['seconds']) * 1000:8.1f}"
            )
    device = "cuda" if torch.cuda.is_available() else "cpu"
    g = _run(GC_VS_RELEASE, device)
    ratio = float(g["release"]) / float(g["gc"])
    print(
        f"release() {float(g['release']) * 1000:.1f} ms vs gc.collect() {float(g['gc']) * 1000:.1f} ms "
        f"with {g['objects']} objects on {device}: ratio {ratio:.2f} (target <= 1.5): "
        f"{'PASS' if ratio <= 1.5 else 'FAIL'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
