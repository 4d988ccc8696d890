"""Stored rows decoded without trusting them: a damaged row becomes a named defect, never a traceback.

The log's own writes always produce well-formed rows, but the rows an audit reads are the ones an audit
exists for: a payload cut short, text that is not JSON (or JSON no parser can hold: ``1e400``, nesting
thousands deep), an array where an object belongs, a BLOB where text belongs, a ``'x'`` in an integer
column. :func:`decode_event_row` turns any row into a :class:`~specround.statemachine.ports.StoredEvent`;
what was wrong with it is written to its ``defect`` field (the hash chain and replay then refuse the event
by name), and the fields that could not be read get neutral placeholders. :func:`decode_head_row` raises
:class:`~specround.errors.LogIntegrityError` naming the request and the column instead.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from specround.canonical import load
from specround.errors import LogIntegrityError
from specround.signing import SignatureRow
from specround.statemachine.ports import LogHead, StoredEvent

__all__ = ["SignatureRow", "decode_event_row", "decode_head_row", "decode_signature_row", "row_text"]

_INT64 = 2**63


def row_text(value: Any) -> str | None:
    """A text column's value as ``str``, or None when it holds something else."""
    return value if isinstance(value, str) else None


def _ascii(value: Any) -> str | None:
    return value if isinstance(value, str) and value.isascii() else None


def _integer(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or not -_INT64 <= value < _INT64:
        return None
    return value


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _raw_bytes(text: str) -> bytes:
    """The stored bytes of a text read with ``surrogateescape`` (see the SQLite connection hook)."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def decode_event_row(row: Sequence[Any]) -> StoredEvent:
    """One ``events`` row (in :data:`~specround.adapters.sql.fence.EVENT_COLUMNS` order) as a stored event.

    Never raises for a row of ten values: every problem is named in ``defect``.
    """
    request_id, seq, kind, round_id, generation, version, prev, link, at, text = row
    problems: list[str] = []

    def column(name: str, value: Any, read: Any, fallback: Any) -> Any:
        out = read(value)
        if out is None:
            problems.append(f"{name} {_short(value)} is not a valid {name}")
            return fallback
        return out

    rid = column("request_id", request_id, row_text, str(request_id))
    seq_ = column("seq", seq, _integer, -1)
    kind_ = column("kind", kind, row_text, "")
    if round_id is not None and not isinstance(round_id, str):
        problems.append(f"round_id {_short(round_id)} is not text")
        round_id = str(round_id)
    generation_ = column("generation", generation, _integer, -1)
    version_ = column("schema_version", version, _integer, -1)
    prev_ = column("prev_hash", prev, _ascii, "")
    link_ = column("hash", link, _ascii, "")
    at_ = column("recorded_at", at, _number, 0.0)
    payload: dict[str, Any] = {}
    data: bytes | None
    readable = True
    if isinstance(text, str):
        try:
            data = text.encode("utf-8")  # the exact bytes the chain hashed
        except UnicodeEncodeError:
            data, readable = _raw_bytes(text), False
            problems.append("the payload is not valid UTF-8 text")
    elif isinstance(text, (bytes, bytearray, memoryview)):
        data = bytes(text)
        problems.append("the payload is stored as a BLOB, not text")
    else:
        data = None
        problems.append(f"the payload {_short(text)} is not text")
    if data is not None and readable:
        try:
            decoded = load(data)
        except Exception as exc:  # orjson: invalid JSON, a cut payload, 1e400, nesting past its limit
            problems.append(f"the payload is not readable JSON ({' '.join(str(exc).split())[:120]})")
        else:
            if isinstance(decoded, dict):
                payload = decoded
            else:
                problems.append(f"the payload is a JSON {type(decoded).__name__}, not an object")
    return StoredEvent(
        rid,
        seq_,
        kind_,
        round_id,
        generation_,
        version_,
        payload,
        prev_,
        link_,
        at_,
        data,
        "; ".join(problems) or None,
    )


def decode_head_row(row: Sequence[Any]) -> LogHead:
    """One ``requests`` row (id, generation, head seq, head hash, state digest, finished) as a head."""
    request_id, generation, seq, link, digest, finished = row
    problems = []
    generation_ = _integer(generation)
    seq_ = _integer(seq)
    if generation_ is None:
        problems.append(f"generation {_short(generation)} is not an integer")
    if seq_ is None:
        problems.append(f"head_seq {_short(seq)} is not an integer")
    if _ascii(link) is None:
        problems.append(f"head_hash {_short(link)} is not text")
    if row_text(digest) is None:
        problems.append(f"state_digest {_short(digest)} is not text")
    if finished not in (0, 1, True, False):
        problems.append(f"finished {_short(finished)} is not a boolean")
    if problems:
        raise LogIntegrityError(f"request {request_id!r}: the head row is malformed: {'; '.join(problems)}")
    assert generation_ is not None and seq_ is not None
    return LogHead(
        request_id=str(request_id),
        generation=generation_,
        seq=seq_,
        hash=link,
        state_digest=digest,
        finished=bool(finished),
    )


def decode_signature_row(row: Sequence[Any]) -> SignatureRow:
    """One ``signatures`` row (id, scope, request id, scheme, key id, message, signature); never raises."""
    sid, scope, request_id, scheme, key_id, message, signature = row
    problems = []
    sid_ = _integer(sid)
    if sid_ is None:
        problems.append(f"id {_short(sid)} is not an integer")
    texts = {"scope": scope, "scheme": scheme, "key_id": key_id, "signature": signature}
    for name, value in texts.items():
        if not isinstance(value, str):
            problems.append(f"{name} {_short(value)} is not text")
    if request_id is not None and not isinstance(request_id, str):
        problems.append(f"request_id {_short(request_id)} is not text")
    if isinstance(message, str):
        data = _raw_bytes(message)
    elif isinstance(message, (bytes, bytearray, memoryview)):
        data = bytes(message)
        problems.append("the message is stored as a BLOB, not text")
    else:
        data = b""
        problems.append(f"the message {_short(message)} is not text")
    return SignatureRow(
        id=sid_ if sid_ is not None else -1,
        scope=scope if isinstance(scope, str) else "",
        request_id=request_id if isinstance(request_id, str) or request_id is None else str(request_id),
        scheme=scheme if isinstance(scheme, str) else "",
        key_id=key_id if isinstance(key_id, str) else "",
        message=data,
        signature=signature if isinstance(signature, str) else "",
        defect="; ".join(problems) or None,
    )
