"""Claim (issues 16, 25): the device-free estimate (fake tensors) is within 5 % of the measured peak, training
and inference, for the documented models and for those outside the first table (T5, LSTM/GRU language
models, GPT-2 with dropout and with activation checkpointing); it agrees with the measured
``torchmem.estimate()``.

Per case (all built from transformers configs or torch.nn, random weights, no downloads), fp32, AdamW:

- **measured**: one real step after two warm-up steps. CUDA: ``torch.cuda.max_memory_allocated`` after
  ``reset_peak_memory_stats`` (absolute: weights, gradients, optimizer state, the batch, workspaces), per
  phase (forward + loss, backward, optimizer step), with the bytes saved for backward
  (``saved_tensors_hooks``, each storage once, parameters excluded) and the allocator's requested-bytes
  peak (the same peak without its block rounding: what the fake ledger's 512-byte rounding stands in for).
  CPU: torchmem's exact ledger (the model built inside it). Inference: a fresh model's second forward in
  eval mode under ``inference_mode``, before any training. The cuBLAS workspaces earlier cases left are
  freed first, so each row holds its own, as a process running only that model would.
- **fake**: ``estimate_fake(factory, inputs, target=...)``'s allocated peak, and its per-phase figures.
- **measured estimate()** (``--with-estimate``): ``torchmem.estimate(model, batch of 2, device=...)``.
- **accelerate** / **DeepSpeed ZeRO-2 formula** (``--with-estimate``): as in issue 16's table.
- **cuDNN recurrent layers** (CUDA): the reserve space ``_cudnn_rnn`` keeps for backward (read from its
  saved tensors) against the formula the fake run uses (``capture.fake.kernels._cudnn_reserve_bytes``), and
  what its forward and backward hold transiently (workspaces, seq-first copies), for a few LSTM/GRU/RNN
  shapes.

Every case is caught on its own: one that fails prints its error and the others go on.

Run (GPU, about 3 min on an H100): ``PYTHONPATH=src python3 benchmarks/estimate_accuracy.py --out
$OUT/est.json``; CPU (smaller configs): ``--device cpu``; ``--only t5,lstm`` picks cases by name.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from torchmem.analysis.targets import Target, resolve_target
from torchmem.capture.fake import estimate_fake
from torchmem.capture.fake.kernels import _CUDNN_DROPOUT_STATE, _cudnn_reserve_bytes
from torchmem.capture.fake.plan import _blocks, _checkpointed
from torchmem.devices import ledger

Factory = Callable[[], torch.nn.Module]
Batch = Callable[[int, str], Any]
_MiB = float(1 << 20)


@dataclass
class Case:
    """One row pair of the table: a model, its batch, and how it runs."""

    name: str
    factory: Factory
    batch: Batch
    bs: int
    checkpoint: bool = False  # activation checkpointing of every repeated block (non-reentrant)
    key: str = ""  # for --only
    generate: int = 0  # also a greedy generate() of this many new tokens after the prompt (inference)


class RNNLM(torch.nn.Module):
    """A language model on a recurrent core: embedding, an LSTM or GRU (batch first), a vocabulary head,
    the cross-entropy loss on the shifted tokens."""

    def __init__(self, vocab: int, d: int, hidden: int, layers: int, cell: str = "LSTM", p: float = 0.2):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, d)
        self.rnn = getattr(torch.nn, cell)(d, hidden, num_layers=layers, batch_first=True, dropout=p)
        self.drop = torch.nn.Dropout(p)
        self.head = torch.nn.Linear(hidden, vocab)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> Any:
        h, _ = self.rnn(self.drop(self.emb(input_ids)))
        logits = self.head(self.drop(h))
        if labels is None:
            return {"logits": logits}
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
        return {"loss": loss, "logits": logits}


def _cases(small: bool) -> list[Case]:
    from transformers import (
        BertConfig,
        BertForSequenceClassification,
        GPT2Config,
        GPT2LMHeadModel,
        LlamaConfig,
        LlamaForCausalLM,
        ResNetConfig,
        ResNetForImageClassification,
        T5Config,
        T5ForConditionalGeneration,
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
        t5 = T5Config(d_model=128, d_ff=512, d_kv=32, num_layers=2, num_heads=4, vocab_size=4000)
        rnn = {"vocab": 4000, "d": 128, "hidden": 256, "layers": 2}
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
        gpt2 = GPT2Config()  # GPT-2 small (124M), dropout 0.1 (attention, residual, embedding)
        t5 = T5Config()  # T5-small: 6+6 layers, d_model 512, 8 heads, 32128 tokens
        rnn = {"vocab": 10000, "d": 512, "hidden": 1024, "layers": 2}
    t5.decoder_start_token_id = 0  # t5-small's config.json sets it; T5Config() may not
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

    enc, dec = (64, 32) if small else (256, 128)

    def seq2seq(bs: int, dev: str) -> Any:
        return {
            "input_ids": torch.randint(0, t5.vocab_size, (bs, enc), device=dev),
            "labels": torch.randint(0, t5.vocab_size, (bs, dec), device=dev),
        }

    rseq = 64 if small else 256
    return [
        Case(
            "ResNet-50 (CNN)" if not small else "ResNet (CNN)",
            lambda: ResNetForImageClassification(resnet),
            pixels,
            8 if small else 64,
            key="resnet",
        ),
        Case(
            "ViT-base" if not small else "ViT",
            lambda: ViTForImageClassification(vit),
            pixels,
            8 if small else 32,
            key="vit",
        ),
        Case(
            "BERT-base" if not small else "BERT",
            lambda: BertForSequenceClassification(bert),
            cls_tokens,
            8 if small else 32,
            key="bert",
        ),
        Case(
            "Llama-style",
            lambda: LlamaForCausalLM(llama),
            tokens(lseq, llama.vocab_size),
            4 if small else 8,
            key="llama",
            generate=32 if small else 256,
        ),
        Case(
            "GPT-2",
            lambda: GPT2LMHeadModel(gpt2),
            tokens(lseq, gpt2.vocab_size),
            4 if small else 8,
            key="gpt2",
            generate=32 if small else 256,
        ),
        Case(
            "GPT-2 checkpointed",
            lambda: GPT2LMHeadModel(gpt2),
            tokens(lseq, gpt2.vocab_size),
            4 if small else 8,
            checkpoint=True,
            key="gpt2-ckpt",
        ),
        Case(
            "T5-small" if not small else "T5",
            lambda: T5ForConditionalGeneration(t5),
            seq2seq,
            4 if small else 16,
            key="t5",
        ),
        Case(
            "T5-small checkpointed" if not small else "T5 checkpointed",
            lambda: T5ForConditionalGeneration(t5),
            seq2seq,
            4 if small else 16,
            checkpoint=True,
            key="t5-ckpt",
        ),
        Case(
            "LSTM LM (2 layers)",
            lambda: RNNLM(**rnn),
            tokens(rseq, rnn["vocab"]),
            8 if small else 32,
            key="lstm",
        ),
        Case(
            "GRU LM (2 layers)",
            lambda: RNNLM(**rnn, cell="GRU"),
            tokens(rseq, rnn["vocab"]),
            8 if small else 32,
            key="gru",
        ),
    ]


def _loss(out: Any) -> torch.Tensor:
    return out["loss"] if isinstance(out, dict) else out.loss  # type: ignore[no-any-return]


def _checkpoint_blocks(model: torch.nn.Module) -> None:
    """The fake run's checkpointing on the real model: every repeated block, non-reentrant."""
    for name in _blocks(model):
        _checkpointed(model.get_submodule(name))


