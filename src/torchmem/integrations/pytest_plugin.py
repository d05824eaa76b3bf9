"""pytest plugin: fail a test that leaves tensors allocated, grows memory across repeated calls, or goes over
its peak — with the allocation site, the holder and the fix as the failure message.

Registered through the ``pytest11`` entry point (installing torchmem is enough); it does nothing until asked:

- per test: ``@pytest.mark.torchmem(max_leak="1MiB", max_peak="2GiB", repeat=3, device="cuda")``;
- for a whole suite: ``pytest --torchmem`` (with ``--torchmem-max-leak``, ``--torchmem-max-peak``,
  ``--torchmem-repeat``, ``--torchmem-device``); a marker's arguments win over the options;
- in a test: the ``torchmem_check`` fixture, ``torchmem_check(fn, repeat=5, max_leak="64KiB")``, which runs
  ``fn`` and fails the test the same way (it returns the :class:`~torchmem.capture.memcheck.MemCheck`).

A checked test runs ``repeat`` times (its fixtures are set up once) under torchmem's exact tensor accounting,
on the CPU as on CUDA, so a library can check its memory in CPU-only CI. With ``repeat=1`` the test may leave
at most ``max_leak`` bytes of tensors alive (default 0); with more calls, the calls after the first may keep
at most ``max_leak`` bytes per call (a first call that builds a cache passes). Importing this module imports
neither torch nor the rest of torchmem: an unchecked suite pays nothing.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest

_OPTIONS = ("max_leak", "max_peak", "repeat", "device")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("torchmem", "torchmem: device memory checks")
    group.addoption(
        "--torchmem",
        action="store_true",
        default=False,
        help="check every test's memory: tensors left allocated, growth across calls, peak",
    )
    group.addoption("--torchmem-max-leak", default="0", help="bytes a test may leave allocated (e.g. 1MiB)")
    group.addoption("--torchmem-max-peak", default=None, help="bytes above its start a test may peak at")
    group.addoption("--torchmem-repeat", default="1", help="run each checked test this many times")
    group.addoption("--torchmem-device", default=None, help="the device to check (default: the accelerator)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "torchmem(max_leak=0, max_peak=None, repeat=1, device=None): fail the test when it leaves tensors "
        "allocated, grows memory across its repeated calls, or peaks over max_peak (sizes: bytes or '1MiB')",
    )


def _settings(item: pytest.Item) -> dict[str, Any] | None:
    marker = item.get_closest_marker("torchmem")
    config = item.config
    if marker is None and not config.getoption("--torchmem"):
        return None
    out: dict[str, Any] = {
        "max_leak": config.getoption("--torchmem-max-leak"),
        "max_peak": config.getoption("--torchmem-max-peak"),
        "repeat": config.getoption("--torchmem-repeat"),
        "device": config.getoption("--torchmem-device"),
    }
    if marker is not None:
        if marker.args:
            raise ValueError(
                f"{item.nodeid}: @pytest.mark.torchmem takes keyword arguments only ({', '.join(_OPTIONS)})"
            )
        unknown = set(marker.kwargs) - set(_OPTIONS)
        if unknown:
            raise ValueError(
                f"{item.nodeid}: @pytest.mark.torchmem got unknown argument(s) {sorted(unknown)}; "
                f"it takes {', '.join(_OPTIONS)}"
            )
        out.update(marker.kwargs)
    return _parsed(out, item.nodeid)


def _size(value: Any, what: str, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"{where}: {what} must be a size in bytes or like '1MiB', not {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{where}: {what} must be >= 0, not {value}")
        return value
    from torchmem._units import parse_size

    n = parse_size(str(value))
    if n is None:
        raise ValueError(f"{where}: {what} must be a size in bytes or like '1MiB', not {value!r}")
    return n


def _parsed(raw: dict[str, Any], where: str) -> dict[str, Any]:
    repeat = raw["repeat"]
    try:
        repeat = int(repeat)
    except (TypeError, ValueError):
        repeat = 0
    if repeat < 1 or isinstance(raw["repeat"], bool):
        raise ValueError(f"{where}: torchmem repeat must be a positive integer, not {raw['repeat']!r}")
    return {
        "max_leak": _size(raw["max_leak"], "max_leak", where) or 0,
        "max_peak": _size(raw["max_peak"], "max_peak", where),
        "repeat": repeat,
        "device": raw["device"],
    }


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    problem = ""
    try:
        settings = _settings(pyfuncitem)
    except ValueError as exc:
        problem, settings = str(exc), None
    if problem:
        pytest.fail(f"torchmem: {problem}", pytrace=False)
    if settings is None:
        return None  # pytest calls the test as usual
    fn = pyfuncitem.obj
    if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
        return None  # an async test's plugin (pytest-asyncio, anyio) runs it: left unchecked
    args = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
    _check(lambda: fn(**args), settings, pyfuncitem.name)
    return True


def _check(fn: Any, settings: dict[str, Any], name: str) -> Any:
    from torchmem.capture.memcheck import check_calls

    result = check_calls(
        fn,
        device=settings["device"],
        repeat=settings["repeat"],
        max_leak=settings["max_leak"],
        max_peak=settings["max_peak"],
        name=name,
    )
    if result.failed:
        pytest.fail(result.message, pytrace=False)
    return result


@pytest.fixture
def torchmem_check(request: pytest.FixtureRequest) -> Any:
    """``torchmem_check(fn, *, repeat=1, max_leak=0, max_peak=None, device=None)``: run ``fn`` and fail the
    test when it leaves tensors allocated, grows memory across its calls or peaks over ``max_peak``; returns
    the :class:`~torchmem.capture.memcheck.MemCheck` otherwise.

    Example::

        def test_cache_is_bounded(torchmem_check):
            cache = MyCache(max_items=4)
            torchmem_check(lambda: cache.put(torch.randn(1024)), repeat=10, max_leak="1KiB")
    """

    def check(
        fn: Any, *, repeat: int = 1, max_leak: Any = 0, max_peak: Any = None, device: Any = None
    ) -> Any:
        problem = ""
        try:
            settings = _parsed(
                {"max_leak": max_leak, "max_peak": max_peak, "repeat": repeat, "device": device},
                request.node.nodeid,
            )
        except ValueError as exc:
            problem = str(exc)
        if problem:
            pytest.fail(f"torchmem: {problem}", pytrace=False)
        name = getattr(fn, "__name__", "the call")
        return _check(fn, settings, f"{request.node.name}: {name}")

    return check
