"""``from_dict()`` for frozen dataclasses, driven by their annotations: the inverse of ``to_dict()``.

A stored dict may come from an older or newer torchmem: unknown keys are ignored, a missing key takes the
field's default (or ``None`` where the type allows it), and a value of the wrong shape raises
:class:`ResultFormatError` naming the type and the field, never a bare ``KeyError`` from deep inside.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar, Union

from torchmem._errors import TorchmemError

T = TypeVar("T")

_HINTS: dict[type, dict[str, Any]] = {}


class ResultFormatError(TorchmemError, ValueError):
    """A stored result does not have the shape of the type it is read as (a damaged or foreign record)."""


def _hints(cls: type) -> dict[str, Any]:
    h = _HINTS.get(cls)
    if h is None:
        h = typing.get_type_hints(cls)
        _HINTS[cls] = h
    return h


def _convert(tp: Any, v: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return v
    if origin in (Union, types.UnionType):
        if v is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _convert(a, v, where)
            except (ResultFormatError, TypeError, ValueError) as e:
                errors.append(str(e))
        raise ResultFormatError(f"{where}: {v!r} fits none of {tp}")
    if v is None:
        raise ResultFormatError(f"{where}: missing (None)")
    if origin is tuple:
        if not isinstance(v, (list, tuple)):
            raise ResultFormatError(f"{where}: expected a list, got {type(v).__name__}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(args[0], x, f"{where}[{i}]") for i, x in enumerate(v))
        if args and len(args) != len(v):
            raise ResultFormatError(f"{where}: expected {len(args)} items, got {len(v)}")
        return tuple(_convert(a, x, f"{where}[{i}]") for i, (a, x) in enumerate(zip(args, v)))
    if origin in (dict, Mapping) or tp in (dict, Mapping):
        if not isinstance(v, Mapping):
            raise ResultFormatError(f"{where}: expected an object, got {type(v).__name__}")
        if len(args) == 2:
            return {
                _convert(args[0], k, where): _convert(args[1], x, f"{where}[{k!r}]") for k, x in v.items()
            }
        return dict(v)
    if origin is list or tp is list:
        if not isinstance(v, (list, tuple)):
            raise ResultFormatError(f"{where}: expected a list, got {type(v).__name__}")
        return [_convert(args[0], x, where) if args else x for x in v]
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(v, Mapping):
            raise ResultFormatError(f"{where}: expected an object for {tp.__name__}, got {type(v).__name__}")
        fd = getattr(tp, "from_dict", None)
        return fd(v) if fd is not None else from_mapping(tp, v)
    if tp is bool:
        if isinstance(v, bool):
            return v
        raise ResultFormatError(f"{where}: expected true/false, got {v!r}")
    if tp is int:
        if (
            isinstance(v, bool)
            or not isinstance(v, (int, float))
            or (isinstance(v, float) and not v.is_integer())
        ):
            raise ResultFormatError(f"{where}: expected an integer, got {v!r}")
        return int(v)
    if tp is float:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ResultFormatError(f"{where}: expected a number, got {v!r}")
        return float(v)
    if tp is str:
        if not isinstance(v, str):
            raise ResultFormatError(f"{where}: expected text, got {v!r}")
        return v
    if origin is typing.Literal:
        if v in args:
            return v
        raise ResultFormatError(f"{where}: {v!r} is not one of {args}")
    if isinstance(tp, type):
        if isinstance(v, tp):
            return v
        try:
            return tp(v)
        except Exception as e:
            raise ResultFormatError(f"{where}: cannot read {v!r} as {tp.__name__}") from e
    return v


def from_mapping(cls: type[T], d: Mapping[str, Any], **overrides: Any) -> T:
    """An instance of the dataclass ``cls`` from ``d`` (as its ``to_dict()`` wrote it).

    ``overrides`` give fields that need more than their annotation says (computed or renamed keys).

    Raises:
        ResultFormatError: ``d`` is not a mapping, or a field has the wrong shape.
    """
    if not isinstance(d, Mapping):
        raise ResultFormatError(f"a stored {cls.__name__} must be an object, got {type(d).__name__}")
    hints = _hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if not f.init:
            continue
        if f.name in overrides:
            kwargs[f.name] = overrides[f.name]
            continue
        tp = hints.get(f.name, Any)
        if f.name in d:
            kwargs[f.name] = _convert(tp, d[f.name], f"{cls.__name__}.{f.name}")
        elif f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
            continue
        elif type(None) in typing.get_args(tp):
            kwargs[f.name] = None
        else:
            raise ResultFormatError(f"a stored {cls.__name__} has no {f.name!r}")
    return cls(**kwargs)


__all__ = ["ResultFormatError", "from_mapping"]
