"""Issue 12's scenario suite on the CPU: each program in ``programs/`` run with ``torchmem run prog.py`` (no
option but the capture's path) in a process of its own, its capture checked for the verdict, allocation site
and holder ``run_catalog`` states. CUDA is hidden so the CPU path (the exact ledger) is the one tested."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from scenarios.run_catalog import (
    BY_NAME,
    Expected,
    check,
    fixture_workers,
    for_device,
    run_all,
    safety_failures,
)

CPU_ENV = {"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
CPU = for_device("cpu")


# The longest runs on a 2-core machine (5-6 s each, run alone): started first, none is left for the end.
SLOW_FIRST = (
    "uses_torchmem_watch",
    "ema_host_chain",
    "dataloader_workers_spawn",
    "val_loss_tensors_logged",
    "own_profile_and_trace",
    "lightning_step_outputs",
    "oom_retry_in_except",
    "timeline_simulation",
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Every program run once, three at a time (two in a worker of ``-n``), each in a child forked from an
    interpreter that has imported torch and torchmem (each run is mostly interpreter and torch start-up
    otherwise): the suite stays within the CPU suite's time budget. ``test_cost_against_plain_python`` and
    ``tests/cli`` run ``python -m torchmem run`` from a fresh interpreter."""
    order = sorted(CPU, key=lambda s: s.name not in SLOW_FIRST)
    return run_all(order, tmp_path_factory, workers=fixture_workers(), env=CPU_ENV, fork_server=True)


_KNOWN: dict[str, str] = {}


@pytest.mark.parametrize(
    "s",
    [pytest.param(s, marks=pytest.mark.xfail(strict=True, reason=_KNOWN[s.name])) if s.name in _KNOWN else s
     for s in CPU],
    ids=[s.name for s in CPU],
)  # fmt: skip
def test_program_is_reported_as_expected(s: Expected, runs: dict[str, Any]) -> None:
    r = runs[s.name]
    failures = safety_failures(s, r)
    assert r.capture is not None and r.capture.exists(), f"no capture written\n{r.stderr[-3000:]}"
    failures += check(r.capture, s)
    assert not failures, (
        f"{s.name} ({s.about}):\n- " + "\n- ".join(failures) + f"\nsummary:\n{r.stderr[-2500:]}"
    )


def test_catalog_is_consistent() -> None:
    """Every program has its expectation, every leak-like one a single # SITE line, names are unique."""
    programs = {p.name for p in (Path(__file__).parent / "programs").glob("*.py")}
    assert programs == {s.file for s in BY_NAME.values()}
    assert len(BY_NAME) == len(programs)
    for s in BY_NAME.values():
        if s.verdict in ("leak", "host_leak", "survivors", "oom"):
            assert s.site is not None and s.site.startswith(s.file + ":"), s.name
        else:
            assert s.site is None, s.name


def _capture(path: Path, *records: dict[str, Any]) -> Path:
    from torchmem.capture.file import FORMAT, VERSION

    lines = [{"format": FORMAT, "version": VERSION, "device": "cpu"}]
    lines += [{"t": 0.1 * i, **r} for i, r in enumerate(records, 1)]
    lines.append({"type": "end", "t": 9.0, "exit_code": 0, "reason": "exit", "steps": 30, "seconds": 9.0})
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def _leak(site: str, holder: str, boundary: str = "top-level Sequential() call") -> dict[str, Any]:
    culprit = {
        "kind": "graph_chain",
        "site": site,
        "sites": [{"site": site, "bytes_per_step": 2.0**20}],
        "holder": holder,
        "bytes": 2**24,
        "bytes_per_step": 2.0**20,
        "graph_bytes": 2.0**20,
        "fix": "x",
    }
    report = {"device": "cpu", "leaking": True, "detected_at": 9, "culprits": [culprit], "boundary": boundary}
    return {"type": "leak", "final": True, "report": report}


def test_checker_fails_on_a_wrong_site_holder_boundary_or_false_alarm(tmp_path: Path) -> None:
    """The checker itself: a right capture passes; a wrong site, holder or boundary, a missing OOM, or a
    control with a claim each fail, with the record in the message."""
    s = BY_NAME["eval_running_sum"]
    right = _capture(tmp_path / "right.jsonl", _leak(str(s.site), "__main__.total_loss.grad_fn"))
    assert check(right, s) == []
    wrong_site = _capture(tmp_path / "site.jsonl", _leak("eval_running_sum.py:1", "__main__.total_loss"))
    assert any("miss" in f for f in check(wrong_site, s))
    wrong_holder = _capture(tmp_path / "holder.jsonl", _leak(str(s.site), "__main__.val_set[3]"))
    assert any("lacks 'total_loss'" in f for f in check(wrong_holder, s))
    wrong_boundary = _capture(
        tmp_path / "b.jsonl", _leak(str(s.site), "__main__.total_loss", "optimizer step")
    )
    assert any("boundary 'optimizer'" in f for f in check(wrong_boundary, s))
    control = BY_NAME["control_lru_cache"]
    assert any("claims growth" in f for f in check(right, control))
    oom = BY_NAME["oom_retry_in_except"]
    record = {
        "type": "oom",
        "step": 1,
        "caught": True,
        "site": oom.site,
        "diagnosis": {"causes": [{"kind": "pinned_by_exception"}]},
    }
    assert check(_capture(tmp_path / "oom.jsonl", record), oom) == []
    uncaught = _capture(tmp_path / "oom2.jsonl", {**record, "caught": False})
    assert any("no oom record with" in f for f in check(uncaught, oom))
    assert check(_capture(tmp_path / "none.jsonl"), oom) == ["no oom record"]
