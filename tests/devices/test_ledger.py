"""Exact CPU tensor accounting under ``torchmem.cpu_tracking()``, checked against real storage sizes.

Every expected figure is a sum of ``untyped_storage().nbytes()`` of real tensors (the ``nbytes`` fixture),
so a ledger that miscounts by a single byte fails.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

import torchmem
from torchmem.devices import ledger

NB = Callable[..., int]


@pytest.fixture
def fresh_error_reports() -> Iterator[None]:
    """The ledger reports each failing place once per process; give this test a clean slate."""
    reported = ledger()._reported.places
    saved = set(reported)
    reported.clear()
    yield
    reported.clear()
    reported.update(saved)


# -- births and deaths --------------------------------------------------------------------------------


def test_allocate_and_free_exact(nbytes: NB) -> None:
    with torchmem.cpu_tracking() as cpu:
        assert cpu.allocated == 0 and cpu.tensors == 0
        a = torch.ones(1000)
        b = torch.empty(3, 5, dtype=torch.float64)
        c = torch.zeros(7, dtype=torch.int8)
        assert nbytes(a, b, c) == 4000 + 120 + 7
        assert cpu.allocated == nbytes(a, b, c)
        assert cpu.tensors == 3
        del b
        assert cpu.allocated == nbytes(a, c)
        assert cpu.tensors == 2
        del a, c
        assert cpu.allocated == 0
        assert cpu.tensors == 0


def test_many_factories_and_ops_exact(nbytes: NB) -> None:
    with torchmem.cpu_tracking() as cpu:
        xs = [
            torch.arange(10),
            torch.full((3, 3), 2.0),
            torch.randn(5).to(torch.float64),
            torch.ones(4, 4).t().contiguous(),
            torch.stack([torch.ones(3), torch.ones(3)]),
            torch.zeros(3).new_zeros(7),
            torch.ones(6).clone(),
            torch.randint(0, 10, (11,), dtype=torch.int16),
            torch.ones(2, 3) @ torch.ones(3, 4),
        ]
        assert cpu.allocated == nbytes(*xs)
        assert cpu.tensors == len(xs)
        del xs
        assert cpu.allocated == 0


def test_torch_tensor_from_data_is_counted(nbytes: NB) -> None:
    """``torch.tensor(data)`` allocates a new storage like any factory."""
    with torchmem.cpu_tracking() as cpu:
        t = torch.tensor([1.0, 2.0, 3.0])
        assert cpu.allocated == nbytes(t) == 12
        u = torch.as_tensor([[1, 2], [3, 4]])
        assert cpu.allocated == nbytes(t, u) == 12 + 32
        del t, u
        assert cpu.allocated == 0


def test_zero_byte_storage_is_a_storage() -> None:
    with torchmem.cpu_tracking() as cpu:
        e = torch.empty(0)
        assert cpu.allocated == 0
        assert cpu.tensors == 1
        del e
        assert cpu.tensors == 0


def test_meta_tensors_are_not_counted() -> None:
    with torchmem.cpu_tracking() as cpu:
        m = torch.empty(1_000_000, device="meta")
        m2 = m * 2
        assert cpu.allocated == 0
        assert cpu.tensors == 0
        del m, m2


def test_inference_mode_tensors_are_counted(nbytes: NB) -> None:
    with torchmem.cpu_tracking() as cpu:
        with torch.inference_mode():
            a = torch.ones(100) * 3
        assert cpu.allocated == nbytes(a) == 400


# -- views and in-place ops ---------------------------------------------------------------------------


def test_views_count_nothing_extra(nbytes: NB) -> None:
    with torchmem.cpu_tracking() as cpu:
        a = torch.ones(100)
        before = cpu.allocated
        assert before == nbytes(a) == 400
        views = [
            a.view(10, 10),
            a[5:],
            a[::2],
            a.view(10, 10).t(),
            a.view(10, 10).transpose(0, 1),
            a[:1].expand(50),
            a.detach(),
            a.unsqueeze(0),
            *a.split(25),
            a.reshape(4, 25),
        ]
        assert cpu.allocated == before
        assert cpu.tensors == 1
        # A view keeps the whole storage alive, and it stays counted until the view dies.
        v = a[90:]
        del a, views
        assert cpu.allocated == nbytes(v) == 400
        del v
        assert cpu.allocated == 0


def test_adopting_an_existing_storage_counts_nothing(nbytes: NB) -> None:
    pre = torch.ones(1000)
    with torchmem.cpu_tracking() as cpu:
        t = torch.empty(0).set_(pre.untyped_storage())
        u = torch.empty(0).set_(pre)
        assert cpu.allocated == 0
        inside = torch.ones(10)
        v = torch.empty(0).set_(inside.untyped_storage())
        assert cpu.allocated == nbytes(inside) == 40
        del inside
        assert cpu.allocated == nbytes(v) == 40  # v keeps the storage alive
        del t, u, v
        assert cpu.allocated == 0


def test_inplace_ops_count_nothing_extra(nbytes: NB) -> None:
    with torchmem.cpu_tracking() as cpu:
        a = torch.ones(100)
        src = torch.zeros(100)
        before = cpu.allocated
        assert before == nbytes(a, src)
        a.add_(1)
        a.mul_(2)
        a.copy_(src)
        a.clamp_(min=-1)
        a[3:7] = 5.0
        a.view(10, 10).t().add_(1)
        assert cpu.allocated == before
        assert torch.equal(a[3:7], torch.full((4,), 6.0))


def test_inplace_on_tensor_created_before_tracking(nbytes: NB) -> None:
    pre = torch.ones(100)
    with torchmem.cpu_tracking() as cpu:
        pre.add_(1)
        pre.mul_(2)
        v = pre.view(10, 10).t()
        v.sub_(1)
        assert cpu.allocated == 0
        assert cpu.tensors == 0
        src = torch.full((100,), 7.0)
        pre.copy_(src)
        assert cpu.allocated == nbytes(src) == 400
        assert torch.equal(pre, src)
        del v, src
        assert cpu.allocated == 0


def test_freeing_a_tensor_from_before_tracking_does_not_go_negative() -> None:
    pre = torch.ones(1000)
    with torchmem.cpu_tracking() as cpu:
        keep = torch.ones(10)
        del pre
        gc.collect()
        assert cpu.allocated == 40
        del keep


# -- resize_ and out= ---------------------------------------------------------------------------------


def test_resize_growth_of_tensor_created_inside(nbytes: NB) -> None:
    with torchmem.cpu_tracking() as cpu:
        b = torch.empty(10)
        assert cpu.allocated == 40
        b.resize_(1000)
        assert cpu.allocated == nbytes(b) == 4000
        b.resize_(5000)
        assert cpu.allocated == nbytes(b) == 20000
        assert cpu.peak == 20000
        b.resize_(10)  # shrinking the shape keeps the storage
        assert cpu.allocated == nbytes(b) == 20000
        del b
        assert cpu.allocated == 0


def test_resize_growth_of_tensor_created_before_counts_growth_only(nbytes: NB) -> None:
    pre = torch.empty(10)
    start = nbytes(pre)
    with torchmem.cpu_tracking() as cpu:
        pre.resize_(100)
        assert cpu.allocated == nbytes(pre) - start == 360
        del pre
        assert cpu.allocated == 0


def test_repeated_resize_of_tensor_created_before_counts_growth_only(nbytes: NB) -> None:
    """Two growths of a pre-existing storage: the figure is still everything above its starting size."""
    pre = torch.empty(10)
    start = nbytes(pre)  # 40 bytes that tracking did not see being allocated
    with torchmem.cpu_tracking() as cpu:
        pre.resize_(100)
        assert cpu.allocated == nbytes(pre) - start == 360
        pre.resize_(1000)
        assert cpu.allocated == nbytes(pre) - start == 3960
        del pre


def test_out_variants(nbytes: NB) -> None:
    pre_out = torch.empty(0)
    with torchmem.cpu_tracking() as cpu:
        a = torch.ones(100)
        o = torch.empty(0)
        assert cpu.allocated == nbytes(a, o) == 400
        torch.add(a, 1, out=o)  # o grows from 0 to 400 bytes
        assert cpu.allocated == nbytes(a, o) == 800
        torch.mul(a, 2, out=o)  # same size: nothing new
        assert cpu.allocated == 800
        o.resize_(0)  # keeps its 400-byte storage
        assert cpu.allocated == 800
        torch.cat([a, a], out=o)  # grows to 800 bytes
        assert cpu.allocated == nbytes(a, o) == 1200
        # An out= tensor from before tracking: only its growth counts.
        torch.add(a, 1, out=pre_out)
        assert cpu.allocated == nbytes(a, o) + nbytes(pre_out) == 1600
        sized = torch.empty(100)
        torch.sin(a, out=sized)
        assert cpu.allocated == nbytes(a, o, sized) + nbytes(pre_out)
        del a, o, sized
        assert cpu.allocated == 400  # pre_out's growth is still alive
    del pre_out


def test_an_unannotated_alias_of_a_storage_from_before_counts_nothing(nbytes: NB) -> None:
    """``_unsafe_view`` returns its input's storage without saying so in its schema: the ledger still sees
    that the storage is the input's (it compares storages, it does not trust alias annotations)."""
    pre = torch.ones(100)
    with torchmem.cpu_tracking() as cpu:
        v = torch.ops.aten._unsafe_view(pre, [10, 10])
        assert v.untyped_storage()._cdata == pre.untyped_storage()._cdata
        assert cpu.allocated == 0 and cpu.tensors == 0
        inside = torch.ones(50)
        w = torch.ops.aten._unsafe_view(inside, [5, 10])
        assert cpu.allocated == nbytes(inside, w) == 200 and cpu.tensors == 1
        del v, w, inside
        assert cpu.allocated == 0


