"""Host growth per step of the CUDA states the host watcher names (issue 26), on a GPU: the C heap and the
resident set over 100 steps of a small MLP with the allocator's history off and on, and of a small conv net
under ``cudnn.benchmark`` with one input shape and with a new one every step (and without benchmark).

Run: PYTHONPATH=src python benchmarks/host_kinds_cuda_states.py   (needs CUDA)
"""

from __future__ import annotations

import torch
from torch import nn

from torchmem.devices._host import heap_in_use, process_rss
from torchmem.devices._state import cudnn_benchmark_on, memory_history_recording


def run(kind: str) -> None:
    torch.manual_seed(0)
    if kind.startswith("conv"):
        model = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1)
        ).cuda()
    else:
        model = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 1)).cuda()

    def step(i: int) -> None:
        if kind == "conv_new" or kind == "conv_new_nobench":
            x = torch.randn(2, 3, 16 + i, 24 + i, device="cuda")
        elif kind.startswith("conv"):
            x = torch.randn(2, 3, 64, 64, device="cuda")
        else:
            x = torch.randn(64, 512, device="cuda")
        loss = model(x).square().mean()
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                if p.grad is not None:
                    p.sub_(0.01 * p.grad)
                    p.grad = None
        torch.cuda.synchronize()

    for i in range(20):
        step(i)
    h0, r0 = heap_in_use() or 0, process_rss() or 0
    for i in range(20, 120):
        step(i)
    heap = ((heap_in_use() or 0) - h0) / 100
    rss = ((process_rss() or 0) - r0) / 100
    print(
        f"{kind:<18} heap {heap:+10.0f} B/step  rss {rss:+10.0f} B/step  "
        f"history={memory_history_recording()} cudnn.benchmark={cudnn_benchmark_on()}"
    )


def main() -> int:
    if not torch.cuda.is_available():
        print("needs CUDA")
        return 0
    run("linear")
    torch.cuda.memory._record_memory_history()
    run("linear_history")
    torch.cuda.memory._record_memory_history(enabled=None)
    torch.backends.cudnn.benchmark = True
    run("conv_fixed")
    run("conv_new")
    torch.backends.cudnn.benchmark = False
    run("conv_new_nobench")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
