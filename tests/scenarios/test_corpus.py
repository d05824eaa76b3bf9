"""Issue 26's corpus on the CPU: every program in ``corpus/`` run with ``torchmem run prog.py`` (no option but
the capture's path), three at a time from a fork server, CUDA hidden; each capture checked against
``corpus_catalog``. Entries torchmem is known to get wrong are strict xfails whose reason says what it says
instead (``KNOWN_WRONG``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from scenarios.corpus_catalog import BY_NAME, CORPUS, KNOWN_WRONG, for_device, leaks
from scenarios.run_catalog import Expected, check, fixture_workers, run_all, safety_failures

CPU_ENV = {"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
CPU = for_device("cpu")

# The longest runs (host scans, transformers' import, timelines paced to 2 s): started first.
SLOW_FIRST = (
    "short_hf_generate_kept",
    "host_anomaly_mode_losses",
    "host_profiler_left_on",
    "metric_torchmetrics_never_reset",
    "metric_handwritten_never_reset",
    "transform_function_cache",
    "epoch_function_history",
    "host_numpy_rows",
    "host_log_dicts",
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    order = sorted(
        CPU, key=lambda s: (s.name not in SLOW_FIRST, SLOW_FIRST.index(s.name) if s.name in SLOW_FIRST else 0)
    )
    workers = fixture_workers()
    return run_all(order, tmp_path_factory, workers=workers, env=CPU_ENV, fork_server=True, timeout=120)


def _param(s: Expected) -> Any:
    reason = KNOWN_WRONG.get((s.name, "cpu"))
    return pytest.param(s, marks=pytest.mark.xfail(strict=True, reason=reason)) if reason else s


@pytest.mark.parametrize("s", [_param(s) for s in CPU], ids=[s.name for s in CPU])
def test_corpus_program_is_reported_as_expected(s: Expected, runs: dict[str, Any]) -> None:
    r = runs[s.name]
    failures = safety_failures(s, r)
    assert r.capture is not None and r.capture.exists(), f"no capture written\n{r.stderr[-3000:]}"
    failures += check(r.capture, s)
    assert not failures, (
        f"{s.name} ({s.about}):\n- " + "\n- ".join(failures) + f"\nsummary:\n{r.stderr[-2500:]}"
    )


def test_corpus_is_consistent() -> None:
    """Every program has an entry on each device it runs on, every leak-like one a single # SITE line inside
    its own file, names are unique; the corpus holds at least 25 leaks/OOMs and 10 controls."""
    programs = {p.name for p in CORPUS.glob("*.py")}
    assert programs == {s.file for s in BY_NAME.values()}
    for s in BY_NAME.values():
        assert s.path.parent == CORPUS, s.name
        if s.verdict in ("leak", "host_leak", "survivors", "oom"):
            assert s.site is not None and s.site.startswith(s.file + ":"), s.name
        else:
            assert s.site is None, s.name
    for device in ("cpu", "cuda"):
        assert len({s.file for s in leaks(device)}) >= 25, device
        assert sum(s.verdict == "quiet" for s in for_device(device)) >= 10, device
    assert all(name in BY_NAME and dev in ("cpu", "cuda") for name, dev in KNOWN_WRONG)


def test_the_corpus_checker_can_fail(tmp_path: Path) -> None:
    """A capture that reports nothing fails every leak, OOM and inner-growth entry: no expectation is
    vacuous."""
    import json

    from torchmem.capture.file import FORMAT, VERSION

    empty = tmp_path / "empty.jsonl"
    lines = [{"format": FORMAT, "version": VERSION, "device": "cpu"}]
    lines.append({"type": "end", "t": 9.0, "exit_code": 0, "reason": "exit", "steps": 30, "seconds": 9.0})
    empty.write_text("".join(json.dumps(x) + "\n" for x in lines))
    for s in CPU:
        if s.verdict != "quiet":
            assert check(empty, s), s.name
        else:
            assert check(empty, s) == [] or all("boundary" in f for f in check(empty, s)), s.name
