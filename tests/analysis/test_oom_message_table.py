"""The OOM message parser is table-driven: every row of its tables is well formed, and a new message format
is one row in ``SOURCES`` (its marker, its pattern, the fields its phrases yield)."""

from __future__ import annotations

import builtins
import dataclasses
import re
from pathlib import Path

import pytest
import torch

from torchmem.analysis.oom import diagnose, find_oom_message, is_oom, oom_exception, parse_oom_message
from torchmem.analysis.oom import messages as table
from torchmem.results.oom import FORMAT_WORDS, SOURCE_WORDS, ParsedOOM

MiB = 1 << 20
FIELD_NAMES = {f.name for f in dataclasses.fields(ParsedOOM)}
CORPUS = Path(__file__).resolve().parent.parent / "data" / "oom_messages"


def _groups(rule: table.FieldRule) -> set[str]:
    return set(rule.pattern.groupindex)


def test_every_source_row_names_a_known_source_and_every_kind_has_a_marker() -> None:
    sources = {rule.source for rule in table.SOURCES}
    assert sources <= set(SOURCE_WORDS)
    assert all(rule.format is None or rule.format in FORMAT_WORDS for rule in table.SOURCES)
    # every kind of message can be found in a log: a row without a marker shares an earlier row's pattern
    for i, rule in enumerate(table.SOURCES):
        if rule.marker is None:
            assert any(e.pattern is rule.pattern and e.marker is not None for e in table.SOURCES[:i]), rule


def test_every_named_group_is_a_field_or_has_a_reader() -> None:
    rules = [*table.FIELDS, *(f for rule in table.SOURCES for f in rule.fields)]
    for rule in rules:
        for group in _groups(rule):
            assert group in FIELD_NAMES or group in table.READERS or group == "cached", (group, rule)
        for name, _ in rule.constants:
            assert name in FIELD_NAMES
    assert {name for name, _ in table.READERS.values()} <= FIELD_NAMES


def test_sizes_in_messages_are_binary_and_exact() -> None:
    p = parse_oom_message(
        "MPS backend out of memory (MPS allocated: 1.50 GB, other allocations: 512 bytes, "
        "max allowed: 3.00 GB). Tried to allocate 256 bytes on shared pool."
    )
    assert p is not None
    assert (p.allocated, p.other_allocations, p.allowed, p.requested) == (
        round(1.5 * (1 << 30)),
        512,
        3 << 30,
        256,
    )
    assert p.precision["allocated"] == (1 << 30) // 200  # half of the last printed digit: 0.005 GiB
    assert p.pool == "shared"
    cpu = parse_oom_message(
        "DefaultCPUAllocator: not enough memory: you tried to allocate 123456789012345678 bytes. "
        "Error code 12"
    )
    assert cpu is not None and cpu.requested == 123456789012345678  # integers are read exactly
    assert cpu.error_code == "errno 12" and cpu.precision["requested"] == 0


def test_a_new_message_format_is_one_row(monkeypatch: pytest.MonkeyPatch) -> None:
    message = (
        "RuntimeError: FROB device 2 exhausted: wanted 3.00 MiB, pool holds 1.00 GiB "
        "of which 2.00 MiB is free."
    )
    assert parse_oom_message(message) is None and not is_oom(message)
    row = table.SourceRule(
        table._re(r"FROB device \d+ exhausted"),
        "allocator",
        "bare",
        marker=re.compile(r"FROB device \d+ exhausted"),
        fields=(table.FieldRule(table._re(r"wanted {requested}, pool holds {device_total}")),),
    )
    monkeypatch.setattr(table, "SOURCES", (row, *table.SOURCES))
    found = find_oom_message(f"step 7\n{message}\n\nshutting down")
    assert found == message
    p = parse_oom_message(message)
    assert p is not None and p.is_oom and p.source == "allocator" and p.exception_type == "RuntimeError"
    assert (p.requested, p.device_total, p.device_free, p.device_index) == (3 * MiB, 1 << 30, 2 * MiB, 2)
    assert diagnose(p).is_oom


def test_exception_groups_are_searched_for_the_oom() -> None:
    group_type = getattr(builtins, "ExceptionGroup", None)
    if group_type is None:
        pytest.skip("ExceptionGroup needs Python 3.11")
    oom = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB.")
    group = group_type("workers failed", [ValueError("bad input"), oom])
    assert oom_exception(group) is oom
    assert is_oom(group)


@pytest.mark.parametrize("path", sorted(CORPUS.glob("*.txt")), ids=lambda p: p.stem)
def test_a_message_flattened_to_one_line_parses_the_same(path: Path) -> None:
    body = "\n".join(ln for ln in path.read_text().splitlines() if not ln.startswith("# "))
    a, b = parse_oom_message(body), parse_oom_message(" ".join(body.split()))
    if a is None:
        assert b is None or not b.is_oom
        return
    assert b is not None
    assert dataclasses.replace(a, text="") == dataclasses.replace(b, text="")


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ("torch.AcceleratorError: CUDA error: out of memory", "torch.AcceleratorError"),
        (
            "[rank1]: 12:00:01 torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB",
            "torch.cuda.OutOfMemoryError",
        ),
        ("RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB", "RuntimeError"),
    ],
)
def test_the_exception_name_is_read_whole_never_its_tail(text: str, name: str) -> None:
    found = find_oom_message(text)
    assert found is not None
    parsed = parse_oom_message(found)
    assert parsed is not None and parsed.exception_type == name
