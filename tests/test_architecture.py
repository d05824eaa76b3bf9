"""The layering of docs/architecture.md, checked on the source: every import (module level, inside functions,
under ``TYPE_CHECKING``) goes down the layer order, no two modules import each other (directly or through a
chain), and only ``devices/`` touches ``torch.cuda`` and the other device runtimes."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "src" / "torchmem"

# Bottom to top. A module may import its own layer and the layers below it, never one above.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "base",
        (
            "torchmem._errors",
            "torchmem._units",
            "torchmem._exceptions",
            "torchmem._version",
            "torchmem._format",
            "torchmem._warn",
            "torchmem._outputs",
            "torchmem._decorate",
            "torchmem._patch",
            "torchmem._gc",
        ),
    ),
    ("lint", ("torchmem.lint",)),
    ("devices", ("torchmem.devices",)),
    ("results", ("torchmem.results",)),
    ("analysis", ("torchmem.analysis",)),
    ("capture", ("torchmem.capture",)),
    ("report", ("torchmem.report",)),
    ("actions", ("torchmem.actions",)),
    ("integrations", ("torchmem.integrations",)),
    ("run", ("torchmem.run",)),
    ("cli", ("torchmem.cli", "torchmem.__main__")),
    ("root", ("torchmem",)),
]
RANK = {name: i for i, (name, _) in enumerate(LAYERS)}
# report turns results into text, JSON, HTML and plots: it imports results (and base) only.
ONLY = {"report": {"base", "results", "report"}}
DEVICE_RUNTIMES = ("torch.cuda", "torch.mps", "torch.xpu", "torch.accelerator", "pynvml", "cupy")


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        name = _module_name(p)
        if name.startswith("torchmem._demo"):  # a user program shipped as data, not part of the library
            continue
        out[name] = p
    return out


def _layer(mod: str) -> str:
    best = ""
    layer = "root"
    for name, prefixes in LAYERS:
        for pre in prefixes:
            if (mod == pre or mod.startswith(pre + ".")) and len(pre) > len(best) and pre != "torchmem":
                best, layer = pre, name
    return layer


def _imports(mod: str, path: Path, known: set[str]) -> list[tuple[str, int, str]]:
    """(imported torchmem module, line, how) for every import statement anywhere in the file."""
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.name == "__init__.py"
    out: list[tuple[str, int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("torchmem"):
                    out.append((a.name, node.lineno, f"import {a.name}"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                src = ".".join(base + ([node.module] if node.module else []))
            else:
                src = node.module or ""
            if not src.startswith("torchmem"):
                continue
            for a in node.names:
                sub = f"{src}.{a.name}"
                if sub.startswith("torchmem._demo"):  # the demo program is data, not a layer
                    continue
                target = sub if sub in known else src
                out.append((target, node.lineno, f"from {src} import {a.name}"))
    return out


def _graph() -> tuple[dict[str, set[str]], list[str]]:
    mods = _modules()
    known = set(mods)
    graph: dict[str, set[str]] = defaultdict(set)
    upward: list[str] = []
    for mod, path in sorted(mods.items()):
        here = _layer(mod)
        for target, line, how in _imports(mod, path, known):
            while target not in known and "." in target:
                target = target.rsplit(".", 1)[0]
            if target == mod:
                continue
            graph[mod].add(target)
            there = _layer(target)
            allowed = ONLY.get(here)
            if RANK[there] > RANK[here] or (allowed is not None and there not in allowed):
                upward.append(f"{path.relative_to(PKG.parent)}:{line}: {here} -> {there}: {how}")
    return graph, upward


def test_every_import_goes_down_the_layers() -> None:
    _, upward = _graph()
    assert not upward, "imports against the layer order:\n" + "\n".join(upward)


def test_no_import_cycles() -> None:
    graph, _ = _graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(_modules()):
        if v not in index:
            visit(v)
    # The package root imports everything to build the public API; a module importing the root back is the
    # cycle (it shows up in the components as "torchmem").
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def _runtime_uses(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        text = None
        if isinstance(node, ast.Attribute):
            try:
                text = ast.unparse(node)
            except Exception:  # pragma: no cover
                continue
        elif isinstance(node, ast.Import):
            text = ",".join(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            text = node.module or ""
        if text and any(text == r or text.startswith(r + ".") or f",{r}" in text for r in DEVICE_RUNTIMES):
            found.append((node.lineno, text))
    return found


def test_only_the_device_layer_touches_device_runtimes() -> None:
    bad = []
    for mod, path in sorted(_modules().items()):
        if _layer(mod) == "devices":
            continue
        for line, text in _runtime_uses(path):
            bad.append(f"{path.relative_to(PKG.parent)}:{line}: {text}")
    assert not bad, "device runtimes used outside devices/:\n" + "\n".join(sorted(set(bad)))


def test_lint_never_imports_torch() -> None:
    """``torchmem lint`` runs wherever Python does: no module of ``torchmem.lint`` imports torch, directly or
    through the torchmem modules it imports (every import statement, at any level, followed to the end).
    ``tests/cli/test_lint_no_torch.py`` checks the same at run time, through the CLI."""
    mods = _modules()
    known = set(mods)
    lint = sorted(m for m in mods if _layer(m) == "lint")
    assert "torchmem.lint" in lint and "torchmem.lint._checker" in lint  # the scan sees the package
    reached: dict[str, str] = {}  # torchmem module -> the lint module whose imports reach it
    todo = [(m, m) for m in lint]
    while todo:
        mod, via = todo.pop()
        if mod in reached:
            continue
        reached[mod] = via
        for target, _, _ in _imports(mod, mods[mod], known):
            while target not in known and "." in target:
                target = target.rsplit(".", 1)[0]
            if target in known and target not in reached:
                todo.append((target, via))
    bad = []
    for mod, via in sorted(reached.items()):
        path = mods[mod]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                if name == "torch" or name.startswith("torch."):
                    where = "" if mod == via else f" (reached from {via})"
                    bad.append(f"{path.relative_to(PKG.parent)}:{node.lineno}: import {name}{where}")
    assert not bad, "torchmem.lint imports torch:\n" + "\n".join(bad)


@pytest.mark.parametrize(
    ("mod", "layer"),
    [
        ("torchmem._units", "base"),
        ("torchmem.devices._cuda", "devices"),
        ("torchmem.results.leaks", "results"),
        ("torchmem.cli.run", "cli"),
        ("torchmem", "root"),
    ],
)
def test_the_checker_knows_the_layers(mod: str, layer: str) -> None:
    assert _layer(mod) == layer


def test_the_checker_sees_function_level_and_type_checking_imports(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from torchmem.cli import run\n"
        "def f():\n    from torchmem.report import html\n    import torchmem.actions.release\n"
    )
    found = {t for t, _, _ in _imports("torchmem.devices.m", src, set(_modules()))}
    assert {"torchmem.cli.run", "torchmem.report.html", "torchmem.actions.release"} <= found


# ---------------------------------------------------------------------------------------------------------
# the capture's record schema: one table (results.capture.RECORDS) that the writers, the reader and
# `torchmem report --json` agree with

# Keys of `report --json` besides one per record kind.
_JSON_KEYS = {"path", "header", "summary", "truncated", "unknown", "lines"}
# Calls that write a record: Session._write(kind, ...), CaptureWriter.record(kind, ...).
_WRITER_CALLS = {"_write", "record"}


def _record_writes() -> list[tuple[str, str, set[str], bool]]:
    """(where, kind, field names, whether some fields come from ``**``) for every call in the package that
    writes a capture record with a literal kind, found by parsing the source."""
    found = []
    for path in sorted(_modules().values()):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in _WRITER_CALLS
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                continue
            names = {k.arg for k in node.keywords if k.arg is not None} - {"t"}
            star = any(k.arg is None for k in node.keywords)
            found.append((f"{path.relative_to(PKG.parent)}:{node.lineno}", node.args[0].value, names, star))
    return found


def test_every_record_the_code_writes_is_in_the_record_table() -> None:
    import dataclasses

    from torchmem.results.capture import RECORDS

    writes = _record_writes()
    written = {kind for _, kind, _, _ in writes}
    # the scan sees the writers (not vacuous): the session's records and CaptureWriter's typed ones
    assert {"sample", "step", "end", "host_leak", "survivors", "overhead", "oom", "forecast"} <= written
    bad = [f"{where}: {kind!r} is not in RECORDS" for where, kind, _, _ in writes if kind not in RECORDS]
    assert not bad, "records written of kinds the table does not have:\n" + "\n".join(bad)
    lost = []
    for where, kind, names, _ in writes:
        fields = {f.name for f in dataclasses.fields(RECORDS[kind].type)}
        lost += [f"{where}: {kind}.{n} is written but {RECORDS[kind].type.__name__} has no such field"
                 for n in sorted(names - fields)]  # fmt: skip
    assert not lost, "fields the reader would drop:\n" + "\n".join(lost)
    unwritten = set(RECORDS) - written
    assert not unwritten, f"kinds in the table that nothing writes: {sorted(unwritten)}"


def _example(tp: object, name: str) -> object:
    """A value of the annotation ``tp`` for a record's field ``name`` (as it reads back from JSON)."""
    import types
    import typing
    from collections.abc import Mapping

    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
    origin, args = typing.get_origin(tp) or tp, typing.get_args(tp)
    if tp is bool:
        return True
    if tp is int:
        return 7
    if tp is float:
        return 1.5
    if tp is str:
        return f"{name}-text"
    if origin in (Mapping, dict):
        return {"a": 0.25} if args == (str, float) else {"key": name, "n": [1, 2]}
    if origin is tuple:
        return ("n1",) if args[0] is str else ({"module": "m", "params": 1},)
    raise AssertionError(f"no example value for {name}: {tp!r}")


