"""Fast construction and canonical bytes of the frozen records the controller builds on its hot path.

The controller builds a handful of frozen pydantic records per round (RNG counters, the successor state,
the commit record, five events) from values it computed and checked itself. Validating them again would
only re-check the controller's own work, and ``BaseModel.model_construct`` is slower than validation in
pydantic 2 (it resolves aliases and defaults in Python). :func:`assemble` sets the instance dictionary
directly, exactly as ``model_construct`` does when every field is given. It is only allowed for the record
classes registered here, which have no aliases, validators that transform values, private attributes or
post-init hooks (checked at registration; the records' tests compare ``assemble`` with validated
construction for every class).

:func:`record_bytes` is :func:`specround.canonical.canonical_bytes` for those records, serialising the
instance dictionary instead of ``model_dump(mode="json")`` first (the bytes are identical: tuples become
arrays, str-valued enums their value, nested models their dump). Event logs use it to hash events. Its NaN
check looks only at the fields whose annotation can hold a float (found once, at registration), which is
what makes it cheaper than the generic check.
"""

from __future__ import annotations

import hashlib
import math
import types
import typing
from typing import Any, TypeVar

from pydantic import BaseModel

from specround.canonical import canonical_bytes, dumps_trusted, first_non_finite
from specround.statemachine.tokens import Tokens

__all__ = [
    "assemble",
    "canonical_text",
    "record_bytes",
    "record_digest",
    "record_digest_of",
    "register_record",
]

M = TypeVar("M", bound=BaseModel)

_DEFAULTS: dict[type[BaseModel], dict[str, Any]] = {}
_FIELD_COUNT: dict[type[BaseModel], int] = {}
_ALL_FIELDS: dict[type[BaseModel], set[str]] = {}
"""Per registered record: the set of its field names, shared as the fields set of every assembled
instance (each has every field; a set never mutated in place: pydantic's copies take their own)."""
_FLOAT_FIELDS: dict[type[BaseModel], tuple[tuple[str, int], ...]] = {}
"""Per registered record: the fields whose values may hold a float, with how (checked by record_bytes)."""
_set_attr = object.__setattr__
_new = object.__new__
# BaseModel's slots, set through their descriptors (what model_construct does, minus the attribute lookup).
_set_fields_set = BaseModel.__dict__["__pydantic_fields_set__"].__set__
_set_extra = BaseModel.__dict__["__pydantic_extra__"].__set__
_set_private = BaseModel.__dict__["__pydantic_private__"].__set__
_isfinite = math.isfinite


def register_record(cls: type[M]) -> type[M]:
    """Allow :func:`assemble` for ``cls`` after checking that plain construction is faithful for it."""
    if cls.__pydantic_post_init__ or cls.__private_attributes__ or cls.__pydantic_root_model__:
        raise TypeError(f"{cls.__name__} has post-init hooks, private attributes or is a root model")
    if cls.__new__ is not object.__new__:
        raise TypeError(f"{cls.__name__} defines __new__")
    defaults: dict[str, Any] = {}
    for name, field in cls.__pydantic_fields__.items():
        if field.alias is not None or field.validation_alias is not None or field.serialization_alias:
            raise TypeError(f"{cls.__name__}.{name} has an alias")
        if field.default_factory is not None:
            raise TypeError(f"{cls.__name__}.{name} has a default factory")
        if not field.is_required():
            defaults[name] = field.default
    _DEFAULTS[cls] = defaults
    _FIELD_COUNT[cls] = len(cls.__pydantic_fields__)
    _ALL_FIELDS[cls] = set(cls.__pydantic_fields__)
    kinds = ((name, _float_kind(field.annotation)) for name, field in cls.__pydantic_fields__.items())
    _FLOAT_FIELDS[cls] = tuple((name, kind) for name, kind in kinds if kind != _NO_FLOAT)
    return cls


