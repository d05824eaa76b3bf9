"""The merged report's claims about GPUs and contexts, each with the case where it must be said and the cases
where it must not: every process on its own GPU (mp.spawn children that followed set_device) is silent."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from torchmem.analysis.ranks import merge_captures
from torchmem.capture.file import CaptureWriter, read_capture
from torchmem.results.stats import MemoryStats, ProcessMemory

GiB = 1 << 30
MiB = 1 << 20


def _write(path: Path, index: int, device: str, others: list[int], *, follow_from: str | None = None) -> None:
    """A followed child's capture (mp.spawn), written by the real writer; ``follow_from``: the device the
    session started on before it found the GPU the child works on."""
    st = MemoryStats(
        device=device,
        platform="cuda",
        name="GPU",
        timestamp=0.0,
        allocated=GiB,
        reserved=2 * GiB,
        peak_allocated=2 * GiB,
        peak_reserved=2 * GiB,
        process_used=2 * GiB + 518 * MiB,
        other_processes=tuple(ProcessMemory(p, "python", 2 * GiB) for p in others),
    )
    w = CaptureWriter(
        str(path),
        device=follow_from or device,
        source="allocator",
        rank={
            "rank": index,
            "world_size": 2,
            "local_rank": index,
            "launcher": "spawn",
            "host": "h",
            "job": "j",
        },
    )
    if follow_from:
        w.record("device", device=device, previous=follow_from, reason=f"the program works on {device}")
    w.sample(step=1, allocated=GiB, reserved=2 * GiB, peak_allocated=2 * GiB, peak_reserved=2 * GiB)
    w.stats("end", st.to_dict())
    w.close(steps=5)


def _merged(tmp_path: Path, specs: list[tuple[str, list[int], str | None]]):  # type: ignore[no-untyped-def]
    for k, (device, others, start) in enumerate(specs):
        _write(tmp_path / f"p{k}.jsonl", k, device, others, follow_from=start)
    caps = [read_capture(tmp_path / f"p{k}.jsonl") for k in range(len(specs))]
    caps = [dataclasses.replace(c, header={**c.header, "pid": 100 + k}) for k, c in enumerate(caps)]
    return merge_captures(caps)


def test_each_process_on_its_own_gpu_makes_no_context_or_imbalance_claim(tmp_path: Path) -> None:
    # mp.spawn children: each session started on cuda:0 and followed its child to the GPU it works on
    merged = _merged(tmp_path, [("cuda:0", [], "cuda:0"), ("cuda:1", [], "cuda:0")])
    assert [r.device for r in merged.rows] == ["cuda:0", "cuda:1"]
    text = "\n".join(merged.imbalance)
    assert "also holds CUDA contexts" not in text and "map_location" not in text
    assert "share one GPU" not in text


def test_two_processes_watched_on_one_gpu_are_said_to_share_it_never_to_hold_stray_contexts(
    tmp_path: Path,
) -> None:
    merged = _merged(tmp_path, [("cuda:0", [101], None), ("cuda:0", [100], None)])
    text = "\n".join(merged.imbalance)
    assert "also holds CUDA contexts" not in text and "map_location" not in text
    assert "both work on cuda:0 of h: they share one GPU's memory" in text


def test_a_process_s_context_on_another_s_gpu_is_still_named(tmp_path: Path) -> None:
    merged = _merged(tmp_path, [("cuda:0", [101], None), ("cuda:1", [], None)])
    text = "\n".join(merged.imbalance)
    assert "cuda:0 (proc 0's) also holds CUDA contexts of proc 1 (2.00 GiB)" in text
    assert "share one GPU" not in text
