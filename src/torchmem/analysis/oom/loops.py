"""Which variables of a loop still hold the previous iteration's values: read from the bytecode.

At an OOM raised at offset ``lasti`` of a frame running a loop, a variable that the loop's body assigns only
*after* ``lasti`` (``out = model(batch)``: the store follows the call that failed) still holds what the
previous iteration assigned: the previous batch's outputs, alive while the next batch is computed. A variable
assigned before ``lasti`` in the same iteration (the loop variable ``batch``) holds this iteration's value.

Pure: code objects and offsets in, names out. Cost: one pass over a code object's instructions, cached.
"""

from __future__ import annotations

import dis
import functools
import types

_STORES = frozenset({"STORE_FAST", "STORE_NAME", "STORE_GLOBAL", "STORE_DEREF"})
_JUMPS = frozenset(dis.hasjrel) | frozenset(dis.hasjabs)


@functools.lru_cache(maxsize=256)
def _shape(code: types.CodeType) -> tuple[tuple[tuple[int, int], ...], tuple[tuple[str, int], ...]]:
    """The loops of ``code`` as ``(first offset, last offset)`` (each backward jump and its target), and
    every store as ``(name, offset)``."""
    loops: list[tuple[int, int]] = []
    stores: list[tuple[str, int]] = []
    for ins in dis.get_instructions(code):
        # a jump back (JUMP_BACKWARD, a while loop's POP_JUMP_BACKWARD_IF_TRUE, 3.10's JUMP_ABSOLUTE)
        if ins.opcode in _JUMPS and isinstance(ins.argval, int) and ins.argval <= ins.offset:
            loops.append((ins.argval, ins.offset))
        elif ins.opname in _STORES and isinstance(ins.argval, str):
            stores.append((ins.argval, ins.offset))
    return tuple(loops), tuple(stores)


def stale_names(code: types.CodeType, lasti: int) -> tuple[tuple[str, ...], int | None]:
    """The names the innermost loop around offset ``lasti`` assigns only after it (so their values are the
    previous iteration's, or from before the loop), and the line of the first such assignment.

    ``((), None)`` when ``lasti`` is in no loop.

    Example:
        >>> def train(batches, model):
        ...     for batch in batches:
        ...         out = model(batch)
        ...         loss = out.sum()
        >>> call = next(i.offset for i in dis.get_instructions(train) if i.opname.startswith("CALL"))
        >>> stale_names(train.__code__, call)[0]
        ('out', 'loss')
    """
    loops, stores = _shape(code)
    around = [(a, b) for a, b in loops if a <= lasti <= b]
    if not around:
        return (), None
    first, last = min(around, key=lambda ab: ab[1] - ab[0])
    before: set[str] = set()
    after: dict[str, int] = {}
    for name, offset in stores:
        if not first <= offset <= last:
            continue
        if offset <= lasti:
            before.add(name)
        else:
            after.setdefault(name, offset)
    names = tuple(n for n in after if n not in before)
    if not names:
        return (), None
    line = None
    for start, ln in dis.findlinestarts(code):
        if ln is not None and start <= min(after[n] for n in names):
            line = ln
    return names, line


__all__ = ["stale_names"]
