"""The shared peak counter (devices/_peaks.py) over a real counter: torchmem's exact CPU ledger, whose peak
is read and reset like the CUDA allocator's. Real tensors; every observer's peak must be exactly what it would
read if it owned the counter."""

from __future__ import annotations

from typing import Any

import torch

import torchmem
from torchmem.devices._peaks import _Mux

MiB = 1 << 20


def _nested(_index: int) -> dict[str, Any]:
    from torchmem.devices import ledger

    peak = ledger().peak("cpu")
    return {"allocated_bytes": {"all": {"peak": peak}}, "reserved_bytes": {"all": {"peak": peak}}}


def _alloc(mib: int) -> torch.Tensor:
    return torch.empty(mib * MiB, dtype=torch.uint8)


def test_nested_readers_and_the_programs_resets_each_get_their_exact_peak() -> None:
    with torchmem.cpu_tracking() as cpu:
        mux = _Mux(0, _nested, lambda _i: torchmem.reset_peak("cpu"))
        base = cpu.allocated

        def program_peak() -> int:
            nested = mux.user_view_nested(_nested(0))
            return int(nested["allocated_bytes"]["all"]["peak"])

        big = _alloc(64)
        del big  # the program's peak: base + 64 MiB
        outer = mux.open()
        a = _alloc(8)
        inner = mux.open()
        b = _alloc(16)
        del b
        assert mux.close(inner)[0] == base + 24 * MiB  # its own peak, not the program's 64 MiB
        c = _alloc(4)
        del a, c
        assert mux.peaks(outer)[0] == base + 24 * MiB
        assert program_peak() == base + 64 * MiB  # the program's view is unchanged by the readers' resets
        # the program resets while a reader is open: the program sees its new peak, the reader keeps its own
        x = _alloc(32)
        del x
        mux.user_reset()
        y = _alloc(2)
        assert program_peak() == base + 2 * MiB
        del y
        assert mux.close(outer)[0] == base + 32 * MiB
        assert program_peak() == base + 2 * MiB
        assert mux.idle()  # nothing differs from the raw counter any more: torch's functions can go back


def test_a_reader_opened_after_a_high_peak_does_not_see_it() -> None:
    with torchmem.cpu_tracking() as cpu:
        mux = _Mux(0, _nested, lambda _i: torchmem.reset_peak("cpu"))
        base = cpu.allocated
        big = _alloc(48)
        del big
        r = mux.open()
        t = _alloc(1)
        assert mux.close(r)[0] == base + 1 * MiB
        del t
        assert not mux.idle()  # the program's 48 MiB peak is only in torchmem's folded view now


def test_a_restart_is_a_close_and_an_open_from_one_reading() -> None:
    with torchmem.cpu_tracking() as cpu:
        mux = _Mux(0, _nested, lambda _i: torchmem.reset_peak("cpu"))
        base = cpu.allocated
        outer = mux.open()
        step = mux.open()
        a = _alloc(8)
        del a
        assert mux.restart(step)[0] == base + 8 * MiB  # the first interval
        b = _alloc(2)
        del b
        assert mux.restart(step)[0] == base + 2 * MiB  # the second one alone
        assert mux.close(step)[0] == base
        assert mux.close(outer)[0] == base + 8 * MiB  # a restart folds the counter into the other readers
