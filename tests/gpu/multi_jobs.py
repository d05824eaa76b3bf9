"""Helpers the multi-GPU test files share: a job started as a subprocess of this interpreter (torchmem from
this checkout's src/, the multi-GPU programs importable), its result saved beside its captures, the figures
written for docs/benchmarks.md, and ``torchmem report`` on captures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

PROGRAMS = Path(__file__).parent / "programs" / "multi"
SRC = str(Path(__file__).resolve().parents[2] / "src")


def job_env() -> dict[str, str]:
    """This environment less a launcher's variables (each job sets its own), torchmem and the programs
    importable, output unbuffered."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHELASTIC_", "TORCHMEM_"))}
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_PORT"):
        env.pop(k, None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (SRC, str(PROGRAMS), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def figures(name: str, data: dict[str, Any]) -> None:
    """``$TORCHMEM_FIGURES/<name>.json`` when that variable is set (the lead copies them into the docs)."""
    where = os.environ.get("TORCHMEM_FIGURES")
    if where:
        Path(where).mkdir(parents=True, exist_ok=True)
        (Path(where) / f"{name}.json").write_text(json.dumps(data, indent=1, default=str))


class Job:
    """``python <args>`` started now in ``cwd``; :meth:`result` waits for it (once) and keeps its output."""

    def __init__(self, args: list[str], cwd: Path, env: dict[str, str] | None = None) -> None:
        self.cwd = cwd
        self.args = [sys.executable, *args]
        self.t0 = time.monotonic()
        self.proc = subprocess.Popen(
            self.args,
            cwd=cwd,
            env={**job_env(), **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.done: subprocess.CompletedProcess[str] | None = None
        self.seconds = 0.0

    def result(self, timeout: float = 240) -> subprocess.CompletedProcess[str]:
        if self.done is None:
            try:
                out, err = self.proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                out, err = self.proc.communicate()
                pytest.fail(f"job {self.args} still ran after {timeout} s:\n{err[-3000:]}")
            self.seconds = time.monotonic() - self.t0
            self.done = subprocess.CompletedProcess(self.args, self.proc.returncode, out, err)
            (self.cwd / "stdout.txt").write_text(out)
            (self.cwd / "stderr.txt").write_text(err)
        return self.done

    def kill(self) -> None:
        if self.done is None:
            self.proc.kill()
            self.proc.communicate()


def report(cwd: Path, *captures: str) -> str:
    """``torchmem report <captures>``'s output (it must succeed)."""
    r = subprocess.run(
        [sys.executable, "-m", "torchmem", "report", *captures], cwd=cwd, env=job_env(), capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout
