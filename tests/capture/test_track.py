"""``torchmem.track("cpu")``: delta, peak, peak_delta, born and survived, exact with real tensors."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import torch

import torchmem
from torchmem.devices import ledger

NB = Callable[..., int]
MiB = 1 << 20


def _floats(nbytes: int) -> torch.Tensor:
    """A real float32 tensor of exactly ``nbytes`` bytes."""
    return torch.ones(nbytes // 4)


def test_docstring_example() -> None:
    with torchmem.track("cpu") as t:
        x = torch.ones(1024, 1024)  # 4 MiB that outlives the block
        tmp = torch.ones(2048, 1024)
        del tmp  # 8 MiB only at the peak
    assert (t.delta, t.survived, t.peak_delta) == (4 * MiB, 4 * MiB, 12 * MiB)
    assert t.peak == 12 * MiB
    r = t.result
    assert r is not None
    assert r.device == "cpu"
    assert r.allocated_before == 0
    assert r.allocated_after == x.untyped_storage().nbytes() == 4 * MiB
    assert r.born == 12 * MiB
    assert r.survived_tensors == 1
    assert r.reserved_before is None and r.reserved_after is None
    assert r.seconds >= 0


def test_track_turns_tracking_off_afterwards() -> None:
    with torchmem.track("cpu"):
        assert torchmem.stats("cpu").allocated == 0
    assert torchmem.stats("cpu").allocated is None
    assert not ledger().active


def test_figures_inside_an_enclosing_cpu_tracking(nbytes: NB) -> None:
    with torchmem.cpu_tracking() as cpu:
        old = _floats(MiB)
        with torchmem.track("cpu") as t:
            new = _floats(2 * MiB)
            del old  # a storage from before the block dies inside it
            tmp = _floats(3 * MiB)
            del tmp
        assert t.result is not None
        assert t.result.allocated_before == MiB
        assert t.result.allocated_after == nbytes(new) == 2 * MiB
        assert t.delta == MiB
        assert t.peak == 2 * MiB + 3 * MiB  # old was gone before tmp was made
        assert t.peak_delta == 4 * MiB
        assert t.result.born == 5 * MiB
        assert t.survived == 2 * MiB
        assert t.result.survived_tensors == 1
        assert cpu.allocated == 2 * MiB  # the enclosing block goes on
        del new


def test_freeing_only_gives_a_negative_delta_and_no_peak_over_start() -> None:
    with torchmem.cpu_tracking():
        big = _floats(MiB)
        with torchmem.track("cpu") as t:
            del big
        assert t.delta == -MiB
        assert t.peak == MiB
        assert t.peak_delta == 0
        assert t.survived == 0
        assert t.result is not None and t.result.born == 0


def test_storage_grown_inside_the_block_counts_as_born_there(nbytes: NB) -> None:
    """What survived a block was born in it, so ``born`` can never be less than ``survived``."""
    with torchmem.track("cpu") as t:
        b = torch.empty(10)
        b.resize_(1000)
    assert t.survived == nbytes(b) == 4000
    assert t.delta == 4000
    assert t.peak_delta == 4000
    assert t.result is not None and t.result.survived_tensors == 1
    assert t.result.born is not None
    assert t.result.born >= t.survived
    del b


def test_nested_blocks_have_their_own_peaks() -> None:
    with torchmem.track("cpu") as outer:
        a = _floats(MiB)
        tmp = _floats(8 * MiB)
        del tmp  # outer peak 9 MiB, before the inner block begins
        with torchmem.track("cpu") as inner:
            b = _floats(2 * MiB)
            tmp = _floats(4 * MiB)
            del tmp  # inner peak 1 + 2 + 4 = 7 MiB
        c = _floats(MiB)
    # The inner block does not see what the outer did before it began.
    assert inner.result is not None and outer.result is not None
    assert inner.result.allocated_before == MiB
    assert inner.peak == 7 * MiB
    assert inner.peak_delta == 6 * MiB
    assert inner.delta == 2 * MiB
    assert inner.survived == 2 * MiB
    assert inner.result.born == 6 * MiB
    assert outer.peak == 9 * MiB
    assert outer.peak_delta == 9 * MiB
    assert outer.delta == 4 * MiB
    assert outer.survived == 4 * MiB  # a, b (born in the inner block) and c
    assert outer.result.survived_tensors == 3
    assert outer.result.born == 16 * MiB
    del a, b, c


def test_outer_peak_includes_inner_peak() -> None:
    with torchmem.track("cpu") as outer:
        a = _floats(MiB)
        with torchmem.track("cpu") as inner:
            tmp = _floats(16 * MiB)
            del tmp
    assert inner.peak == 17 * MiB
    assert inner.peak_delta == 16 * MiB
    assert inner.delta == 0 and inner.survived == 0
    assert outer.peak == 17 * MiB
    assert outer.peak_delta == 17 * MiB
    assert outer.delta == MiB
    del a


def test_sibling_blocks_do_not_see_each_others_peaks() -> None:
    with torchmem.track("cpu") as outer:
        with torchmem.track("cpu") as first:
            tmp = _floats(8 * MiB)
            del tmp
        with torchmem.track("cpu") as second:
            keep = _floats(MiB)
    assert first.peak == 8 * MiB
    assert second.peak == MiB
    assert second.peak_delta == MiB
    assert outer.peak == 8 * MiB
    del keep


def test_survivors_false_gives_none_for_born_and_survived() -> None:
    with torchmem.track("cpu", survivors=False) as t:
        x = _floats(MiB)
        tmp = _floats(2 * MiB)
        del tmp
    assert t.result is not None
    assert t.result.born is None
    assert t.survived is None
    assert t.result.survived_tensors is None
    assert t.delta == MiB  # delta and peak are still exact on the CPU
    assert t.peak_delta == 3 * MiB
    assert "survived" not in str(t)
    del x


def test_reading_figures_before_exit_raises() -> None:
    with torchmem.track("cpu") as t:
        for name in ("delta", "peak", "peak_delta", "survived"):
            with pytest.raises(torchmem.TrackingError) as info:
                getattr(t, name)
            assert info.value.hint
        assert t.result is None
        assert str(t) == "<torchmem.track: running>"
    assert t.delta == 0


def test_exit_without_enter_raises() -> None:
    t = torchmem.track("cpu")
    with pytest.raises(torchmem.TrackingError):
        t.__exit__(None, None, None)


def test_exception_propagates_and_result_is_recorded() -> None:
    seen = []
    with pytest.raises(KeyError, match="boom"), torchmem.track("cpu", on_exit=seen.append) as t:
        keep = _floats(4096)
        tmp = _floats(8192)
        del tmp
        raise KeyError("boom")
    assert t.delta == 4096
    assert t.peak_delta == 4096 + 8192
    assert t.survived == 4096
    assert seen == [t.result]
    assert not ledger().active
    del keep


def test_on_exit_called_with_each_result() -> None:
    seen: list[torchmem.TrackResult] = []
    tracker = torchmem.track("cpu", on_exit=seen.append)
    with tracker:
        a = _floats(1000)
    with tracker:
        b = _floats(2000)
    assert [r.delta for r in seen] == [1000, 2000]
    assert seen == tracker.results
    assert tracker.result is seen[-1]
    del a, b


def test_decorator_records_each_call() -> None:
    tracker = torchmem.track("cpu")

    def make(n: int) -> torch.Tensor:
        """Doc of make."""
        tmp = torch.ones(2 * n)
        del tmp
        return torch.ones(n)

    wrapped = tracker(make)
    assert wrapped.__name__ == "make" and wrapped.__doc__ == "Doc of make."
    out1 = wrapped(1000)
    out2 = wrapped(10)
    assert out1.shape == (1000,) and out2.shape == (10,)
    assert [r.delta for r in tracker.results] == [4000, 40]
    assert [r.survived for r in tracker.results] == [4000, 40]
    assert [r.peak_delta for r in tracker.results] == [8000, 80]  # tmp died before the result was made
    assert tracker.delta == 40
    del out1, out2


def test_decorator_syntax_and_exceptions() -> None:
    seen: list[torchmem.TrackResult] = []

    @torchmem.track("cpu", on_exit=seen.append)
    def fail() -> None:
        _kept = torch.ones(100)
        raise ValueError("inside")

    with pytest.raises(ValueError, match="inside"):
        fail()
    assert len(seen) == 1
    assert seen[0].born == 400
    assert seen[0].survived == 400  # at exit the traceback still holds the frame and its local
    assert seen[0].peak_delta == 400


def test_recursive_decorated_calls_nest() -> None:
    tracker = torchmem.track("cpu")

    @tracker
    def rec(depth: int) -> None:
        x = torch.ones(1000)  # 4000 bytes per level, alive while deeper levels run
        if depth > 1:
            rec(depth - 1)
        del x

    rec(3)
    # innermost block ends first
    assert [r.peak_delta for r in tracker.results] == [4000, 8000, 12000]
    assert [r.born for r in tracker.results] == [4000, 8000, 12000]
    assert [r.survived for r in tracker.results] == [0, 0, 0]
    assert [r.delta for r in tracker.results] == [0, 0, 0]


def test_default_device_is_cpu_here() -> None:
    with torchmem.track() as t:
        keep = torch.ones(3)
    assert t.result is not None and t.result.device == "cpu"
    assert t.delta == 12
    del keep


def test_str_and_to_dict() -> None:
    with torchmem.track("cpu") as t:
        x = torch.ones(1024, 1024)
        tmp = torch.ones(2048, 1024)
        del tmp
    r = t.result
    assert r is not None
    text = str(t)
    assert text == str(r)
    assert text.startswith("cpu: delta +4.00 MiB, peak 12.00 MiB (+12.00 MiB over start)")
    assert "survived 4.00 MiB in 1 tensor" in text and "tensor(s)" not in text
    d = r.to_dict()
    assert set(d) == {
        "device",
        "allocated_before",
        "allocated_after",
        "delta",
        "peak",
        "peak_delta",
        "reserved_before",
        "reserved_after",
        "born",
        "survived",
        "survived_tensors",
        "seconds",
    }
    assert d["delta"] == d["survived"] == 4 * MiB
    assert d["peak_delta"] == 12 * MiB
    assert d["reserved_before"] is None
    assert json.loads(json.dumps(d)) == d
    with pytest.raises(AttributeError):
        r.delta = 0  # type: ignore[misc]
    del x


def test_reset_peak_cpu() -> None:
    torchmem.reset_peak("cpu")  # outside tracking: allowed, nothing to reset
    assert torchmem.stats("cpu").peak_allocated is None
    with torchmem.cpu_tracking() as cpu:
        a = _floats(MiB)
        tmp = _floats(4 * MiB)
        del tmp
        assert cpu.peak == 5 * MiB
        torchmem.reset_peak("cpu")
        assert cpu.peak == cpu.allocated == MiB
        assert torchmem.stats("cpu").peak_allocated == MiB
        b = _floats(2 * MiB)
        assert cpu.peak == 3 * MiB
        del b
        torchmem.reset_peak(torch.device("cpu"))
        assert torchmem.counters("cpu").peak_allocated == MiB
        del a


def test_a_decorator_shared_by_two_threads_gives_each_call_its_own_result() -> None:
    import threading

    tracker = torchmem.track("cpu")
    kept: dict[str, torch.Tensor] = {}
    results: dict[str, object] = {}
    errors: list[BaseException] = []
    a_allocated, b_allocated, a_done = threading.Event(), threading.Event(), threading.Event()

    @tracker
    def work(name: str, nbytes: int, signal: threading.Event, wait_for: threading.Event) -> None:
        kept[name] = _floats(nbytes)  # outlives the call
        signal.set()
        assert wait_for.wait(10), "the other thread never got there"

    def thread_a() -> None:
        try:
            work("a", 4096, a_allocated, b_allocated)  # still open while b enters and allocates
            results["a"] = tracker.result
            results["a stack"] = torch._C._len_torch_dispatch_stack()
        except BaseException as exc:
            errors.append(exc)
        finally:
            a_done.set()

    def thread_b() -> None:
        try:
            assert a_allocated.wait(10)
            work("b", 12288, b_allocated, a_done)  # exits after a exited
            results["b"] = tracker.result
            results["b stack"] = torch._C._len_torch_dispatch_stack()
        except BaseException as exc:
            errors.append(exc)
            b_allocated.set()

    threads = [threading.Thread(target=thread_a), threading.Thread(target=thread_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    a, b = results["a"], results["b"]
    assert isinstance(a, torchmem.TrackResult) and isinstance(b, torchmem.TrackResult)
    # Each call's result is built from its own entry: b entered after a's 4096 bytes existed.
    assert a.allocated_before == 0 and b.allocated_before == 4096
    # Storages are counted per device: a's block saw both allocations, b's only its own.
    assert (a.born, a.survived) == (4096 + 12288, 4096 + 12288)
    assert (b.born, b.survived) == (12288, 12288)
    assert tracker.results == [a, b] and tracker.result is b
    assert results["a stack"] == 0 and results["b stack"] == 0  # each thread's dispatch mode was removed
    assert not ledger().active
