"""The compact binary body of one stored round: its five lifecycle events, losslessly.

A published round is stored as one ``rounds`` row (see :mod:`specround.adapters.sql.tables`). The row's
columns carry the request, generation, round id, commit digest, time and the two ends of the round's hash
chain; the body carries everything else of the five events (``round_ready`` .. ``round_published``).
:func:`decode_round` rebuilds each event's canonical JSON object exactly, so ``canonical_bytes`` of the
rebuilt payloads are the bytes that were hashed when the round was published, and every hash link is
recomputed from them on reading.

Layout (little-endian). Byte 0 is the form:

``COMPACT`` (1)
    byte 1: type code of the integer array (0 ``B``, 1 ``H``, 2 ``I``, 3 ``q``); byte 2: type code of the
    float array (0 ``d`` float64, 1 ``f`` float32, used only when every float is exactly a float32);
    bytes 3-4 and 5-6: the number of integers and floats (``uint16``); then the integer array, the float
    array and the raw 32-byte values of every digest, each in event order. Integers hold counters, token
    ids, list lengths, presence flags and the codes of ``terminal`` and ``finish_reason``; the event kinds,
    the request and round ids, the schema version and the commit digest are implied by the row.
``RAW`` (2)
    the five canonical JSON texts, each preceded by its ``uint32`` length (for events whose shape the
    compact form does not cover, e.g. an older schema version or a value outside its types).

:func:`encode_round` chooses ``COMPACT`` only when every value has exactly the type the compact form
restores (``int`` not ``bool``, ``float`` not ``int``, lowercase 64-hex digests, known enum values, the
exact key set), and ``RAW`` otherwise, so no input can be stored lossily.
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping, Sequence
from typing import Any

from specround.errors import LogIntegrityError

__all__ = ["COMPACT", "RAW", "decode_round", "encode_raw", "encode_round", "raw_payloads"]

COMPACT = 1
RAW = 2

_INT_CODES = ("B", "H", "I", "q")
_INT_LIMITS = (0xFF, 0xFFFF, 0xFFFF_FFFF)
_FLOAT_CODES = ("d", "f")
_TERMINALS = ("correction", "bonus", "stop")
_TERMINAL_CODE = {name: code for code, name in enumerate(_TERMINALS)}
_REASONS = (None, "stop", "length")
_REASON_CODE = {name: code for code, name in enumerate(_REASONS)}
_OPTIONAL_FLOATS = (
    "terminal_uniform",
    "residual_mass",
    "terminal_mass_before",
    "terminal_token_mass",
    "terminal_p",
    "terminal_q",
)
_TIMINGS = ("draft_s", "queue_s", "state_s", "verify_s")
_TIMING_KEYS = frozenset(_TIMINGS)
_ENVELOPE = ("kind", "request_id", "round_id", "schema_version")
_KEYS = {
    "round_ready": frozenset(
        (
            *_ENVELOPE,
            "expected_generation",
            "coordinate_digest",
            "draft_ids",
            "q_draft",
            "proposal_before",
            "proposal_after",
            "q_rows_digest",
        )
    ),
    "round_verified": frozenset((*_ENVELOPE, "p_draft", "verify_rows", "p_rows_digest")),
    "round_decided": frozenset(
        (
            *_ENVELOPE,
            "accepted",
            "terminal",
            "emitted_ids",
            "accept_counter",
            "accept_draws",
            "accept_uniforms",
            "terminal_counter",
            "terminal_draws",
            "terminal_row",
            "degenerate_correction",
            "finished",
            "finish_reason",
            *_OPTIONAL_FLOATS,
        )
    ),
    "round_staged": frozenset(
        (
            *_ENVELOPE,
            "committed_kv_ids",
            "discarded_kv_ids",
            "processor_before",
            "processor_after",
            "rng_before",
            "rng_after",
            "successor_digest",
        )
    ),
    "round_published": frozenset((*_ENVELOPE, "generation", "commit_digest", "timings")),
}
_KINDS = ("round_ready", "round_verified", "round_decided", "round_staged", "round_published")
_SCHEMA_VERSION = 1
_MAX_COUNT = 0xFFFF
_SEQUENCE_TYPES = {list, tuple}


class _NotCompactError(Exception):
    """A value the compact form cannot restore exactly: the round is stored ``RAW``."""


def encode_raw(payloads: Sequence[bytes]) -> bytes:
    """The ``RAW`` body of a round: its five canonical JSON texts."""
    parts = [bytes((RAW,))]
    for payload in payloads:
        parts.append(len(payload).to_bytes(4, "little"))
        parts.append(payload)
    return b"".join(parts)


def encode_round(
    events: Sequence[Mapping[str, Any]],
    request_id: str,
    round_id: str,
    commit_digest: str,
    payloads: Sequence[bytes],
) -> bytes:
    """The body of a round from its five events' values (record fields or decoded JSON objects).

    ``payloads`` are the events' canonical bytes, stored as they are when the values do not fit the
    compact form exactly. ``commit_digest`` is the row's column (``round_published`` must carry it).
    """
    try:
        return _encode_compact(events, request_id, round_id, commit_digest)
    except _NotCompactError:
        return encode_raw(payloads)


def _check(event: Mapping[str, Any], kind: str, request_id: str, round_id: str) -> None:
    if (
        event.keys() != _KEYS[kind]
        or event["kind"] != kind
        or type(event["schema_version"]) is not int
        or event["schema_version"] != _SCHEMA_VERSION
        or event["request_id"] != request_id
        or event["round_id"] != round_id
        or type(event["request_id"]) is not str
        or type(event["round_id"]) is not str
    ):
        raise _NotCompactError


def _flag(value: Any) -> int:
    if type(value) is not bool:
        raise _NotCompactError
    return 1 if value else 0


def _encode_compact(
    events: Sequence[Mapping[str, Any]], request_id: str, round_id: str, commit_digest: str
) -> bytes:
    if len(events) != len(_KINDS):
        raise _NotCompactError
    ready, verified, decided, staged, published = events
    for event, kind in zip(events, _KINDS, strict=True):
        _check(event, kind, request_id, round_id)
    try:
        ints: list[Any] = []
        floats: list[Any] = []
        digests: list[Any] = [ready["coordinate_digest"]]
        # round_ready
        drafts, q_draft, q_rows = ready["draft_ids"], ready["q_draft"], ready["q_rows_digest"]
        sequences = (
            drafts,
            q_draft,
            verified["p_draft"],
            decided["accept_uniforms"],
            decided["emitted_ids"],
            staged["committed_kv_ids"],
            staged["discarded_kv_ids"],
            staged["rng_before"],
            staged["rng_after"],
        )
        if not set(map(type, sequences)) <= _SEQUENCE_TYPES:
            raise _NotCompactError
        ints += (
            ready["expected_generation"],
            ready["proposal_before"],
            ready["proposal_after"],
            len(drafts),
            *drafts,
            len(q_draft),
            0 if q_rows is None else 1,
        )
        floats += q_draft
        if q_rows is not None:
            digests.append(q_rows)
        # round_verified
        p_draft, p_rows = verified["p_draft"], verified["p_rows_digest"]
        ints += (verified["verify_rows"], len(p_draft), 0 if p_rows is None else 1)
        floats += p_draft
        if p_rows is not None:
            digests.append(p_rows)
        # round_decided
        row = decided["terminal_row"]
        if row is not None and type(row) is not int:
            raise _NotCompactError
        uniforms, emitted = decided["accept_uniforms"], decided["emitted_ids"]
        mask = 0
        for bit, name in enumerate(_OPTIONAL_FLOATS):
            if decided[name] is not None:
                mask |= 1 << bit
        ints += (
            decided["accepted"],
            _TERMINAL_CODE[decided["terminal"]],
            decided["accept_counter"],
            decided["accept_draws"],
            decided["terminal_counter"],
            decided["terminal_draws"],
            0 if row is None else row + 1,
            _flag(decided["degenerate_correction"]),
            _flag(decided["finished"]),
            _REASON_CODE[decided["finish_reason"]],
            mask,
            len(uniforms),
            len(emitted),
            *emitted,
        )
        floats += uniforms
        floats += [decided[name] for name in _OPTIONAL_FLOATS if decided[name] is not None]
        # round_staged
        committed, discarded = staged["committed_kv_ids"], staged["discarded_kv_ids"]
        rng_before, rng_after = staged["rng_before"], staged["rng_after"]
        if len(rng_before) != 3 or len(rng_after) != 3:
            raise _NotCompactError
        ints += (len(committed), *committed, len(discarded), *discarded, *rng_before, *rng_after)
        digests += (staged["processor_before"], staged["processor_after"], staged["successor_digest"])
        # round_published
        timings = published["timings"]
        ints += (published["generation"], 0 if timings is None else 1)
        if published["commit_digest"] != commit_digest or type(published["commit_digest"]) is not str:
            raise _NotCompactError
        if timings is not None:
            values = timings if isinstance(timings, dict) else timings.__dict__
            if values.keys() != _TIMING_KEYS:
                raise _NotCompactError
            floats += [values[name] for name in _TIMINGS]
    except (KeyError, TypeError) as exc:  # an unknown enum value, a non-sequence, a wrong type
        raise _NotCompactError from exc
    if not set(map(type, ints)) <= {int} or not set(map(type, floats)) <= {float}:
        raise _NotCompactError
    if len(ints) > _MAX_COUNT or len(floats) > _MAX_COUNT:
        raise _NotCompactError
    if not all(type(value) is str and len(value) == 64 for value in digests):
        raise _NotCompactError
    joined = "".join(digests)
    try:
        digest_bytes = bytes.fromhex(joined)
    except ValueError as exc:
        raise _NotCompactError from exc
    if digest_bytes.hex() != joined:  # uppercase hex would come back lowercase
        raise _NotCompactError
    low, high = (min(ints), max(ints)) if ints else (0, 0)
    int_code = 3 if low < 0 else next((c for c, limit in enumerate(_INT_LIMITS) if high <= limit), 3)
    try:
        int_array = array(_INT_CODES[int_code], ints)
    except OverflowError as exc:  # beyond int64
        raise _NotCompactError from exc
    float_array = array("d", floats)
    float_code = 0
    try:
        narrow = array("f", floats)
        if array("d", narrow) == float_array:
            float_array, float_code = narrow, 1
    except OverflowError:
        pass
    header = bytes((COMPACT, int_code, float_code)) + len(ints).to_bytes(2, "little")
    header += len(floats).to_bytes(2, "little")
    return header + int_array.tobytes() + float_array.tobytes() + digest_bytes


def decode_round(body: bytes, request_id: str, round_id: str, commit_digest: str) -> list[dict[str, Any]]:
    """The five events of a round as canonical JSON objects (what ``load(canonical_bytes(event))`` gives).

    Raises :class:`~specround.errors.LogIntegrityError` for a body that cannot be read.
    """
    try:
        form = body[0]
        if form == COMPACT:
            return _decode_compact(body, request_id, round_id, commit_digest)
        if form == RAW:
            return _decode_raw(body)
    except (IndexError, ValueError, TypeError, KeyError) as exc:
        raise LogIntegrityError(
            f"request {request_id!r} round {round_id!r}: unreadable stored round ({exc})"
        ) from exc
    raise LogIntegrityError(f"request {request_id!r} round {round_id!r}: unknown stored round form {form}")


def raw_payloads(body: bytes) -> list[bytes] | None:
    """The stored canonical texts of a ``RAW`` body (None for a ``COMPACT`` one)."""
    if body[0] != RAW:
        return None
    out, at = [], 1
    for _ in _KINDS:
        size = int.from_bytes(body[at : at + 4], "little")
        out.append(bytes(body[at + 4 : at + 4 + size]))
        at += 4 + size
    if at != len(body):
        raise ValueError("trailing bytes after the fifth event")
    return out


def _decode_raw(body: bytes) -> list[dict[str, Any]]:
    from specround.canonical import load

    payloads = raw_payloads(body)
    assert payloads is not None
    return [load(payload) for payload in payloads]


def _decode_compact(body: bytes, request_id: str, round_id: str, commit_digest: str) -> list[dict[str, Any]]:
    int_code, float_code = body[1], body[2]
    n_ints = body[3] | (body[4] << 8)
    n_floats = body[5] | (body[6] << 8)
    ints_type = array(_INT_CODES[int_code])
    floats_type = array(_FLOAT_CODES[float_code])
    at = 7
    end = at + n_ints * ints_type.itemsize
    ints_type.frombytes(body[at:end])
    at, end = end, end + n_floats * floats_type.itemsize
    floats_type.frombytes(body[at:end])
    blob = body[end:]
    if len(blob) % 32:
        raise ValueError("digest bytes are not a whole number of digests")
    i = ints_type.tolist()
    f = floats_type.tolist()
    hexes = blob.hex()
    d = 0  # next digest (64 hex characters each)
    k = 0  # next int
    x = 0  # next float

    def digest() -> str:
        nonlocal d
        value = hexes[d : d + 64]
        if len(value) != 64:
            raise ValueError("missing digest bytes")
        d += 64
        return value

    coordinate = digest()
    expected, before, after, n = i[0:4]
    k = 4
    drafts = i[k : k + n]
    k += n
    nq, q_flag = i[k], i[k + 1]
    k += 2
    q_draft = f[x : x + nq]
    x += nq
    ready = {
        "kind": "round_ready",
        "schema_version": _SCHEMA_VERSION,
        "request_id": request_id,
        "round_id": round_id,
        "expected_generation": expected,
        "coordinate_digest": coordinate,
        "draft_ids": drafts,
        "q_draft": q_draft,
        "proposal_before": before,
        "proposal_after": after,
        "q_rows_digest": digest() if q_flag else None,
    }
    verify_rows, np_, p_flag = i[k : k + 3]
    k += 3
    p_draft = f[x : x + np_]
    x += np_
    verified = {
        "kind": "round_verified",
        "schema_version": _SCHEMA_VERSION,
        "request_id": request_id,
        "round_id": round_id,
        "p_draft": p_draft,
        "verify_rows": verify_rows,
        "p_rows_digest": digest() if p_flag else None,
    }
    (
        accepted,
        terminal,
        accept_counter,
        accept_draws,
        terminal_counter,
        terminal_draws,
        row,
        degenerate,
        finished,
        reason,
        mask,
        nu,
        ne,
    ) = i[k : k + 13]
    k += 13
    emitted = i[k : k + ne]
    k += ne
    uniforms = f[x : x + nu]
    x += nu
    decided = {
        "kind": "round_decided",
        "schema_version": _SCHEMA_VERSION,
        "request_id": request_id,
        "round_id": round_id,
        "accepted": accepted,
        "terminal": _TERMINALS[terminal],
        "emitted_ids": emitted,
        "accept_counter": accept_counter,
        "accept_draws": accept_draws,
        "accept_uniforms": uniforms,
        "terminal_counter": terminal_counter,
        "terminal_draws": terminal_draws,
        "terminal_row": row - 1 if row else None,
        "degenerate_correction": degenerate == 1,
        "finished": finished == 1,
        "finish_reason": _REASONS[reason],
    }
    for bit, name in enumerate(_OPTIONAL_FLOATS):
        if mask >> bit & 1:
            decided[name] = f[x]
            x += 1
        else:
            decided[name] = None
    nc = i[k]
    committed = i[k + 1 : k + 1 + nc]
    k += 1 + nc
    nd = i[k]
    discarded = i[k + 1 : k + 1 + nd]
    k += 1 + nd
    staged = {
        "kind": "round_staged",
        "schema_version": _SCHEMA_VERSION,
        "request_id": request_id,
        "round_id": round_id,
        "committed_kv_ids": committed,
        "discarded_kv_ids": discarded,
        "rng_before": i[k : k + 3],
        "rng_after": i[k + 3 : k + 6],
        "processor_before": digest(),
        "processor_after": digest(),
        "successor_digest": digest(),
    }
    k += 6
    generation, t_flag = i[k], i[k + 1]
    k += 2
    timings = None
    if t_flag:
        timings = dict(zip(_TIMINGS, f[x : x + 4], strict=True))
        x += 4
    published = {
        "kind": "round_published",
        "schema_version": _SCHEMA_VERSION,
        "request_id": request_id,
        "round_id": round_id,
        "generation": generation,
        "commit_digest": commit_digest,
        "timings": timings,
    }
    if k != len(i) or x != len(f) or d != len(hexes):
        raise ValueError("the stored round has values left over")
    return [ready, verified, decided, staged, published]
