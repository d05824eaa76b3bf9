"""A small GPT-style language model trained on random tokens (no download).

The "real training script on a GPU" of ``benchmarks/run_cost.py``: ``torchmem run`` must cost at most 2 % of
the wall clock. With ``transformers`` installed the model is ``GPT2LMHeadModel`` with the LR schedule
``get_linear_schedule_with_warmup``; without it, the same shape built from ``nn.TransformerEncoderLayer``
with a causal mask and a linear-warmup ``LambdaLR``. AdamW, gradient clipping at 1.0, ``loss.item()`` logged
every 10 steps, a short evaluation under ``torch.no_grad()`` every ``--eval-interval`` steps, and bf16
autocast on CUDA.

Sizes: on CUDA GPT-2 small (12 layers, 768 wide, 12 heads, vocabulary 50257, 512 tokens, batch 8) for 300
steps; on the CPU 2 layers, 128 wide, 128 tokens, batch 8, vocabulary 2048.

    python benchmarks/programs/gpt_train.py [--device cpu|cuda] [--steps N] [--no-transformers]

The environment variable ``TORCHMEM_BENCH_SCALE`` multiplies the default number of steps. Prints
``LOOP_SECONDS=<float>`` (the training loop with its evaluations) at the end.
"""

from __future__ import annotations

import argparse
import math
import os
import time

import torch
import torch.nn.functional as F
from torch import nn

try:
    from transformers import (  # type: ignore[import-not-found,unused-ignore]
        GPT2Config,
        GPT2LMHeadModel,
        get_linear_schedule_with_warmup,
    )

    HAVE_TRANSFORMERS = True
except ImportError:
    HAVE_TRANSFORMERS = False


class TinyGPT(nn.Module):
    """Decoder-only transformer: token + position embeddings, pre-norm causal blocks, a tied LM head."""

    def __init__(self, vocab_size: int, block_size: int, n_embd: int, n_layer: int, n_head: int) -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(vocab_size, n_embd)
        self.pos_emb = nn.Embedding(block_size, n_embd)
        self.drop = nn.Dropout(0.1)
        layer = nn.TransformerEncoderLayer(
            n_embd, n_head, 4 * n_embd, dropout=0.1, activation="gelu", batch_first=True, norm_first=True
        )
        self.blocks = nn.TransformerEncoder(layer, n_layer, enable_nested_tensor=False)
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.lm_head.weight = self.tok_emb.weight
        self.causal_mask: torch.Tensor
        mask = nn.Transformer.generate_square_subsequent_mask(block_size)
        self.register_buffer("causal_mask", mask, persistent=False)
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.size(1)
        pos = torch.arange(t, device=idx.device)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))
        x = self.blocks(x, mask=self.causal_mask[:t, :t], is_causal=True)
        logits: torch.Tensor = self.lm_head(self.ln_f(x))
        return logits


def build_model(args: argparse.Namespace, use_hf: bool) -> nn.Module:
    if use_hf:
        config = GPT2Config(
            vocab_size=args.vocab,
            n_positions=args.seq,
            n_embd=args.n_embd,
            n_layer=args.n_layer,
            n_head=args.n_head,
            bos_token_id=args.vocab - 1,
            eos_token_id=args.vocab - 1,
        )
        hf_model: nn.Module = GPT2LMHeadModel(config)
        return hf_model
    return TinyGPT(args.vocab, args.seq, args.n_embd, args.n_layer, args.n_head)


def lm_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor, use_hf: bool) -> torch.Tensor:
    if use_hf:
        loss: torch.Tensor = model(input_ids=x, labels=x).loss  # the model shifts the labels itself
        return loss
    logits = model(x)
    return F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))


def main() -> None:
    default_device = "cuda" if torch.cuda.is_available() else "cpu"
    parser = argparse.ArgumentParser(description="GPT-style LM on random tokens")
    parser.add_argument("--device", default=os.environ.get("TORCHMEM_BENCH_DEVICE", default_device))
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--no-transformers", action="store_true", help="use the nn.Transformer model")
    args = parser.parse_args()
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    scale = float(os.environ.get("TORCHMEM_BENCH_SCALE", "1"))
    if cuda:
        args.n_layer, args.n_embd, args.n_head, args.seq, args.batch, args.vocab = 12, 768, 12, 512, 8, 50257
        default_steps = 300
    else:
        args.n_layer, args.n_embd, args.n_head, args.seq, args.batch, args.vocab = 2, 128, 4, 128, 8, 2048
        default_steps = 400
    steps = args.steps or max(1, round(default_steps * scale))
    eval_interval = 100 if cuda else 50
    use_hf = HAVE_TRANSFORMERS and not args.no_transformers

    torch.manual_seed(1337)
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    # A "corpus" of random tokens; batches are random windows of it (as nanoGPT's get_batch).
    train_data = torch.randint(args.vocab, (200_000,), dtype=torch.long)
    val_data = torch.randint(args.vocab, (20_000,), dtype=torch.long)

    def get_batch(split: str) -> tuple[torch.Tensor, torch.Tensor]:
        data = train_data if split == "train" else val_data
        ix = torch.randint(len(data) - args.seq - 1, (args.batch,))
        x = torch.stack([data[i : i + args.seq] for i in ix])
        y = torch.stack([data[i + 1 : i + 1 + args.seq] for i in ix])
        if cuda:
            return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
        return x.to(device), y.to(device)

    model = build_model(args, use_hf).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {'GPT2LMHeadModel' if use_hf else 'TinyGPT'}, {n_params / 1e6:.2f}M parameters")
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    warmup = max(1, steps // 10)
    if use_hf:
        scheduler = get_linear_schedule_with_warmup(optimizer, warmup, steps)
    else:

        def lr_lambda(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            return max(0.0, (steps - step) / max(1, steps - warmup))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)
    autocast = torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=cuda)

    @torch.no_grad()
    def estimate_loss() -> float:
        model.eval()
        losses = []
        for _ in range(5):
            x, y = get_batch("val")
            with autocast:
                losses.append(lm_loss(model, x, y, use_hf).item())
        model.train()
        return sum(losses) / len(losses)

    model.train()
    c0 = time.process_time()  # the process's CPU time: its threads, torchmem's included
    t0 = time.perf_counter()
    for step in range(steps):
        x, y = get_batch("train")
        with autocast:
            loss = lm_loss(model, x, y, use_hf)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        if step % 10 == 0:
            print(f"step {step}: loss {loss.item():.4f}, lr {scheduler.get_last_lr()[0]:.2e}")
        if (step + 1) % eval_interval == 0 or step == steps - 1:
            val = estimate_loss()
            print(f"step {step}: val loss {val:.4f}, ppl {math.exp(val):.1f}")
    if cuda:
        torch.cuda.synchronize(device)
    print(f"LOOP_CPU_SECONDS={time.process_time() - c0:.4f}")
    print(f"LOOP_SECONDS={time.perf_counter() - t0:.4f}")


if __name__ == "__main__":
    main()
