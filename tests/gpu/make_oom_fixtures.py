"""Record real CUDA OOMs with the allocator state torchmem's observer captured at the moment of each.

Usage (on a machine with a CUDA GPU, from the repository root)::

    PYTHONPATH=src python3 tests/gpu/make_oom_fixtures.py tests/data/oom_states

writes ``fragmentation.json``, ``too_large.json`` and ``working_set.json`` there: each holds the OOM
message, the captured :class:`~torchmem.analysis.fragmentation.AllocatorState` (``state``), the allocator
settings and the torch version. Every scenario runs in its own process (each fills the device).
``--one NAME [--history]`` runs one scenario in this process (the GPU tests use it); with ``--history``
memory history is recorded and the observer writes a memory_viz snapshot next to the JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import torch

MiB = 1 << 20
SCENARIOS = ("fragmentation", "too_large", "working_set")


def _fill_small(keep: list[torch.Tensor], dev: torch.device) -> None:
    """Take the device's last free memory in 1 MiB pieces (small pool), until the driver refuses."""
    while True:
        try:
            keep.append(torch.empty(MiB, dtype=torch.uint8, device=dev))
        except torch.OutOfMemoryError:
            return


def fragmentation(dev: torch.device, k: int = 32) -> dict[str, Any]:
    """k 64 MiB segments, each split into two 32 MiB blocks, one of them freed; device otherwise full.
    A 48 MiB request then fails although k * 32 MiB are free in the cache."""
    free, _ = torch.cuda.mem_get_info(dev)
    ballast = torch.empty(max(0, free - (k * 64 + 256) * MiB), dtype=torch.uint8, device=dev)
    big = [torch.empty(64 * MiB, dtype=torch.uint8, device=dev) for _ in range(k)]
    filler: list[torch.Tensor] = []
    _fill_small(filler, dev)
    del big  # k whole free 64 MiB segments stay cached
    halves = [torch.empty(32 * MiB, dtype=torch.uint8, device=dev) for _ in range(2 * k)]
    kept = halves[1::2]
    del halves  # the even halves are freed: k free 32 MiB pieces, each beside an allocated one
    try:
        torch.empty(48 * MiB, dtype=torch.uint8, device=dev)
    except torch.OutOfMemoryError as e:
        return {
            "message": str(e),
            "expected_largest_free": 32 * MiB,
            "k": k,
            "_keep": (ballast, filler, kept),
        }
    raise AssertionError("the fragmentation scenario did not OOM")


def too_large(dev: torch.device) -> dict[str, Any]:
    total = torch.cuda.get_device_properties(dev).total_memory
    try:
        torch.empty(total + 1024 * MiB, dtype=torch.uint8, device=dev)
    except torch.OutOfMemoryError as e:
        return {"message": str(e)}
    raise AssertionError("the too-large scenario did not OOM")


def working_set(dev: torch.device) -> dict[str, Any]:
    held: list[torch.Tensor] = []
    try:
        while True:
            held.append(torch.empty(256 * MiB, dtype=torch.uint8, device=dev))
    except torch.OutOfMemoryError as e:
        return {"message": str(e), "held": len(held) * 256 * MiB, "_keep": held}


def run_one(name: str, out_dir: str, history: bool = False) -> dict[str, Any]:
    from torchmem.capture.oom import attach_oom_observer, last_oom_state
    from torchmem.devices._allocator import alloc_conf

    dev = torch.device("cuda", 0)
    torch.cuda.init()
    torch.empty(1, device=dev)  # context and allocator up
    if history:
        torch.cuda.memory._record_memory_history(max_entries=10000)
    seen: list[Any] = []
    handle = attach_oom_observer(seen.append, snapshot_dir=out_dir if history else None)
    if handle.problem:
        raise SystemExit(f"observer not attached: {handle.problem}")
    result = {"fragmentation": fragmentation, "too_large": too_large, "working_set": working_set}[name](dev)
    state = last_oom_state(0)
    assert state is not None and seen, "the observer did not fire"
    result.pop("_keep", None)
    stats_after = {k: int(v) for k, v in torch.cuda.memory_stats(dev).items() if isinstance(v, (int, float))}
    if history:
        torch.cuda.memory._record_memory_history(enabled=None)
    out = {
        "scenario": name,
        "message": result.pop("message"),
        "state": state.to_dict(),
        "alloc_conf": alloc_conf(),
        "torch": torch.__version__,
        "device_name": torch.cuda.get_device_name(dev),
        "observer_calls": len(seen),
        "stats_after": stats_after,
        **result,
    }
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
        json.dump(out, f, indent=1, default=str)
    return out


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        print(__doc__)
        return 2
    out_dir = argv[0]
    if "--one" in argv:
        run_one(argv[argv.index("--one") + 1], out_dir, history="--history" in argv)
        return 0
    if os.environ.get("PYTORCH_CUDA_ALLOC_CONF") or os.environ.get("PYTORCH_ALLOC_CONF"):
        print("note: an allocator configuration is set; the fragmentation scenario expects the default.")
    rc = 0
    for name in SCENARIOS:
        p = subprocess.run([sys.executable, __file__, out_dir, "--one", name], check=False)
        print(f"{name}: {'ok' if p.returncode == 0 else f'failed ({p.returncode})'}")
        rc = rc or p.returncode
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
