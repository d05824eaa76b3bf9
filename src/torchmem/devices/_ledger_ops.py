"""What the ledger reads from an op: which arguments it writes (from its schema, once per op), which of its
outputs' storages are its inputs' (a view, an in-place or ``out=`` result is not a birth), and the tensors a
wrapper subclass (DTensor) holds. Pure functions over an op's arguments: no ledger state.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

import torch

# Ops that return their input as a *new* tensor: torch.tensor(data) builds the storage below the dispatcher
# and hands it through lift_fresh, so the output aliases the input and is still a fresh allocation.
FRESH = frozenset(
    op
    for op in (
        getattr(getattr(torch.ops.aten, "lift_fresh", None), "default", None),
        getattr(getattr(torch.ops.aten, "lift", None), "default", None),
    )
    if op is not None
)


def storage_key(t: torch.Tensor) -> tuple[int, Any] | None:
    try:
        s = t.untyped_storage()
    except (RuntimeError, NotImplementedError, TypeError):  # sparse, nested and other storage-less layouts
        return None
    return s._cdata, s


def tensors_in(args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> Iterator[torch.Tensor]:
    for a in args:
        if isinstance(a, torch.Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            for b in a:
                if isinstance(b, torch.Tensor):
                    yield b
    if kwargs:
        for a in kwargs.values():
            if isinstance(a, torch.Tensor):
                yield a
            elif isinstance(a, (list, tuple)):
                for b in a:
                    if isinstance(b, torch.Tensor):
                        yield b


def is_input_storage(key: int, out: torch.Tensor, args: tuple[Any, ...], kwargs: Any) -> bool:
    """Whether the storage ``key`` of an op's output is one of its input tensors' (read after the op: set_()
    and out= may have changed which storage an input has)."""
    tensor = torch.Tensor
    for a in args:
        if isinstance(a, tensor):
            if a is out:
                return True
            try:
                if a.untyped_storage()._cdata == key:
                    return True
            except (RuntimeError, NotImplementedError, TypeError):
                pass
        elif type(a) is list or type(a) is tuple:
            for b in a:
                if isinstance(b, tensor):
                    if b is out:
                        return True
                    try:
                        if b.untyped_storage()._cdata == key:
                            return True
                    except (RuntimeError, NotImplementedError, TypeError):
                        pass
    if kwargs:
        for b in tensors_in((), kwargs):
            if b is out:
                return True
            found = storage_key(b)
            if found is not None and found[0] == key:
                return True
    return False


# An op with more outputs than this checks them against one set of its inputs' storages (a _foreach_ op over
# N parameters would otherwise compare N outputs with N inputs each).
MANY_OUTPUTS = 4


def input_storage_keys(args: tuple[Any, ...], kwargs: Any) -> set[int]:
    """The storage keys of an op's input tensors (read after the op), for ops with many outputs
    (``_foreach_*`` over a model's parameters): one pass instead of one per output. A tensor subclass that
    wraps others (DTensor) gives its inner tensors' keys too."""
    keys = set()
    for a in tensors_in(args, kwargs):
        for b in with_inner(a):
            try:
                keys.add(b.untyped_storage()._cdata)
            except (RuntimeError, NotImplementedError, TypeError):
                pass
    return keys


def inner_tensors(t: torch.Tensor) -> list[torch.Tensor] | None:
    """The tensors a wrapper subclass holds (DTensor: its local shard), ``None`` for any other tensor. A
    wrapper's own storage holds no memory: it reports the full logical size (the unsharded size for a
    DTensor), so the memory is its inner tensors'."""
    if type(t) is torch.Tensor or type(t) is torch.nn.Parameter:
        return None
    flatten = getattr(t, "__tensor_flatten__", None)
    if flatten is None:
        return None
    try:
        names, _ = flatten()
        inner = [getattr(t, n) for n in names]
    except Exception:
        return None
    return [x for x in inner if isinstance(x, torch.Tensor)]


def with_inner(t: torch.Tensor) -> list[torch.Tensor]:
    inner = inner_tensors(t)
    if inner is None:
        return [t]
    out = [t]
    for x in inner:
        out.extend(with_inner(x))
    return out


class OpFacts(NamedTuple):
    func: Any
    written: tuple[tuple[int, str], ...]  # (position or -1 for keyword-only, name) of each written argument
    fresh: bool  # in FRESH


def op_facts(func: Any) -> OpFacts:
    """What the recording path needs to know about an op, read from its schema."""
    written: list[tuple[int, str]] = []
    schema = getattr(func, "_schema", None)
    try:
        for i, a in enumerate(getattr(schema, "arguments", ())):
            info = a.alias_info
            if info is not None and info.is_write:
                written.append((-1 if a.kwarg_only else i, a.name))
    except Exception:  # an op without a readable schema: treat every tensor argument as written
        written = [(-2, "")]
    return OpFacts(func, tuple(written), func in FRESH)


def written_sizes(
    facts: OpFacts, args: tuple[Any, ...], kwargs: dict[str, Any] | None
) -> dict[int, tuple[Any, int]] | None:
    """Before a mutating op: the storages of the arguments it writes, with their sizes; ``None`` for an op
    that writes none."""
    written = facts.written
    if not written:
        return None
    if len(written) == 1 and 0 <= written[0][0] < len(args):  # the common case: one written `self`
        a = args[written[0][0]]
        if isinstance(a, torch.Tensor):
            try:
                s = a.untyped_storage()
            except (RuntimeError, NotImplementedError, TypeError):
                return None
            return {s._cdata: (s, s.nbytes())}
    if written[0][0] == -2:
        picked: tuple[Any, ...] = tuple(tensors_in(args, kwargs))
    else:
        picked = tuple(args[i] if 0 <= i < len(args) else (kwargs or {}).get(name) for i, name in written)
    before: dict[int, tuple[Any, int]] = {}
    for a in tensors_in(picked, None):
        k = storage_key(a)
        if k is not None:
            before[k[0]] = (k[1], k[1].nbytes())
    return before


__all__ = [
    "FRESH",
    "MANY_OUTPUTS",
    "OpFacts",
    "inner_tensors",
    "input_storage_keys",
    "is_input_storage",
    "op_facts",
    "storage_key",
    "tensors_in",
    "with_inner",
    "written_sizes",
]
