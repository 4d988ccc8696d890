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
instance dictionary instead of ``model_dump(mode="json")`` first (the JSON text is identical: tuples become
arrays, str-valued enums their value, nested models their dump). Event logs may use it to hash events.
"""

from __future__ import annotations

import hashlib
import json
from enum import Enum
from typing import Any, TypeVar

from pydantic import BaseModel

__all__ = ["assemble", "canonical_text", "record_bytes", "record_digest", "register_record"]

M = TypeVar("M", bound=BaseModel)

_DEFAULTS: dict[type[BaseModel], dict[str, Any]] = {}
_set_attr = object.__setattr__


def register_record(cls: type[M]) -> type[M]:
    """Allow :func:`assemble` for ``cls`` after checking that plain construction is faithful for it."""
    if cls.__pydantic_post_init__ or cls.__private_attributes__ or cls.__pydantic_root_model__:
        raise TypeError(f"{cls.__name__} has post-init hooks, private attributes or is a root model")
    defaults: dict[str, Any] = {}
    for name, field in cls.__pydantic_fields__.items():
        if field.alias is not None or field.validation_alias is not None or field.serialization_alias:
            raise TypeError(f"{cls.__name__}.{name} has an alias")
        if field.default_factory is not None:
            raise TypeError(f"{cls.__name__}.{name} has a default factory")
        if not field.is_required():
            defaults[name] = field.default
    _DEFAULTS[cls] = defaults
    return cls


def assemble(cls: type[M], values: dict[str, Any]) -> M:
    """An instance of a registered record from complete, already-checked values (no validation).

    Fields missing from ``values`` take their static defaults; unknown keys are a programming error.
    """
    defaults = _DEFAULTS[cls]
    data = {**defaults, **values} if defaults else values
    instance = cls.__new__(cls)
    _set_attr(instance, "__dict__", data)
    _set_attr(instance, "__pydantic_fields_set__", set(data))
    _set_attr(instance, "__pydantic_extra__", None)
    _set_attr(instance, "__pydantic_private__", None)
    return instance


def _nested(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    raise TypeError(f"value of type {type(value).__name__} has no canonical JSON form")


_ENCODER = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=_nested
)
"""One encoder with the canonical settings of :mod:`specround.canonical`, built once."""


def canonical_text(value: Any) -> str:
    """Canonical JSON text of a JSON-able value (what ``canonical_bytes`` encodes), with a reused encoder."""
    return _ENCODER.encode(value)


def record_bytes(record: BaseModel) -> bytes:
    """Canonical JSON bytes of a registered record (equal to ``canonical_bytes(record)``)."""
    return _ENCODER.encode(record.__dict__).encode("utf-8")


def record_digest(record: BaseModel) -> str:
    """SHA-256 hex digest of :func:`record_bytes` (equal to ``canonical.digest(record)``)."""
    return hashlib.sha256(record_bytes(record)).hexdigest()
