"""Record small capture files from real CPU training runs (the samples the report tests read).

Run ``python tests/data/captures/make_captures.py`` from the repository root to write them again:

- ``leak_cpu.jsonl``: 16 steps of a small MLP whose loop keeps every validation loss with its autograd
  graph (a real leak, found and attributed by ``torchmem.watch``), with start/end stats, a per-module
  table, notes.
- ``flat_cpu.jsonl``: the same loop with the leak fixed (``.item()``): flat memory, no leak.
- ``oom_cpu.jsonl``: a run that ends with a real CPU out-of-memory error, diagnosed by ``explain_oom``.
- ``killed_cpu.jsonl``: the leak run cut in the middle of a line, as a SIGKILL leaves it.

Tests import :func:`record_run` from here to record fresh captures too.
"""

from __future__ import annotations

import platform
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

import torchmem
from torchmem.capture.file import CaptureWriter

HERE = Path(__file__).resolve().parent


def _module_rows(
    model: nn.Module, opt: torch.optim.Optimizer, activations: dict[str, int]
) -> list[dict[str, Any]]:
    rows = []
    for name, mod in model.named_modules():
        params = list(mod.parameters())
        rows.append(
            {
                "module": name or type(model).__name__,
                "params": sum(p.nbytes for p in params),
                "grads": sum(p.grad.nbytes for p in params if p.grad is not None),
                "optimizer_state": sum(
                    v.nbytes for p in params for v in opt.state.get(p, {}).values() if torch.is_tensor(v)
                ),
                "activations": activations.get(name, 0),
                "forward_peak": None,
                "backward_peak": None,
            }
        )
    return rows


def record_run(
    path: str | Path,
    *,
    steps: int = 16,
    leak: bool = True,
    oom: bool = False,
    samples_per_step: int = 3,
    argv: list[str] | None = None,
) -> Path:
    """Train a small MLP on the CPU under exact tracking and write what was measured as a capture.

    Args:
        path: The capture file to write.
        steps: Training steps.
        leak: Keep every step's output with its autograd graph (a real leak).
        oom: After the steps, ask for 32 TiB and record the real out-of-memory error and its diagnosis.
        samples_per_step: Timeline readings per step (after forward, backward, optimizer step).
        argv: The header's argv (default: this script and its options).
    """
    torch.manual_seed(0)
    path = Path(path)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 256))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    kept: list[torch.Tensor] = []
    activations: dict[str, int] = {}
    w = CaptureWriter(
        path,
        device="cpu",
        device_name=platform.processor() or platform.machine() or None,
        source="ledger",
        argv=argv or ["train.py", "--steps", str(steps)] + (["--leak"] if leak else []),
    )
    reason, code = "exit", 0
    with torchmem.cpu_tracking():
        s = torchmem.stats("cpu")
        w.stats("start", s, s.breakdown())
        w.note("recorded by tests/data/captures/make_captures.py on the CPU with torchmem.cpu_tracking()")
        starts: dict[str, int] = {}

        def pre(name: str) -> Any:
            def hook(mod: nn.Module, inp: Any) -> None:
                starts[name] = torchmem.counters("cpu").allocated or 0

            return hook

        def post(name: str) -> Any:
            def hook(mod: nn.Module, inp: Any, out: Any) -> None:
                now = torchmem.counters("cpu").allocated or 0
                activations[name] = max(activations.get(name, 0), now - starts.get(name, now))

            return hook

        handles = []
        for name, mod in model.named_modules():
            handles.append(mod.register_forward_pre_hook(pre(name)))
            handles.append(mod.register_forward_hook(post(name)))

        def sample(step: int) -> None:
            c = torchmem.counters("cpu")
            w.sample(step=step, allocated=c.allocated, reserved=c.reserved, peak_allocated=c.peak_allocated)

        with torchmem.watch(device="cpu", warn=False) as watcher:
            for step in range(1, steps + 1):
                x = torch.randn(128, 256)
                out = model(x)
                loss = out.square().mean()
                if samples_per_step > 1:
                    sample(step)
                loss.backward()
                if samples_per_step > 2:
                    sample(step)
                opt.step()
                opt.zero_grad(set_to_none=False)
                val = model(torch.randn(256, 256)).square().mean()  # validation, without no_grad()
                if leak:
                    kept.append(val)  # the leak: each kept loss keeps its whole autograd graph
                else:
                    kept.append(torch.tensor(val.item()))
                watcher.step()
                sample(step)
                w.step(step, allocated=torchmem.counters("cpu").allocated)
                if step % 8 == 0:
                    w.leak(watcher.report())
            for h in handles:
                h.remove()
            w.modules(
                _module_rows(model, opt, activations),
                ["activations: bytes a module's forward left alive (forward hooks, exact CPU accounting)"],
            )
            w.leak(watcher.report())
            if oom:
                try:
                    torch.empty(1 << 45, dtype=torch.uint8)
                except RuntimeError as exc:
                    w.oom(torchmem.explain_oom(exc), step=steps)
                    reason, code = "oom", 1
        s = torchmem.stats("cpu")
        w.stats("end", s, s.breakdown())
    w.close(exit_code=code, reason=reason, steps=steps)
    return path


def cut(src: Path, dst: Path, fraction: float = 0.6) -> Path:
    """Copy ``src`` to ``dst`` stopping in the middle of a line, as a killed writer leaves a file."""
    data = src.read_bytes()
    n = int(len(data) * fraction)
    if data[n - 1 : n] == b"\n":
        n += 5
    dst.write_bytes(data[:n])
    return dst


def main() -> int:
    record_run(HERE / "leak_cpu.jsonl", leak=True)
    record_run(HERE / "flat_cpu.jsonl", leak=False, argv=["train.py", "--steps", "16", "--fixed"])
    record_run(HERE / "oom_cpu.jsonl", steps=10, leak=True, oom=True)
    cut(HERE / "leak_cpu.jsonl", HERE / "killed_cpu.jsonl")
    for p in sorted(HERE.glob("*.jsonl")):
        print(p.name, p.stat().st_size, "bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
