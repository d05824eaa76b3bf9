"""Files to findings: discovery, parsing, the checks, ``# noqa`` suppression, selection."""

from __future__ import annotations

import ast
import fnmatch
import gc
import io
import multiprocessing
import os
import re
import sys
import threading
import tokenize
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path

from torchmem.lint._checker import check_tree
from torchmem.lint._config import ConfigFinder, LintConfig, check_codes
from torchmem.lint._finding import LintFinding
from torchmem.lint._rules import PARSE_ERROR, RULES, severity

#: Folder names never walked into (a path given explicitly is still checked).
SKIP_DIRS = frozenset(
    {
        ".git", ".hg", ".svn", ".bzr", "__pycache__", ".venv", "venv", ".env", ".tox", ".nox", ".eggs",
        ".mypy_cache", ".ruff_cache", ".pytest_cache", ".ipynb_checkpoints", "node_modules", "build",
        "dist", "site-packages", "__pypackages__", "_build", "buck-out",
    }
)  # fmt: skip

_NOQA = re.compile(r"#\s*noqa(?::\s*(?P<codes>[A-Z]+[0-9]+(?:[\s,]+[A-Z]+[0-9]+)*))?", re.IGNORECASE)


# Syntax newer than some supported Pythons: (the version that reads it, what it is, the line's pattern).
_NEWER = (
    ((3, 12), "type parameters", re.compile(r"^\s*(?:async\s+)?(?:def|class)\s+\w+\s*\[")),
    ((3, 12), "a `type` alias", re.compile(r"^\s*type\s+\w+\s*(?:\[[^=]*\])?\s*=")),
    ((3, 11), "`except*`", re.compile(r"^\s*except\s*\*")),
)


def newer_syntax(source: str, line: int, msg: str) -> tuple[str, str, bool] | None:
    """``(version, what, sure)`` where a parse error at ``line`` may come from syntax a later Python reads and
    this Python is older: PEP 695's type parameters and aliases and ``except*`` (``sure``: no older Python
    reads such a line), or an f-string error (not sure: PEP 701's nested quotes, or a real error); ``None``
    otherwise."""
    lines = source.splitlines()
    text = lines[line - 1] if 0 < line <= len(lines) else ""
    for version, what, pattern in _NEWER:
        if sys.version_info < version and pattern.match(text):
            return f"{version[0]}.{version[1]}", what, True
    if sys.version_info < (3, 12) and msg.startswith("f-string"):
        return "3.12", "an f-string with nested quotes, a backslash or a comment", False
    return None


def _enabled(code: str, select: Iterable[str] | None, ignore: Iterable[str]) -> bool:
    if code == PARSE_ERROR:
        return True
    if select is not None and not any(s.upper() == "ALL" or code.startswith(s.upper()) for s in select):
        return False
    return not any(code.startswith(i.upper()) for i in ignore if i.upper() != "ALL") and not any(
        i.upper() == "ALL" for i in ignore
    )


def _noqa_lines(source: str) -> dict[int, frozenset[str] | None]:
    """Line -> the codes its ``# noqa: ...`` comment names (None: a bare ``# noqa``, every code)."""
    out: dict[int, frozenset[str] | None] = {}
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type != tokenize.COMMENT:
                continue
            m = _NOQA.search(tok.string)
            if m is None:
                continue
            codes = m.group("codes")
            out[tok.start[0]] = (
                None if codes is None else frozenset(c.upper() for c in re.split(r"[\s,]+", codes) if c)
            )
    except (tokenize.TokenError, SyntaxError):  # the parser accepted it; be lenient with the tokenizer
        pass
    return out


def _char_col(line_text: str, byte_col: int) -> int:
    """ast's byte offset as a 1-based character column."""
    if line_text.isascii():
        return byte_col + 1
    return len(line_text.encode("utf-8")[:byte_col].decode("utf-8", errors="replace")) + 1


