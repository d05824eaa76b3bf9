"""The OOM message of torchmem's own cap (limit() / budget(hard=True)) and memory pinned by old CPU
exceptions: real torch.OutOfMemoryError raised by the exact ledger on the CPU."""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator

import pytest
import torch

import torchmem
from torchmem.actions.limit import budget, limit
from torchmem.analysis.oom import diagnose, is_oom, parse_oom_message
from torchmem.results.oom import render_diagnosis

MiB = 1 << 20


def _cap_oom(cap: int, n: int) -> torch.OutOfMemoryError:
    with torchmem.cpu_tracking(), limit(cap, "cpu"):
        keep = torch.ones(MiB // 4)  # 1 MiB counted
        try:
            torch.ones(n)
        except torch.OutOfMemoryError as e:
            err = e
        del keep
    err.__traceback__ = None
    return err


@pytest.fixture
def no_last_exception() -> Iterator[None]:
    yield
    for attr in ("last_value", "last_traceback", "last_type", "last_exc"):
        if hasattr(sys, attr):
            setattr(sys, attr, None)
    gc.collect()


def test_cpu_limit_message_is_a_recognised_format_with_its_fields() -> None:
    err = _cap_oom(3 * MiB, MiB)  # 1 MiB held, 4 MiB asked, 3 MiB cap
    text = str(err)
    p = parse_oom_message(text)
    assert p is not None and p.is_oom
    assert (p.source, p.format, p.backend) == ("torchmem_cap", "torchmem", "cpu")
    assert p.requested == 4 * MiB
    assert p.allowed == 3 * MiB
    assert p.device_free == 2 * MiB
    assert p.allocated == MiB
    assert p.cap_owner == "torchmem.limit()"
    assert not p.truncated
    assert p.allocator_oom
    assert is_oom(text)

    d = torchmem.explain_oom(text)  # the pasted text alone
    assert d.is_oom
    assert d.kinds[0] == "too_large"
    assert "cut short" not in " ".join(d.notes)
    shown = str(d)
    assert "caching allocator" not in shown
    assert "cap set by torchmem.limit()" in shown
    settings = [f.setting for f in d.fixes]
    assert "torchmem.limit(None, 'cpu')" in settings
    assert "with torch.autocast('cpu', dtype=torch.bfloat16): ..." in settings
    assert not any(f.kind == "alloc_conf" for f in d.fixes)  # no CUDA allocator setting for a CPU cap
    assert not any("set_per_process_memory_fraction" in (f.setting or "") for f in d.fixes)
    assert sum(1 for f in d.fixes if f.kind == "batch_size") == 1
    fields = render_diagnosis(d, fields=True)
    assert "free under the cap" in fields and "the cap set by torchmem.limit()" in fields


def test_working_set_under_the_cap_and_a_hard_budget_owner() -> None:
    with torchmem.cpu_tracking(), budget(6 * MiB, "cpu", hard=True):
        held = [torch.ones(MiB // 4) for _ in range(5)]  # 5 MiB of the 6 MiB budget
        try:
            torch.ones(MiB // 2)  # 2 MiB more
        except torch.OutOfMemoryError as e:
            text = str(e)
        del held
    p = parse_oom_message(text)
    assert p is not None and p.source == "torchmem_cap"
    assert p.cap_owner is not None and p.cap_owner.startswith("torchmem.budget(")
    assert p.requested == 2 * MiB and p.allocated == 5 * MiB
    d = diagnose(p)
    assert d.kinds[0] == "working_set"
    assert "too_large" not in d.kinds  # 2 MiB fits the 6 MiB budget on its own
    assert any(f.kind == "limit" and "hard budget" in f.text for f in d.fixes)


def test_memory_pinned_by_an_old_cpu_oom_is_reported(no_last_exception: None) -> None:
    def step() -> None:
        activations = [torch.ones(MiB // 4) for _ in range(3)]  # 3 MiB
        torch.ones(2 * MiB) + activations[0].sum()  # over the cap

    def wrapped() -> None:
        try:
            step()
        except torch.OutOfMemoryError as e:
            raise ValueError("step failed") from e

    with torchmem.cpu_tracking(), limit(6 * MiB, "cpu"):
        try:
            wrapped()
        except ValueError as e:  # what a REPL keeps after an uncaught error
            sys.last_value, sys.last_traceback = e, e.__traceback__
            del e
        try:
            torch.ones(MiB)  # 4 MiB: over the cap while the old traceback holds 3 MiB
        except torch.OutOfMemoryError as e:
            d = torchmem.explain_oom(e)
        sys.last_value = sys.last_traceback = None
        gc.collect()
    assert "pinned_by_exception" in d.kinds
    pinned = next(c for c in d.causes if c.kind == "pinned_by_exception")
    assert pinned.bytes == 3 * MiB  # found in the wrapped OOM's frames, its __cause__


def test_the_oom_being_explained_is_not_pinned_memory(no_last_exception: None) -> None:
    """sys.last_value is the exception that wraps the OOM (the excepthook's case): it is not an old one."""

    def step(x: torch.Tensor) -> None:
        activations = [x * 2 for _ in range(2)]
        torch.ones(2 * MiB) + activations[0].sum()

    def wrapped() -> None:
        inputs = torch.ones(MiB // 4)  # held by the wrapper's frame, in the outer exception's traceback
        try:
            step(inputs)
        except torch.OutOfMemoryError as e:
            raise ValueError("step failed") from e

    with torchmem.cpu_tracking(), limit(6 * MiB, "cpu"):
        try:
            wrapped()
        except ValueError as outer:
            sys.last_value, sys.last_traceback = outer, outer.__traceback__
            d = torchmem.explain_oom(outer)
            del outer
        sys.last_value = sys.last_traceback = None
        gc.collect()
    assert d.is_oom
    assert "pinned_by_exception" not in d.kinds, str(d)
