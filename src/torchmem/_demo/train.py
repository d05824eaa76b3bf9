"""A small, realistic training script with a classic leak — the one ``torchmem demo`` runs.

It trains an MLP on synthetic regression data and, every step, evaluates on a validation batch. The leaky
version keeps each validation output *with its autograd graph* (no ``torch.no_grad()``) "to average later";
``--fixed`` evaluates under ``torch.no_grad()`` and keeps a number. Run it alone with ``python train.py``, or
under torchmem with ``torchmem run train.py`` (no code change needed).
"""

from __future__ import annotations

import argparse

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--fixed", action="store_true", help="evaluate under no_grad() and keep numbers")
    args = ap.parse_args()
    dev = torch.device(args.device)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(128, 256),
        torch.nn.GELU(),
        torch.nn.Linear(256, 256),
        torch.nn.GELU(),
        torch.nn.Linear(256, 1),
    ).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x_val = torch.randn(512, 128, device=dev)
    y_val = x_val[:, :1].sin()
    val_losses: list[torch.Tensor | float] = []
    for step in range(args.steps):
        x = torch.randn(256, 128, device=dev)
        loss = (model(x) - x[:, :1].sin()).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if args.fixed:
            with torch.no_grad():
                val_losses.append((model(x_val) - y_val).square().mean().item())  # a number
        else:
            val_loss = (model(x_val) - y_val).square().mean()  # keeps the whole validation graph
            val_losses.append(val_loss)
        if step % 10 == 0:
            print(
                f"step {step:3d}  train loss {loss.detach().item():.4f}  val loss {_num(val_losses[-1]):.4f}"
            )
    print(f"done: {args.steps} steps, mean val loss {sum(_num(v) for v in val_losses) / len(val_losses):.4f}")


def _num(v: torch.Tensor | float) -> float:
    return v.detach().item() if isinstance(v, torch.Tensor) else v


if __name__ == "__main__":
    main()