def lint_source(
    source: str,
    path: str = "<string>",
    select: Iterable[str] | None = None,
    ignore: Iterable[str] = (),
) -> list[LintFinding]:
    """Check one module's source text and return its findings, sorted by line.

    Args:
        source: The module's text.
        path: The name findings carry (and whether it is a test file, for the eval-name rule).
        select: Codes or prefixes to check (default: every rule).
        ignore: Codes or prefixes not to report.

    A source that does not parse gives one ``TM000`` finding instead of raising.

    Example:
        >>> from torchmem.lint import lint_source
        >>> code = '''
        ... total = 0
        ... for x, y in loader:
        ...     loss = criterion(model(x), y)
        ...     loss.backward()
        ...     opt.step()
        ...     total += loss
        ... '''
        >>> [f.code for f in lint_source(code)]
        ['TM001']
    """
    select_t = tuple(select) if select is not None else None
    ignore_t = tuple(ignore)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # SyntaxWarning for invalid escapes in the user's code
            tree = ast.parse(source, filename=path)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        line = getattr(exc, "lineno", None) or 1
        col = getattr(exc, "offset", None) or 1
        msg = getattr(exc, "msg", None) or str(exc)
        newer = newer_syntax(source, line, msg)
        if newer is not None:
            need, what, sure = newer
            here = f"{sys.version_info.major}.{sys.version_info.minor}"
            said = (
                f"the line uses Python {need} syntax ({what})"
                if sure
                else f"if it is {what}, that is Python {need} syntax"
            )
            fix = f"run torchmem lint with Python {need} or later" + ("" if sure else " to tell")
            return [
                LintFinding(
                    path,
                    line,
                    max(col, 1),
                    PARSE_ERROR,
                    f"cannot parse with Python {here} ({msg}): {said}",
                    fix,
                )
            ]
        return [
            LintFinding(path, line, max(col, 1), PARSE_ERROR, f"cannot parse: {msg}", RULES[PARSE_ERROR].fix)
        ]
    try:
        raw = check_tree(tree, path)
    except RecursionError:  # expressions nested thousands deep: report, never a traceback
        msg = "nested too deeply to check"
        return [
            LintFinding(path, 1, 1, PARSE_ERROR, msg, "split the expression (or add this file to exclude)")
        ]
    except Exception as exc:  # torchmem's own error on this file: said for the file, the others still checked
        msg = f"torchmem lint could not check this file: internal error ({type(exc).__name__}: {exc})"
        fix = "report it to torchmem; exclude the file meanwhile"
        return [LintFinding(path, 1, 1, PARSE_ERROR, msg, fix)]
    if not raw:
        return []
    lines = source.splitlines()
    noqa = _noqa_lines(source) if "noqa" in source.lower() else {}
    seen: set[tuple[int, int, str]] = set()
    out: list[LintFinding] = []
    for r in raw:
        if not _enabled(r.code, select_t, ignore_t):
            continue
        if r.line in noqa:
            codes = noqa[r.line]
            if codes is None or r.code in codes:
                continue
        key = (r.line, r.col, r.code)
        if key in seen:
            continue
        seen.add(key)
        text = lines[r.line - 1] if 0 < r.line <= len(lines) else ""
        col = _char_col(text, r.col)
        level = severity(r.code, r.form)
        fix = r.fix or RULES[r.code].fix
        out.append(LintFinding(path, r.line, col, r.code, r.message, fix, r.form, level))
    out.sort(key=lambda f: (f.line, f.col, f.code))
    return out


def _excluded(path: Path, config: LintConfig) -> bool:
    if not config.exclude:
        return False
    try:
        rel = path.resolve().relative_to(config.root) if config.root else path
    except ValueError:
        rel = path
    rel_s = rel.as_posix()
    for pattern in config.exclude:
        pat = pattern.rstrip("/")
        if fnmatch.fnmatch(rel_s, pat) or fnmatch.fnmatch(path.name, pat) or rel_s.startswith(pat + "/"):
            return True
    return False


def _is_venv(folder: str) -> bool:
    return os.path.isfile(os.path.join(folder, "pyvenv.cfg"))


def iter_files(paths: Iterable[str | os.PathLike[str]], configs: ConfigFinder | None) -> Iterator[Path]:
    """The Python files under ``paths``, each once, in a stable order (missing paths raise first)."""
    given = [Path(p) for p in paths]
    missing = [str(p) for p in given if not p.exists()]
    if missing:
        raise FileNotFoundError(f"no such file or directory: {', '.join(missing)}")
    seen: set[Path] = set()
    for p in given:
        if p.is_file():
            config = configs.for_dir(p.parent) if configs else LintConfig()
            if _excluded(p, config):
                continue
            key = p.resolve()
            if key not in seen:
                seen.add(key)
                yield p
            continue
        for folder, dirs, files in os.walk(p):
            config = configs.for_dir(Path(folder)) if configs else LintConfig()
            keep = []
            for d in sorted(dirs):
                full = os.path.join(folder, d)
                if (
                    d in SKIP_DIRS
                    or d.endswith(".egg-info")
                    or _is_venv(full)
                    or _excluded(Path(full), config)
                ):
                    continue
                keep.append(d)
            dirs[:] = keep
            for name in sorted(files):
                if not name.endswith(".py"):
                    continue
                f = Path(folder, name)
                if _excluded(f, config):
                    continue
                key = f.resolve()
                if key not in seen:
                    seen.add(key)
                    yield f


def _read(path: Path) -> str:
    with open(path, "rb") as f:
        data = f.read()
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError:
        encoding = "utf-8"
    return data.decode(encoding)


