"""Framework programs under `torchmem run` with no flag, on a GPU: HF generate, torch.compile, Lightning."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

HERE = Path(__file__).parent / "programs"
SRC = str(Path(__file__).resolve().parents[2] / "src")


def _run(
    name: str, tmp_path: Path, timeout: float = 400
) -> tuple[subprocess.CompletedProcess[str], list[dict]]:
    cap = tmp_path / f"{name}.jsonl"
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    r = subprocess.run(
        [sys.executable, "-m", "torchmem", "run", "--no-status", "-o", str(cap), str(HERE / f"{name}.py")],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=tmp_path,
    )
    print(r.stdout[-3000:], r.stderr[-6000:])
    recs = [json.loads(x) for x in cap.read_text().splitlines()[1:]] if cap.exists() else []
    return r, recs


def _site(name: str) -> str:
    lines = (HERE / f"{name}.py").read_text().splitlines()
    return f"{name}.py:{next(i for i, x in enumerate(lines, 1) if '# SITE' in x)}"


def _final(recs: list[dict], kind: str = "leak") -> dict:
    return [r for r in recs if r["type"] == kind][-1]


def test_hf_generate_outputs_kept(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    r, recs = _run("hf_generate_keep", tmp_path)
    assert r.returncode == 0
    assert _final(recs, "boundary")["kind"] == "generate"
    rep = _final(recs)["report"]
    assert rep["leaking"], rep
    top = rep["culprits"][0]
    assert "results" in (top["holder"] or ""), top
    assert _site("hf_generate_keep") in [top["site"]] + [s["site"] for s in top["sites"]], top


def test_compiled_model_eval_loop(tmp_path: Path) -> None:
    r, recs = _run("compiled_infer", tmp_path)
    assert r.returncode == 0
    assert _final(recs, "boundary")["kind"] == "module"
    rep = _final(recs)["report"]
    assert rep["leaking"], rep
    assert "losses" in (rep["culprits"][0]["holder"] or "")


def test_lightning_fit_counts_optimizer_steps(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    r, recs = _run("lightning_fit", tmp_path)
    assert r.returncode == 0, r.stderr
    b = _final(recs, "boundary")
    assert b["kind"] == "optimizer" and b["count"] >= 60, b
    rep = _final(recs)["report"]
    assert not rep["leaking"], rep
    assert "Traceback" not in r.stderr
