"""Memory pinned by old exceptions and notebook output: the tensors that the finished frames of an exception
(``sys.last_exc``, the OOM being handled when another was raised) and IPython's output history hold on a
device.

:func:`pinned_tensors` is the public reader; the event capture (:mod:`torchmem.capture.oom_events`) and
:func:`torchmem.capture.oom.explain_oom` use the collector (:class:`_Pins`) and the frame walks beside it.
Re-exported by :mod:`torchmem.capture.oom`.
"""

from __future__ import annotations

import inspect
import os
import sys
import types
from collections.abc import Iterable
from typing import Any

import torch

from torchmem._exceptions import exception_chain
from torchmem.devices._storage import storage_id
from torchmem.results.oom import PinnedTensor


def _tensors_in(obj: Any, depth: int = 2) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if depth <= 0:
        return []
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [t for x in list(obj)[:1000] for t in _tensors_in(x, depth - 1)]
    if isinstance(obj, dict):
        return [t for x in list(obj.values())[:1000] for t in _tensors_in(x, depth - 1)]
    return []


def _storage_key(t: torch.Tensor) -> int | None:
    try:
        return storage_id(t)
    except Exception:
        return None


def _nbytes(t: torch.Tensor) -> int:
    try:
        return int(t.untyped_storage().nbytes())
    except Exception:
        return 0


def _function_locals(frame: types.FrameType) -> list[tuple[str, Any]]:
    """The locals of a finished *function* frame (module and class frames: ``[]``, their names are the
    program's namespace). Before Python 3.13 reading ``f_locals`` leaves a snapshot dict on the frame that
    ``frame.clear()`` does not empty, so a program that clears the frames itself (``traceback.clear_frames``)
    would still keep the tensors: the snapshot is emptied again after reading (for a function frame it is a
    copy; the frame's own variables are untouched)."""
    if not frame.f_code.co_flags & inspect.CO_OPTIMIZED:
        return []
    try:
        loc = frame.f_locals
        items = list(loc.items())
    except Exception:
        return []
    if sys.version_info < (3, 13) and type(loc) is dict:
        loc.clear()
    return items


class _Pins:
    """Collects :class:`PinnedTensor` s: storages on ``device`` (every non-CPU device when ``None``), each
    counted once, parameters skipped (a model holds them anyway)."""

    def __init__(self, device: torch.device | None) -> None:
        self.device = device
        self.seen: set[int] = set()
        self.out: list[PinnedTensor] = []

    def wanted(self, t: torch.Tensor) -> bool:
        if isinstance(t, torch.nn.Parameter):
            return False
        if self.device is None:
            return t.device.type not in ("cpu", "meta")
        return t.device == self.device or (t.device.type == self.device.type and self.device.index is None)

    def add(self, where: str, objs: list[torch.Tensor]) -> None:
        total = 0
        for t in objs:
            if not self.wanted(t):
                continue
            key = _storage_key(t)
            if key is None or key in self.seen:
                continue
            self.seen.add(key)
            total += _nbytes(t)
        if total:
            self.out.append(PinnedTensor(where, total))

    def frames(
        self, label: str, tbs: Iterable[types.TracebackType], skip: set[int], limit: int = 256
    ) -> None:
        """The tensors held by the finished function frames of ``tbs`` (not those whose id is in ``skip``)."""
        n = 0
        for first in tbs:
            tb: types.TracebackType | None = first
            while tb is not None and n < limit:
                frame, line = tb.tb_frame, tb.tb_lineno
                tb = tb.tb_next
                if id(frame) in skip:
                    continue
                skip.add(id(frame))
                n += 1
                code = frame.f_code
                for name, value in _function_locals(frame):
                    self.add(
                        f"{label} -> frame {os.path.basename(code.co_filename)}:{line} {code.co_name}() "
                        f"local {name!r}",
                        _tensors_in(value),
                    )
            del first


def _old_exceptions(pins: _Pins, exclude: BaseException | None) -> None:
    # the whole chain, causes and contexts: every part of it is the OOM being explained
    excluded = {id(e) for e in exception_chain(exclude)}
    last = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    tbs: list[types.TracebackType] = []
    if last is not None:
        # the old exception and its cause/context chain: a wrapped OOM's frames are in its __cause__
        tbs.extend(
            e.__traceback__
            for e in exception_chain(last)
            if id(e) not in excluded and e.__traceback__ is not None
        )
    else:
        last_tb = getattr(sys, "last_traceback", None)
        if last_tb is not None:
            tbs.append(last_tb)
    pins.frames("sys.last_traceback", tbs, set())
    tbs.clear()
    ip = sys.modules.get("IPython")
    get = getattr(ip, "get_ipython", None) if ip is not None else None
    shell = get() if get is not None else None
    ns = getattr(shell, "user_ns", None)
    if isinstance(ns, dict):
        outs = ns.get("Out")
        if isinstance(outs, dict):
            for k, v in list(outs.items()):
                pins.add(f"IPython Out[{k}]", _tensors_in(v))
        for name in ("_", "__", "___"):
            if name in ns:
                pins.add(f"IPython {name}", _tensors_in(ns[name]))


def pinned_tensors(
    device: torch.device | None = None, *, exclude: BaseException | None = None
) -> list[PinnedTensor]:
    """Device memory held by a finished exception (``sys.last_exc`` / ``last_traceback``) and by IPython's
    output history (``Out``, ``_``): storages on ``device`` (every non-CPU device when ``None``), one entry
    per holder, each storage counted once. Parameters are skipped (a model holds them anyway); an old
    exception in ``exclude``'s cause/context chain (the OOM being explained, or the exception that wraps
    it) is skipped: its frames are the working set, not an old leftover. Only function frames count (a
    module's frame holds the program's own namespace).
    """
    pins = _Pins(device)
    _old_exceptions(pins, exclude)
    return pins.out


def _type_name(exc: BaseException) -> str:
    t = type(exc)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _tracebacks(exc: BaseException | None, limit: int = 16) -> list[types.TracebackType]:
    out: list[types.TracebackType] = []
    for i, e in enumerate(exception_chain(exc)):
        if i >= limit:
            break
        if e.__traceback__ is not None:
            out.append(e.__traceback__)
    return out


def _frame_ids(tbs: Iterable[types.TracebackType]) -> set[int]:
    ids: set[int] = set()
    for first in tbs:
        tb: types.TracebackType | None = first
        while tb is not None:
            ids.add(id(tb.tb_frame))
            tb = tb.tb_next
    return ids


def _stack_ids() -> set[int]:
    ids: set[int] = set()
    f: types.FrameType | None = sys._getframe(1)
    while f is not None:
        ids.add(id(f))
        f = f.f_back
    return ids


def _handled_pins(pins: _Pins, handled: BaseException, running: set[int]) -> None:
    """What the frames of ``handled`` (the OOM being handled when a new one was raised) hold, except the
    frames in ``running`` (still executing then: their locals are the program's, not the failed attempt's)."""
    pins.frames(f"the handled {_type_name(handled)}'s traceback", _tracebacks(handled), set(running))


# ---------------------------------------------------------------------------------------------------------
# OOM events: every OOM at the moment it is raised, caught or not


__all__ = ["pinned_tensors"]