def lint_file(path: Path, select: Iterable[str] | None, ignore: Iterable[str]) -> list[LintFinding]:
    """One file's findings; a file that cannot be read is a ``TM000`` finding, never an exception."""
    name = str(path)
    try:
        source = _read(path)
    except (OSError, UnicodeDecodeError, LookupError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return [LintFinding(name, 1, 1, PARSE_ERROR, f"cannot read: {reason}", RULES[PARSE_ERROR].fix)]
    return lint_source(source, name, select, ignore)


def lint_paths(
    paths: Iterable[str | os.PathLike[str]],
    select: Iterable[str] | None = None,
    ignore: Iterable[str] | None = None,
    *,
    config: bool = True,
    jobs: int | None = None,
) -> list[LintFinding]:
    """Check Python files and folders (walked recursively) for memory anti-patterns; return the findings.

    Args:
        paths: Files and folders. Folders skip ``.git``, virtual environments, ``build``/``dist`` and
            caches; files named explicitly are always read (unless the configuration excludes them).
        select: Codes or code prefixes to check (``["TM001", "TM00"]``); replaces the configuration's
            ``select``. Default: the configuration's, else every rule.
        ignore: Codes or prefixes not to report; added to the configuration's ``ignore``.
        config: Read ``[tool.torchmem.lint]`` from the nearest ``pyproject.toml`` of each file.
        jobs: Processes to check the files in. None (the default): one per usable core left idle by
            the machine's load (1-minute load average) for a tree of at least 64 files, when the process
            runs no other thread and can fork (POSIX); else 1. The findings are the same whatever the
            number.

    Returns:
        The findings, sorted by path, line and column. A file that cannot be read or parsed is one
        finding with code ``"TM000"``; ``# noqa`` and ``# noqa: TM001`` comments suppress findings on
        their line. Every finding of every selected rule is returned, each with its ``severity``:
        ``"warning"`` for the rule forms precise on held-out code, ``"info"`` for the others (the command
        line shows those only with ``--all``; docs/lint.md, "Default output").

    Raises:
        FileNotFoundError: A path does not exist.
        LintConfigError: A code in ``select``/``ignore`` (or in the configuration) matches no rule.

    Example:
        >>> import torchmem
        >>> for finding in torchmem.lint_paths(["train.py"]):  # doctest: +SKIP
        ...     print(finding)
        train.py:31:9: TM001 `total` accumulates `loss`, ... (fix: keep a number ...: `.item()` ...)
    """
    sel = tuple(select) if select is not None else None
    ign = tuple(ignore or ())
    check_codes(sel or (), "select")
    check_codes(ign, "ignore")
    finder = ConfigFinder() if config else None
    tasks: list[_Task] = []
    for path in iter_files(paths, finder):
        conf = finder.for_dir(path.parent) if finder else LintConfig()
        file_select = sel if sel is not None else conf.select
        tasks.append((path, file_select, (*conf.ignore, *ign)))
    out = _check_all(tasks, _jobs(jobs, len(tasks)))
    out.sort(key=lambda f: (f.path, f.line, f.col, f.code))
    return out


_Task = tuple[Path, "tuple[str, ...] | None", "tuple[str, ...]"]
_MIN_FILES_PER_JOB = 32


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _jobs(jobs: int | None, files: int) -> int:
    """How many processes check ``files`` files (see :func:`lint_paths`)."""
    if jobs is not None:
        return max(1, min(jobs, files))
    if files < 2 * _MIN_FILES_PER_JOB or threading.active_count() > 1:
        return 1  # small trees: a fork costs more than it saves; threads: forking them is unsafe
    if "fork" not in multiprocessing.get_all_start_methods():
        return 1  # pragma: no cover - spawn re-imports the package in every worker: not worth it
    cores = _usable_cores()
    try:
        idle = cores - os.getloadavg()[0]  # cores other processes leave free now
    except (AttributeError, OSError):  # pragma: no cover - no load average on this platform
        idle = float(cores)
    # A process that would not get a core of its own only adds the fork and the copying (measured: on a
    # 2-core machine at load 5.5, two processes took 2.70 s where one took 2.42 s).
    return max(1, min(cores, round(idle), files // _MIN_FILES_PER_JOB, 8))


def _check_chunk(tasks: list[_Task]) -> list[LintFinding]:
    out: list[LintFinding] = []
    # Parsing and walking make millions of short-lived container objects and no reference cycles (after
    # linting NeMo's 2,579 files a collection finds 12 unreachable objects): reference counting frees each
    # file's trees, and the cyclic collector's passes over them only cost time (13 % of the 100k-line tree,
    # benchmarks/lint_speed.py). It is off while the files are checked, with a collection every 1,000 files.
    enabled = gc.isenabled()
    gc.disable()
    try:
        for i, (path, select, ignore) in enumerate(tasks, 1):
            out.extend(lint_file(path, select, ignore))
            if i % 1000 == 0:
                gc.collect()
    finally:
        if enabled:
            gc.enable()
    return out


def _check_all(tasks: list[_Task], jobs: int) -> list[LintFinding]:
    if jobs <= 1:
        return _check_chunk(tasks)
    # Interleaved chunks (every jobs*4-th file) balance big and small folders across the workers.
    n = jobs * 4
    chunks = [tasks[i::n] for i in range(n)]
    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        parts = pool.map(_check_chunk, chunks)
    return [f for part in parts for f in part]


def config_notes(paths: Iterable[str | os.PathLike[str]]) -> list[str]:
    """What the configuration lookup for ``paths`` wants the user to know (unknown keys, a skipped file)."""
    finder = ConfigFinder()
    for p in paths:
        path = Path(p)
        finder.for_dir(path if path.is_dir() else path.parent)
    return finder.notes
