"""Canonical JSON bytes and digests: the one way specround turns a value into a hash.

A leaf module (like :mod:`specround.errors`) that every layer may import; the event logs, replay and the
audit all encode through it, so writer and auditor share one implementation.

**Canonical form** (what :func:`canonical_bytes` writes, via ``orjson`` with ``OPT_SORT_KEYS``):

* UTF-8 JSON, no whitespace, object keys sorted by code point, non-ASCII characters written as UTF-8 (not
  escaped); object keys must be strings.
* Tuples, lists and other sequences (not strings or bytes) are arrays; sets are sorted arrays; enums are
  their value; pydantic models are ``model_dump(mode="json")``; ``None`` is ``null``; booleans
  ``true``/``false``.
* Integers in decimal; only integers in ``[-2**63, 2**64)`` have a canonical form (seeds, counters and
  token ids all fit).
* Floats in the shortest decimal that reads back to the same double (``0.1``, ``1e-7``, ``1e+16``,
  ``-0.0``; always with a fraction or an exponent), so a logged probability re-reads bit for bit with any
  correct JSON parser (:func:`load` uses orjson). NaN and infinities have no canonical form: they are
  refused with :class:`ValueError`.

Anything else (dataclasses, datetimes, arbitrary objects) is refused with :class:`TypeError`.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from enum import Enum
from typing import Any

import orjson
from pydantic import BaseModel

__all__ = [
    "GENESIS_HASH",
    "canonical_bytes",
    "chain_hash",
    "digest",
    "dumps_trusted",
    "first_non_finite",
    "load",
]

GENESIS_HASH = "0" * 64
"""The "previous hash" of the first event of every request's chain."""

_OPTIONS = orjson.OPT_SORT_KEYS | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME
"""Sorted keys; dataclasses and datetimes go to :func:`_default` (which refuses them) instead of being
serialised by orjson's own rules."""

_dumps = orjson.dumps
_sha256 = hashlib.sha256
_isfinite = math.isfinite


def _default(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes, bytearray)):
        return list(value)  # e.g. a request's token sequence (specround.statemachine.tokens.Tokens)
    raise TypeError(f"value of type {type(value).__name__} has no canonical JSON form")


def first_non_finite(value: Any) -> float | None:
    """The first NaN or infinity inside ``value`` (dicts, sequences, sets, pydantic models), or None."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float):
            if not _isfinite(item):
                return item
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            stack.extend(item)
        elif isinstance(item, BaseModel):
            stack.extend(item.__dict__.values())
    return None


def dumps_trusted(value: Any) -> bytes:
    """Canonical bytes of a value already known to hold only finite floats (no NaN check).

    For hot paths whose floats were checked where they entered (see
    :func:`specround.statemachine.records.record_bytes`); everything else uses :func:`canonical_bytes`.
    """
    return _dumps(value, default=_default, option=_OPTIONS)


def canonical_bytes(value: Any) -> bytes:
    """Serialise ``value`` to canonical JSON bytes (see the module docstring); refuses NaN and infinities."""
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    data = _dumps(value, default=_default, option=_OPTIONS)
    # orjson writes NaN and infinities as null: a value whose bytes hold no null cannot contain one.
    if b"null" in data:
        bad = first_non_finite(value)
        if bad is not None:
            raise ValueError(f"Out of range float values are not JSON compliant: {bad!r}")
    return data


def load(data: bytes | str) -> Any:
    """Parse JSON text (canonical or not) into plain Python values (dicts, lists, str, int, float, ...)."""
    return orjson.loads(data)


def digest(value: Any) -> str:
    """SHA-256 hex digest of the canonical bytes of ``value``."""
    return _sha256(canonical_bytes(value)).hexdigest()


def chain_hash(previous_hash: str, event_bytes: bytes) -> str:
    """Next link of a per-request hash chain: ``sha256(previous_hash_hex || event_bytes)``."""
    return _sha256(previous_hash.encode("ascii") + event_bytes).hexdigest()