def _accepts_use_cache(model: torch.nn.Module) -> bool:
    import inspect

    try:
        return "use_cache" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


class _Saved:
    """Bytes saved for backward in one forward: each storage once, the model's parameters excluded."""

    def __init__(self, exclude: set[int]) -> None:
        self.exclude = exclude
        self.seen: dict[int, int] = {}

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        try:
            st = t.untyped_storage()
            key = st.data_ptr()
            if key and key not in self.exclude:
                self.seen[key] = int(st.nbytes())
        except Exception:
            pass
        return t

    @staticmethod
    def unpack(t: torch.Tensor) -> torch.Tensor:
        return t


def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _measured(case: Case, dev: torch.device) -> dict[str, Any]:
    """Training and inference peaks (absolute bytes), training per phase: the CUDA allocator's or the CPU
    ledger's figures."""
    gc.collect()
    cuda = dev.type == "cuda"
    if cuda:  # free the workspaces earlier cases left (the autograd thread's among them)
        torch.cuda.synchronize()
        clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if clear is not None:
            clear()
        torch.cuda.empty_cache()
    out: dict[str, Any] = {}
    with ledger().enabled() if not cuda else _null() as led:

        def reset() -> None:
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats(dev)
            else:
                led.reset_peak("cpu")

        def peak() -> int:
            _sync(dev)
            return int(torch.cuda.max_memory_allocated(dev) if cuda else led.peak("cpu"))

        def now() -> int:
            _sync(dev)
            return int(torch.cuda.memory_allocated(dev) if cuda else led.current("cpu"))

        torch.manual_seed(0)
        model = case.factory().to(dev)
        x = case.batch(case.bs, dev.type)
        model.eval()
        if cuda:
            with torch.inference_mode():
                model(**x)  # warm-up: the main thread's cuBLAS workspace, as in any serving loop
        reset()
        with torch.inference_mode():
            model(**x)
        out["inference"] = peak()
        if case.checkpoint:
            _checkpoint_blocks(model)
            if _accepts_use_cache(model):
                x = {**x, "use_cache": False}
        model.train()
        opt = torch.optim.AdamW(model.parameters())
        own = {p.untyped_storage().data_ptr() for p in model.parameters()}
        for i in range(3):
            last = i == 2
            if last:
                reset()
                out["before_forward"] = now()
            saved = _Saved(own)
            with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
                result = model(**x)
                loss = _loss(result)
            if last:  # after forward with the output still held, as the fake run reads it
                out["forward_peak"], out["after_forward"] = peak(), now()
                out["saved"] = sum(saved.seen.values())
            del result
            if last:
                reset()
            loss.backward()
            del loss, saved
            if last:
                out["backward_peak"] = peak()
                reset()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if last:
                out["step_peak"] = peak()
        out["training"] = max(out["forward_peak"], out["backward_peak"], out["step_peak"])
        out["phase"] = max(("forward", "backward", "step"), key=lambda k: out[f"{k}_peak"])
        if cuda:  # the step's peak again, requested bytes (no block rounding) beside allocated ones
            reset()
            loss = _loss(model(**x))
            loss.backward()
            del loss
            opt.step()
            opt.zero_grad(set_to_none=True)
            _sync(dev)
            stats = torch.cuda.memory_stats(dev)
            out["allocated_peak_again"] = int(stats.get("allocated_bytes.all.peak", 0))
            out["requested_peak"] = int(stats.get("requested_bytes.all.peak", 0))
        del model, opt, x
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return out


