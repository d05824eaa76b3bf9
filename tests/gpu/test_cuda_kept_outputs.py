"""A newcomer's transformers loop on a GPU that keeps model outputs, under ``torchmem run`` with no flag.

Inference without ``no_grad`` keeping every 10th batch's logits keeps each one's graph with its activations:
a ``retained_graph`` fixed by ``torch.no_grad()``, even where the holder path ends at the logits (no
``.grad_fn`` hop). The same logits kept after their backward keep only the graph's nodes: an accumulation of
large tensors, fixed without ``.item()`` (there is no scalar to keep) and with ``.detach()``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

SRC = str(Path(__file__).resolve().parents[2] / "src")

PROGRAM = textwrap.dedent(
    """
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    model = GPT2LMHeadModel(GPT2Config(n_layer=2)).to("cuda")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    samples = []
    for i in range({steps}):
        ids = torch.randint(0, 50257, (4, 64), device="cuda")
        {body}
    print("done", len(samples))
    """
)

BODIES = {
    "inference": "logits = model(ids).logits\n    if i % 10 == 0:\n        samples.append(logits)",
    "after_backward": (
        "out = model(ids, labels=ids)\n    out.loss.backward(); opt.step(); opt.zero_grad()\n"
        "    samples.append(out.logits)"
    ),
    "inference_no_grad": (
        "with torch.no_grad():\n        logits = model(ids).logits\n    if i % 10 == 0:\n"
        "        samples.append(logits.argmax(-1).cpu())"
    ),
}


def _run(tmp: Path, name: str, steps: int) -> subprocess.CompletedProcess[str]:
    script = tmp / f"{name}.py"
    script.write_text(PROGRAM.format(steps=steps, body=BODIES[name]))
    out = subprocess.run(
        [sys.executable, "-m", "torchmem", "run", str(script)],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=SRC),
        cwd=tmp,
        check=False,
    )
    print(out.stderr[-3000:])
    return out


def test_inference_outputs_kept_without_no_grad_are_a_retained_graph(tmp_path: Path) -> None:
    out = _run(tmp_path, "inference", 300)
    assert out.returncode == 0, out.stderr
    assert "LEAK on cuda" in out.stderr and "retained_graph" in out.stderr, out.stderr
    assert "__main__.samples[" in out.stderr and "torch.no_grad()" in out.stderr, out.stderr
    assert "device_accumulation" not in out.stderr and ".item()" not in out.stderr, out.stderr


def test_outputs_kept_after_their_backward_are_large_tensors_to_detach(tmp_path: Path) -> None:
    out = _run(tmp_path, "after_backward", 120)
    assert out.returncode == 0, out.stderr
    assert "LEAK on cuda" in out.stderr and "device_accumulation" in out.stderr, out.stderr
    assert "__main__.samples[" in out.stderr and "`.detach()` what you keep" in out.stderr, out.stderr
    device = out.stderr.split("LEAK on cuda", 1)[1].split("LEAK on host", 1)[0]
    assert "[1] device_accumulation" in device and "retained_graph" not in device, out.stderr
    assert "keep numbers (`.item()`)" not in out.stderr, out.stderr


def test_inference_under_no_grad_keeping_token_ids_on_the_cpu_is_not_a_device_leak(tmp_path: Path) -> None:
    out = _run(tmp_path, "inference_no_grad", 300)
    assert out.returncode == 0, out.stderr
    assert "LEAK on cuda" not in out.stderr and "retained_graph" not in out.stderr, out.stderr
