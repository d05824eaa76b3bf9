"""Claim (issue 16): the device-free estimate (fake tensors) is within 10 % of the measured peak, training and
inference, for five real models; it agrees with the measured ``torchmem.estimate()`` within 10 %.

Per model (a CNN: ResNet-50; ViT-base; BERT-base; a Llama-style decoder from a config; GPT-2 — all built
from transformers configs, no weights, no torchvision), fp32, AdamW:

- **measured**: one real step after two warm-up steps. CUDA: ``torch.cuda.max_memory_allocated`` after
  ``reset_peak_memory_stats`` (absolute: weights, gradients, optimizer state, the batch, workspaces). CPU:
  torchmem's exact ledger (the model built inside it). Inference: a fresh model's second forward in eval
  mode under ``inference_mode``, before any training. The cuBLAS workspaces earlier models left are freed
  first, so each row holds its own, as a process running only that model would: the main thread's in
  inference, the main and the autograd thread's in training.
- **fake**: ``estimate_fake(factory, inputs, target=...)``'s allocated peak (allocator block rounding; on
  CUDA the H100's cuBLAS workspace; on the CPU a target without workspace).
- **measured estimate()**: ``torchmem.estimate(model, batch of 2, device=...)``: small real steps at 2, 4,
  then doubling up to half the row's batch (``estimate_probes`` in the JSON), extrapolated.
- **accelerate**: ``accelerate.commands.estimate``: ``calculate_maximum_sizes`` then
  ``estimate_training_usage(size, "float32")``'s peak (training), the weights' size (inference).
- **DeepSpeed ZeRO-2 formula** (implemented here from DeepSpeed's documented
  ``estimate_zero2_model_states_mem_needs``, one GPU, no offload: ``4 P + 16 P / gpus`` bytes; model
  states only; training only).

Run (GPU, < 5 min on an H100): ``PYTHONPATH=src python benchmarks/estimate_accuracy.py --device cuda``;
CPU (smaller configs): ``--device cpu``. Prints a table; writes ``$OUT/estimate_accuracy.json`` if ``$OUT``
is set (else ``--json PATH``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time
from collections.abc import Callable
from typing import Any

import torch

from torchmem.analysis.targets import Target, resolve_target
from torchmem.capture.fake import estimate_fake
from torchmem.capture.measure import estimate
from torchmem.devices import ledger

Factory = Callable[[], torch.nn.Module]
Batch = Callable[[int, str], Any]


def _models(small: bool) -> dict[str, tuple[Factory, Batch, int]]:
    from transformers import (
        BertConfig,
        BertForSequenceClassification,
        GPT2Config,
        GPT2LMHeadModel,
        LlamaConfig,
        LlamaForCausalLM,
        ResNetConfig,
        ResNetForImageClassification,
        ViTConfig,
        ViTForImageClassification,
    )

    img = 64 if small else 224
    seq = 128 if small else 256
    lseq = 128 if small else 512
    if small:
        resnet = ResNetConfig(
            embedding_size=32, hidden_sizes=[32, 64, 128, 256], depths=[1, 1, 1, 1], layer_type="bottleneck"
        )
        vit = ViTConfig(
            hidden_size=192,
            num_hidden_layers=4,
            num_attention_heads=3,
            intermediate_size=768,
            image_size=img,
            patch_size=16,
        )
        bert = BertConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024)
        llama = LlamaConfig(
            hidden_size=256,
            intermediate_size=688,
            num_hidden_layers=4,
            num_attention_heads=8,
            num_key_value_heads=4,
            vocab_size=8000,
            max_position_embeddings=512,
        )
        gpt2 = GPT2Config(n_embd=256, n_layer=4, n_head=4, vocab_size=8000, n_positions=512)
    else:
        resnet = ResNetConfig()  # ResNet-50
        vit = ViTConfig()  # ViT-base/16, 224
        bert = BertConfig()  # BERT-base
        llama = LlamaConfig(
            hidden_size=1024,
            intermediate_size=2816,
            num_hidden_layers=12,
            num_attention_heads=16,
            num_key_value_heads=8,
            vocab_size=32000,
            max_position_embeddings=2048,
        )
        gpt2 = GPT2Config()  # GPT-2 small (124M)
    for cfg in (resnet, vit, bert, llama, gpt2):
        cfg.attn_implementation = "sdpa"

    def pixels(bs: int, dev: str) -> Any:
        return {
            "pixel_values": torch.randn(bs, 3, img, img, device=dev),
            "labels": torch.zeros(bs, dtype=torch.long, device=dev),
        }

    def tokens(n: int, vocab: int) -> Batch:
        def make(bs: int, dev: str) -> Any:
            ids = torch.randint(0, vocab, (bs, n), device=dev)
            return {"input_ids": ids, "labels": ids}

        return make

    def cls_tokens(bs: int, dev: str) -> Any:
        ids = torch.randint(0, bert.vocab_size, (bs, seq), device=dev)
        return {"input_ids": ids, "labels": torch.zeros(bs, dtype=torch.long, device=dev)}

    return {
        "ResNet-50 (CNN)" if not small else "ResNet (CNN)": (
            lambda: ResNetForImageClassification(resnet),
            pixels,
            8 if small else 64,
        ),
        "ViT-base" if not small else "ViT": (
            lambda: ViTForImageClassification(vit),
            pixels,
            8 if small else 32,
        ),
        "BERT-base" if not small else "BERT": (
            lambda: BertForSequenceClassification(bert),
            cls_tokens,
            8 if small else 32,
        ),
        "Llama-style": (lambda: LlamaForCausalLM(llama), tokens(lseq, llama.vocab_size), 4 if small else 8),
        "GPT-2": (lambda: GPT2LMHeadModel(gpt2), tokens(lseq, gpt2.vocab_size), 4 if small else 8),
    }


def _loss(out: Any) -> torch.Tensor:
    return out.loss  # type: ignore[no-any-return]


def _measured(factory: Factory, batch: Batch, bs: int, dev: torch.device) -> tuple[int, int]:
    """(training peak, inference peak), absolute bytes (CUDA allocator / CPU ledger)."""
    gc.collect()
    cuda = dev.type == "cuda"
    if cuda:  # free the workspaces earlier models left (the autograd thread's among them)
        torch.cuda.synchronize()
        clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if clear is not None:
            clear()
        torch.cuda.empty_cache()
    with ledger().enabled() if not cuda else _null() as led:
        torch.manual_seed(0)
        model = factory().to(dev)
        x = batch(bs, dev.type)
        model.eval()
        if cuda:
            with torch.inference_mode():
                model(**x)  # warm-up: the main thread's cuBLAS workspace, as in any serving loop
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats(dev)
        else:
            led.reset_peak("cpu")
        with torch.inference_mode():
            model(**x)
        inf = torch.cuda.max_memory_allocated(dev) if cuda else led.peak("cpu")
        model.train()
        opt = torch.optim.AdamW(model.parameters())
        peak = 0
        for i in range(3):
            if i == 2:
                if cuda:
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats(dev)
                else:
                    led.reset_peak("cpu")
            loss = model(**x).loss
            loss.backward()
            del loss
            opt.step()
            opt.zero_grad(set_to_none=True)
            if i == 2:
                if cuda:
                    torch.cuda.synchronize()
                peak = torch.cuda.max_memory_allocated(dev) if cuda else led.peak("cpu")
        del model, opt, x
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return int(peak), int(inf)


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *a: Any) -> None:
        return None


def _accelerate(factory: Factory) -> tuple[int | None, int | None]:
    try:
        from accelerate import init_empty_weights
        from accelerate.commands.estimate import calculate_maximum_sizes, estimate_training_usage
    except ImportError:
        return None, None
    with init_empty_weights():
        model = factory()
    total, _largest = calculate_maximum_sizes(model)
    training = estimate_training_usage(int(total), "float32")
    return int(max(v for v in training.values() if v is not None)), int(total)


def _deepspeed_zero2(params: int, gpus: int = 1) -> int:
    """DeepSpeed's documented ZeRO-2 model-states formula (no offload): 4 P + 16 P / gpus bytes."""
    return 4 * params + int(16 * params / gpus)