def _measured_generate(case: Case, dev: torch.device) -> int:
    """The allocated peak of one greedy ``generate()`` of ``case.generate`` new tokens (exactly that many)
    after the example's prompt, on a fresh model in eval mode under ``inference_mode``, after one
    warm-up call: the CUDA allocator's peak or the CPU ledger's."""
    gc.collect()
    cuda = dev.type == "cuda"
    if cuda:  # the cuBLAS workspaces the training rows left (autograd's thread's): a server has none
        torch.cuda.synchronize()
        clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if clear is not None:
            clear()
        torch.cuda.empty_cache()
    with ledger().enabled() if not cuda else _null() as led:
        torch.manual_seed(0)
        model = case.factory().to(dev).eval()
        # no token equals the pad id: generate() would read those as padding and mask them
        ids = case.batch(case.bs, dev.type)["input_ids"].clamp_min(1)
        kw = {
            "max_new_tokens": case.generate,
            "min_new_tokens": case.generate,
            "do_sample": False,
            "pad_token_id": 0,
        }
        with torch.inference_mode():
            if cuda:
                model.generate(ids, **{**kw, "max_new_tokens": 2, "min_new_tokens": 2})  # warm-up
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats(dev)
            else:
                led.reset_peak("cpu")
            out = model.generate(ids, **kw)
            _sync(dev)
            peak = int(torch.cuda.max_memory_allocated(dev) if cuda else led.peak("cpu"))
        assert out.shape[1] == ids.shape[1] + case.generate, out.shape
        del model, out, ids
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    return peak


