"""A project on disk for the lint tests that need more than one file (callers in other files, imported
classes): each file written under ``root``, then ``lint_paths`` over the folder."""

from __future__ import annotations

import textwrap
from pathlib import Path

from torchmem.lint import lint_paths


def project(root: Path, files: dict[str, str]) -> list[str]:
    """The codes ``lint_paths`` finds in ``files`` (path -> text, dedented) written under ``root``."""
    for name, text in files.items():
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))
    return [f.code for f in lint_paths([root], config=False)]
