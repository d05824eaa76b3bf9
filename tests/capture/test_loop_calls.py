"""The repeating unit read from the loop's bytecode (issue 26): a loop whose call is cheap beside the rest of
an iteration (a metric ``update()`` between tensor ops and a sleep) is found from a look at the loop's frame
at any of its lines, wrapped where it is bound (a class, an instance's dict, a module's globals) and counted;
torch's functions, builtins, generators and code outside any loop never are."""

from __future__ import annotations

import functools
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
import torch

from torchmem.capture import units
from torchmem.capture.loop_calls import (
    carried_names,
    dotted_loads,
    innermost_loop,
    loop_calls,
    loop_ranges,
    where_bound,
)
from torchmem.capture.units import UnitFinder
from torchmem.run.session import Session


class WrappedPerInstance:
    """A metric whose ``update`` is wrapped per instance (as torchmetrics does): the function the loop calls
    lives in the instance's dict."""

    def __init__(self) -> None:
        self.rows: list[torch.Tensor] = []
        self.update = self._wrap(self.update)  # type: ignore[method-assign]

    @staticmethod
    def _wrap(fn: Any) -> Any:
        @functools.wraps(fn)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            return fn(*args, **kwargs)

        return wrapped

    def update(self, x: torch.Tensor) -> None:
        self.rows.append(x.clone())

    def compute(self) -> torch.Tensor:
        return torch.cat(self.rows).mean()

    def reset(self) -> None:
        self.rows.clear()


class Loud:
    """Reading ``Loud().boom`` runs code: the lookup must not."""

    reads = 0

    @property
    def boom(self) -> Any:
        Loud.reads += 1
        return print

    def step(self) -> None:
        pass


def _calls_seen_in(body: Any) -> list[Any]:
    """What :func:`loop_calls` finds on a look at ``body(ready, stop)`` running on a thread of its own."""
    ready, stop = threading.Event(), threading.Event()
    t = threading.Thread(target=body, args=(ready, stop), daemon=True)
    t.start()
    try:
        assert ready.wait(5)
        time.sleep(0.02)
        frame: FrameType = sys._current_frames()[t.ident]  # type: ignore[index]
        return list(loop_calls(frame, set()))
    finally:
        stop.set()
        t.join()


def _looping(body: Any, ready: threading.Event, stop: threading.Event) -> threading.Thread:
    t = threading.Thread(target=body, args=(ready, stop), daemon=True)
    t.start()
    assert ready.wait(5)
    return t


def test_the_loop_s_calls_are_found_at_any_line_of_the_loop() -> None:
    metric = WrappedPerInstance()
    loud = Loud()

    def body(ready: threading.Event, stop: threading.Event) -> None:
        ready.set()
        while not stop.is_set():
            x = torch.rand(4)
            metric.update(x)
            loud.step()
            if stop is None:  # never true: the loop names `loud.boom` without reading it
                _ = loud.boom
            time.sleep(0.002)  # where the look mostly finds the frame: not inside any call

    found = _calls_seen_in(body)
    labels = [(name, label, type(owner).__name__) for owner, name, _fn, label in found]
    # the instance's wrapped update (in its dict) and the class's method; torch.rand, the builtin sleep,
    # stop.is_set (the standard library's) are not; the property is never read
    assert ("update", "WrappedPerInstance.update", "dict") in labels, labels
    assert ("step", None, "type") in labels, labels
    assert len(labels) == 2, labels
    assert Loud.reads == 0


def test_code_outside_a_loop_gives_no_call() -> None:
    metric = WrappedPerInstance()

    def body(ready: threading.Event, stop: threading.Event) -> None:
        metric.update(torch.rand(2))
        ready.set()
        stop.wait(5)  # waiting, not looping: the frame is at no loop's line

    assert _calls_seen_in(body) == []


def test_loops_and_dotted_names_are_read_from_the_bytecode() -> None:
    src = "for i in range(3):\n    a.b.c(i)\n    f(i)\nafter()\n"
    code = compile(src, "<prog>", "exec")
    (first, last), *_ = sorted(
        {innermost_loop(code, off) for off in range(0, 400, 2)} - {None},  # type: ignore[arg-type]
        key=lambda ab: ab[0],
    )
    names = dotted_loads(code, first, last)
    assert ("a", "b", "c") in names and ("f",) in names and ("i",) in names
    assert ("after",) not in names  # after the loop


