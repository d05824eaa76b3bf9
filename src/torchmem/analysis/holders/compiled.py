"""Memory held by compiled graphs: torch.compile's CUDA-graph trees (``mode="reduce-overhead"``) and other
private memory pools (``torch.cuda.graph``).

A CUDA graph records its tensors in a *private pool* of the caching allocator; torch.compile keeps one tree of
recorded graphs per device (``torch._inductor.cudagraph_trees``), reachable only through a
``weakref.finalize`` entry — a holder path through it reads as
``weakref.finalize._registry[<finalize>].func.__self__.tree_manager.roots[<FunctionID>][0]...``, which names
nothing a person wrote. :func:`compiled_pools` finds the trees and the private-pool segments and describes
each pool once ("torch.compile (reduce-overhead) CUDA graphs of `forward` (model.py:12), 3 recorded graphs,
568.00 MiB in a private pool"), with its fix, so ``live_tensors()`` can name that as the holder of every
tensor in the pool or reached through the tree.

torch's CUDA-graph tree internals are private: every read here is guarded, and a torch whose internals differ
gives plain private-pool descriptions (from the allocator's segments, a public snapshot format).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import Any

from torchmem._format import fmt_bytes

TREE_TYPES = frozenset({"CUDAGraphTreeManager", "CUDAGraphNode", "TreeManagerContainer", "WrappedFunction"})
"""Type names (last dotted part) of torch.compile's CUDA-graph tree objects: a holder path through one of
them is the tree's, whatever the rest of the path says."""

COMPILE_FIX = (
    "torch.compiler.reset() frees the recorded graphs and their pool once the compiled function's outputs "
    "are no longer used (or clone() outputs you keep across calls)"
)
GRAPH_FIX = "delete the torch.cuda.CUDAGraph object (and the tensors it recorded) to free its pool"

_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


@dataclass(frozen=True)
class PrivatePool:
    """One private memory pool on a device: its segments' address ranges and bytes, and what owns it."""

    pool: tuple[int, int]
    ranges: tuple[tuple[int, int], ...]
    bytes: int
    label: str
    fix: str
    compiled: bool

    def holds(self, ptr: int) -> bool:
        return any(a <= ptr < b for a, b in self.ranges)


def _type_tail(name: str | None) -> str:
    return (name or "").rsplit(".", 1)[-1]


def through_tree(path: Any) -> bool:
    """Whether a holder path (a :class:`~torchmem.results.holders.HolderPath`) goes through a CUDA-graph
    tree object of torch.compile."""
    try:
        return any(_type_tail(s.holder_type) in TREE_TYPES for s in path.typed_steps)
    except Exception:
        return False


def _tree_managers(index: int) -> list[Any]:
    mod = sys.modules.get("torch._inductor.cudagraph_trees")
    if mod is None:
        return []
    out: list[Any] = []
    try:
        local = getattr(mod, "local", None)
        containers = getattr(local, "tree_manager_containers", None)
        if containers is None:
            import torch

            if torch._C._is_key_in_tls("tree_manager_containers"):
                containers = torch._C._get_obj_in_tls("tree_manager_containers")
        for dev, container in dict(containers or {}).items():
            manager = getattr(container, "tree_manager", None)
            if manager is not None and int(dev) == index:
                out.append(manager)
    except Exception:
        return out
    return out


def _count_nodes(manager: Any) -> int:
    n, todo = 0, [node for nodes in dict(manager.roots or {}).values() for node in nodes]
    seen: set[int] = set()
    while todo and n < 100_000:
        node = todo.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        n += 1
        for kids in dict(getattr(node, "children", {}) or {}).values():
            todo.extend(kids)
    return n


def _function_names(manager: Any) -> list[str]:
    """The compiled functions, as ``name (file.py:line)`` from the recorded stack traces."""
    names: list[str] = []
    traces = dict(getattr(manager, "ids_to_stack_traces", {}) or {})
    for fid in dict(getattr(manager, "ids_to_funcs", {}) or {}):
        text = None
        for trace in traces.get(fid) or ():
            m = _FRAME.search(trace or "")
            if m:
                file = m.group(1).replace("\\", "/").rsplit("/", 1)[-1]
                text = f"`{m.group(3)}` ({file}:{m.group(2)})"
                break
        if text is None:
            try:
                text = f"`{manager.get_func_name(fid)}`"
            except Exception:
                text = f"function #{getattr(fid, 'id', '?')}"
        if text not in names:
            names.append(text)
    return names


def compiled_pools(index: int) -> list[PrivatePool]:
    """The private pools of CUDA device ``index``, each described once (empty when there are none, CUDA is
    not in use, or this torch's snapshot has no pool ids)."""
    from torchmem.devices import _allocator

    try:
        segs = _allocator.private_pool_segments(index)
    except Exception:
        segs = None
    by_pool: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for pool, addr, size in segs or ():
        by_pool.setdefault(pool, []).append((addr, addr + size))
    out: list[PrivatePool] = []
    managers = _tree_managers(index)
    seen: set[tuple[int, int]] = set()
    for m in managers:
        try:
            raw = m.cuda_graphs_thread_pool
            pool = (int(raw[0]), int(raw[1]))
        except Exception:
            continue
        ranges = tuple(sorted(by_pool.get(pool, ())))
        size = sum(b - a for a, b in ranges)
        try:
            graphs = _count_nodes(m)
        except Exception:
            graphs = 0
        names = _function_names(m)
        what = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        label = (
            f"torch.compile (reduce-overhead) CUDA graphs of {what or 'a compiled function'}, "
            f"{graphs} recorded graph{'s' if graphs != 1 else ''}, {fmt_bytes(size)} in a private pool"
        )
        out.append(PrivatePool(pool, ranges, size, label, COMPILE_FIX, True))
        seen.add(pool)
    for pool, rs in sorted(by_pool.items()):
        if pool in seen:
            continue
        ranges = tuple(sorted(rs))
        size = sum(b - a for a, b in ranges)
        label = f"a CUDA graph's private pool {pool} (torch.cuda.graph), {fmt_bytes(size)}"
        out.append(PrivatePool(pool, ranges, size, label, GRAPH_FIX, False))
    return out


__all__ = ["COMPILE_FIX", "GRAPH_FIX", "TREE_TYPES", "PrivatePool", "compiled_pools", "through_tree"]