def test_ops_on_lists_and_keyword_tensors(nbytes: NB) -> None:
    pre = [torch.ones(10), torch.ones(10)]
    pre_out = torch.empty(0)
    with torchmem.cpu_tracking() as cpu:
        cat = torch.cat(pre)  # a list of inputs from before: the output is new
        assert cpu.allocated == nbytes(cat) == 80
        torch._foreach_add_(pre, 1.0)  # in place on a list from before: nothing new
        assert cpu.allocated == 80
        news = torch._foreach_add(pre, 1.0)  # a list of new outputs
        assert cpu.allocated == nbytes(cat, *news) == 160
        torch.ops.aten.add.out(pre[0], pre[1], out=pre_out)  # out= as a keyword, from before: its growth
        assert cpu.allocated == nbytes(cat, *news, pre_out) == 200
        pre_out.resize_(0)
        torch.ops.aten.add.out(cat, cat, out=pre_out)  # and again, larger
        assert cpu.allocated == nbytes(cat, *news, pre_out) == 240
        del cat, news
        assert cpu.allocated == nbytes(pre_out) == 80  # pre_out's growth (it had no bytes before)
    del pre_out


def test_an_op_without_a_schema_is_recorded_as_one_that_writes_its_arguments() -> None:
    led = ledger()
    a = torch.ones(4)

    class NoSchema:  # what a higher-order or Python-only op may look like to the mode
        __name__ = "no_schema"

    facts = led._facts(NoSchema())
    assert facts.written == () and not facts.fresh  # no schema: writes nothing it can name
    before = led.sizes_before(torch.ops.aten.add_.Tensor, (a, a), {})
    assert before is not None and list(before) == [a.untyped_storage()._cdata]  # only `self` is written
    assert led.sizes_before(torch.ops.aten.add.Tensor, (a, a), {}) is None  # a functional op writes nothing


