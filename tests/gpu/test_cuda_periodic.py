"""Growth that comes every N steps on a GPU, under ``torchmem run`` with no flag: a validation pass every 20
steps that keeps its losses with their graphs and in-memory snapshots of the weights every 50 steps are leaks
named with line and holder; the same loops keeping numbers, or only the best snapshot, are not (and are not
said to have "stopped")."""

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

HEAD = textwrap.dedent(
    """
    import torch; nn = torch.nn
    dev = torch.device("cuda", 0)
    model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    val_x = [torch.randn(512, 1024, device=dev) for _ in range(2)]
    kept, best = [], None
    for step in range(400):
        loss = model(torch.randn(64, 1024, device=dev)).square().mean()
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
    """
)

BODIES = {
    # a validation pass every 20 steps without no_grad, its loss kept with the graph (~32 MiB each time)
    "val_graphs": """
        if step % 20 == 0:
            kept.append(sum(model(x).square().mean() for x in val_x))
""",
    # in-memory snapshots of the weights every 50 steps (32 MiB each)
    "snapshots": """
        if step % 50 == 0:
            kept.append({k: v.detach().clone() for k, v in model.state_dict().items()})
""",
    # controls: the same validation keeping numbers; only the latest snapshot kept
    "val_numbers": """
        if step % 20 == 0:
            with torch.no_grad():
                kept.append(sum(model(x).square().mean() for x in val_x).item())
""",
    "best_snapshot": """
        if step % 50 == 0:
            best = {k: v.detach().clone() for k, v in model.state_dict().items()}
""",
}


def _run(tmp: Path, name: str) -> tuple[subprocess.CompletedProcess[str], int]:
    body = textwrap.indent(textwrap.dedent(BODIES[name]).strip("\n"), "    ")
    code = HEAD + body + "\n"
    script = tmp / f"{name}.py"
    script.write_text(code)
    lines = code.splitlines()
    line = 1 + next(i for i, x in enumerate(lines) if "kept.append(" in x or "best = {" in x)
    return _torchmem_run(script), line


def _torchmem_run(script: Path) -> subprocess.CompletedProcess[str]:
    """``torchmem run script`` with no flag, in the script's folder; its stderr's end printed."""
    out = subprocess.run(
        [sys.executable, "-m", "torchmem", "run", str(script)],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=SRC),
        cwd=script.parent,
        check=False,
    )
    print(out.stderr[-3000:])
    return out


@pytest.mark.parametrize("name", ["val_graphs", "snapshots"])
def test_growth_every_n_steps_is_a_leak_with_its_line_and_holder(tmp_path: Path, name: str) -> None:
    out, line = _run(tmp_path, name)
    assert out.returncode == 0, out.stderr
    assert "LEAK on cuda:0" in out.stderr, out.stderr
    assert f"{name}.py:{line}" in out.stderr and "__main__.kept[" in out.stderr, out.stderr
    assert "stopped" not in out.stderr and "one-time" not in out.stderr, out.stderr


@pytest.mark.parametrize("name", ["val_numbers", "best_snapshot"])
def test_the_same_loops_keeping_numbers_or_one_snapshot_are_not(tmp_path: Path, name: str) -> None:
    out, _ = _run(tmp_path, name)
    assert out.returncode == 0, out.stderr
    assert "LEAK" not in out.stderr and "below the leak threshold" not in out.stderr, out.stderr


GRAPHS_AFTER_BACKWARD = textwrap.dedent(
    """
    import torch; nn = torch.nn
    dev = torch.device("cuda", 0)
    model = nn.Sequential(*[nn.Linear(64, 64) for _ in range(24)], nn.Linear(64, 2)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    kept = []
    for step in range(240):
        logits = model(torch.randn(8, 64, device=dev))
        logits.square().mean().backward(); opt.step(); opt.zero_grad(set_to_none=True)
        kept.append(logits{detach})  # a 64-byte tensor a step; with its graph, ~75 nodes on the host
    """
)


@pytest.mark.parametrize("detach", ["", ".detach()"])
def test_device_tensors_kept_with_their_graph_are_named_on_the_host(tmp_path: Path, detach: str) -> None:
    """Each step's logits kept after the backward: the device grows by 512 B a step (below any threshold),
    the host by the graph's nodes: named on the host with holder, line and the detach fix; detached, not."""
    script = tmp_path / "kept.py"
    script.write_text(GRAPHS_AFTER_BACKWARD.replace("{detach}", detach))
    out = _torchmem_run(script)
    assert out.returncode == 0, out.stderr
    if detach:
        assert "LEAK on host" not in out.stderr and "retained_graph" not in out.stderr, out.stderr
    else:
        assert "LEAK on host" in out.stderr and "retained_graph" in out.stderr, out.stderr
        assert "__main__.kept[" in out.stderr, out.stderr
        assert "kept.py:8" in out.stderr or "kept.py:10" in out.stderr, out.stderr  # made, or kept


VAL_TO_CPU = textwrap.dedent(
    """
    import torch; nn = torch.nn
    dev = torch.device("cuda", 0)
    model = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    val_x = [torch.randn(512, 1024, device=dev) for _ in range(4)]
    kept = []
    for step in range(400):
        loss = model(torch.randn(64, 1024, device=dev)).square().mean()
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
        if step % 20 == 0:
            with torch.no_grad():
                for x in val_x:
                    kept.append({keep})  # 2 MiB on the host each, 8 MiB a pass
    """
)


@pytest.mark.parametrize("keep", ["model(x).cpu()", "model(x).mean().item()"])
def test_a_validation_pass_keeping_cpu_copies_is_a_host_leak_named_during_the_run(
    tmp_path: Path, keep: str
) -> None:
    """Every 20 steps a validation pass keeps its outputs' CPU copies (+400 KiB/step on the host, flat
    between the passes): a host leak seen by the periodic test during the run, its scans spread over the
    passes, named with its holder; keeping numbers instead is not a leak."""
    script = tmp_path / "val_cpu.py"
    script.write_text(VAL_TO_CPU.replace("{keep}", keep))
    out = _torchmem_run(script)
    assert out.returncode == 0, out.stderr
    if keep.endswith(".item()"):
        assert "LEAK on host" not in out.stderr and "nothing torchmem can see" not in out.stderr, out.stderr
    else:
        assert "LEAK on host" in out.stderr and "__main__.kept[" in out.stderr, out.stderr
        assert "nothing torchmem can see explains" not in out.stderr, out.stderr
