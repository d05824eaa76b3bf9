"""Sets of storages the module profiler counts (:mod:`~torchmem.capture.profile`): bytes of storages still
alive (:class:`Alive`, each storage once, by weak reference) and of storages autograd still holds as saved
tensors (:class:`Saved`), the activations of each module made of the latter (:class:`Activations`), and the
tensors and storages found in a hook's arguments.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import Any

import torch

from torchmem.analysis.profile import RawModule


def storage_of(t: torch.Tensor) -> Any | None:
    try:
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError, TypeError):
        return None


def tensors_in(obj: Any, depth: int = 0) -> Iterator[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        yield obj
    elif depth > 3:
        return
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from tensors_in(v, depth + 1)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from tensors_in(v, depth + 1)


class Alive:
    """Bytes of a set of storages that are still alive (each storage once; weak references)."""

    __slots__ = ("__weakref__", "bytes", "refs")

    def __init__(self) -> None:
        self.bytes = 0
        self.refs: dict[int, tuple[int, weakref.ref[Any]]] = {}

    def add(self, storage: Any) -> tuple[int, weakref.ref[Any]]:
        key = storage._cdata
        old = self.refs.get(key)
        if old is not None and old[1]() is not None:
            return old
        nb = int(storage.nbytes())
        me = weakref.ref(self)

        def gone(r: weakref.ref[Any], key: int = key, nb: int = nb) -> None:
            owner = me()
            if owner is not None and owner.refs.get(key, (0, None))[1] is r:
                del owner.refs[key]
                owner.bytes -= nb

        entry = (nb, weakref.ref(storage, gone))
        self.refs[key] = entry
        self.bytes += nb
        return entry

    def __contains__(self, key: int) -> bool:
        e = self.refs.get(key)
        return e is not None and e[1]() is not None

    def clear(self) -> None:
        self.refs.clear()
        self.bytes = 0


class Saved:
    """Bytes of storages autograd still holds as saved tensors (each storage once).

    A storage counts while at least one packed tensor (what the pack hook handed to autograd) is alive: when
    the graph is freed the packed tensors die, even if the user still holds the storage (an input).
    """

    __slots__ = ("__weakref__", "bytes", "keys", "refs")

    def __init__(self) -> None:
        self.bytes = 0
        self.keys: dict[int, list[int]] = {}  # storage key -> [nbytes, live packed tensors]
        self.refs: set[weakref.ref[Any]] = set()

    def add(self, storage: Any, packed: torch.Tensor) -> int:
        key = storage._cdata
        e = self.keys.get(key)
        if e is None:
            e = self.keys[key] = [int(storage.nbytes()), 0]
            self.bytes += e[0]
        e[1] += 1
        me = weakref.ref(self)

        def gone(r: weakref.ref[Any], key: int = key) -> None:
            owner = me()
            if owner is None or r not in owner.refs:
                return
            owner.refs.discard(r)
            ent = owner.keys.get(key)
            if ent is not None:
                ent[1] -= 1
                if ent[1] <= 0:
                    del owner.keys[key]
                    owner.bytes -= ent[0]

        self.refs.add(weakref.ref(packed, gone))
        return e[0]

    def held(self, key: int) -> bool:
        return key in self.keys

    def clear(self) -> None:
        self.refs.clear()
        self.keys.clear()
        self.bytes = 0


class Activations:
    """The storages autograd saves, attributed to the module whose forward saved them.

    A tensor saved while a forward runs belongs to the innermost module running (the profiler keeps that
    module's saved storages with its forward call). At that forward's end the storages still saved are its
    activations (each storage once), and they count for every enclosing module too; at the end of the
    outermost forward (a pass), each module's activations are the most any pass kept. A tensor saved outside
    any forward (the loss, usually) counts for the block only: ``outside_peak`` is the most such tensors held.
    """

    def __init__(self, rows: list[RawModule]) -> None:
        self.saved = Saved()
        self._rows = rows
        self._pass: dict[int, dict[int, int]] = {}  # row -> storage key -> bytes, in the pass under way
        self._outside: dict[int, int] = {}  # storage key -> bytes, saved outside any forward
        self.outside_peak = 0

    @property
    def bytes(self) -> int:
        """Bytes of the storages autograd holds as saved tensors now."""
        return self.saved.bytes

    def add(self, storage: Any, packed: torch.Tensor) -> int:
        """A tensor autograd saves (``packed``: what it keeps) of ``storage``: the storage's bytes."""
        return self.saved.add(storage, packed)

    def add_outside(self, key: int, nbytes: int) -> None:
        """A storage saved outside any forward: freed early in backward, so its high mark is taken now."""
        self._outside[key] = nbytes
        held = self.saved.held
        b = sum(n for k, n in self._outside.items() if held(k))
        self.outside_peak = max(self.outside_peak, b)

    def forward_ended(self, row: int, saved: dict[int, int]) -> dict[int, int]:
        """The forward of row ``row`` ended, having saved ``saved`` (storage key -> bytes): those still
        saved, its activations in this pass (for the enclosing module's forward too)."""
        held = self.saved.held
        alive = {k: v for k, v in saved.items() if held(k)}
        self._pass.setdefault(row, {}).update(alive)
        return alive

    def end_pass(self) -> None:
        """The outermost forward ended: each module's activations are the most a pass kept."""
        for row, saved in self._pass.items():
            r = self._rows[row]
            if r.activations is None:
                continue
            b = sum(saved.values())
            r.activations = max(r.activations, b)
        self._pass.clear()

    def flush_outside(self) -> None:
        """A new pass or backward begins: the high mark of what was saved outside any forward is taken."""
        if self._outside:
            b = sum(nb for k, nb in self._outside.items() if self.saved.held(k))
            self.outside_peak = max(self.outside_peak, b)
            self._outside.clear()

    def clear(self) -> None:
        self.saved.clear()


__all__ = ["Activations", "Alive", "Saved", "storage_of", "tensors_in"]