# -- autograd -----------------------------------------------------------------------------------------


def test_tensors_saved_for_backward_are_counted_until_the_graph_is_freed(nbytes: NB) -> None:
    with torchmem.cpu_tracking() as cpu:
        w = torch.randn(1000, requires_grad=True)
        y = (w * 2).sin().sum()
        sin_node = y.grad_fn.next_functions[0][0]
        saved = sin_node._saved_self  # the product w * 2, held only by autograd
        expected = nbytes(w, saved, y)
        assert expected == 4000 + 4000 + 4
        del saved, sin_node
        assert cpu.allocated == expected
        del y  # frees the graph and the saved product
        assert cpu.allocated == nbytes(w) == 4000


def test_backward_frees_saved_tensors_and_counts_grads(nbytes: NB) -> None:
    with torchmem.cpu_tracking() as cpu:
        w = torch.randn(1000, requires_grad=True)
        y = (w * 2).sin().sum()
        assert cpu.allocated == 8004
        y.backward()
        assert w.grad is not None
        assert cpu.allocated == nbytes(w, w.grad, y) == 8004
        assert cpu.peak >= 8004 + 4000  # the grad and the saved product coexisted
        del y
        w.grad = None
        assert cpu.allocated == nbytes(w)


def test_graph_on_a_leaf_created_before_tracking(nbytes: NB) -> None:
    w = torch.randn(500, requires_grad=True)
    with torchmem.cpu_tracking() as cpu:
        y = (w * 3).exp().sum()
        saved = y.grad_fn.next_functions[0][0]._saved_result  # exp saves its result
        expected = nbytes(saved, y)
        del saved
        assert cpu.allocated == expected == 2004
        y.backward()
        assert cpu.allocated == nbytes(w.grad, y) == 2004
        del y
        w.grad = None
        assert cpu.allocated == 0


