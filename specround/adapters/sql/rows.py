"""Stored rows decoded without trusting them: a damaged row becomes a named defect, never a traceback.

The log's own writes always produce well-formed rows, but the rows an audit reads are the ones an audit
exists for: a payload cut short, text that is not JSON (or JSON no parser can hold: ``1e400``, nesting
thousands deep), an array where an object belongs, a BLOB where text belongs, a ``'x'`` in an integer
column. :func:`decode_event_row` turns any row into a :class:`~specround.statemachine.ports.StoredEvent`;
what was wrong with it is written to its ``defect`` field (the hash chain and replay then refuse the event
by name), and the fields that could not be read get neutral placeholders. :func:`read_round_row` does
the same for a ``rounds`` row (its five events share the row's defect: a body that cannot be read, a BLOB
column holding text, a generation that is not an integer). :func:`decode_head_row` raises
:class:`~specround.errors.LogIntegrityError` naming the request and the column instead.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from specround.adapters.sql.packed_payload import unpack_payload
from specround.adapters.sql.round_body import COMPACT, COMPACT2, decode_round, raw_payloads
from specround.adapters.sql.tables import PREV_LINK_BYTES
from specround.canonical import dumps_trusted, load
from specround.errors import LogIntegrityError
from specround.signing import SignatureRow
from specround.statemachine.events import ROUND_EVENT_KINDS
from specround.statemachine.ports import LogHead, StoredEvent, StoredRound, round_events
from specround.statemachine.round_ids import derived_round_id

__all__ = [
    "EVENT_COLUMNS",
    "SignatureRow",
    "decode_event_row",
    "decode_head_row",
    "decode_signature_row",
    "derived_id_of_body",
    "read_round_row",
    "round_payloads",
    "row_blob",
    "row_id",
    "row_text",
]

_INT64 = 2**63

EVENT_COLUMNS = (
    "request_id",
    "seq",
    "kind",
    "round_id",
    "generation",
    "schema_version",
    "prev_hash",
    "hash",
    "recorded_at",
    "payload",
    "packed_payload",
)
"""The ``events`` columns a row holds, in the order :func:`decode_event_row` reads them."""


def row_text(value: Any) -> str | None:
    """A text column's value as ``str``, or None when it holds something else."""
    return value if isinstance(value, str) else None


def row_blob(value: Any) -> bytes | None:
    """A binary column's value as ``bytes``, or None when it holds something else."""
    return bytes(value) if isinstance(value, (bytes, bytearray, memoryview)) else None


def row_id(value: Any) -> str:
    """A request id column's value as the ``str`` the reader groups by (its ``str()`` when not text)."""
    return value if isinstance(value, str) else str(value)


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


def _payload_bytes(text: Any, packed: Any, problems: list[str]) -> tuple[bytes | None, bool]:
    """The stored bytes of an event's text and whether they can be read as JSON.

    The text is ``payload``, or unpacked from ``packed_payload``; each problem is appended to ``problems``.
    """
    if packed is not None:
        blob = row_blob(packed)
        if blob is None:
            problems.append(f"packed_payload {_short(packed)} is not a BLOB")
            return None, False
        if text != "":
            problems.append("the row holds both a payload text and a packed payload")
        try:
            data = unpack_payload(blob)
        except ValueError as exc:
            problems.append(str(exc))
            return None, False
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            problems.append("the packed payload is not valid UTF-8 text")
            return data, False
        return data, True
    if isinstance(text, str):
        try:
            return text.encode("utf-8"), True  # the exact bytes the chain hashed
        except UnicodeEncodeError:
            problems.append("the payload is not valid UTF-8 text")
            return _raw_bytes(text), False
    if isinstance(text, (bytes, bytearray, memoryview)):
        problems.append("the payload is stored as a BLOB, not text")
        return bytes(text), True
    problems.append(f"the payload {_short(text)} is not text")
    return None, False


def decode_event_row(row: Sequence[Any]) -> StoredEvent:
    """One ``events`` row as a stored event.

    The row's values: request id, seq, kind, round id, generation, schema version, prev hash, hash, time,
    payload text and packed payload (:mod:`specround.adapters.sql.packed_payload`; NULL when the text is
    stored as it is, and the text ``''`` when it is not).

    Never raises for a row of eleven values: every problem is named in ``defect``.
    """
    request_id, seq, kind, round_id, generation, version, prev, link, at, text, packed = row
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
    data, readable = _payload_bytes(text, packed, problems)
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


