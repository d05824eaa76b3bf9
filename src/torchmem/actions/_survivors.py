"""Who holds a tensor storage: every Python tensor on it (one heap scan) plus autograd's saved tensors."""

from __future__ import annotations

import gc
from typing import Any

import torch


def _aliases(storages: list[Any], limit: int = 8) -> list[list[torch.Tensor]]:
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


def holders_of_storages(
    storages: list[Any], max_paths: int = 4, time_limit: float = 2.0, info: dict[str, Any] | None = None
) -> list[tuple[str, ...]]:
    """Readable holder paths for each storage, in order (empty where nothing nameable holds it).

    ``info``, when given, receives ``truncated``/``reason``/``seconds``/``visited`` of the search.
    """
    if not storages:
        return []
    from torchmem.analysis.holders import find_holders

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
    out: list[tuple[str, ...]] = []
    i = 0
    for g in groups:
        merged: list[str] = []
        for paths in search.paths[i : i + len(g)]:
            merged.extend(str(p) for p in paths if str(p) not in merged)
        i += len(g)
        out.append(tuple(merged[:max_paths]))
    flat.clear()
    groups.clear()
    return out
