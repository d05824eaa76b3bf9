"""``[tool.torchmem.lint]`` in the nearest ``pyproject.toml``: select, ignore, exclude (ruff's names)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchmem._errors import TorchmemError
from torchmem.lint._rules import RULES

_KEYS = ("select", "ignore", "exclude", "extend-exclude")


class LintConfigError(TorchmemError, ValueError):
    """A ``[tool.torchmem.lint]`` table or a ``--select``/``--ignore`` code that cannot be used (also a
    ``ValueError``)."""


@dataclass(frozen=True)
class LintConfig:
    """The settings of one ``[tool.torchmem.lint]`` table (defaults when there is none).

    Attributes:
        select: Codes or code prefixes to check (None: every rule).
        ignore: Codes or code prefixes not to report.
        exclude: Glob patterns (matched against each path part and against the path relative to
            ``root``) of files and folders to skip.
        root: The folder of the ``pyproject.toml`` it came from.
        source: That ``pyproject.toml``.
        notes: Things worth telling the user (an unknown key, a config skipped on Python 3.10).
    """

    select: tuple[str, ...] | None = None
    ignore: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    root: Path | None = None
    source: Path | None = None
    notes: tuple[str, ...] = field(default=())


def check_codes(codes: tuple[str, ...], where: str) -> None:
    """Raise :class:`LintConfigError` for a code or prefix that matches no rule."""
    for code in codes:
        if code.upper() == "ALL":
            continue
        if not any(c.startswith(code.upper()) for c in RULES):
            known = ", ".join(c for c in RULES if c != "TM000")
            raise LintConfigError(f"{where}: unknown rule code {code!r} (known: {known})")


def _load_toml(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        try:
            import tomli as tomllib  # type: ignore[import-not-found,unused-ignore]
        except ImportError:
            return None, f"{path}: [tool.torchmem.lint] not read (Python 3.10 needs the 'tomli' package)"
    try:
        with open(path, "rb") as f:
            return tomllib.load(f), None
    except (OSError, ValueError) as exc:
        raise LintConfigError(f"{path}: cannot read it as TOML ({exc})") from exc


def _codes(table: dict[str, Any], key: str, path: Path) -> tuple[str, ...]:
    value = table.get(key, [])
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise LintConfigError(f"{path}: [tool.torchmem.lint] {key} must be a list of strings")
    return tuple(v.strip() for v in value)


def read_config(pyproject: Path) -> LintConfig | None:
    """The ``[tool.torchmem.lint]`` table of one ``pyproject.toml``; None when it has none."""
    if b"torchmem" not in pyproject.read_bytes():  # the cheap test first: most pyproject files lack it
        return None
    data, note = _load_toml(pyproject)
    if data is None:
        return LintConfig(root=pyproject.parent, source=pyproject, notes=(note,) if note else ())
    table = data.get("tool", {}).get("torchmem", {}).get("lint")
    if table is None:
        return None
    if not isinstance(table, dict):
        raise LintConfigError(f"{pyproject}: [tool.torchmem.lint] must be a table")
    notes = tuple(
        f"{pyproject}: unknown key {k!r} in [tool.torchmem.lint] (known: {', '.join(_KEYS)})"
        for k in table
        if k not in _KEYS
    )
    select = _codes(table, "select", pyproject) if "select" in table else None
    ignore = _codes(table, "ignore", pyproject)
    check_codes(select or (), f"{pyproject}: select")
    check_codes(ignore, f"{pyproject}: ignore")
    exclude = _codes(table, "exclude", pyproject) + _codes(table, "extend-exclude", pyproject)
    return LintConfig(select, ignore, exclude, pyproject.parent, pyproject, notes)


class ConfigFinder:
    """The nearest ``pyproject.toml`` with a ``[tool.torchmem.lint]`` table, per folder, cached."""

    def __init__(self) -> None:
        self._by_dir: dict[Path, LintConfig] = {}
        self.notes: list[str] = []

    def for_dir(self, folder: Path) -> LintConfig:
        folder = folder.resolve()
        seen: list[Path] = []
        found = LintConfig()
        d: Path | None = folder
        while d is not None:
            if d in self._by_dir:
                found = self._by_dir[d]
                break
            seen.append(d)
            candidate = d / "pyproject.toml"
            if candidate.is_file():
                config = read_config(candidate)
                if config is not None:
                    found = config
                    self.notes.extend(n for n in config.notes if n not in self.notes)
                    break
            d = d.parent if d.parent != d else None
        for s in seen:
            self._by_dir[s] = found
        return found