_UNRESOLVED = "-" * (64 - 2 * PREV_LINK_BYTES)
"""Pads the stored prefix of a link that names no stored event (a ``prev_hash`` no event has as hash)."""


def round_payloads(
    body: bytes, request_id: str, round_id: str, generation: int, commit: str, previous: str | None
) -> tuple[list[dict[str, Any]], list[bytes], list[str | None], str]:
    """The five payloads of a body, their canonical bytes, what is wrong with each and the round id.

    A defect of None means nothing is wrong. An empty ``round_id`` stands for the round's derived id: the
    compact decoder rebuilds it, and for a ``RAW`` body it is derived from the stored ``round_ready`` text
    (still ``''`` when that text cannot name it). A ``RAW`` body keeps each event's stored text, so each is
    read (and named) on its own; a body that cannot be split into five events raises ValueError.
    """
    count = len(ROUND_EVENT_KINDS)
    try:
        raw = raw_payloads(body)
        if raw is None:
            payloads = decode_round(body, request_id, round_id, generation, commit, previous)
            if len(payloads) != count or not all(type(p) is dict or isinstance(p, dict) for p in payloads):
                raise ValueError("the stored round does not hold five JSON objects")
            texts = list(map(dumps_trusted, payloads))
            return payloads, texts, _NO_DEFECTS, round_id or payloads[0]["round_id"]
    except LogIntegrityError as exc:
        raise ValueError(str(exc).split(": ", 1)[-1]) from None
    except ValueError:
        raise
    except Exception as exc:  # a cut body, a value no decoder can hold
        raise ValueError(f"unreadable stored round ({' '.join(str(exc).split())[:120]})") from None
    objects: list[dict[str, Any]] = []
    defects: list[str | None] = []
    for data in raw:
        why: str | None
        try:
            decoded = load(data)
        except Exception as exc:  # orjson: invalid JSON, a cut payload, 1e400, nesting past its limit
            decoded, why = {}, f"the payload is not readable JSON ({' '.join(str(exc).split())[:120]})"
        else:
            why = None if isinstance(decoded, dict) else f"the payload is a JSON {type(decoded).__name__}"
        objects.append(decoded if isinstance(decoded, dict) else {})
        defects.append(why)
    return objects, list(raw), defects, round_id or _derived_id(objects[0], generation)


def derived_id_of_body(body: bytes, request_id: str, generation: int) -> str:
    """The derived id of a stored round whose ``round_id`` column is ``''`` (``''`` if it cannot be read).

    Only the round's ``round_ready`` values are read: a reference to the previous round's processor
    digest, and the commit digest, get stand-ins.
    """
    try:
        return round_payloads(body, request_id, "", generation, _STAND_IN_DIGEST, _STAND_IN_DIGEST)[3]
    except ValueError:
        return ""


_STAND_IN_DIGEST = "0" * 64


def _derived_id(ready: dict[str, Any], generation: int) -> str:
    """The derived id of the round whose ``round_ready`` payload is ``ready`` ('' if it cannot name one)."""
    coordinate, drafts = ready.get("coordinate_digest"), ready.get("draft_ids")
    if type(coordinate) is str and type(drafts) is list and all(type(token) is int for token in drafts):
        return derived_round_id(generation - 1, coordinate, drafts)
    return ""


_BUILT_FORMS = (COMPACT, COMPACT2)
"""Body forms whose events' envelopes the decoder builds from the row (they match it by construction)."""
_EMPTY_PAYLOADS: list[dict[str, Any]] = []
_EMPTY_DATA: list[bytes] = [b""] * len(ROUND_EVENT_KINDS)
_NO_DEFECTS: list[str | None] = [None] * len(ROUND_EVENT_KINDS)