def _carried(fn: Any) -> list[str]:
    code = fn.__code__
    outer = max(loop_ranges(code), key=lambda ab: ab[1] - ab[0])
    return sorted(carried_names(code, *outer))


def test_the_state_a_loop_hands_to_its_next_iteration_is_read_from_its_code() -> None:
    def decode(model: Any, tokens: Any, hidden: Any, generated: list[Any]) -> None:
        for _ in range(3):
            logits, hidden = model(tokens, hidden)  # hidden: read, then written
            tokens = logits.argmax(-1)  # logits: written, then read (the step's output)
            generated.append(tokens)  # generated: read, never written

    assert _carried(decode) == ["hidden", "tokens"]

    def running_total(batches: Any, model: Any) -> Any:
        total = 0
        for x in batches:
            out = model(x)
            squares = [v * v for v in out]  # the comprehension's variable is not carried
            total = total + sum(squares)
            if total:
                best = out  # written only: a branch's variable is not carried
        return total, best

    assert _carried(running_total) == ["total"]
    # at module level (LOAD_NAME / STORE_NAME)
    code = compile("h = 0\nfor i in range(3):\n    h = f(h, i)\n    y = h * 2\n", "<prog>", "exec")
    assert sorted(carried_names(code, *loop_ranges(code)[0])) == ["h"]


def test_where_bound_never_takes_a_builtin_or_a_property() -> None:
    assert where_bound(torch, "rand") is None  # a builtin of torch's module
    assert where_bound(Loud(), "boom") is None
    assert where_bound(WrappedPerInstance(), "reset") is not None


def test_a_cheap_metric_update_in_a_loop_becomes_the_unit() -> None:
    """The calls take a tiny part of each iteration: a look inside them is rare, a look at the loop is not."""
    steps: list[int] = []
    found: list[str] = []
    errors: list[str] = []
    metric = WrappedPerInstance()
    original = metric.__dict__["update"]
    ready, stop = threading.Event(), threading.Event()
    f: list[UnitFinder] = []

    def body(ready: threading.Event, stop: threading.Event) -> None:
        f.append(UnitFinder(lambda: steps.append(1), found.append, errors.append, threading.get_ident()))
        ready.set()
        for _ in range(60):
            metric.update(torch.rand(8))
            time.sleep(0.005)
        stop.set()

    sampler_stop = threading.Event()

    def sampler() -> None:
        while not sampler_stop.wait(0.02):
            if f:
                f[0].sample()

    s = threading.Thread(target=sampler)
    s.start()
    t = _looping(body, ready, stop)
    t.join()
    sampler_stop.set()
    s.join()
    f[0].remove()
    assert errors == [] and found == ["WrappedPerInstance.update() call"], (found, errors)
    assert len(steps) >= 30
    assert metric.__dict__["update"] is original  # the wrapper removed


def test_a_run_names_a_never_reset_metric_and_its_reset(tmp_path: Path) -> None:
    metric = WrappedPerInstance()
    s = Session(str(tmp_path / "run.jsonl"), device="cpu", status=False, interval=0.01).start()
    try:
        for i in range(150):
            metric.update(torch.full((64, 1024), float(i)))  # 256 KiB kept per call
            time.sleep(0.002)
    finally:
        res = s.finish(0, "exit")
    assert res.boundary.startswith("WrappedPerInstance.update() call"), res.boundary
    leak = res.leak
    assert leak is not None and leak.leaking and leak.unit == "step", str(leak)
    top = leak.culprits[0]
    assert top.kind == "metric_state", str(leak)
    assert "metric.reset()" in top.fix and "metric.rows" in top.fix, top.fix


def load_file(i: int) -> torch.Tensor:
    time.sleep(0.001)
    return torch.zeros(4)


