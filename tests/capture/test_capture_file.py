"""The capture file: writer and reader, crash safety (a real SIGKILL), damaged and foreign files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch

import torchmem
from torchmem._errors import TorchmemError
from torchmem.capture.file import (
    FORMAT,
    VERSION,
    Capture,
    CaptureError,
    CaptureFormatError,
    CaptureVersionError,
    CaptureWriteError,
    CaptureWriter,
    read_capture,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "captures"
SRC = Path(__file__).resolve().parents[2] / "src"


def _lines(p: Path) -> list[bytes]:
    return p.read_bytes().split(b"\n")


# ---------------------------------------------------------------------------------------------------------
# round trip


def test_round_trip_of_every_record_type(tmp_path: Path) -> None:
    p = tmp_path / "run.jsonl"
    with torchmem.cpu_tracking():
        w = CaptureWriter(p, device="cpu", device_name="test cpu", source="ledger", argv=["t.py", "-x"])
        s0 = torchmem.stats("cpu")
        w.stats("start", s0, s0.breakdown())
        x = torch.randn(1024)  # 4096 bytes of storage
        c = torchmem.counters("cpu")
        w.sample(step=0, allocated=c.allocated, peak_allocated=c.peak_allocated)
        w.step(1, allocated=c.allocated)
        w.oom(torchmem.explain_oom("CUDA out of memory. Tried to allocate 2.00 GiB."), step=1)
        w.modules([{"module": "fc", "params": 10, "grads": 10, "optimizer_state": 20, "activations": 5,
                    "forward_peak": 7, "backward_peak": 9}], ["approximate"])  # fmt: skip
        w.note("café <b> 'q' \"d\"")
        w._write_raw(b'{"type":"future_type","t":0.5,"payload":[1,2]}\n')  # a later version's kind
        s1 = torchmem.stats("cpu")
        w.stats("end", s1, None)
        w.close(exit_code=0)
        del x
    cap = read_capture(p)
    assert isinstance(cap, Capture)
    h = cap.header
    assert h["format"] == FORMAT and h["version"] == VERSION
    assert h["torch"] == torch.__version__ and h["torchmem"] == torchmem.__version__
    assert h["device"] == "cpu" and h["device_name"] == "test cpu" and h["source"] == "ledger"
    assert h["argv"] == ["t.py", "-x"] and h["pid"] == os.getpid()
    assert abs(h["started"] - time.time()) < 60
    assert len(cap.samples) == 1 and cap.samples[0].allocated == c.allocated
    assert c.allocated is not None and c.allocated >= 4096
    assert cap.samples[0].reserved is None  # unknown stays unknown, never 0
    assert [s.step for s in cap.steps] == [1]
    assert [r.when for r in cap.stats] == ["start", "end"]
    assert cap.stats[0].stats == json.loads(json.dumps(s0.to_dict()))
    assert cap.stats[0].breakdown is not None and cap.stats[1].breakdown is None
    assert cap.ooms[0].step == 1 and cap.ooms[0].diagnosis["is_oom"] is True
    assert cap.ooms[0].diagnosis["parsed"]["requested"] == 2 * 1024**3
    assert cap.modules[0].rows[0]["module"] == "fc" and cap.modules[0].notes == ("approximate",)
    assert cap.notes[0].text == "café <b> 'q' \"d\""
    assert cap.unknown[0]["type"] == "future_type"  # a later record type: kept, not an error
    assert cap.end is not None and cap.end.exit_code == 0 and cap.end.reason == "exit"
    assert cap.end.steps == 1 and cap.finished and cap.truncated is None
    assert cap.step_count == 1
    assert cap.peak_allocated is not None and cap.peak_allocated >= 4096
    times = [cap.samples[0].t, cap.steps[0].t, cap.ooms[0].t, cap.end.t]
    assert times == sorted(times) and times[0] >= 0
    # every line is pure ASCII JSON (non-ASCII escaped), one object per line
    raw = p.read_bytes()
    raw.decode("ascii")
    assert raw.endswith(b"\n")
    assert all(isinstance(json.loads(line), dict) for line in raw.splitlines())
    # to_dict is JSON-able and keeps the figures
    d = json.loads(json.dumps(cap.to_dict()))
    assert d["summary"]["steps"] == 1 and d["end"]["reason"] == "exit"


def test_nan_tuples_and_odd_objects_are_written_as_json(tmp_path: Path) -> None:
    p = tmp_path / "odd.jsonl"
    w = CaptureWriter(p, argv=[])
    w.record("note", text="x", value=float("nan"), inf=float("inf"), pair=(1, 2), dev=torch.device("cpu"))
    w.close()
    line = json.loads(_lines(p)[1])
    assert line["value"] is None and line["inf"] is None and line["pair"] == [1, 2] and line["dev"] == "cpu"
    assert read_capture(p).notes[0].text == "x"


def test_context_manager_records_how_the_block_ended(tmp_path: Path) -> None:
    cases = [
        (None, 0, "exit"),
        (SystemExit(3), 3, "exit"),
        (KeyboardInterrupt(), 130, "keyboard_interrupt"),
        (ValueError("boom"), 1, "exception"),
        (torch.OutOfMemoryError("CUDA out of memory."), 1, "oom"),
    ]
    for i, (exc, code, reason) in enumerate(cases):
        p = tmp_path / f"{i}.jsonl"
        try:
            with CaptureWriter(p, argv=[]) as w:
                w.step(4)
                if exc is not None:
                    raise exc
        except BaseException as got:
            assert got is exc
        end = read_capture(p).end
        assert end is not None and (end.exit_code, end.reason, end.steps) == (code, reason, 4)
    w.close()  # a second close does nothing
    assert len(read_capture(p).unknown) == 0 and _lines(p)[-2].count(b'"end"') == 1


def test_threads_write_whole_lines(tmp_path: Path) -> None:
    p = tmp_path / "threads.jsonl"
    w = CaptureWriter(p, argv=[])

    def work(k: int) -> None:
        for i in range(300):
            w.sample(step=i, allocated=k * 1_000_000 + i, reserved=None)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    w.close()
    cap = read_capture(p)
    assert cap.truncated is None and len(cap.samples) == 1200
    assert sorted(s.allocated or 0 for s in cap.samples) == sorted(
        k * 1_000_000 + i for k in range(4) for i in range(300)
    )


# ---------------------------------------------------------------------------------------------------------
# crash safety

_WRITER_SCRIPT = textwrap.dedent(
    """
    import sys, torch, torchmem
    from torchmem.capture.file import CaptureWriter
    w = CaptureWriter(sys.argv[1], device="cpu", source="ledger")
    kept = []
    with torchmem.cpu_tracking():
        step = 0
        while True:  # a training-like loop that never ends: it is killed
            step += 1
            kept.append(torch.randn(256))
            c = torchmem.counters("cpu")
            w.sample(step=step, allocated=c.allocated, peak_allocated=c.peak_allocated)
            w.step(step, allocated=c.allocated)
            if step == 200:
                print("ready", flush=True)
    """
)


def test_sigkill_leaves_a_readable_file(tmp_path: Path) -> None:
    p = tmp_path / "killed.jsonl"
    script = tmp_path / "writer.py"
    script.write_text(_WRITER_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    with subprocess.Popen(
        [sys.executable, str(script), str(p)], stdout=subprocess.PIPE, env=env, text=True
    ) as proc:
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready"
            proc.send_signal(signal.SIGKILL)
        finally:
            proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    cap = read_capture(p)
    assert cap.end is None and not cap.finished
    raw = p.read_bytes()
    whole = raw.count(b"\n")  # complete lines, header included
    assert len(cap.samples) + len(cap.steps) == whole - 1  # every complete line was read
    assert len(cap.steps) >= 200 and [s.step for s in cap.steps] == list(range(1, len(cap.steps) + 1))
    alloc = [s.allocated for s in cap.steps]
    assert all(a is not None for a in alloc) and alloc == sorted(alloc)  # 1 KiB more per step
    if raw.endswith(b"\n"):
        assert cap.truncated is None
    else:  # killed in the middle of a line
        assert cap.truncated is not None and f"line {whole + 1}" in cap.truncated
    assert cap.step_count == len(cap.steps)


def test_truncated_file_reads_up_to_the_cut(tmp_path: Path) -> None:
    src = (DATA / "leak_cpu.jsonl").read_bytes()
    lines = src.split(b"\n")
    keep = 20
    cut_at = sum(len(x) + 1 for x in lines[:keep])  # byte offset of line keep+1
    p = tmp_path / "cut.jsonl"
    p.write_bytes(src[: cut_at + 7])
    cap = read_capture(p)
    assert cap.truncated == (
        f"the file stops at line {keep + 1} (byte {cut_at}): the run was killed or the file is truncated"
    )
    full = read_capture(DATA / "leak_cpu.jsonl")
    n_read = len(cap.samples) + len(cap.steps) + len(cap.stats) + len(cap.leaks) + len(cap.notes)
    assert n_read == keep - 1
    assert cap.samples == full.samples[: len(cap.samples)]
    assert cap.end is None


def test_corrupt_line_in_the_middle_stops_there(tmp_path: Path) -> None:
    lines = (DATA / "flat_cpu.jsonl").read_bytes().split(b"\n")
    lines[10] = b'{"type": "sample", "t": 1.0, "allocated'  # damaged, then more lines
    p = tmp_path / "corrupt.jsonl"
    p.write_bytes(b"\n".join(lines))
    cap = read_capture(p)
    assert cap.truncated is not None and "line 11 " in cap.truncated
    lines[10] = b'["not", "a", "record"]'
    p.write_bytes(b"\n".join(lines))
    assert "line 11 " in (read_capture(p).truncated or "")
    lines[10] = b'{"type": "modules", "t": 1.0, "rows": "nope"}'
    p.write_bytes(b"\n".join(lines))
    assert "line 11 " in (read_capture(p).truncated or "")


def test_header_only_and_partial_header(tmp_path: Path) -> None:
    p = tmp_path / "h.jsonl"
    w = CaptureWriter(p, argv=[])
    del w  # dropped without close: the header is on disk
    cap = read_capture(p)
    assert cap.samples == () and cap.end is None and cap.truncated is None
    head = p.read_bytes().rstrip(b"\n")
    p.write_bytes(head)  # the header line without its newline
    assert read_capture(p).header["format"] == FORMAT
    p.write_bytes(head[:30])
    with pytest.raises(CaptureFormatError, match="not a torchmem capture"):
        read_capture(p)


# ---------------------------------------------------------------------------------------------------------
# foreign, empty and newer files


def _png_bytes() -> bytes:
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    raw = b"\x00\xff\x00\x00" * 1
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(raw))
        + chunk(b"IEND", b"")
    )


@pytest.mark.parametrize(
    ("content", "found"),
    [
        (_png_bytes(), "a PNG image"),
        (b'{"name": "x", "value": 3}\n', "keys 'name', 'value'"),
        (b'{"format": "memray", "version": 1}\n', "format 'memray'"),
        (b"[1, 2, 3]\n", "JSON list"),
        (b"step,allocated\n1,2\n", "text starting with 'step,allocated'"),
        (b"<!doctype html><html></html>", "HTML"),
        (b"\x00\x01\x02garbage", "binary data"),
    ],
)
def test_foreign_files_are_rejected_naming_what_was_found(tmp_path: Path, content: bytes, found: str) -> None:
    p = tmp_path / "foreign"
    p.write_bytes(content)
    with pytest.raises(CaptureFormatError) as ei:
        read_capture(p)
    assert "not a torchmem capture file" in ei.value.message and found in ei.value.message
    assert "torchmem run" in ei.value.hint


def test_newer_version_is_rejected_with_upgrade_hint(tmp_path: Path) -> None:
    p = tmp_path / "v999.jsonl"
    p.write_text(
        json.dumps({"format": FORMAT, "version": 999, "torchmem": "9.0"}) + '\n{"type": "sample", "t": 0}\n'
    )
    with pytest.raises(CaptureVersionError) as ei:
        read_capture(p)
    assert "version 999" in ei.value.message and "torchmem 9.0" in ei.value.message
    assert "pip install -U torchmem" in ei.value.hint
    for bad in ("1", 0, None, True):
        p.write_text(json.dumps({"format": FORMAT, "version": bad}) + "\n")
        with pytest.raises(CaptureVersionError, match="unknown version"):
            read_capture(p)


def test_empty_missing_and_folder(tmp_path: Path) -> None:
    p = tmp_path / "empty.jsonl"
    for content in (b"", b"\n\n  \n"):
        p.write_bytes(content)
        with pytest.raises(CaptureFormatError, match="is empty"):
            read_capture(p)
    with pytest.raises(CaptureError, match="no capture file"):
        read_capture(tmp_path / "nope.jsonl")
    with pytest.raises(CaptureError, match="is a folder"):
        read_capture(tmp_path)
    assert issubclass(CaptureError, TorchmemError)


# ---------------------------------------------------------------------------------------------------------
# writer errors


def test_unwritable_paths_fail_before_anything_runs(tmp_path: Path) -> None:
    with pytest.raises(CaptureWriteError, match="does not exist") as ei:
        CaptureWriter(tmp_path / "no" / "such" / "dir" / "run.jsonl")
    assert "create the folder" in ei.value.hint
    with pytest.raises(CaptureWriteError, match="is a folder"):
        CaptureWriter(tmp_path)
    with pytest.raises(CaptureWriteError):  # the header cannot be written: device full
        CaptureWriter("/dev/full")
    assert not (tmp_path / "no").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores file permissions")
def test_read_only_folder(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        with pytest.raises(CaptureWriteError, match="permission denied"):
            CaptureWriter(ro / "run.jsonl")
    finally:
        ro.chmod(0o700)


_FULL_DISK_SCRIPT = textwrap.dedent(
    """
    import resource, signal, sys, warnings
    from torchmem.capture.file import CaptureWriter
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # writes past the limit fail with EFBIG instead
    resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))
    w = CaptureWriter(sys.argv[1], device="cpu", source="ledger")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(1000):
            w.sample(step=i, allocated=i)
        w.close()
    print("still running", w.recording, len(caught), repr(w.error))
    print(caught[0].message)
    """
)


def test_write_error_after_opening_never_reaches_the_program(tmp_path: Path) -> None:
    p = tmp_path / "full.jsonl"
    script = tmp_path / "full.py"
    script.write_text(_FULL_DISK_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    out = subprocess.run(
        [sys.executable, str(script), str(p)], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr
    first, second = out.stdout.splitlines()[:2]
    assert first.startswith("still running False 1 'OSError")  # reported once, recording stopped
    assert "recording stopped" in second
    cap = read_capture(p)
    assert 0 < len(cap.samples) < 1000 and cap.end is None
    assert p.stat().st_size <= 4096
