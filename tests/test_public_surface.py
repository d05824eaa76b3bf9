"""The public surface comes from one table, and everything it hands out can be named from ``torchmem``.

``torchmem._EXPORTS`` (module -> the public names it defines) is the one list: ``__all__`` and the lazy
loading are built from it at run time, and the ``TYPE_CHECKING`` imports type checkers read are generated
from it. After editing the table, regenerate those imports::

    python tests/test_public_surface.py

Every error a public function documents under ``Raises:`` and every type its return annotation names
(overloads included) is reachable as ``torchmem.<Name>``, so ``except torchmem.XError`` and
``isinstance(r, torchmem.X)`` always work.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

INIT = Path(__file__).resolve().parents[1] / "src" / "torchmem" / "__init__.py"
BEGIN = "# BEGIN generated from _EXPORTS"
END = "# END generated"


def _table() -> dict[str, tuple[str, ...]]:
    """``_EXPORTS`` as written in ``__init__.py`` (read without importing torchmem, or needing the rest of
    the file to parse: the generator runs on a file whose generated block is being rewritten)."""
    m = re.search(r"^_EXPORTS: [^=]*= (\{.*?^\})", INIT.read_text(), re.M | re.S)
    assert m is not None, "no _EXPORTS table in torchmem/__init__.py"
    value: dict[str, tuple[str, ...]] = ast.literal_eval(m.group(1))
    return value


def generated_block(table: dict[str, tuple[str, ...]], indent: str = "    ") -> str:
    """The ``TYPE_CHECKING`` imports for ``table``, as ruff formats them: ``X as X``, the explicit re-export
    type checkers honour (kept out of isort, which would give each alias a statement of its own)."""
    lines = [f"{indent}# isort: off"]
    for module, names in sorted(table.items()):
        one_line = f"{indent}from {module} import " + ", ".join(f"{n} as {n}" for n in sorted(names))
        if len(one_line) <= 110:
            lines.append(one_line)
        else:
            lines += [f"{indent}from {module} import (", *(f"{indent}    {n} as {n}," for n in sorted(names))]
            lines.append(f"{indent})")
    lines.append(f"{indent}# isort: on")
    return "\n".join(lines) + "\n"


def write_block() -> None:
    """Rewrite the generated imports in ``__init__.py`` from its table."""
    text = INIT.read_text()
    head, rest = text.split(BEGIN, 1)
    marker_line, rest = rest.split("\n", 1)
    _, tail = rest.split(END, 1)
    indent = head[head.rindex("\n") + 1 :]
    INIT.write_text(f"{head}{BEGIN}{marker_line}\n{generated_block(_table(), indent)}{indent}{END}{tail}")


# ---------------------------------------------------------------------------------------------------------
# the one list


def _type_checking_imports() -> set[tuple[str, str, str | None]]:
    found: set[tuple[str, str, str | None]] = set()
    for node in ast.parse(INIT.read_text()).body:
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for stmt in node.body:
                if isinstance(stmt, ast.ImportFrom):
                    found |= {(stmt.module or "", a.name, a.asname) for a in stmt.names}
    return found


def test_type_checking_imports_are_generated_from_the_table() -> None:
    expected = {(m, n, n) for m, names in _table().items() for n in names}
    found = _type_checking_imports()
    assert found == expected, (
        f"the TYPE_CHECKING imports and _EXPORTS disagree (missing {sorted(expected - found)}, extra "
        f"{sorted(found - expected)}): run `python tests/test_public_surface.py` to regenerate them"
    )


def test_all_comes_from_the_table_each_name_once() -> None:
    import torchmem

    names = [n for names in _table().values() for n in names]
    assert len(names) == len(set(names)), "a name is listed under two modules"
    assert torchmem.__all__ == sorted([*names, "__version__"])
    ns: dict[str, object] = {}
    exec("from torchmem import *", ns)
    assert {k for k in ns if k != "__builtins__"} == set(torchmem.__all__)


def test_each_name_comes_from_the_module_the_table_gives() -> None:
    import torchmem

    for module, names in _table().items():
        mod = importlib.import_module(module)
        for name in names:
            value = getattr(torchmem, name)
            expected = getattr(mod, name, None) or importlib.import_module(f"{module}.{name}")
            assert value is expected, f"torchmem.{name} is not {module}.{name}"


def test_no_public_object_has_two_names() -> None:
    """An alias is a second name to document and keep; none was ever released (0.1.0 is the first)."""
    import torchmem

    by_id: dict[int, list[str]] = {}
    for name in torchmem.__all__:
        by_id.setdefault(id(getattr(torchmem, name)), []).append(name)
    assert [names for names in by_id.values() if len(names) > 1] == []
    for package in ("torchmem.actions", "torchmem.analysis", "torchmem.capture", "torchmem.results"):
        for mod in _modules_under(package):
            seen: dict[int, str] = {}
            for name in getattr(mod, "__all__", ()):
                value = getattr(mod, name)
                if isinstance(value, (str, int, float, bool, type(None))):
                    continue
                assert id(value) not in seen, f"{mod.__name__}: {name} is another name for {seen[id(value)]}"
                seen[id(value)] = name


def _modules_under(package: str) -> Iterator[types.ModuleType]:
    import pkgutil

    pkg = importlib.import_module(package)
    yield pkg
    for info in pkgutil.walk_packages(pkg.__path__, f"{package}."):
        yield importlib.import_module(info.name)


# ---------------------------------------------------------------------------------------------------------
# what public functions raise and return


def _raises(doc: str | None) -> list[str]:
    """The class names of a Google-style docstring's ``Raises:`` section."""
    m = re.search(r"^Raises:[ \t]*\n((?:[ \t]+\S.*\n?|[ \t]*\n)+)", doc or "", re.M)
    if m is None:
        return []
    return re.findall(r"^ {4}(\w+)(?: \(.*?\))?:", m.group(1), re.M)