def _fake_generate(case: Case, tgt: Target) -> dict[str, Any]:
    t0 = time.perf_counter()
    fk = estimate_fake(
        case.factory,
        lambda b, batch=case.batch: {"input_ids": batch(b, "cpu")["input_ids"]},
        batch_sizes=[case.bs],
        training=False,
        target=tgt,
        generate_tokens=case.generate,
        suggest=False,
    )
    return {
        "generate": fk.allocated_peak,
        "kv_cache": fk.kv_cache,
        "seconds": round(time.perf_counter() - t0, 2),
    }


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *a: Any) -> None:
        return None


def _fake(case: Case, tgt: Target) -> dict[str, Any]:
    t0 = time.perf_counter()
    fk = estimate_fake(
        case.factory,
        lambda b, batch=case.batch: batch(b, "cpu"),
        optimizer="adamw",
        batch_sizes=[case.bs],
        target=tgt,
        loss_fn=_loss,
        checkpoint=True if case.checkpoint else None,
        suggest=False,
    )
    m = fk.measurements[0]
    return {
        "training": fk.peak(case.bs, "training"),
        "inference": fk.peak(case.bs, "inference"),
        "forward_peak": m.forward_peak,
        "after_forward": m.after_forward,
        "backward_peak": m.backward_peak,
        "step_peak": m.step_peak,
        "saved": m.saved_for_backward,
        "notes": list(fk.notes),
        "seconds": round(time.perf_counter() - t0, 2),
    }


def _measured_estimate(case: Case, dev: torch.device) -> dict[str, Any]:
    from torchmem.capture.measure import estimate

    torch.manual_seed(0)
    model = case.factory().to(dev)
    if case.checkpoint:
        _checkpoint_blocks(model)
    me = estimate(
        model, case.batch(2, dev.type), optimizer="adamw", batch_sizes=[case.bs], device=dev, loss_fn=_loss
    )
    params = sum(p.numel() for p in model.parameters())
    del model
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    acc_tr, acc_inf = _accelerate(case.factory)
    return {
        "training": me.peak(case.bs, "training"),
        "inference": me.peak(case.bs, "inference"),
        "probes": list(me.measured_at),
        "accelerate_training": acc_tr,
        "accelerate_inference": acc_inf,
        "deepspeed_zero2_training": 4 * params + 16 * params,  # 4 P + 16 P / gpus, one GPU
    }


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