def test_the_record_table_the_reader_and_report_json_agree(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import dataclasses
    import json
    import os
    import typing

    from torchmem.capture.file import CaptureWriter, read_capture
    from torchmem.cli import main
    from torchmem.results.capture import RECORDS, Capture

    # every Capture attribute but the file's own facts is one kind's group, and the other way round
    groups = {r.group for r in RECORDS.values()}
    assert len(groups) == len(RECORDS)
    assert set(Capture.__dataclass_fields__) - _JSON_KEYS == groups

    examples = {}
    for i, (kind, r) in enumerate(RECORDS.items()):
        hints = typing.get_type_hints(r.type)
        values = {f.name: _example(hints[f.name], f.name) for f in dataclasses.fields(r.type)}
        values["t"] = 1.0 + i
        examples[kind] = r.type(**values)
    p = tmp_path / "every-kind.jsonl"
    w = CaptureWriter(p, argv=["every-kind.py"])
    for kind, rec in examples.items():
        w.record(kind, **rec.to_dict())  # the writer takes every kind (the end record too)
    fd, w._fd = w._fd, None  # closed without close(): the file ends with the example's end record
    assert fd is not None
    os.close(fd)
    cap = read_capture(p)
    assert cap.truncated is None and not cap.unknown
    for kind, rec in examples.items():
        assert cap.records(kind) == (rec,), f"the reader did not read the {kind} record back"

    assert main(["report", str(p), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) == _JSON_KEYS | groups
    for kind, rec in examples.items():
        r = RECORDS[kind]
        want = json.loads(json.dumps(rec.to_dict()))
        assert data[r.group] == ([want] if r.many else want), f"report --json: {kind} as {r.group}"
    assert Capture.from_dict(data) == dataclasses.replace(cap, path=data["path"])


# -- size: no module over 800 lines, no class over 500 (issue 28) ------------------------------------------
MAX_MODULE_LINES = 800
MAX_CLASS_LINES = 500


def _sizes() -> tuple[dict[str, int], dict[str, int]]:
    modules: dict[str, int] = {}
    classes: dict[str, int] = {}
    for name, path in _modules().items():
        text = path.read_text(encoding="utf-8")
        modules[name] = len(text.splitlines())
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                classes[f"{name}.{node.name}"] = node.end_lineno - node.lineno + 1
    return modules, classes


def test_no_module_over_800_lines_and_no_class_over_500() -> None:
    modules, classes = _sizes()
    assert len(modules) > 50 and classes  # the walk saw the package
    big = {k: v for k, v in modules.items() if v > MAX_MODULE_LINES}
    assert not big, f"modules over {MAX_MODULE_LINES} lines (split them by idea): {big}"
    large = {k: v for k, v in classes.items() if v > MAX_CLASS_LINES}
    assert not large, f"classes over {MAX_CLASS_LINES} lines (compose them of parts): {large}"


def test_the_size_check_counts_what_it_should(tmp_path: Path) -> None:
    src = "class A:\n" + "    x = 1\n" * 600 + "\n\nclass B:\n    pass\n"
    tree = ast.parse(src)
    found = {n.name: n.end_lineno - n.lineno + 1 for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    assert found["A"] == 601 > MAX_CLASS_LINES and found["B"] == 2
