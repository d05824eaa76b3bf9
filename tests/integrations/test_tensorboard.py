"""log_figures() into a real torch.utils.tensorboard SummaryWriter, read back from the event file."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.tensorboard import SummaryWriter

from torchmem.integrations.tensorboard import log_figures


def test_figures_land_as_scalars_per_step(tmp_path: Path) -> None:
    writer = SummaryWriter(str(tmp_path))
    kept = []
    written = []
    for step in range(5):
        kept.append(torch.ones(1024, 1024))  # the heap grows 4 MiB per step
        written.append(log_figures(writer, step, "cpu"))
    writer.close()
    acc = EventAccumulator(str(tmp_path))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"torchmem/host_rss"} <= tags
    if "torchmem/heap" in tags:  # glibc: the C heap in use
        heap = [e.value for e in acc.Scalars("torchmem/heap")]
        assert [e.step for e in acc.Scalars("torchmem/heap")] == list(range(5))
        assert heap[-1] - heap[0] >= 15 * (1 << 20)
        assert heap == pytest.approx([w["heap"] for w in written], rel=1e-6)
    del kept


def test_not_a_writer_is_a_clear_error() -> None:
    with pytest.raises(TypeError, match="needs a SummaryWriter"):
        log_figures(object(), 0, "cpu")
