"""JSON output: every report object has ``to_dict()``; this writes them the same way everywhere."""

from __future__ import annotations

import json
from typing import IO, Any


def dumps(obj: Any) -> str:
    data = obj.to_dict() if hasattr(obj, "to_dict") else obj
    return json.dumps(data, indent=2, sort_keys=False, default=str)


def write(obj: Any, file: IO[str]) -> None:
    file.write(dumps(obj))
    file.write("\n")
