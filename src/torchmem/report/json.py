"""JSON output: every report object has ``to_dict()``; this writes them the same way everywhere."""

from __future__ import annotations

import json
from typing import IO, Any


def _data(obj: Any) -> Any:
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    if isinstance(obj, dict):
        return {k: _data(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_data(v) for v in obj]
    return obj


def dumps(obj: Any, *, indent: int | None = 2) -> str:
    """``obj`` (a result, or dicts and lists of results) as JSON; ``indent=None``: one line (JSON Lines)."""
    return json.dumps(_data(obj), indent=indent, sort_keys=False, default=str)


def write(obj: Any, file: IO[str], *, indent: int | None = 2) -> None:
    """:func:`dumps` and a newline to ``file``."""
    file.write(dumps(obj, indent=indent))
    file.write("\n")
