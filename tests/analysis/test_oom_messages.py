"""The OOM message parser over a corpus of real messages (tests/data/oom_messages/, one per file).

Each file starts with ``# source:``, ``# what:`` and ``# expect:`` lines; ``expect`` lists the fields the
parser must read (sizes as printed), the ``source``/``format``/``backend``, the top cause (``top=``), or
``not_oom``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from torchmem.analysis.oom import diagnose, find_oom_message, is_oom, parse_oom_message, parse_size

CORPUS = Path(__file__).resolve().parent.parent / "data" / "oom_messages"
FILES = sorted(CORPUS.glob("*.txt"))

_SIZE_FIELDS = {
    "requested",
    "device_total",
    "device_free",
    "allowed",
    "process_used",
    "allocated",
    "private_pools",
    "reserved",
    "reserved_unallocated",
    "other_allocations",
}


def _load(path: Path) -> tuple[dict[str, str], bool, str]:
    lines = path.read_text().splitlines()
    header = [ln for ln in lines if ln.startswith("# ")]
    body = "\n".join(ln for ln in lines if not ln.startswith("# "))
    expect_line = next(ln for ln in header if ln.startswith("# expect:"))[len("# expect:") :].strip()
    assert any(ln.startswith("# source:") for ln in header), f"{path.name} has no source line"
    if expect_line == "not_oom":
        return {}, True, body
    pairs = re.findall(r"(\w+)=(.*?)(?=\s+\w+=|$)", expect_line)
    return dict(pairs), False, body


def test_corpus_is_large_enough() -> None:
    real = [p for p in FILES if "not_oom" not in p.name and "truncated" not in p.name]
    assert len(real) >= 15
    backends = {_load(p)[0].get("backend", "cuda") for p in real}
    assert {"cuda", "rocm", "mps", "xpu", "cpu"} <= backends


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_parse_corpus_message(path: Path) -> None:
    expect, not_oom, body = _load(path)
    parsed = parse_oom_message(body)
    if not_oom:
        assert parsed is None or not parsed.is_oom
        assert not is_oom(body)
        assert not diagnose(parsed).is_oom if parsed is not None else True
        return
    assert parsed is not None and parsed.is_oom, body
    assert is_oom(body)
    for key, want in expect.items():
        if key in _SIZE_FIELDS:
            got = getattr(parsed, key)
            if want == "None":
                assert got is None, key
            else:
                assert got == parse_size(want), f"{key}: {got} != {want}"
        elif key in ("source", "format", "backend", "pool"):
            assert getattr(parsed, key) == want, f"{key}: {getattr(parsed, key)} != {want}"
        elif key == "truncated":
            assert parsed.truncated is (want == "True")
        elif key == "processes":
            assert len(parsed.other_processes) == int(want)
        elif key == "top":
            d = diagnose(parsed)
            assert d.is_oom
            assert d.causes, str(d)
            assert d.causes[0].kind == want, str(d)
        elif key == "also":
            assert want in diagnose(parsed).kinds
    if "backend" not in expect and parsed.source in ("allocator", "cuda_malloc_async"):
        assert parsed.backend == "cuda"
    if "truncated" not in expect:
        assert not parsed.truncated, f"{path.name} parsed as truncated"


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_every_message_diagnoses_and_renders(path: Path) -> None:
    _, not_oom, body = _load(path)
    parsed = parse_oom_message(body)
    d = diagnose(parsed)
    text = str(d)
    assert text
    data = d.to_dict()
    assert data["is_oom"] is (not not_oom)
    if not not_oom:
        assert text.startswith("Out of memory")
        kinds = [c["kind"] for c in data["causes"]]
        assert len(kinds) == len(set(kinds))


def test_sizes_are_binary_and_exact() -> None:
    assert parse_size("1.00 KiB") == 1024
    assert parse_size("2.00 GiB") == 2 << 30
    assert parse_size("3.95 MB") == round(3.95 * (1 << 20))  # MPS labels binary sizes "MB"
    assert parse_size("0 bytes") == 0
    assert parse_size("256 bytes") == 256
    assert parse_size("lots") is None


def test_find_message_in_long_log_takes_the_last_oom() -> None:
    first = (CORPUS / "torch1_free_exceeds_request.txt").read_text().splitlines()[-1]
    last = (CORPUS / "torch23_this_process_22MiB.txt").read_text().splitlines()[-1]
    log = "\n".join(
        [
            "epoch 1 step 10 loss 0.5",
            f"RuntimeError: {first}",
            "",
            "retrying with a smaller batch",
            "Traceback (most recent call last):",
            '  File "train.py", line 42, in <module>',
            "    loss = model(x).sum()",
            last,
            "",
            "wandb: finished",
        ]
    )
    found = find_oom_message(log)
    assert found is not None and found.startswith("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried")
    assert "wandb" not in found and "train.py" not in found
    parsed = parse_oom_message(log)
    assert parsed is not None and parsed.requested == 22 << 20


def test_multiline_async_message_keeps_its_lines() -> None:
    body = _load(CORPUS / "cuda_malloc_async_multiline.txt")[2]
    found = find_oom_message("some log line\n" + body)
    assert found is not None
    assert found.startswith("torch.cuda.OutOfMemoryError: Allocation on device 0")
    assert "Free (according to CUDA)" in found


def test_exception_prefix_and_log_prefix_are_read() -> None:
    body = _load(CORPUS / "torch2_private_pools_container.txt")[2]
    parsed = parse_oom_message(body)
    assert parsed is not None
    assert parsed.exception_type == "torch.OutOfMemoryError"
    assert parsed.text.startswith("torch.OutOfMemoryError")
    assert parsed.notes  # this process is not named in the list (container)


def test_text_without_oom_gives_none() -> None:
    assert parse_oom_message("") is None
    assert parse_oom_message("all good") is None
    assert find_oom_message("loss went down") is None