def test_no_grad_saves_nothing(nbytes: NB) -> None:
    with torchmem.cpu_tracking() as cpu:
        w = torch.randn(1000, requires_grad=True)
        with torch.no_grad():
            y = (w * 2).sin().sum()
        assert cpu.allocated == nbytes(w, y) == 4004


def _linear_setup() -> tuple[torch.nn.Linear, torch.optim.AdamW, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return model, opt, torch.randn(16, 64), torch.randn(16, 32)


def _state_tensors(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]


def test_linear_mse_forward_backward_exact(nbytes: NB) -> None:
    with torchmem.cpu_tracking() as cpu:
        model, _opt, x, target = _linear_setup()
        params = list(model.parameters())
        assert cpu.allocated == nbytes(*params, x, target) == 8320 + 4096 + 2048
        out = model(x)
        loss = torch.nn.functional.mse_loss(out, target)
        # addmm saves x and weight (already counted); mse_loss saves out and target.
        assert cpu.allocated == nbytes(*params, x, target, out, loss)
        loss.backward()
        grads = [p.grad for p in params]
        assert all(g is not None for g in grads)
        assert cpu.allocated == nbytes(*params, x, target, out, loss, *grads)  # type: ignore[arg-type]


def test_adamw_step_counts_params_grads_and_state(nbytes: NB) -> None:
    with torchmem.cpu_tracking() as cpu:
        model, opt, x, target = _linear_setup()
        params = list(model.parameters())
        loss = torch.nn.functional.mse_loss(model(x), target)
        loss.backward()
        grads = [p.grad for p in params]
        opt.step()
        state = _state_tensors(opt)
        # exp_avg, exp_avg_sq and step for each of weight and bias
        assert len(state) == 6
        expected = nbytes(*params, x, target, loss, *grads, *state)  # type: ignore[arg-type]
        assert cpu.allocated == expected


def test_training_steps_return_to_start_after_del(nbytes: NB) -> None:
    keep = torch.ones(10)
    with torchmem.cpu_tracking() as cpu:
        base = torch.ones(25)
        start = cpu.allocated
        assert start == nbytes(base) == 100
        model, opt, x, target = _linear_setup()
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(model(x), target)
            loss.backward()
            opt.step()
        after_three = cpu.allocated
        # a further step allocates nothing that outlives it
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), target)
        loss.backward()
        opt.step()
        assert cpu.allocated == after_three
        opt.zero_grad(set_to_none=True)
        grads_bytes = nbytes(*model.parameters())  # zero_grad(set_to_none) frees exactly the grads
        assert cpu.allocated == after_three - grads_bytes
        assert cpu.peak > after_three
        del model, opt, x, target, loss
        gc.collect()
        assert cpu.allocated == start
        assert cpu.tensors == 1
    assert torch.equal(keep, torch.ones(10))


# -- peaks, nesting, lifetime of the handle ----------------------------------------------------------


def test_peak_figures(nbytes: NB) -> None:
    with torchmem.cpu_tracking() as cpu:
        a = torch.ones(1000)
        tmp = torch.ones(5000)
        assert cpu.peak == nbytes(a, tmp) == 24000
        del tmp
        assert cpu.allocated == 4000
        assert cpu.peak == 24000
        assert torchmem.stats("cpu").peak_allocated == 24000
        assert torchmem.counters("cpu").peak_allocated == 24000
        b = torch.ones(100)
        assert cpu.peak == 24000  # lower than the peak: unchanged
        torchmem.reset_peak("cpu")
        assert cpu.peak == cpu.allocated == nbytes(a, b) == 4400
        del a, b