def _classes_in(tp: Any) -> Iterator[type]:
    if isinstance(tp, type):
        yield tp
    for arg in typing.get_args(tp):
        yield from _classes_in(arg)


def _documented_elsewhere() -> Iterator[tuple[str, Any]]:
    """What the docs import from submodules (``from torchmem.report.html import write_html``): public too.
    The framework integrations (``torchmem.integrations.*``: callbacks, exporters) are left out."""
    root = INIT.parents[2]
    seen = set()
    for doc in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        imports = re.findall(r"^from (torchmem(?:\.\w+)+) import ([\w, ]+)$", doc.read_text(), re.M)
        for module, names in imports:
            if module.startswith("torchmem.integrations"):
                continue
            for name in (n.strip() for n in names.split(",")):
                if (module, name) not in seen:
                    seen.add((module, name))
                    yield f"{module}.{name}", getattr(importlib.import_module(module), name)


def _public_callables() -> Iterator[tuple[str, Any]]:
    """``torchmem.__all__``'s functions, its classes with their public methods and properties, the
    functions of the namespaces it exports (``torchmem.distributed``) and what the docs import from
    submodules."""
    import torchmem

    objects = [(f"torchmem.{name}", getattr(torchmem, name)) for name in torchmem.__all__]
    for where, obj in [*objects, *_documented_elsewhere()]:
        name = where.removeprefix("torchmem.")
        if inspect.ismodule(obj):
            for sub in getattr(obj, "__all__", ()):
                if inspect.isfunction(getattr(obj, sub)):
                    yield f"torchmem.{name}.{sub}", getattr(obj, sub)
        elif inspect.isclass(obj):
            yield f"torchmem.{name}", obj
            for attr, member in vars(obj).items():
                if attr.startswith("_") and attr not in ("__init__", "__enter__", "__call__", "__iter__"):
                    continue
                func = member.fget if isinstance(member, property) else getattr(member, "__func__", member)
                if inspect.isfunction(func):
                    yield f"torchmem.{name}.{attr}", func
        elif inspect.isfunction(obj):
            yield f"torchmem.{name}", obj
            for overload in typing.get_overloads(obj) if hasattr(typing, "get_overloads") else ():
                yield f"torchmem.{name} (overload)", overload


def _returned_classes(func: Any) -> set[type]:
    import torchmem

    # Names a module imports only for type checkers resolve through torchmem: unresolvable is a failure.
    namespace = {**{n: getattr(torchmem, n) for n in torchmem.__all__}, **getattr(func, "__globals__", {})}
    hints = typing.get_type_hints(func, globalns=namespace)
    return set(_classes_in(hints.get("return")))


def test_every_error_raised_and_type_returned_is_importable_from_torchmem() -> None:
    import builtins

    import torchmem

    elsewhere = [obj for _, obj in _documented_elsewhere()]
    unreachable = []
    for where, func in _public_callables():
        for name in _raises(inspect.getdoc(func)):
            if not hasattr(torchmem, name) and not hasattr(builtins, name):
                unreachable.append(f"{where} raises {name}")
        try:
            returned = set() if inspect.isclass(func) else _returned_classes(func)
        except NameError as exc:
            unreachable.append(f"{where}: return annotation names {exc.name}, which torchmem does not export")
            continue
        for cls in returned:
            if cls in elsewhere:  # a class the docs import from its module (CaptureWriter.__enter__)
                continue
            if cls.__module__.startswith("torchmem") and getattr(torchmem, cls.__name__, None) is not cls:
                unreachable.append(f"{where} returns {cls.__module__}.{cls.__name__}")
    assert unreachable == []


def test_the_raises_parser_reads_google_sections() -> None:
    doc = (
        "Do it.\n\nRaises:\n    AError: when a.\n        More on a.\n    BError (sometimes): b.\n\n"
        "Example:\n    x\n"
    )
    assert _raises(doc) == ["AError", "BError"]
    assert _raises("No section.") == []


def test_every_exported_error_is_a_torchmem_error() -> None:
    import torchmem

    errors = [
        getattr(torchmem, n)
        for n in torchmem.__all__
        if inspect.isclass(getattr(torchmem, n))
        and issubclass(getattr(torchmem, n), BaseException)
        and not issubclass(getattr(torchmem, n), Warning)
    ]
    assert errors and [e.__name__ for e in errors if not issubclass(e, torchmem.TorchmemError)] == []


def test_release_errors_say_which_is_which() -> None:
    import torchmem

    assert "could not" in (torchmem.ReleaseFailedError.__doc__ or "")
    assert "used after" in (torchmem.ReleasedError.__doc__ or "")
    assert not issubclass(torchmem.ReleaseFailedError, torchmem.ReleasedError)
    assert not issubclass(torchmem.ReleasedError, torchmem.ReleaseFailedError)


def test_the_readme_lists_the_public_names() -> None:
    import torchmem

    readme = (INIT.parents[2] / "README.md").read_text()
    section = readme.split("\n## API\n", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^- [^:]*: (.*?)(?=^- |\Z)", section, re.M | re.S))
    names = {n for text in listed for n in re.findall(r"`(\w+)`", re.sub(r"\([^)]*\)", "", text))}
    assert names == set(torchmem.__all__) - {"__version__"}, (
        f"README's API list: missing {sorted(set(torchmem.__all__) - names - {'__version__'})}, "
        f"not public {sorted(names - set(torchmem.__all__))}"
    )


if __name__ == "__main__":
    write_block()
