"""The public surface: what ``import torchmem`` exports, documents, ships, and (does not) do."""

from __future__ import annotations

import doctest
import importlib.resources
import inspect
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import torchmem

# The public names come from one table, torchmem._EXPORTS (tests/test_public_surface.py checks that
# __all__, the lazy loading and the type checkers' imports agree with it); these are read from it.
PUBLIC_FUNCTIONS = sorted(n for n in torchmem.__all__ if inspect.isfunction(getattr(torchmem, n)))
PUBLIC_CLASSES = sorted(n for n in torchmem.__all__ if inspect.isclass(getattr(torchmem, n)))
ERRORS = [
    n
    for n in PUBLIC_CLASSES
    if issubclass(getattr(torchmem, n), Exception) and not issubclass(getattr(torchmem, n), Warning)
]
# The errors made as TorchmemError(message, hint); the others take their figures (BudgetExceededError, ...).
PLAIN_ERRORS = [n for n in ERRORS if getattr(torchmem, n).__init__ is torchmem.TorchmemError.__init__]


def test_every_name_in_all_exists() -> None:
    missing = [name for name in torchmem.__all__ if not hasattr(torchmem, name)]
    assert missing == []


@pytest.mark.parametrize("name", PUBLIC_FUNCTIONS)
def test_public_functions_have_docstring_with_example(name: str) -> None:
    doc = inspect.getdoc(getattr(torchmem, name))
    assert doc, f"{name} has no docstring"
    assert "Example" in doc, f"{name}'s docstring has no Example section"
    # The Example section holds a doctest.
    assert ">>> " in doc.split("Example", 1)[1]


@pytest.mark.parametrize("name", PUBLIC_FUNCTIONS)
def test_public_function_examples_run(name: str) -> None:
    """The docstring examples are real doctests and give the printed results on a CPU build."""
    fn = getattr(torchmem, name)
    tests = doctest.DocTestFinder(recurse=False).find(fn, name, globs={})
    assert tests and tests[0].examples
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for t in tests:
        runner.run(t)
    result = runner.summarize(verbose=False)
    assert result.failed == 0


@pytest.mark.parametrize("name", PUBLIC_CLASSES)
def test_public_classes_have_docstrings(name: str) -> None:
    obj = getattr(torchmem, name)
    assert inspect.isclass(obj)
    assert (obj.__doc__ or "").strip(), f"{name} has no docstring"


def test_budget_error_is_a_torchmem_error_with_its_figures() -> None:
    err = torchmem.BudgetExceededError("cpu", 1024, 4096, 8192, False, ())
    assert isinstance(err, torchmem.TorchmemError)
    assert err.used == 4096 and err.budget == 1024 and err.message and err.hint


@pytest.mark.parametrize("name", PLAIN_ERRORS)
def test_errors_derive_from_torchmem_error(name: str) -> None:
    cls = getattr(torchmem, name)
    assert issubclass(cls, torchmem.TorchmemError)
    err = cls("what happened", "what to do")
    assert err.message == "what happened"
    assert err.hint == "what to do"
    assert "what happened" in str(err) and "what to do" in str(err)


def test_device_errors_share_a_base() -> None:
    for name in (
        "DeviceIndexError",
        "DeviceUnavailableError",
        "UnknownDeviceError",
        "UnsupportedDeviceError",
    ):
        assert issubclass(getattr(torchmem, name), torchmem.DeviceError)
    assert not issubclass(torchmem.TrackingError, torchmem.DeviceError)


def test_version_matches_distribution_metadata() -> None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed = version("torchmem")
    except PackageNotFoundError:  # run from the source tree (PYTHONPATH=src), not installed
        pytest.skip("torchmem is not installed as a distribution here")
    assert torchmem.__version__ == installed


def test_py_typed_is_shipped() -> None:
    assert importlib.resources.files("torchmem").joinpath("py.typed").is_file()
    tomllib = pytest.importorskip("tomllib")
    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    data = tomllib.loads(pyproject.read_text())
    assert "py.typed" in data["tool"]["setuptools"]["package-data"]["torchmem"]


_IMPORT_PROBE = textwrap.dedent(
    """
    import json, sys, threading
    import torch
    threads_after_torch = threading.active_count()
    names_after_torch = sorted(t.name for t in threading.enumerate())
    import torchmem
    from torch.utils._python_dispatch import _get_current_dispatch_mode
    print(json.dumps({
        "cuda_initialized": torch.cuda.is_initialized(),
        "threads_after_torch": threads_after_torch,
        "threads_after_torchmem": threading.active_count(),
        "names_after_torch": names_after_torch,
        "names_after_torchmem": sorted(t.name for t in threading.enumerate()),
        "dispatch_stack": torch._C._len_torch_dispatch_stack(),
        "function_stack": torch._C._len_torch_function_stack(),
        "current_mode": repr(_get_current_dispatch_mode()),
    }))
    """
)


def test_import_does_no_work_in_a_fresh_process() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _IMPORT_PROBE], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    assert data["cuda_initialized"] is False
    assert data["threads_after_torchmem"] == data["threads_after_torch"]
    assert data["names_after_torchmem"] == data["names_after_torch"]
    assert data["dispatch_stack"] == 0
    assert data["function_stack"] == 0
    assert data["current_mode"] == "None"


def test_import_loads_nothing_until_a_name_is_used() -> None:
    probe = (
        "import sys, json; import torchmem; "
        "before = sorted(m for m in sys.modules if m.startswith('torchmem')); "
        "torch_loaded = 'torch' in sys.modules; torchmem.stats; "
        "print(json.dumps([before, torch_loaded, 'torchmem.capture.read' in sys.modules]))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    before, torch_loaded, loaded_on_use = json.loads(proc.stdout.strip().splitlines()[-1])
    # _gc reads one counter (the objects the interpreter froze before torchmem): nothing else loads
    assert before == ["torchmem", "torchmem._gc", "torchmem._version"] and torch_loaded is False
    assert loaded_on_use is True
    assert set(torchmem.__all__) <= set(dir(torchmem))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        torchmem.nope  # type: ignore[attr-defined]  # noqa: B018


def test_the_distributed_namespace_is_a_documented_module() -> None:
    mod = torchmem.distributed
    assert inspect.ismodule(mod) and (mod.__doc__ or "").strip()
    for fn in (mod.gather_stats, mod.local_stats):
        assert ">>>" in (fn.__doc__ or ""), fn.__name__