def test_nested_blocks_share_figures(nbytes: NB) -> None:
    with torchmem.cpu_tracking() as outer:
        a = torch.ones(100)
        with torchmem.cpu_tracking() as inner:
            assert inner.allocated == outer.allocated == 400
            b = torch.ones(50)
            assert inner.allocated == outer.allocated == nbytes(a, b) == 600
            assert inner.tensors == outer.tensors == 2
        assert not inner.active and outer.active
        assert inner.allocated == 600 and inner.peak == 600 and inner.tensors == 2
        assert torchmem.stats("cpu").allocated == 600  # the outer block is still on
        del b
        assert outer.allocated == 400
        assert inner.allocated == 600  # the inner handle keeps its figures at exit
        c = torch.ones(1000)
        assert outer.peak == nbytes(a, c) == 4400
        del a, c


def test_after_exit_handle_keeps_final_figures_and_stats_go_back_to_none(nbytes: NB) -> None:
    with torchmem.cpu_tracking() as cpu:
        a = torch.ones(256)
        tmp = torch.ones(1024)
        del tmp
        assert cpu.active
    assert not cpu.active
    assert cpu.allocated == nbytes(a) == 1024
    assert cpu.peak == 1024 + 4096
    assert cpu.tensors == 1
    assert "off" in repr(cpu) and "allocated=1024" in repr(cpu)
    assert torchmem.stats("cpu").allocated is None
    assert torchmem.stats("cpu").peak_allocated is None
    assert torchmem.counters("cpu") == torchmem.HotReading(None, None, None, None, None)
    assert not ledger().active
    del a
    assert cpu.allocated == 1024


def test_storages_from_a_previous_session_do_not_leak_into_the_next(nbytes: NB) -> None:
    with torchmem.cpu_tracking():
        old = torch.ones(1000)
    with torchmem.cpu_tracking() as cpu:
        assert cpu.allocated == 0
        new = torch.ones(10)
        del old
        gc.collect()
        assert cpu.allocated == nbytes(new) == 40
        del new
        assert cpu.allocated == 0


def test_handle_cannot_be_entered_twice_while_open() -> None:
    handle = torchmem.cpu_tracking()
    with handle:
        with pytest.raises(torchmem.TrackingError) as info:
            handle.__enter__()
        assert info.value.hint
    assert not handle.active


def test_handle_can_be_reused_after_exit(nbytes: NB) -> None:
    handle = torchmem.cpu_tracking()
    with handle:
        a = torch.ones(10)
    assert handle.allocated == 40
    with handle:
        assert handle.allocated == 0
        b = torch.ones(20)
        assert handle.allocated == nbytes(b) == 80
    assert handle.allocated == 80
    del a, b


# -- threads ------------------------------------------------------------------------------------------


def test_other_threads_without_tracking_are_not_counted(nbytes: NB) -> None:
    box: list[torch.Tensor] = []

    def work() -> None:
        box.append(torch.ones(10_000))
        box.append(box[0] * 2)

    with torchmem.cpu_tracking() as cpu:
        mine = torch.ones(10)
        th = threading.Thread(target=work)
        th.start()
        th.join()
        assert len(box) == 2
        assert cpu.allocated == nbytes(mine) == 40
        assert cpu.tensors == 1
        box.clear()
        assert cpu.allocated == 40


def test_tracking_in_another_thread_is_shared(nbytes: NB) -> None:
    box: list[torch.Tensor] = []
    seen: list[int] = []

    def work() -> None:
        with torchmem.cpu_tracking() as theirs:
            box.append(torch.ones(1000))
            seen.append(theirs.allocated)

    with torchmem.cpu_tracking() as cpu:
        mine = torch.ones(10)
        th = threading.Thread(target=work)
        th.start()
        th.join()
        assert seen == [nbytes(mine) + 4000]
        assert cpu.allocated == nbytes(mine, box[0]) == 4040
        box.clear()
        assert cpu.allocated == 40


def test_tracking_in_another_thread_does_not_count_this_thread(nbytes: NB) -> None:
    started = threading.Event()
    release = threading.Event()
    result: list[int] = []

    def work() -> None:
        with torchmem.cpu_tracking() as theirs:
            started.set()
            release.wait(10)
            result.append(theirs.allocated)

    th = threading.Thread(target=work)
    th.start()
    try:
        assert started.wait(10)
        assert torchmem.stats("cpu").allocated == 0  # the ledger is on (in the other thread)
        here = torch.ones(1000)
        assert torchmem.stats("cpu").allocated == 0
    finally:
        release.set()
        th.join()
    assert result == [0]
    del here


# -- robustness ---------------------------------------------------------------------------------------


