"""Who holds a tensor storage: every Python tensor on it (one heap scan) plus autograd's saved tensors.

A storage has no holder paths of its own: the tensors on it do. :func:`holder_paths_of_storages` finds up
to 8 live tensors per storage (one pass over ``gc.get_objects()``), adds a probe tensor on the same storage
(so that tensors autograd saved, which only a data-pointer match finds, are named too) and runs one holder
search for all of them; the paths of a storage's tensors are merged, deduplicated by their text, and carry
what the autograd graph of those tensors still keeps (:attr:`HolderPath.graph`). Used to name
what survives ``release()``/``scope()``, a leak's holders in ``watch()``, and what a failing ``limit()``
block keeps. Cost: one heap scan plus one search (bounded by ``time_limit``).
"""

from __future__ import annotations

import gc
from dataclasses import replace
from typing import Any

import torch

from torchmem.analysis.holders.autograd import graph_state
from torchmem.analysis.holders.find import find_holders
from torchmem.results.holders import HolderPath


def _aliases(storages: list[Any], limit: int = 8) -> list[list[torch.Tensor]]:
    """Up to ``limit`` live tensors on each storage, in order."""
    wanted = {s._cdata: i for i, s in enumerate(storages)}
    found: list[list[torch.Tensor]] = [[] for _ in storages]
    tensor_type = torch.Tensor
    for o in gc.get_objects():
        # type() rather than isinstance(): some objects warn or raise when __class__ is read.
        if issubclass(type(o), tensor_type):
            try:
                i = wanted.get(o.untyped_storage()._cdata)
            except (RuntimeError, NotImplementedError):
                continue
            if i is not None and len(found[i]) < limit:
                found[i].append(o)
    return found


def holder_paths_of_storages(
    storages: list[Any], max_paths: int = 4, time_limit: float = 2.0, info: dict[str, Any] | None = None
) -> list[tuple[HolderPath, ...]]:
    """The holder paths of each storage, in order (empty where nothing nameable holds it).

    ``info``, when given, receives ``truncated``/``reason``/``seconds``/``visited`` of the search.
    """
    if not storages:
        return []
    groups = _aliases(storages)
    # A probe tensor on the same storage lets the search match tensors that autograd saved.
    for s, g in zip(storages, groups):
        g.append(torch.empty(0, dtype=torch.uint8, device=s.device).set_(s))
    flat = [t for g in groups for t in g]
    search = find_holders(flat, max_paths=max_paths, time_limit=time_limit, exclude=[storages, groups, flat])
    if info is not None:
        info.update(
            truncated=search.truncated, reason=search.reason, seconds=search.seconds, visited=search.visited
        )
    out: list[tuple[HolderPath, ...]] = []
    i = 0
    for g in groups:
        merged: dict[str, HolderPath] = {}
        for paths in search.paths[i : i + len(g)]:
            for p in paths:
                merged.setdefault(str(p), p)
        i += len(g)
        found = tuple(merged.values())[:max_paths]
        # What the storage's tensors drag along: a kept output whose graph still holds its activations.
        state = graph_state(g[:-1]) if found else ""
        out.append(tuple(replace(p, graph=state) for p in found) if state else found)
    flat.clear()
    groups.clear()
    return out


def holders_of_storages(
    storages: list[Any], max_paths: int = 4, time_limit: float = 2.0, info: dict[str, Any] | None = None
) -> list[tuple[str, ...]]:
    """Readable holder paths for each storage, in order (empty where nothing nameable holds it).

    ``info``, when given, receives ``truncated``/``reason``/``seconds``/``visited`` of the search.
    """
    paths = holder_paths_of_storages(storages, max_paths=max_paths, time_limit=time_limit, info=info)
    return [tuple(str(p) for p in ps) for ps in paths]