def _cudnn_rnn_probe(dev: torch.device) -> list[dict[str, Any]]:
    """cuDNN's reserve space (the uint8 tensors ``_cudnn_rnn`` saves: the reserve, and cuDNN's dropout
    state once a call with dropout made it) against the fake run's formula, and what its forward and
    backward hold beyond their outputs, for a few shapes."""
    rows = []
    for cell, layers, inp, hidden, bidir, p, steps, batch in [
        ("LSTM", 1, 128, 256, False, 0.0, 64, 32),
        ("LSTM", 1, 1024, 256, False, 0.0, 64, 32),
        ("LSTM", 2, 512, 1024, False, 0.2, 256, 32),
        ("LSTM", 3, 128, 512, True, 0.0, 64, 32),
        ("GRU", 2, 512, 1024, False, 0.2, 256, 32),
        ("RNN", 2, 128, 256, False, 0.0, 64, 32),
        ("LSTM", 1, 100, 300, False, 0.0, 50, 10),
    ]:
        try:
            torch.manual_seed(0)
            rnn = getattr(torch.nn, cell)(
                inp, hidden, num_layers=layers, batch_first=True, dropout=p, bidirectional=bidir
            )
            rnn = rnn.to(dev).train()
            x = torch.randn(batch, steps, inp, device=dev, requires_grad=True)
            saved: list[int] = []

            def pack(t: torch.Tensor, saved: list[int] = saved) -> torch.Tensor:
                if t.dtype == torch.uint8:
                    saved.append(int(t.untyped_storage().nbytes()))
                return t

            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated(dev)
            torch.cuda.reset_peak_memory_stats(dev)
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                y, _ = rnn(x)
            torch.cuda.synchronize()
            fwd_peak = torch.cuda.max_memory_allocated(dev) - base
            after = torch.cuda.memory_allocated(dev) - base
            torch.cuda.reset_peak_memory_stats(dev)
            y.sum().backward()
            torch.cuda.synchronize()
            bwd_peak = torch.cuda.max_memory_allocated(dev) - base
            mode = {"LSTM": "lstm", "GRU": "gru", "RNN": "rnn_tanh"}[cell]
            formula = _cudnn_reserve_bytes(
                mode, layers, 2 if bidir else 1, steps, batch, hidden, 4, p > 0 and layers > 1
            )
            rows.append(
                {
                    "cell": cell,
                    "layers": layers,
                    "input": inp,
                    "hidden": hidden,
                    "bidirectional": bidir,
                    "dropout": p,
                    "steps": steps,
                    "batch": batch,
                    "uint8_saved": saved,
                    "formula_reserve": formula,
                    "formula_dropout_state": _CUDNN_DROPOUT_STATE,
                    "forward_peak_above": int(fwd_peak),
                    "after_forward_above": int(after),
                    "backward_peak_above": int(bwd_peak),
                }
            )
            del rnn, x, y
        except Exception as exc:
            rows.append({"cell": cell, "layers": layers, "error": f"{type(exc).__name__}: {exc}"[:300]})
    return rows


def _pct(est: int | None, ref: int | None) -> str:
    return "n/a" if est is None or not ref else f"{100.0 * (est - ref) / ref:+.1f} %"