_NO_FLOAT, _SCALAR, _SEQUENCE, _NESTED = 0, 1, 2, 3
"""How a field can hold a float: not at all, as a scalar (``float | None``), as a flat sequence of numbers
(``tuple[float, ...]``), or anywhere inside (nested models, dicts, ``Any``)."""


def _float_kind(annotation: Any) -> int:
    """Classify a field annotation (see :data:`_SCALAR` and its siblings)."""
    if annotation is float:
        return _SCALAR
    if annotation is Tokens:  # token ids: ints only
        return _NO_FLOAT
    if annotation is Any or annotation is typing.Any:
        return _NESTED
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return _NESTED
    origin = typing.get_origin(annotation)
    args = [arg for arg in typing.get_args(annotation) if arg is not Ellipsis]
    if origin is typing.Union or origin is types.UnionType:
        return max(_float_kind(arg) for arg in args)
    if origin is tuple:
        inner = max((_float_kind(arg) for arg in args), default=_NO_FLOAT)
        return _SEQUENCE if inner == _SCALAR else inner
    if origin is dict:
        return _NESTED if max((_float_kind(arg) for arg in args), default=_NO_FLOAT) else _NO_FLOAT
    if origin is typing.Literal or annotation in (int, str, bool, type(None)):
        return _NO_FLOAT
    # Enums and other int/str types hold no float; anything unrecognised is checked fully.
    return _NO_FLOAT if isinstance(annotation, type) and issubclass(annotation, (int, str)) else _NESTED


def assemble(cls: type[M], values: dict[str, Any]) -> M:
    """An instance of a registered record from complete, already-checked values (no validation).

    Fields missing from ``values`` take their static defaults; unknown keys are a programming error.
    ``values`` becomes the instance's dictionary when no default is missing (do not reuse it).
    """
    defaults = _DEFAULTS[cls]
    data = {**defaults, **values} if defaults and len(values) < _FIELD_COUNT[cls] else values
    instance = _new(cls)
    _set_attr(instance, "__dict__", data)
    # Every field is set, so the fields set is the class's own (one object for all instances).
    _set_fields_set(instance, _ALL_FIELDS[cls] if len(data) == _FIELD_COUNT[cls] else set(data))
    _set_extra(instance, None)
    _set_private(instance, None)
    return instance


def canonical_text(value: Any) -> str:
    """Canonical JSON text of a JSON-able value (``canonical_bytes(value)`` decoded)."""
    return canonical_bytes(value).decode("utf-8")


def _check_floats(cls: type[BaseModel], data: dict[str, Any]) -> None:
    """Refuse NaN and infinities in the float-bearing fields of a record's values (ValueError)."""
    for name, kind in _FLOAT_FIELDS[cls]:
        value = data[name]
        if value is None:
            continue
        if kind == _SCALAR:
            finite = value - value == 0  # NaN - NaN and inf - inf are NaN
        elif kind == _SEQUENCE:
            finite = all(map(_isfinite, value))
        else:
            finite = first_non_finite(value) is None
        if not finite:
            raise ValueError(f"Out of range float values are not JSON compliant: {cls.__name__}.{name}")


def record_bytes(record: BaseModel) -> bytes:
    """Canonical JSON bytes of a registered record (equal to ``canonical_bytes(record)``).

    Refuses NaN and infinities (:class:`ValueError`) in the fields that can hold floats.
    """
    data = record.__dict__
    _check_floats(type(record), data)
    return dumps_trusted(data)


def record_digest_of(cls: type[BaseModel], values: dict[str, Any]) -> str:
    """``record_digest(assemble(cls, values))`` without building the record (every field given)."""
    _check_floats(cls, values)
    return hashlib.sha256(dumps_trusted(values)).hexdigest()


def record_digest(record: BaseModel) -> str:
    """SHA-256 hex digest of :func:`record_bytes` (equal to ``canonical.digest(record)``)."""
    return hashlib.sha256(record_bytes(record)).hexdigest()
