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
        ),
    ),
    ("devices", ("torchmem.devices",)),
    ("results", ("torchmem.results",)),
    ("analysis", ("torchmem.analysis",)),
    ("capture", ("torchmem.capture",)),
    ("report", ("torchmem.report",)),
    ("actions", ("torchmem.actions",)),
    ("integrations", ("torchmem.integrations",)),
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
