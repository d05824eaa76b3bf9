"""release() on CUDA: back to the baseline, proven by the allocator and NVML (run on the device)."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

MiB = 1 << 20
SRC = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "src"))

SCENARIO = textwrap.dedent(
    """
    import json, sys, torch
    import torchmem
    dev = torch.device("cuda", 0)
    torch.cuda.init(); torch.cuda.synchronize()
    floor = torchmem.stats(dev)
    base_alloc = torch.cuda.memory_allocated(dev)

    model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(8)]).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, 10)
    for _ in range(2):
        loss = model(torch.randn(256, 2048, device=dev)).square().mean()
        loss.backward(); opt.step(); sched.step()
    outputs = {"logits": model(torch.randn(256, 2048, device=dev)), "loss": loss}
    def failing_step():
        activations = torch.empty(1 << 31, dtype=torch.uint8, device=dev)  # 2 GiB
        raise RuntimeError("boom")
    try:
        failing_step()
    except RuntimeError as e:
        err = e
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated(dev) - base_alloc
    w = model[0].weight
    report = torchmem.release(model, opt, sched, outputs, err)
    after = torchmem.stats(dev)
    print("RESULT " + json.dumps({
        "held": held, "base_alloc": base_alloc,
        "alloc_after": torch.cuda.memory_allocated(dev), "reserved_after": torch.cuda.memory_reserved(dev),
        "proc_floor": floor.process_used, "proc_after": after.process_used, "context": after.context,
        "freed": report.freed_bytes, "remaining": report.remaining_bytes, "errors": list(report.errors),
        "shell": list(w.shape), "same_param": model[0].weight is w,
        "dev_proc_after": [d.process_after for d in report.devices],
        "dev_proc_before": [d.process_before for d in report.devices],
        "dev_labels": [d.device for d in report.devices],
    }))
    print(report)
    """
)

OFFLOAD = textwrap.dedent(
    """
    import hashlib, json, torch
    import torchmem
    dev = torch.device("cuda", 0)
    layers = [torch.nn.Linear(512, 512), torch.nn.BatchNorm1d(512), torch.nn.Linear(512, 8)]
    model = torch.nn.Sequential(*layers).to(dev)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(16, 512, device=dev)).sum().backward(); opt.step()
    def digest(ts):
        h = hashlib.sha256()
        for t in ts:
            h.update(t.detach().cpu().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
        return h.hexdigest()
    params = list(model.parameters())
    state = [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]
    before = (digest(params), digest([p.grad for p in params]), digest(list(model.buffers())), digest(state))
    dtypes = [p.dtype for p in params]; rg = [p.requires_grad for p in params]
    report = torchmem.release(model, opt, offload=True)
    after = (digest(params), digest([p.grad for p in params]), digest(list(model.buffers())),
             digest([v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]))
    ok_identity = all(a is b for a, b in zip(params, model.parameters()))
    model(torch.randn(4, 512)).sum().backward(); opt.step()  # keeps working on the CPU
    print("RESULT " + json.dumps({
        "same": before == after, "identity": ok_identity,
        "dtypes": [p.dtype for p in params] == dtypes,
        "requires_grad": [p.requires_grad for p in params] == rg,
        "devices": sorted({str(p.device) for p in params}), "alloc_after": torch.cuda.memory_allocated(dev),
        "offloaded": report.offloaded_bytes, "remaining": report.remaining_bytes,
        "live_cuda": torchmem.live_tensors("cuda:0", holders=False).total,
    }))
    print(report)
    """
)


def _run(code: str) -> dict[str, object]:
    env = dict(os.environ)
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])  # type: ignore[no-any-return]
    raise AssertionError(out.stdout[-3000:] + out.stderr[-3000:])


def test_release_returns_allocated_reserved_and_process_usage_to_the_baseline() -> None:
    r = _run(SCENARIO)
    assert r["errors"] == []
    assert int(r["held"]) > 2 * 1024 * MiB  # model + AdamW + grads + outputs' graph + 2 GiB in the exception
    assert abs(int(r["alloc_after"]) - int(r["base_alloc"])) <= MiB
    assert r["reserved_after"] == 0
    assert r["remaining"] == 0
    assert r["shell"] == [0] and r["same_param"] is True
    # NVML: back to the floor before the model (context + what cuBLAS/cuRAND loaded), within 2 MiB + kernels.
    assert int(r["proc_after"]) - int(r["proc_floor"]) < 256 * MiB
    # The report's own NVML reading, taken right after empty_cache(), may lag the driver; it must still drop.
    cuda_row = r["dev_labels"].index("cuda:0")
    assert int(r["dev_proc_after"][cuda_row]) < int(r["dev_proc_before"][cuda_row])


def test_offload_keeps_exact_values_identity_dtypes_and_frees_the_gpu() -> None:
    r = _run(OFFLOAD)
    assert r["same"] is True
    assert r["identity"] is True and r["dtypes"] is True and r["requires_grad"] is True
    assert r["devices"] == ["cpu"]
    assert r["remaining"] == 0 and r["live_cuda"] == 0  # no tensor is left on the GPU
    # What the allocator still holds is not a tensor: the autograd thread's cuBLAS workspace (2 MiB here).
    assert int(r["alloc_after"]) <= 4 * MiB
    assert int(r["offloaded"]) > 0


def test_live_tensors_on_cuda_reconcile_with_the_allocator() -> None:
    import torchmem

    torch.cuda.synchronize()
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.LayerNorm(1024)).cuda()
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(64, 1024, device="cuda")).sum().backward()
    opt.step()
    kept = model(torch.randn(64, 1024, device="cuda")).sum()  # a graph: saved activations only autograd holds
    torch.cuda.synchronize()
    gc.collect()  # earlier tests' garbage (a compiled module's cycles), which a later collection would free
    r = torchmem.live_tensors("cuda:0")
    assert r.allocated == torch.cuda.memory_allocated(0)
    assert r.unexplained == r.allocated - r.total
    assert r.rounding is not None and 0 <= r.rounding <= r.unexplained
    params = sum(p.untyped_storage().nbytes() for p in model.parameters())
    assert r.by_category["parameter"] >= params
    assert r.by_category["gradient"] >= params
    assert r.by_category["optimizer state"] >= 2 * params
    assert r.by_category.get("saved for backward", 0) >= 64 * 1024 * 4
    # What no tensor explains is small: cuBLAS workspaces and block rounding.
    assert r.unexplained < 128 * MiB
    assert any(t.holder for t in r.tensors)
    del kept


def test_printed_live_tensors_of_a_transformers_model_name_each_weight_by_its_module() -> None:
    """A newcomer's ``print(torchmem.live_tensors())`` after a few AdamW steps of a Hugging Face model, its
    last loss kept: each weight, gradient and optimizer state is listed under its module's name, with no
    'held by' line pointing at the loss's graph (which references every weight too)."""
    transformers = pytest.importorskip("transformers")
    import torchmem

    cfg = transformers.GPT2Config(n_layer=2, n_head=4, n_embd=256, vocab_size=1000, n_positions=128)
    model = transformers.GPT2LMHeadModel(cfg).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for _ in range(3):
        ids = torch.randint(0, 1000, (4, 64), device="cuda")
        loss = model(ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    r = torchmem.live_tensors("cuda:0")
    text = str(r)
    mine = [t for t in r.tensors if t.category in ("parameter", "gradient", "optimizer state")]
    assert len(mine) >= 3 * len(list(model.parameters())) - 2, text  # tied embeddings share a storage
    assert all(t.name and t.holder == t.name for t in mine), [t for t in mine if t.holder != t.name][:3]
    assert "grad_fn" not in "\n".join(line for line in text.splitlines() if "held by" in line), text
    assert r.allocated == torch.cuda.memory_allocated(0) and r.unexplained == r.allocated - r.total
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "live_tensors_gpt2.txt"), "w") as f:
            f.write(text + "\n")
    del loss, opt, model


def test_cuda_graph_pools_are_reset_and_other_devices_left_alone() -> None:
    import torchmem

    lin = torch.nn.Linear(1024, 1024).cuda()
    static_in = torch.randn(512, 1024, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            lin(static_in)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = lin(static_in)
    graph.replay()
    torch.cuda.synchronize()
    cpu_t = torch.ones(100)
    holder = {"graph": graph, "lin": lin, "in": static_in, "out": static_out, "cpu": cpu_t}
    reserved_before = torch.cuda.memory_reserved(0)
    report = torchmem.release(holder, device="cuda:0")
    assert any("CUDA graph" in a for a in report.actions)
    assert cpu_t.numel() == 100 and any("on cpu" in s for s in report.skipped)
    assert static_out.numel() == 0 and lin.weight.numel() == 0
    assert torch.cuda.memory_reserved(0) < reserved_before
    assert report.errors == ()