def _print_table(rows: list[dict[str, Any]], dev: torch.device) -> None:
    print()
    print(
        f"device {dev}, torch {torch.__version__}"
        + (f", {torch.cuda.get_device_name(dev)}" if dev.type == "cuda" else "")
    )
    print("| model | batch | mode | measured MiB | **fake MiB** | **fake err** | estimate() MiB | err |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        if "error" in r:
            print(f"| {r['model']} | {r.get('batch', '')} | error | {r['error'][:120]} | | | | |")
            continue
        for mode in ("training", "inference", "generate"):
            if mode not in r["measured"]:
                continue
            meas = r["measured"][mode]
            label = mode if mode != "generate" else f"generate {r['generate_tokens']} tokens"
            fake = r["fake"].get(mode)
            est = (r.get("estimate") or {}).get(mode)
            print(
                f"| {r['model']} | {r['batch']} | {label} | {meas / _MiB:.1f} | "
                f"{(fake or 0) / _MiB:.1f} | {_pct(fake, meas)} | "
                f"{'n/a' if est is None else f'{est / _MiB:.1f}'} | {_pct(est, meas)} |"
            )
    print("\nper phase, training (MiB): measured / fake")
    print(
        "| model | forward peak | after forward | backward peak | step peak | saved for backward | "
        "allocated - requested peak |"
    )
    print("| --- | --- | --- | --- | --- | --- | ---: |")
    for r in rows:
        if "error" in r:
            continue
        m, f = r["measured"], r["fake"]
        cells = []
        for k in ("forward_peak", "after_forward", "backward_peak", "step_peak", "saved"):
            cells.append(
                f"{(m.get(k) or 0) / _MiB:.1f} / {(f.get(k) or 0) / _MiB:.1f} ({_pct(f.get(k), m.get(k))})"
            )
        slack = (
            (m.get("allocated_peak_again", 0) - m.get("requested_peak", 0)) / _MiB
            if "requested_peak" in m
            else 0
        )
        print(f"| {r['model']} | " + " | ".join(cells) + f" | {slack:.1f} |")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--out", "--json", dest="out", default=None, help="write the results as JSON here")
    ap.add_argument("--target", default="H100-80GB")
    ap.add_argument(
        "--only",
        default="",
        help="comma-separated case keys (resnet, vit, bert, llama, gpt2, gpt2-ckpt, t5, t5-ckpt, lstm, gru)",
    )
    ap.add_argument("--with-estimate", action="store_true", help="also the measured estimate(), accelerate")
    args = ap.parse_args()
    dev = torch.device(args.device)
    small = dev.type == "cpu"
    torch.set_num_threads(max(1, min(os.cpu_count() or 1, 16)))
    tgt = resolve_target(args.target) if not small else Target("cpu", 1 << 40, 0, 0, 0)
    only = {k.strip() for k in args.only.split(",") if k.strip()}
    rows: list[dict[str, Any]] = []
    t_all = time.perf_counter()
    result: dict[str, Any] = {"device": str(dev), "torch": torch.__version__, "rows": rows}
    try:
        import transformers

        result["transformers"] = transformers.__version__
        cases = _cases(small)
    except Exception as exc:  # no transformers: nothing to run but the probe
        print(f"cannot build the cases: {type(exc).__name__}: {exc}")
        cases = []
    for case in cases:
        if only and case.key not in only:
            continue
        t0 = time.perf_counter()
        row: dict[str, Any] = {"model": case.name, "batch": case.bs, "checkpoint": case.checkpoint}
        try:
            row["measured"] = _measured(case, dev)
            row["fake"] = _fake(case, tgt)
            if args.with_estimate:
                row["estimate"] = _measured_estimate(case, dev)
            if case.generate:
                row["measured"]["generate"] = _measured_generate(case, dev)
                g = _fake_generate(case, tgt)
                row["fake"]["generate"], row["fake"]["kv_cache"] = g["generate"], g["kv_cache"]
                row["generate_tokens"] = case.generate
        except Exception as exc:  # one case never stops the others
            row["error"] = f"{type(exc).__name__}: {exc}"[:2000]
            row["traceback"] = traceback.format_exc()[-4000:]
            print(f"{case.name}: FAILED: {row['error'][:300]}", flush=True)
        finally:
            gc.collect()
            if dev.type == "cuda":
                torch.cuda.empty_cache()
        rows.append(row)
        if "error" not in row:
            m, f = row["measured"], row["fake"]
            took = time.perf_counter() - t0
            print(
                f"{case.name}: {took:.1f} s; training {_pct(f['training'], m['training'])}, "
                f"inference {_pct(f['inference'], m['inference'])}"
                + (f", generate {_pct(f['generate'], m['generate'])}" if "generate" in m else ""),
                flush=True,
            )
    if dev.type == "cuda" and (not only or "rnn-probe" in only or "lstm" in only or "gru" in only):
        try:
            result["cudnn_rnn"] = _cudnn_rnn_probe(dev)
            print("\ncuDNN: the uint8 tensors _cudnn_rnn saved (reserve, dropout state) / the formula's")
            for p in result["cudnn_rnn"]:
                print(f"  {p}")
        except Exception as exc:
            print(f"cuDNN probe failed: {type(exc).__name__}: {exc}")
    _print_table(rows, dev)
    print(f"\ntotal {time.perf_counter() - t_all:.1f} s")
    path = args.out or (
        os.path.join(os.environ["OUT"], "estimate_accuracy.json") if os.environ.get("OUT") else None
    )
    if path:
        with open(path, "w") as fh:
            json.dump(result, fh, indent=1, default=str)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
