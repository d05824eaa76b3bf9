"""A script in a fresh interpreter with torchmem's source importable (for tests whose ranks or processes must
not share the test process's state); it answers through files."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torchmem


def run_fresh(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python *args`` with ``src`` and the tests' folder on the path (a test module the script imports
    imports this one), one thread per process and a bare ``PATH``; its output captured, its exit code left
    to the caller."""
    src = str(Path(torchmem.__file__).resolve().parents[1])
    tests = str(Path(__file__).resolve().parent)
    env = {"PYTHONPATH": os.pathsep.join((src, tests)), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=timeout, env=env, check=False
    )
