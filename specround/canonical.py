"""Canonical JSON bytes and digests: the one way specround turns a value into a hash.

A leaf module (like :mod:`specround.errors`) that every layer may import. Canonical form: UTF-8 JSON with
sorted keys, no whitespace, no NaN/Infinity, tuples as arrays, enums by value, pydantic models through
``model_dump(mode="json")``. Python's float ``repr`` round-trips exactly, so logged probabilities re-read
bit for bit.
"""

from __future__ import annotations

import hashlib
import json
from enum import Enum
from typing import Any

from pydantic import BaseModel

__all__ = ["GENESIS_HASH", "canonical_bytes", "chain_hash", "digest"]

GENESIS_HASH = "0" * 64
"""The "previous hash" of the first event of every request's chain."""


def _default(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    raise TypeError(f"value of type {type(value).__name__} has no canonical JSON form")


def canonical_bytes(value: Any) -> bytes:
    """Serialise ``value`` to canonical JSON bytes (sorted keys, compact, finite floats only)."""
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    text = json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=_default
    )
    return text.encode("utf-8")


def digest(value: Any) -> str:
    """SHA-256 hex digest of the canonical bytes of ``value``."""
    return hashlib.sha256(canonical_bytes(value)).hexdigest()


def chain_hash(previous_hash: str, event_bytes: bytes) -> str:
    """Next link of a per-request hash chain: ``sha256(previous_hash_hex || event_bytes)``."""
    h = hashlib.sha256(previous_hash.encode("ascii"))
    h.update(event_bytes)
    return h.hexdigest()
