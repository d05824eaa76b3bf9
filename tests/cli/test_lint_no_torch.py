"""`torchmem lint` runs without importing torch (editors, pre-commit hooks and CI lint steps call it often):
the CLI imports only the module of the command it runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_torchmem_lint_does_not_import_torch(tmp_path: Path) -> None:
    src = tmp_path / "train.py"
    src.write_text(
        "import torch\n\nfor x in data:\n    loss = model(x)\n    loss.backward()\n    total += loss\n"
    )
    code = (
        "import sys\nfrom torchmem.cli import main\n"
        f"rc = main(['lint', {str(src)!r}])\n"
        "print('RC', rc, 'TORCH', 'torch' in sys.modules)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "TM001" in r.stdout and "RC 1 TORCH False" in r.stdout, r.stdout + r.stderr
