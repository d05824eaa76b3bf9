"""The merged report of a distributed job's captures (``torchmem report run.rank*.jsonl``): text and JSON.

Built from :class:`~torchmem.results.ranks.MergedReport` alone (``analysis.ranks.merge_captures`` makes it).
"""

from __future__ import annotations

import json
from typing import IO

from torchmem.results.ranks import MergedReport, render_merged


def write_merged(report: MergedReport, file: IO[str]) -> None:
    """The merged report as text, and a newline."""
    file.write(render_merged(report))
    file.write("\n")


def write_merged_json(report: MergedReport, file: IO[str]) -> None:
    """The merged report as one JSON object (``MergedReport.to_dict()``)."""
    json.dump(report.to_dict(), file, indent=2, allow_nan=False, default=str)
    file.write("\n")


__all__ = ["write_merged", "write_merged_json"]
