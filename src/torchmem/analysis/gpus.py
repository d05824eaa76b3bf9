"""Which GPU a process works on, and what the figures of every GPU it touched show (pure).

Inputs are plain data read by :mod:`torchmem.capture.gpus`: one :class:`~torchmem.results.gpus.GpuRow` per
GPU with a context, and the evidence recorded while the program ran (where CUDA was first used, each
``torch.cuda.set_device``, each ``torch.load`` that restored storages to a GPU without ``map_location``,
each ``nn.DataParallel``, each state dict whose making grew the GPU's memory, the child processes started).
Every statement below is made only from that evidence; where the evidence is not there, nothing is said.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from torchmem._format import fmt_bytes
from torchmem.results.gpus import GpuFinding, GpuRow, GpusReport

MiB = 1 << 20
# A GPU that is not the one the process works on, and that holds at most this (or this share of the
# working GPU's peak), holds no work of the process's: a context there is a stray one.
STRAY_MAX_BYTES = 64 * MiB
STRAY_MAX_SHARE = 0.05
# nn.DataParallel: the first GPU's peak this much above the other GPUs' median, and by at least this much,
# is the imbalance of the gathered outputs.
DP_RATIO = 1.2
DP_MIN_BYTES = 64 * MiB
# A state dict whose making grew the GPU's allocated memory by this much is a gathered (full) one.
STATE_DICT_MIN_BYTES = 64 * MiB
# A CUDA context costs about this much (H100, torch 2.x: 500-540 MiB) where NVML gave no measurement.
CONTEXT_BYTES = 520 * MiB


def choose_device(
    contexts: Sequence[int], current: int | None, allocated: Mapping[int, int | None]
) -> int | None:
    """The GPU a process works on: among the GPUs it has a context on, the one holding the most allocated
    memory; with none allocated anywhere, the current device when it has a context, else the lowest index
    with a context; ``None`` without any context (nothing is known yet).

    Example:
        >>> choose_device([0, 1], 1, {0: 0, 1: 4096})
        1
        >>> choose_device([0], 0, {0: 0})
        0
        >>> choose_device([], None, {}) is None
        True
    """
    if not contexts:
        return None
    best = max(contexts, key=lambda i: (allocated.get(i) or 0, i == current, -i))
    if (allocated.get(best) or 0) > 0:
        return best
    if current is not None and current in contexts:
        return current
    return min(contexts)


def _index(device: str) -> int | None:
    _, _, idx = device.partition(":")
    return int(idx) if idx.isdigit() else None


def _dp_devices(evidence: Mapping[str, Any]) -> set[int]:
    out: set[int] = set()
    for dp in evidence.get("data_parallel", ()) or ():
        ids = dp.get("device_ids") or ()
        if len(ids) > 1:
            out.update(int(i) for i in ids)
    return out


def _stray(rows: Sequence[GpuRow], watched: str, evidence: Mapping[str, Any]) -> list[GpuFinding]:
    main = next((r for r in rows if r.device == watched), None)
    if main is None or len(rows) < 2:
        return []
    w = _index(watched)
    main_peak = main.peak_allocated or 0
    in_dp = _dp_devices(evidence)
    loads = list(evidence.get("loads", ()) or ())
    sets = list(evidence.get("set_device", ()) or ())
    init = evidence.get("cuda_init") or {}
    out: list[GpuFinding] = []
    for r in rows:
        d = _index(r.device)
        if r.device == watched or d is None or d in in_dp or r.peak_allocated is None:
            continue
        loaded = [ld for ld in loads if d in (ld.get("devices") or ())]
        small = r.peak_allocated <= max(STRAY_MAX_BYTES, STRAY_MAX_SHARE * main_peak)
        if not small and not loaded:
            continue  # real work on a second GPU (model parallel, several models): nothing to say
        cost = r.process_used if r.process_used is not None else None
        held = f"{fmt_bytes(cost)} by NVML" if cost is not None else "a context, ~0.5 GiB"
        what = (
            f"this process has a CUDA context on {r.device} ({held}) while its work is on {watched} "
            f"(peak {fmt_bytes(main_peak)} there, {fmt_bytes(r.peak_allocated)} on {r.device})"
        )
        load_fix = f'torch.load(path, map_location="{watched}") (or "cpu")'
        order_fix = (
            f"call torch.cuda.set_device({w}) before the first CUDA call (or give every .cuda()/.to() "
            f'the device "{watched}", or set CUDA_VISIBLE_DEVICES for the process)'
        )
        before = [s for s in sets if s.get("index") == w and d in (s.get("contexts_before") or ())]
        if loaded:
            ld = loaded[0]
            moved = ld.get("bytes")
            text = (
                f"{what}: torch.load at {ld.get('site') or '?'} restored "
                f"{fmt_bytes(moved) + ' of ' if moved else ''}storages to {r.device}, the GPU the checkpoint "
                "was saved from, because no map_location was given"
            )
            fix = load_fix
        elif before:
            s = before[0]
            first = init.get("site") if init.get("device") == d else None
            text = (
                f"{what}: CUDA was already in use on {r.device}"
                + (f" (first CUDA call at {first})" if first else "")
                + f" when torch.cuda.set_device({w}) ran at {s.get('site') or '?'}"
            )
            fix = order_fix
        elif init.get("device") == d and init.get("site"):
            text = (
                f"{what}: the first CUDA call, at {init['site']}, ran while {r.device} was the current device"
            )
            fix = order_fix
        else:
            text = (
                f"{what} and keeps no tensors there: something touched {r.device} (a CUDA call before "
                "torch.cuda.set_device, a torch.load without map_location, a library using the current "
                "device); torchmem saw no such call of the program's own"
            )
            fix = f"{order_fix}; {load_fix}"
        out.append(
            GpuFinding("stray_context", r.device, text, fix, cost if cost is not None else CONTEXT_BYTES)
        )
    return out


def _data_parallel(rows: Sequence[GpuRow], evidence: Mapping[str, Any]) -> list[GpuFinding]:
    peaks = {r.device: r.peak_allocated for r in rows}
    out: list[GpuFinding] = []
    seen: set[str] = set()
    for dp in evidence.get("data_parallel", ()) or ():
        ids = [int(i) for i in dp.get("device_ids") or ()]
        if len(ids) < 2:
            continue
        first = int(dp["output_device"]) if dp.get("output_device") is not None else ids[0]
        dev = f"cuda:{first}"
        others = [peaks.get(f"cuda:{i}") for i in ids if i != first]
        if dev in seen or peaks.get(dev) is None or not others or any(p is None for p in others):
            continue
        top = int(peaks[dev] or 0)
        med = float(statistics.median(int(p or 0) for p in others))
        gap = top - med
        if med <= 0 or top < DP_RATIO * med or gap < DP_MIN_BYTES:
            continue
        seen.add(dev)
        module = dp.get("module") or "the model"
        over = ", ".join(f"cuda:{i}" for i in ids)
        text = (
            f"nn.DataParallel({module}) at {dp.get('site') or '?'} over {over}: {dev} peaked at "
            f"{fmt_bytes(top)} allocated, {fmt_bytes(int(gap))} above the other GPUs (median "
            f"{fmt_bytes(int(med))}): every replica's outputs are gathered on {dev}, and the loss and the "
            "start of its backward run there"
        )
        fix = (
            "compute the loss inside the wrapped module's forward and return it (gather only the per-replica "
            f"losses, then .mean()), or use DistributedDataParallel (one process per GPU, balanced): up to "
            f"{fmt_bytes(int(gap))} less on {dev}"
        )
        out.append(GpuFinding("data_parallel", dev, text, fix, int(gap)))
    return out


_STATE_DICT_FIX = {
    "get_model_state_dict": (
        "StateDictOptions(full_state_dict=True, cpu_offload=True): the full tensors go to host memory as "
        "they are gathered (and save from rank 0 only)"
    ),
    "get_state_dict": (
        "StateDictOptions(full_state_dict=True, cpu_offload=True): the full tensors go to host memory as "
        "they are gathered (and save from rank 0 only)"
    ),
    "state_dict": (
        "FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, FullStateDictConfig(offload_to_cpu=True, "
        "rank0_only=True)), or with FSDP2 get_model_state_dict(model, options=StateDictOptions("
        "full_state_dict=True, cpu_offload=True))"
    ),
}


def _state_dicts(evidence: Mapping[str, Any]) -> list[GpuFinding]:
    by_site: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for s in evidence.get("state_dicts", ()) or ():
        if int(s.get("grew") or 0) >= STATE_DICT_MIN_BYTES:
            by_site.setdefault((str(s.get("site") or "?"), str(s.get("call") or "state_dict")), []).append(s)
    out: list[GpuFinding] = []
    for (site, call), items in by_site.items():
        big = max(items, key=lambda s: int(s.get("grew") or 0))
        dev = f"cuda:{big.get('device', 0)}"
        n = len(items)
        text = (
            f"{call}() at {site} grew {dev}'s memory by {fmt_bytes(int(big['grew']))}"
            + (f" ({n} calls)" if n > 1 else "")
            + ": the full, unsharded tensors are gathered on the GPU, on every rank that makes the call"
        )
        out.append(
            GpuFinding(
                "state_dict",
                dev,
                text,
                _STATE_DICT_FIX.get(call, _STATE_DICT_FIX["state_dict"]),
                int(big["grew"]),
            )
        )
    return out


def describe_child(child: Mapping[str, Any]) -> str:
    """``pid 812 (python3 child.py --rank 1, started at launch.py:14)``."""
    cmd = child.get("command") or child.get("name") or "?"
    site = child.get("site")
    return f"pid {child.get('pid')} ({cmd}" + (f", started at {site}" if site else "") + ")"


def _children(children: Sequence[Mapping[str, Any]], context: int) -> tuple[list[str], list[GpuFinding]]:
    lines: list[str] = []
    found: list[GpuFinding] = []
    for c in children:
        used = {str(k): int(v) for k, v in (c.get("used") or {}).items() if v is not None}
        if not used:
            continue
        lines.append(
            describe_child(c) + ": " + ", ".join(f"{d} {fmt_bytes(b)}" for d, b in sorted(used.items()))
        )
        if len(used) < 2:
            continue
        main_dev, main_b = max(used.items(), key=lambda kv: kv[1])
        if main_b <= 2 * context:
            continue
        for d, b in sorted(used.items()):
            if d == main_dev or b > 1.3 * context:
                continue
            found.append(
                GpuFinding(
                    "child_context",
                    d,
                    f"child process {describe_child(c)} holds a CUDA context on {d} ({fmt_bytes(b)}, "
                    f"about a context's size) besides its work on {main_dev} ({fmt_bytes(main_b)}): a "
                    f"process working on {main_dev} gets a context on {d} from a CUDA call made before "
                    f"torch.cuda.set_device, or from a torch.load of a checkpoint saved from {d} without "
                    "map_location",
                    "in the child, torch.cuda.set_device(...) before its first CUDA call and "
                    "torch.load(..., map_location=...); run it as "
                    f"`torchmem run {c.get('script') or '<script>'}` to have the line named",
                    b,
                )
            )
    return lines, found


def gpus_report(
    rows: Sequence[GpuRow],
    watched: str,
    evidence: Mapping[str, Any] | None = None,
    children: Sequence[Mapping[str, Any]] = (),
    context_bytes: int | None = None,
) -> GpusReport:
    """The :class:`GpusReport` of one process: its GPUs' rows and every finding the evidence supports.

    Example:
        >>> rows = [GpuRow("cuda:0", peak_allocated=0, watched=False),
        ...         GpuRow("cuda:1", peak_allocated=1 << 30, watched=True)]
        >>> [f.kind for f in gpus_report(rows, "cuda:1").findings]
        ['stray_context']
        >>> gpus_report(rows[1:], "cuda:1").findings
        ()
    """
    ev = evidence or {}
    ordered = sorted(rows, key=lambda r: (_index(r.device) is None, _index(r.device) or 0, r.device))
    context = context_bytes or CONTEXT_BYTES
    lines, child_findings = _children(children, context)
    findings = [
        *_stray(ordered, watched, ev),
        *_data_parallel(ordered, ev),
        *_state_dicts(ev),
        *child_findings,
    ]
    findings.sort(key=lambda f: -(f.bytes or 0))
    return GpusReport(watched, tuple(ordered), tuple(findings), tuple(lines))


__all__ = ["choose_device", "describe_child", "gpus_report"]
