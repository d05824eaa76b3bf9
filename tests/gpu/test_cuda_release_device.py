"""release(device=...) on CUDA leaves modules and optimizers on other devices working (run on the device)."""

from __future__ import annotations

import pytest
import torch

import torchmem
from torchmem.actions.release import ReleasedError

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_release_of_one_device_does_not_mark_what_lives_on_another() -> None:
    gpu = torch.nn.Linear(64, 64).cuda()
    gpu_opt = torch.optim.AdamW(gpu.parameters())
    cpu = torch.nn.Linear(64, 64)
    cpu_opt = torch.optim.AdamW(cpu.parameters())
    gpu(torch.ones(2, 64, device="cuda")).sum().backward()
    cpu(torch.ones(2, 64)).sum().backward()
    gpu_opt.step()
    cpu_opt.step()

    report = torchmem.release(gpu, gpu_opt, cpu, cpu_opt, device="cuda:0")
    assert report.errors == ()
    assert gpu.weight.numel() == 0 and cpu.weight.shape == (64, 64)
    assert any("cpu" in s for s in report.skipped)
    # The CPU model and its optimizer were not touched: no ReleasedError, state intact.
    assert len(cpu_opt.state) == 2
    cpu(torch.ones(2, 64)).sum().backward()
    cpu_opt.step()
    with pytest.raises(ReleasedError):
        gpu(torch.ones(2, 64, device="cuda"))
    with pytest.raises(ReleasedError):
        gpu_opt.step()