class _NoStorage(torch.Tensor):
    """A real tensor subclass whose storage cannot be read: every recording step on it fails."""

    def untyped_storage(self):  # type: ignore[no-untyped-def,override]
        raise ValueError("no storage for you")


@pytest.mark.usefixtures("fresh_error_reports")
def test_error_in_recording_path_does_not_break_the_op(nbytes: NB) -> None:
    with torchmem.cpu_tracking() as cpu:
        b = torch.ones(4).as_subclass(_NoStorage)
        with pytest.warns(RuntimeWarning, match="torchmem: tensor accounting failed") as caught:
            r = b + 1
            b.add_(1)
            r2 = b * 3
            r3 = b * 3  # the same failing place again: reported once
        assert torch.equal(r.as_subclass(torch.Tensor), torch.full((4,), 2.0))
        assert torch.equal(b.as_subclass(torch.Tensor), torch.full((4,), 2.0))
        assert torch.equal(r2.as_subclass(torch.Tensor), torch.full((4,), 6.0))
        assert torch.equal(r3.as_subclass(torch.Tensor), torch.full((4,), 6.0))
        messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
        assert len(messages) == len(set(messages))
        assert sum("aten.mul.Tensor" in m for m in messages) == 1
        # Accounting of ordinary tensors goes on exactly.
        before = cpu.allocated
        c = torch.ones(25)
        assert cpu.allocated == before + nbytes(c)


@pytest.mark.usefixtures("fresh_error_reports")
def test_error_in_recording_path_does_not_break_the_op_when_warnings_are_errors() -> None:
    """The recording path never raises into user code, even under ``-W error`` (as this suite runs)."""
    with torchmem.cpu_tracking():
        b = torch.ones(4).as_subclass(_NoStorage)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            b.mul_(2)
            r = b - 1
        assert torch.equal(b.as_subclass(torch.Tensor), torch.full((4,), 2.0))
        assert torch.equal(r.as_subclass(torch.Tensor), torch.full((4,), 1.0))


def test_sparse_coo_tensors_do_not_crash(nbytes: NB) -> None:
    pre_sparse = torch.sparse_coo_tensor(
        torch.tensor([[0, 1], [1, 0]]), torch.tensor([1.0, 2.0]), (2, 2), check_invariants=True
    )
    with torchmem.cpu_tracking() as cpu:
        i = torch.zeros(2, 2, dtype=torch.long)
        i[0, 1] = 1
        i[1, 0] = 1
        v = torch.ones(2)
        assert cpu.allocated == nbytes(i, v) == 40
        sp = torch.sparse_coo_tensor(i, v, (2, 2), check_invariants=True)
        sp2 = (sp * 2).coalesce()
        d = sp2.to_dense()
        mm = torch.sparse.mm(sp, torch.ones(2, 3))
        both = (pre_sparse + sp).to_dense()
        assert torch.equal(d, torch.tensor([[0.0, 2.0], [2.0, 0.0]]))
        assert torch.equal(mm, torch.ones(2, 3))
        assert torch.equal(both, torch.tensor([[0.0, 2.0], [3.0, 0.0]]))
        assert cpu.allocated >= nbytes(i, v, d, mm, both)
        del sp, sp2, d, mm, both, i, v
        gc.collect()
        assert cpu.allocated == 0
        assert cpu.tensors == 0


def test_nested_tensors_do_not_crash(nbytes: NB) -> None:
    with torchmem.cpu_tracking() as cpu:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*nested tensors is in prototype stage.*")
            nt = torch.nested.nested_tensor([torch.ones(3), torch.ones(5)])
        assert cpu.allocated == nbytes(nt) == 32
        nt2 = nt * 2
        assert cpu.allocated == nbytes(nt, nt2) == 64
        jagged = torch.nested.as_nested_tensor([torch.ones(3), torch.ones(5)], layout=torch.jagged)
        jagged2 = jagged.sin()
        assert torch.allclose(jagged2.values(), torch.ones(8).sin())
        del nt, nt2, jagged, jagged2
        gc.collect()
        assert cpu.allocated == 0