def test_a_set_up_loop_s_call_gives_way_to_the_loop_the_program_runs_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A set-up loop (files loaded one by one) is the first loop seen and its call the first unit; once the
    program has left it, the call of the loop it runs now (the metric never reset) takes over and the leak
    is judged and named per call of that."""
    # A unit gives way after 1 s without a return (3 s in a run): the same hand-over, with 2 s fewer of a
    # loop that keeps 256 KiB per call before the new unit counts it
    monkeypatch.setattr(units, "_STALE_S", 1.0)
    metric = WrappedPerInstance()
    s = Session(str(tmp_path / "run.jsonl"), device="cpu", status=False, interval=0.01).start()
    try:
        data = []
        for i in range(400):  # ~0.5 s of set-up, a call the sampler sees
            data.append(load_file(i))
        t0 = time.monotonic()
        i = 0
        # until the new unit has had 150 calls (the set-up loop's call gives way after 1 s without a return):
        # a loaded machine's slow calls still leave it the steps of a verdict; 60 s at most
        switched = None
        while time.monotonic() - t0 < 60.0:
            metric.update(torch.full((64, 1024), float(i)))  # 256 KiB kept per call
            time.sleep(0.004)
            i += 1
            if switched is None and s._source.label.startswith("WrappedPerInstance.update() call"):
                switched = i
            if switched is not None and i - switched >= 150:
                break
    finally:
        res = s.finish(0, "exit")
    assert res.boundary.startswith("WrappedPerInstance.update() call"), res.boundary
    leak = res.leak
    assert leak is not None and leak.leaking, str(leak)
    assert leak.culprits and leak.culprits[0].kind == "metric_state", str(leak)


def epoch(n: float) -> None:
    time.sleep(n)


def _sampled(work: Any, every: float = 0.01) -> tuple[list[int], list[str], UnitFinder]:
    """``work()`` run on this thread while a sampler thread looks for its unit every ``every`` s: the steps
    counted, what was found (labels, and errors), and the finder (its wrappers removed)."""
    steps: list[int] = []
    found: list[str] = []
    f = UnitFinder(lambda: steps.append(1), found.append, found.append, threading.get_ident())
    stop = threading.Event()

    def sampler() -> None:
        while not stop.wait(every):
            f.sample()

    s = threading.Thread(target=sampler)
    s.start()
    try:
        work()
    finally:
        stop.set()
        s.join()
        f.remove()
    return steps, found, f


def test_a_unit_whose_calls_are_long_is_kept_while_it_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """An epoch function that runs for longer than the staleness limit stays the unit: it is on the stack."""
    monkeypatch.setattr(units, "_STALE_S", 1.0)  # 3 s in a run: the same rule, 2.1 s less of sleeping

    def work() -> None:
        for n in (0.02,) * 8 + (1.5, 0.02):
            epoch(n)

    steps, found, f = _sampled(work, every=0.02)
    assert found == ["epoch() call"], found
    assert len(steps) >= 3 and f.label == "epoch() call"  # found once: never let go while it ran


class Vocabulary:
    def __init__(self) -> None:
        self.index: dict[str, int] = {}

    def add_word(self, word: str) -> int:
        return self.index.setdefault(word, len(self.index))


def test_a_call_of_a_few_microseconds_makes_a_step_of_a_run_of_calls() -> None:
    """A tokenizer's ``add_word`` (a few µs a call) as the unit: reading memory at each return would cost the
    program several times its own time; each step is a run of calls lasting about half a millisecond."""
    vocab = Vocabulary()
    calls = [0]

    def work() -> None:
        t0 = time.monotonic()
        while time.monotonic() - t0 < 0.5:  # ~50 looks of the sampler (3 find the unit)
            for word in ("a", "b", "c", "d"):
                vocab.add_word(word)
                calls[0] += 1

    steps, found, _ = _sampled(work)
    assert len(found) == 1 and found[0].startswith("run of "), found
    every = int(found[0].split()[2])
    assert every >= 8 and found[0].endswith(" Vocabulary.add_word() calls"), found
    assert 0 < len(steps) <= calls[0] // every + 1


def test_calls_of_a_millisecond_are_a_step_each() -> None:
    def work() -> None:
        for _ in range(60):
            epoch(0.002)

    _, found, _ = _sampled(work)
    assert found == ["epoch() call"], found


def test_reading_a_frame_s_local_keeps_nothing_alive() -> None:
    """Before Python 3.13, ``frame.f_locals`` leaves a snapshot on the frame that keeps every local it had:
    the unit finder and the step detection read the program's frames, and a model the program deletes
    must be freed (as the test of the boundaries shows, 'never keep a deleted model alive')."""
    import gc
    import sys
    import weakref

    from torchmem.capture.loop_calls import frame_local

    class Model:
        pass

    model = Model()
    other = Model()
    ref = weakref.ref(model)
    frame = sys._getframe()
    assert frame_local(frame, "model") is model
    assert frame_local(frame, "missing", 7) == 7
    del model
    gc.collect()
    assert ref() is None
    assert frame_local(frame, "other") is other  # the frame's own variables are untouched
    del frame
