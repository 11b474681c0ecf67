"""Checks a YAML value against a dataclass field's annotation, so a wrong type is named before anything starts."""

from __future__ import annotations

import enum
import types
import typing
from typing import Any


def matches(value: Any, annotation: Any) -> bool:
    """Whether ``value`` (as YAML produces it) fits ``annotation``; unknown annotations accept anything."""
    if annotation is Any or annotation is typing.Any:
        return True
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(matches(value, a) for a in args)
    if origin is typing.Literal:
        return value in args
    if annotation is type(None):
        return value is None
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return isinstance(value, annotation) or value in {m.value for m in annotation}
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is str:
        return isinstance(value, str)
    if origin in (list, tuple, typing.Sequence) or annotation in (list, tuple):
        return isinstance(value, (list, tuple)) and (not args or all(matches(v, args[0]) for v in value))
    if origin is dict or annotation is dict:
        return isinstance(value, dict)
    return True


def coerce(value: Any, annotation: Any) -> Any:
    """YAML 1.1 reads ``1e-5`` as a string; turn such strings into the number a numeric field expects.
    A single value where a list is expected becomes a list of it, as TRL's and transformers' argument
    parser reads ``--loss_type sigmoid`` (and TRL's configs accept ``loss_type: sigmoid``)."""
    if isinstance(value, str) and not matches(value, annotation):
        for kind in (int, float):
            if matches(kind(0), annotation):
                try:
                    return kind(value)
                except ValueError:
                    continue
    if value is not None and not isinstance(value, (list, tuple, dict)) and not matches(value, annotation):
        if matches([coerce(value, _item_type(annotation))], annotation):
            return [coerce(value, _item_type(annotation))]
    return value


def _item_type(annotation: Any) -> Any:
    """The element type of a list annotation (inside an optional one too), else ``Any``."""
    for candidate in (annotation, *typing.get_args(annotation)):
        if typing.get_origin(candidate) in (list, tuple, typing.Sequence) and typing.get_args(candidate):
            return typing.get_args(candidate)[0]
    return Any


def describe(annotation: Any) -> str:
    """A short human name for an annotation (``int``, ``float or null``, ``one of 'a', 'b'``)."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(describe(a) for a in args)
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return "one of " + ", ".join(repr(m.value) for m in annotation)
    if origin is not None:
        return getattr(origin, "__name__", str(origin)) + (f" of {describe(args[0])}" if args else "")
    return getattr(annotation, "__name__", str(annotation))