def test_users_of_one_thread_may_end_in_any_order() -> None:
    from contextlib import ExitStack

    led = ledger()
    first, second = ExitStack(), ExitStack()
    first.enter_context(led.enabled())
    second.enter_context(led.enabled())
    first.close()  # the first user ends before the second: recording must go on
    a = torch.ones(1000)
    assert led.current("cpu") >= a.untyped_storage().nbytes()
    second.close()
    assert not led.active and torch._C._len_torch_dispatch_stack() == 0
    with led.enabled():  # and a later user records again
        b = torch.ones(2000)
        assert led.current("cpu") == b.untyped_storage().nbytes()


def test_turning_the_ledger_on_does_not_import_dynamo_and_compiled_code_still_counts() -> None:
    # torch wraps a dispatch mode's handler in dynamo's `disable`, which imports torch._dynamo at the first
    # op (0.6-2 s): the ledger's mode is not wrapped while dynamo is not loaded. A program that compiles
    # (dynamo loaded in the middle of a window) is still counted, and gets torch's own handling afterwards.
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(
        """
        import sys, torch
        from torchmem.devices import ledger
        from torchmem.devices import _ledger as L
        with ledger().enabled():
            x = torch.ones(1000) + 1
            print("no dynamo", "torch._dynamo" not in sys.modules, ledger().current("cpu"))
            f = torch.compile(lambda t: (t * 2).sin() + 1, backend="eager")
            y = f(torch.ones(1000))
            print("compiled", "torch._dynamo" in sys.modules, ledger().current("cpu"))
        with ledger().enabled():
            z = f(torch.ones(1000))
            print("after", type(ledger()._tls.mode).__name__, ledger().current("cpu"), torch.equal(y, z))
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    assert out.stdout.splitlines() == [
        "no dynamo True 4000",
        "compiled True 8000",
        "after _LedgerMode 4000 True",
    ], out.stdout + out.stderr


# An "engine thread": code that looks like torch's own (no program frame on its stack), as CUDA's autograd
# engine threads are, where backward's births happen.
_ENGINE_SRC = """
def engine_alloc(led, out):
    with led.enabled():
        out.append(torch.ones(4096))
"""


def _engine_alloc() -> Any:
    namespace: dict[str, Any] = {"torch": torch}
    exec(
        compile(_ENGINE_SRC, os.path.join(os.path.dirname(torch.__file__), "_engine_stub.py"), "exec"),
        namespace,
    )
    return namespace["engine_alloc"]


def test_births_on_an_engine_thread_take_the_caller_site() -> None:
    led = ledger()
    engine_alloc = _engine_alloc()
    out: list[torch.Tensor] = []
    with led.enabled():
        cohort = led.open_cohort("cpu", sites=True)
        try:
            t = threading.Thread(target=engine_alloc, args=(led, out))
            t.start()
            t.join()
            before = dict(led.cohort_site_bytes(cohort))
            caller = led.enter_engine_call(skip=1)  # the line below calls "backward()"
            line = sys._getframe().f_lineno - 1
            try:
                t = threading.Thread(target=engine_alloc, args=(led, out))
                t.start()
                t.join()
            finally:
                led.leave_engine_call(caller)
            after = led.cohort_site_bytes(cohort)
        finally:
            led.close_cohort(cohort)
    assert before == {None: (4096 * 4, 1)}  # no program frame: no site
    sites = {s for s in after if s is not None}
    assert [(os.path.basename(s.filename), s.lineno) for s in sites] == [("test_ledger.py", line)]
    assert led._engine_caller is None


def test_a_dtensor_is_counted_by_its_local_shard() -> None:
    # A DTensor's own storage reports the unsharded size and holds nothing: FSDP2's optimizer state
    # (zeros_like of sharded parameters) was counted world-size times too large.
    dist = pytest.importorskip("torch.distributed")
    fake_pg = pytest.importorskip("torch.testing._internal.distributed.fake_pg")
    tensor_api = pytest.importorskip("torch.distributed.tensor")
    mesh_api = pytest.importorskip("torch.distributed.device_mesh")
    if not dist.is_available() or dist.is_initialized():
        pytest.skip("needs torch.distributed and no process group of the test run")
    dist.init_process_group("fake", rank=0, world_size=4, store=fake_pg.FakeStore())
    try:
        mesh = mesh_api.init_device_mesh("cpu", (4,))
        d = tensor_api.distribute_tensor(torch.randn(1024, 256), mesh, [tensor_api.Shard(0)])
        local = d.to_local().untyped_storage().nbytes()
        assert local * 4 == d.untyped_storage().nbytes() == 1024 * 256 * 4
        led = ledger()
        with led.enabled():
            base = led.current("cpu")
            z = torch.zeros_like(d)  # Adam's moments of a sharded parameter
            w = z * 2
            assert led.current("cpu") - base == 2 * local
            del z, w
            assert led.current("cpu") == base
    finally:
        dist.destroy_process_group()


# -- the program's other threads ------------------------------------------------------------------------
_FOLLOWS = sys.version_info >= (3, 12)


def _worker(go: threading.Event, done: threading.Event, out: list[torch.Tensor], n: int) -> None:
    while not done.is_set():
        if go.wait(0.005):
            go.clear()
            for _ in range(n):
                out.append(torch.empty(4096, dtype=torch.uint8))  # the worker's birth site


@pytest.mark.skipif(not _FOLLOWS, reason="threads are followed from Python 3.12 (setprofile_all_threads)")
def test_births_on_another_thread_are_counted_at_that_threads_site() -> None:
    led = ledger()
    go, done, out = threading.Event(), threading.Event(), []
    t = threading.Thread(target=_worker, args=(go, done, out, 4), name="producer", daemon=True)
    t.start()
    try:
        with led.enabled():
            assert led.follow_threads()
            cohort = led.open_cohort("cpu", sites=True)
            try:
                for _ in range(3):
                    go.set()
                    deadline = time.monotonic() + 5
                    while go.is_set() and time.monotonic() < deadline:
                        time.sleep(0.001)
                    time.sleep(0.02)
                sites = led.cohort_site_bytes(cohort)
            finally:
                led.close_cohort(cohort)
                led.unfollow_threads()
        worker = [(s, v) for s, v in sites.items() if s is not None and s.function == "_worker"]
        assert worker, sites
        site, (nbytes, count) = worker[0]
        assert site.filename.endswith("test_ledger.py") and nbytes >= 4096 * 4 and count >= 4
        # after unfollow: the thread turns recording off at its next Python event
        go.set()
        deadline = time.monotonic() + 5
        while led.active and time.monotonic() < deadline:
            time.sleep(0.005)
        assert not led.active
    finally:
        done.set()
        t.join(5)


@pytest.mark.skipif(not _FOLLOWS, reason="threads are followed from Python 3.12 (setprofile_all_threads)")
def test_following_threads_leaves_a_profiler_alone_and_a_thread_that_ended_is_released() -> None:
    led = ledger()
    sys.setprofile(lambda *a: None)
    try:
        assert not led.follow_threads()  # the program's own profile function: not replaced
    finally:
        sys.setprofile(None)
    go, done, out = threading.Event(), threading.Event(), []
    t = threading.Thread(target=_worker, args=(go, done, out, 1), daemon=True)
    t.start()
    with led.enabled():
        assert led.follow_threads()
        go.set()
        deadline = time.monotonic() + 5
        while go.is_set() and time.monotonic() < deadline:
            time.sleep(0.001)
        done.set()
        t.join(5)  # it ends with its recording on
        led.unfollow_threads()
    assert not led.active and not led._followed


@pytest.mark.skipif(_FOLLOWS, reason="before Python 3.12 only")
def test_before_312_other_threads_are_not_followed() -> None:
    assert not ledger().follow_threads()


@pytest.mark.skipif(not _FOLLOWS, reason="threads are followed from Python 3.12 (setprofile_all_threads)")
def test_a_followed_thread_that_blocks_does_not_keep_the_ledger_on() -> None:
    """A thread that recorded while followed, then blocks in C (a pool's idle worker waiting on a lock):
    once the window closes the ledger is off, and the thread lets its mode go when it runs again."""
    led = ledger()
    go, release, out = threading.Event(), threading.Lock(), []
    release.acquire()

    def worker() -> None:
        go.wait(5)
        out.append(torch.empty(64))  # recorded: the thread is followed by now
        release.acquire()  # blocks in C: no Python event until the lock is released
        out.append(torch.empty(64))

    t = threading.Thread(target=worker, daemon=True)
    t.start()
    time.sleep(0.02)
    with led.enabled():
        assert led.follow_threads()
        go.set()
        deadline = time.monotonic() + 5
        while not out and time.monotonic() < deadline:
            time.sleep(0.001)
        assert led._followed
        led.unfollow_threads()
    assert not led.active  # the blocked thread does not count any more
    release.release()
    t.join(5)
    assert not led.active and not led._releasing and torch._C._len_torch_dispatch_stack() == 0
