"""LoopSurvivors: what a short loop allocated and kept, by site and holder, with real torch on the CPU."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import torchmem
import torchmem.capture.survivors as survivors_mod
from torchmem.analysis.loop_survivors import judge, survivor_fix
from torchmem.capture.survivors import LoopSurvivors
from torchmem.devices import ledger
from torchmem.results.survivors import SurvivorGroup, SurvivorReport, step_ranges

_SOURCE = Path(__file__).read_text().splitlines()


def _line(marker: str) -> str:
    """``"test_loop_survivors.py:N"`` of the line that carries ``# <marker>``."""
    n = next(i for i, text in enumerate(_SOURCE, 1) if text.rstrip().endswith(f"# {marker}"))
    return f"{Path(__file__).name}:{n}"


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """Step times decide how much is recorded: one intra-op thread keeps them steady on a busy machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _ops(n: int) -> torch.Tensor:
    """``n`` tiny aten ops: a step the ledger makes several times slower."""
    x = torch.ones(4)
    for _ in range(n):
        x = x + 1
    return x


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64))


def test_a_six_step_loop_that_keeps_outputs_with_graphs_is_named() -> None:
    model = _model()
    losses = []
    rec = LoopSurvivors("cpu")
    for step in range(1, 7):
        out = model(torch.randn(32, 64))  # LEAK-SITE
        losses.append(out.sum())
        rec.boundary(step)
    rec.stop()
    assert not ledger().active
    r = rec.report(total_steps=6)
    assert r.leaking
    assert r.covered == (2, 3, 4, 5, 6) and r.steps == 6
    top = r.groups[0]
    assert top.site == _line("LEAK-SITE") and top.function.startswith("test_a_six_step")
    assert top.accumulates and top.steps == (2, 3, 4, 5, 6)
    assert top.holder is not None and "losses" in top.holder
    assert top.kind == "retained_graph"
    assert top.fix.startswith("`losses` keeps each iteration's tensors with their autograd graph")
    # The scalar each step appends accumulates too, but 4 bytes a step is not a leak worth a headline.
    small = [g for g in r.groups if g.verdict == "small"]
    assert small and all(g.live_bytes < 4096 for g in small)
    text = str(r)
    assert text.startswith("allocated in the loop and still alive:") and "LEAK" in text
    assert _line("LEAK-SITE") in text and "fix: `losses`" in text
    assert not any(n.startswith("recorded ") for n in r.notes)  # a light loop stays within the budget
    del out, losses


def test_a_loop_that_frees_what_it_makes_is_not_a_leak() -> None:
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    rec = LoopSurvivors("cpu")
    for step in range(1, 7):
        x = torch.randn(32, 64)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        rec.boundary(step)
    rec.stop()
    r = rec.report()
    assert not r.leaking, str(r)
    assert r.covered == (2, 3, 4, 5, 6)
    assert r.groups  # the last step's variables (x, loss, the grads) are alive...
    assert all(g.steps == (6,) and g.verdict == "last_step" for g in r.groups)  # ...and only those
    assert "no accumulation" in str(r)
    del x, loss


def test_a_bounded_cache_is_not_a_leak() -> None:
    model = _model()
    cache: list[torch.Tensor] = []
    rec = LoopSurvivors("cpu")
    for step in range(1, 9):
        with torch.no_grad():
            cache.append(model(torch.randn(32, 64)))  # CACHE-SITE
        if len(cache) > 2:
            cache.pop(0)
        rec.boundary(step)
    rec.stop()
    r = rec.report()
    assert not r.leaking, str(r)
    (g,) = [g for g in r.groups if g.site == _line("CACHE-SITE")]
    assert g.steps == (7, 8) and g.verdict == "recent" and not g.fix
    assert g.holder is not None and "cache" in g.holder


def test_a_graph_carried_from_step_to_step_is_named_with_its_fix() -> None:
    model = _model()
    total = torch.zeros(())
    rec = LoopSurvivors("cpu")
    for step in range(1, 6):
        total = total + model(torch.randn(32, 64)).sum()  # CHAIN-SITE
        rec.boundary(step)
    rec.stop()
    r = rec.report()
    assert r.leaking
    g = r.groups[0]
    assert g.site == _line("CHAIN-SITE") and g.kind == "graph_chain"
    assert "`total` carries its autograd graph" in g.fix
    del total


def test_report_on_demand_in_the_middle_of_the_loop() -> None:
    model = _model()
    kept = []
    rec = LoopSurvivors("cpu")
    mid = None
    for step in range(1, 7):
        kept.append(model(torch.randn(16, 64)))
        rec.boundary(step)
        if step == 4:
            mid = rec.report()
            assert rec.recording and ledger().active  # the report does not end the recording
    rec.stop()
    assert mid is not None
    assert mid.covered == (2, 3, 4) and mid.leaking
    assert any("made while recording" in n for n in mid.notes)
    final = rec.report()
    assert final.covered == (2, 3, 4, 5, 6) and final.leaking
    assert not any("made while recording" in n for n in final.notes)
    assert final.live_bytes > mid.live_bytes


def test_stop_in_the_middle_of_the_window_turns_the_ledger_off() -> None:
    rec = LoopSurvivors("cpu", steps=8)
    kept = []
    for step in range(1, 4):
        kept.append(torch.ones(1024))
        rec.boundary(step)
    assert ledger().active and rec.recording
    kept.append(torch.ones(1024))  # born in a step that never ends: not counted
    rec.stop()
    assert not ledger().active and not rec.recording
    rec.stop()  # idempotent
    rec.boundary(4)  # after stop: nothing turns it on again
    assert not ledger().active
    r = rec.report()
    assert r.covered == (2, 3)
    assert r.count == 2 and r.leaking  # steps 2 and 3: every recorded step
    del kept


def test_the_ledger_is_on_only_for_the_window() -> None:
    rec = LoopSurvivors("cpu", steps=3)
    states = []
    for step in range(1, 8):
        torch.ones(10)
        rec.boundary(step)
        states.append(ledger().active)
    assert states == [True, True, True, False, False, False, False]
    assert rec.covered == (2, 3, 4)
    r = rec.report(total_steps=7)
    assert r.window == 3 and r.steps == 7
    assert r.window_step_s is not None and r.after_step_s is not None
    assert rec.report().steps == 7  # the last boundary's step, also after the window
    rec.stop()


def test_beside_a_watcher_that_keeps_the_ledger_on_and_after_it_forgets() -> None:
    model = _model()
    kept = []
    rec = LoopSurvivors("cpu", steps=4)
    with torchmem.watch(device="cpu", warn=False, source="ledger") as w:
        for step in range(1, 8):
            kept.append(model(torch.randn(32, 64)))
            w.step()
            rec.boundary(step)
            assert ledger().active  # the watcher's ledger, on for the whole watch
        rec.stop()
    assert not ledger().active  # the ledger dropped every entry: the recorder kept its own references
    r = rec.report()
    assert r.covered == (2, 3, 4, 5) and r.leaking
    assert r.groups[0].holder is not None and "kept" in r.groups[0].holder


def test_stop_from_another_thread_waits_for_the_loop_thread() -> None:
    rec = LoopSurvivors("cpu")
    rec.boundary(1)
    t = threading.Thread(target=rec.stop)
    t.start()
    t.join()
    assert not rec.recording
    assert ledger().active  # the dispatch mode belongs to this thread: popped at its next boundary
    rec.boundary(2)
    assert not ledger().active
    assert torch._C._len_torch_dispatch_stack() == 0
    assert any("another thread" in n for n in rec.report().notes)


def test_an_error_in_the_holder_search_is_a_note(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_args: object, **_kwargs: object) -> list[tuple[()]]:
        raise RuntimeError("search exploded")

    monkeypatch.setattr(survivors_mod, "holder_paths_of_storages", broken)
    model = _model()
    kept = []
    rec = LoopSurvivors("cpu")
    for step in range(1, 5):
        kept.append(model(torch.randn(16, 64)))
        rec.boundary(step)
    rec.stop()
    r = rec.report()
    assert r.leaking  # the verdict does not need the holders
    assert any("holder search failed (RuntimeError: search exploded)" in n for n in r.notes)
    assert r.groups[0].holder is None and "no holder was named" in r.groups[0].fix


def test_nothing_recorded_and_a_bad_device_never_raise() -> None:
    r = LoopSurvivors("cpu").report()
    assert r.covered == () and not r.leaking
    assert "not recorded" in str(r)
    rec = LoopSurvivors("no-such-device")
    rec.boundary(1)
    torch.ones(10)
    rec.boundary(2)
    rec.stop()
    assert not ledger().active
    r = rec.report()
    assert r.count == 0 and any("could not be resolved" in n for n in r.notes)
    with pytest.raises(ValueError):
        LoopSurvivors("cpu", steps=0)


def test_the_report_round_trips_through_json() -> None:
    model = _model()
    kept = []
    rec = LoopSurvivors("cpu", steps=4)
    for step in range(1, 6):
        kept.append(model(torch.randn(8, 64)))
        rec.boundary(step)
    rec.stop()
    r = rec.report(boundary="optimizer step")
    assert r.groups and r.groups[0].holders  # typed holder paths make the trip too
    d = json.loads(json.dumps(r.to_dict()))
    back = SurvivorReport.from_dict(d)
    assert back == r
    assert str(back) == str(r) and "one step = one optimizer step" in str(r)
    assert SurvivorGroup.from_dict(r.groups[0].to_dict()) == r.groups[0]
    old = {k: v for k, v in d.items() if k not in ("window", "boundary", "window_step_s", "after_step_s")}
    assert SurvivorReport.from_dict(old).window == 0


def test_heavy_steps_stop_the_recording_and_the_notes_say_so(monkeypatch: pytest.MonkeyPatch) -> None:
    # No absolute allowance: only the 10 % of the run's time, which one recorded heavy step already exceeds.
    monkeypatch.setattr(survivors_mod, "_FLOOR_S", 0.0)
    monkeypatch.setattr(survivors_mod, "_MIN_STEPS_S", 0.0)
    rec = LoopSurvivors("cpu")
    kept = []
    states = []
    for step in range(1, 8):
        kept.append(_ops(3000))
        rec.boundary(step)
        states.append(ledger().active)
    assert states == [True, False, False, False, False, False, False]  # off after the first recorded step
    assert rec.paused and not rec.recording and rec.covered == (2,)
    r = rec.report()
    (note,) = [n for n in r.notes if n.startswith("recorded 1 of 8 steps (2): the exact ledger costs ")]
    assert "per step here" in note and "without it" in note and "recording is paused" in note
    assert "one recorded step cannot show what accumulates" in note
    assert not r.leaking  # one step cannot tell a leak from a loop variable
    rec.stop()
    assert not rec.paused
    final = rec.report()
    assert any("recording more would have cost more than 10% of the run's time" in n for n in final.notes)
    assert final.window_step_s is not None and final.after_step_s is not None
    assert final.window_step_s > 2 * final.after_step_s  # the ledger's cost was measured, not guessed
    del kept


def test_two_recorded_heavy_steps_are_enough_to_name_a_leak(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(survivors_mod, "_FLOOR_S", 0.0)  # the first 2 recorded steps are still allowed
    rec = LoopSurvivors("cpu")
    kept = []
    for step in range(1, 9):
        _ops(1000)
        kept.append(torch.ones(8192))  # HEAVY-LEAK
        rec.boundary(step)
    rec.stop()
    assert rec.covered == (2, 3)
    r = rec.report()
    assert r.leaking
    g = r.groups[0]
    assert g.site == _line("HEAVY-LEAK") and g.steps == (2, 3) and g.accumulates
    assert g.holder is not None and "kept" in g.holder
    assert any(n.startswith("recorded 2 of 8 steps (2-3): the exact ledger costs") for n in r.notes)
    del kept


def test_the_recording_resumes_when_the_run_can_afford_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(survivors_mod, "_FLOOR_S", 0.0)
    monkeypatch.setattr(survivors_mod, "_MIN_STEPS_S", 0.0)
    # A step that mostly waits: recording it costs little, but the first recorded step cannot tell (no step
    # without the ledger has been timed yet), so the recording pauses for one step, measures, and resumes.
    rec = LoopSurvivors("cpu", budget=0.5)
    kept = []
    states = []
    for step in range(1, 11):
        time.sleep(0.02)
        _ops(100)
        kept.append(torch.ones(4096))
        rec.boundary(step)
        states.append(ledger().active)
    assert states[:3] == [True, False, True]
    assert rec.covered == (2, 4, 5, 6, 7, 8, 9, 10)
    assert not ledger().active  # the window is complete
    r = rec.report()
    assert r.leaking and r.groups[0].steps == rec.covered  # the verdicts take the gap in their stride
    assert any(n.startswith("the 8 recorded steps were spread over the run (2, 4-10)") for n in r.notes)
    del kept


def test_a_run_that_ends_while_paused_says_the_cost_was_not_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(survivors_mod, "_FLOOR_S", 0.0)
    monkeypatch.setattr(survivors_mod, "_MIN_STEPS_S", 0.0)
    rec = LoopSurvivors("cpu")
    for step in (1, 2):
        _ops(500)
        rec.boundary(step)
    assert rec.paused and not ledger().active
    rec.stop()
    (note,) = [
        n for n in rec.report().notes if n.startswith("recorded 1 of 8 steps (2): a recorded step took ")
    ]
    assert "its cost could not be measured" in note


def test_bad_budget() -> None:
    with pytest.raises(ValueError, match="budget"):
        LoopSurvivors("cpu", budget=-0.1)
    assert LoopSurvivors("cpu", budget=float("inf")).budget == float("inf")


@pytest.mark.parametrize(
    ("alive", "covered", "verdict"),
    [
        ((2, 3, 4, 5, 6), (2, 3, 4, 5, 6), "accumulates"),
        ((2, 3, 4, 5), (2, 3, 4, 5, 6), "accumulates"),  # every step but the last
        ((2, 3, 5, 6, 7, 8, 9), tuple(range(2, 10)), "accumulates"),  # nearly every step
        ((2, 3), (2, 3), "accumulates"),  # a 3-step loop is enough
        ((2, 4, 5, 9), (2, 4, 5, 9), "accumulates"),  # steps left out by the budget
        ((5, 9), (2, 4, 5, 9), "recent"),
        ((9,), (2, 4, 5, 9), "last_step"),
        ((6,), (2, 3, 4, 5, 6), "last_step"),  # a loop variable
        ((2,), (2, 3, 4, 5, 6), "once"),  # state made once
        ((7, 8), tuple(range(2, 9)), "recent"),  # a cache keeping the 2 newest
        ((3, 4, 5, 6), (2, 3, 4, 5, 6), "recent"),  # the first step's entry was evicted
        ((2, 5), tuple(range(2, 10)), "some_steps"),
    ],
)
def test_judge(alive: tuple[int, ...], covered: tuple[int, ...], verdict: str) -> None:
    assert judge(alive, covered)[0] == verdict


def test_judge_small_and_fix_wording() -> None:
    assert judge((2, 3, 4), (2, 3, 4), 4.0, 4096)[0] == "small"
    assert judge((2, 3, 4), (2, 3, 4), 8192.0, 4096)[0] == "accumulates"
    assert survivor_fix("device_accumulation", "outs", 4096, 1.0) == (
        "`outs` keeps one tensor per iteration (4.0 KiB each): store `.item()`/`.detach()` or clear it"
    )
    assert "the cache `memo`" in survivor_fix("cache", "memo", 4096, 1.0)
    assert step_ranges((2, 3, 4, 6, 8, 9)) == "2-4, 6, 8-9"


def test_a_watcher_with_survivors_names_a_three_step_leak_on_demand() -> None:
    model, kept = _model(), []
    with torchmem.watch(device="cpu", survivors=True, warn=False) as w:
        for _ in range(3):
            kept.append(model(torch.randn(512, 64)))  # WATCHED
            w.step()
        mid = torchmem.survivors()  # the same report through the public function, in the loop
    after = w.survivors()
    assert w.report().verdict in ("too_few", "no_steps"), str(w.report())  # too short for the detector
    for rep in (mid, after):
        assert rep.leaking, str(rep)
        top = rep.groups[0]
        assert top.site == _line("WATCHED") and top.verdict == "accumulates", str(rep)
        assert any("'kept'[" in str(h) for h in top.holders), str(rep)
    assert not ledger().active  # the recording's ledger went off with the watch