def _read_round_columns(
    row: Sequence[Any], problems: list[str], fallback_generation: int
) -> tuple[str, int, str, float, bytes, bytes, bytes, bytes]:
    """The columns of a ``rounds`` row that is not well typed, each problem named in ``problems``."""
    request_id, generation, round_id, at, commit, prev, last, body = row[:8]
    rid = row_id(request_id)
    if not isinstance(request_id, str):
        problems.append(f"request_id {_short(request_id)} is not text")
    generation_ = _integer(generation)
    if generation_ is None:
        problems.append(f"generation {_short(generation)} is not a valid generation")
        generation_ = fallback_generation
    round_id_ = round_id if isinstance(round_id, str) else str(round_id)
    if not isinstance(round_id, str):
        problems.append(f"round_id {_short(round_id)} is not text")
    at_ = _number(at)
    if at_ is None:
        problems.append(f"recorded_at {_short(at)} is not a valid recorded_at")
        at_ = 0.0
    blobs: dict[str, bytes] = {}
    for name, value in (("commit_digest", commit), ("prev_hash", prev), ("hash", last), ("body", body)):
        blob = row_blob(value)
        if blob is None:
            problems.append(f"{name} {_short(value)} is not a BLOB")
            blob = b""
        blobs[name] = blob
    if len(blobs["hash"]) != 32 and "hash" not in " ".join(problems):
        problems.append(f"hash holds {len(blobs['hash'])} bytes, not 32")
    return (
        rid,
        generation_,
        round_id_,
        at_,
        blobs["commit_digest"],
        blobs["prev_hash"],
        blobs["hash"],
        blobs["body"],
    )


def read_round_row(
    row: Sequence[Any],
    links: dict[bytes, str],
    previous_processor: str | None,
    fallback_generation: int = 0,
    *,
    whole: bool = True,
) -> tuple[StoredRound | list[StoredEvent], str | None]:
    """One ``rounds`` row (request id, generation, round id, time, commit, prev, hash, body) as five events.

    ``links`` maps stored link prefixes to full hashes of the request's rows; ``previous_processor`` is the
    previous round's ``processor_after`` (a compact body may refer to it). Returns the events (seqs
    ``5g - 4 .. 5g``, inner links recomputed from the payloads) and this round's ``processor_after``; with
    ``whole``, a well-formed row comes back as one :class:`StoredRound` instead. Never raises for a row of
    eight values: what could not be read is the ``defect`` of all five events, whose payloads are then
    empty (of one event only, for a ``RAW`` body's unreadable text). A generation that is not an integer is
    taken as ``fallback_generation`` (the reader passes the previous row's plus one).
    """
    request_id, generation, round_id, at, commit, prev, last, body = row[:8]
    problems: list[str] = []
    if (  # the rows the log writes: every column of its type (the checks below would find nothing)
        type(request_id) is str
        and type(generation) is int
        and -_INT64 <= generation < _INT64
        and type(round_id) is str
        and type(at) is float
        and at - at == 0.0  # finite
        and type(commit) is bytes
        and type(prev) is bytes
        and type(last) is bytes
        and type(body) is bytes
        and len(last) == 32
    ):
        rid, generation_, round_id_, at_, commit_, prefix, final_, body_ = (
            request_id,
            generation,
            round_id,
            at,
            commit,
            prev,
            last,
            body,
        )
    else:
        rid, generation_, round_id_, at_, commit_, prefix, final_, body_ = _read_round_columns(
            row, problems, fallback_generation
        )
    count = len(ROUND_EVENT_KINDS)
    payloads: list[dict[str, Any]] = _EMPTY_PAYLOADS
    data: list[bytes] = _EMPTY_DATA
    defects: list[str | None] = _NO_DEFECTS
    processor_after: Any = None
    readable = False
    if not problems or not any(p.startswith(("body ", "commit_digest ", "round_id ")) for p in problems):
        try:
            payloads, data, defects, round_id_ = round_payloads(
                body_, rid, round_id_, generation_, commit_.hex(), previous_processor
            )
        except ValueError as exc:
            problems.append(f"the round body is unreadable: {exc}")
        else:
            readable = not any(defects)
            processor_after = payloads[3].get("processor_after")
    link = links.get(prefix) or prefix.hex() + _UNRESOLVED
    processor = processor_after if isinstance(processor_after, str) and readable else None
    if readable and not problems:
        if not whole:
            return round_events(
                rid, round_id_, generation_, at_, link, final_.hex(), payloads, data
            ), processor
        stored = StoredRound(
            rid,
            round_id_,
            generation_,
            at_,
            link,
            final_.hex(),
            tuple(payloads),
            tuple(data),
            body_[0] in _BUILT_FORMS,  # a compact body's envelopes are the decoder's own
        )
        return stored, processor
    if payloads is _EMPTY_PAYLOADS:
        payloads = [{} for _ in range(count)]  # each event its own (empty) object
    defect = "; ".join(problems) if problems else None
    marks = [defect or why for why in defects]
    return round_events(
        rid, round_id_, generation_, at_, link, final_.hex(), payloads, data, marks
    ), processor