def _pct(est: int | None, ref: int) -> str:
    return "n/a" if est is None else f"{100.0 * (est - ref) / ref:+.1f} %"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--json", default=None)
    ap.add_argument("--target", default="H100-80GB")
    args = ap.parse_args()
    dev = torch.device(args.device)
    small = dev.type == "cpu"
    torch.set_num_threads(max(1, min(os.cpu_count() or 1, 16)))
    tgt = resolve_target(args.target) if not small else Target("cpu", 1 << 40, 0, 0, 0)
    rows: list[dict[str, Any]] = []
    t_all = time.perf_counter()
    for name, (factory, batch, bs) in _models(small).items():
        t0 = time.perf_counter()
        peak_tr, peak_inf = _measured(factory, batch, bs, dev)
        t_meas = time.perf_counter() - t0
        t0 = time.perf_counter()
        fk = estimate_fake(
            factory,
            lambda b, batch=batch: batch(b, "cpu"),
            optimizer="adamw",
            batch_sizes=[bs],
            target=tgt,
            loss_fn=_loss,
            suggest=False,
        )
        t_fake = time.perf_counter() - t0
        fake_tr = fk.peak(bs, "training")
        fake_inf = fk.peak(bs, "inference")
        t0 = time.perf_counter()
        torch.manual_seed(0)
        model = factory().to(dev)
        me = estimate(
            model, batch(2, dev.type), optimizer="adamw", batch_sizes=[bs], device=dev, loss_fn=_loss
        )
        t_est = time.perf_counter() - t0
        params = sum(p.numel() for p in model.parameters())
        del model
        gc.collect()
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        acc_tr, acc_inf = _accelerate(factory)
        ds = _deepspeed_zero2(params)
        row = {
            "model": name,
            "batch": bs,
            "params": params,
            "measured_training": peak_tr,
            "measured_inference": peak_inf,
            "fake_training": fake_tr,
            "fake_inference": fake_inf,
            "estimate_training": me.peak(bs, "training"),
            "estimate_inference": me.peak(bs, "inference"),
            "estimate_probes": list(me.measured_at),
            "estimate_notes": list(me.notes),
            "accelerate_training": acc_tr,
            "accelerate_inference": acc_inf,
            "deepspeed_zero2_training": ds,
            "fake_seconds": round(t_fake, 2),
            "estimate_seconds": round(t_est, 2),
            "measure_seconds": round(t_meas, 2),
        }
        rows.append(row)
        print(f"{name}: done in {t_meas + t_fake + t_est:.1f} s", flush=True)
    mib = float(1 << 20)
    print()
    print(
        f"device {dev}, torch {torch.__version__}"
        + (f", {torch.cuda.get_device_name(dev)}" if dev.type == "cuda" else "")
    )
    head = (
        "| model | batch | mode | measured MiB | **fake MiB** | **fake err** | estimate() MiB | err | "
        "fake vs estimate() | accelerate MiB | err | DeepSpeed ZeRO-2 formula MiB | err |"
    )
    print(head)
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        for mode in ("training", "inference"):
            meas = r[f"measured_{mode}"]
            fake = r[f"fake_{mode}"]
            est = r[f"estimate_{mode}"]
            acc = r[f"accelerate_{mode}"]
            ds = r["deepspeed_zero2_training"] if mode == "training" else None
            agree = "n/a" if est is None or fake is None else f"{100.0 * (fake - est) / est:+.1f} %"
            print(
                f"| {r['model']} | {r['batch']} | {mode} | {meas / mib:.1f} | {fake / mib:.1f} | "
                f"{_pct(fake, meas)} | "
                f"{(est or 0) / mib:.1f} | {_pct(est, meas)} | {agree} | "
                f"{(acc or 0) / mib:.1f} | {_pct(acc, meas)} | "
                f"{'n/a' if ds is None else f'{ds / mib:.1f}'} | {_pct(ds, meas) if ds else 'n/a'} |"
            )
    print(f"\ntotal {time.perf_counter() - t_all:.1f} s")
    out = {"device": str(dev), "torch": torch.__version__, "rows": rows}
    path = args.json or (
        os.path.join(os.environ["OUT"], "estimate_accuracy.json") if os.environ.get("OUT") else None
    )
    if path:
        with open(path, "w") as fh:
            json.dump(out, fh, indent=1)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
