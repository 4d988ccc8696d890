"""The compact binary body of one stored round: its five lifecycle events, losslessly.

A published round is stored as one ``rounds`` row (see :mod:`specround.adapters.sql.tables`). The row's
columns carry the request, generation, round id, commit digest, time and the two ends of the round's hash
chain; the body carries everything else of the five events (``round_ready`` .. ``round_published``).
:func:`decode_round` rebuilds each event's canonical JSON object exactly, so ``canonical_bytes`` of the
rebuilt payloads are the bytes that were hashed when the round was published, and every hash link is
recomputed from them on reading.

Layout (little-endian). Byte 0 is the form:

``COMPACT`` (1)
    byte 1 packs the type codes of the arrays that follow (bits 0-1: the small-integer array, bits 2-3:
    the wide-integer array, ``B``/``H``/``I``/``q`` for codes 0-3; bits 4 and 5: the two float arrays
    stored as float32, used only when every float of the array is exactly a float32, float64 otherwise).
    Then the small-integer array (always :data:`SMALL_FIELDS` entries: list lengths, flags, enum codes,
    draw counts and the fields that follow from others as differences, e.g. ``expected_generation``
    against the row's generation and the RNG counters against ``rng_before``), the wide-integer array
    (``rng_before`` and the token-id lists), the two float arrays (the rows' probabilities ``q_draft``,
    ``p_draft``, ``terminal_p`` and ``terminal_q``; then the uniforms, the draw brackets and the timings) and
    the raw 32-byte values of the digests, each in event order. ``processor_before`` is left out when it
    equals the previous round's ``processor_after`` (flagged; the reader passes that digest in). The event
    kinds, the request and round ids, the schema version and the commit digest are implied by the row (a
    round id the row stores as ``''`` is the round's derived id, rebuilt from its coordinate digest and
    drafts; a commit digest of which the row keeps only the first bytes is rebuilt from the events:
    :func:`decode_round`).
``RAW`` (2)
    the five canonical JSON texts, each preceded by its ``uint32`` length (for events whose shape the
    compact form does not cover, e.g. an older schema version or a value outside its types).
``COMPACT2`` (3, what the log writes)
    the values of ``COMPACT``, with what follows from the rest of the round left out. Byte 1 holds flags:
    ``processor_after`` equals ``processor_before`` (1); ``terminal_p`` is ``terminal_token_mass`` (2);
    ``terminal_q`` is ``+0.0`` (4); ``emitted_ids`` start with the accepted drafts (8, only the rest is
    stored); ``committed_kv_ids`` end with the accepted drafts and ``discarded_kv_ids`` are the other
    drafts (16, only the committed tokens before the drafts are stored); bits 5 and 6: the two float arrays
    are float32; bit 7 (128): the four timings are whole microseconds, stored as integers after the wide
    ones (and left out of the second float array). Then a ``uint32`` bitmap of the small fields that differ
    from their prediction (``_shift``: e.g. ``verify_rows`` = drafts + 1, the uniforms = ``accept_draws``;
    0 for the others) and those differences, then the wide integers, all as zigzag LEB128 varints, then the
    two float arrays and the digests as in ``COMPACT`` (less the ones the flags leave out). A value that
    does not follow a pattern is stored as it is, so every round has a ``COMPACT2`` body whenever it has a
    ``COMPACT`` one.

:func:`encode_round` chooses a compact form only when every value has exactly the type the compact form
restores (``int`` not ``bool``, ``float`` not ``int``, lowercase 64-hex digests, known enum values, the
exact key set), and ``RAW`` otherwise, so no input can be stored lossily.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Mapping, Sequence
from itertools import compress
from typing import Any

from specround.adapters.sql.tables import COMMIT_PREFIX_BYTES
from specround.errors import LogIntegrityError
from specround.statemachine.commit_record import commit_digest_of_events
from specround.statemachine.events import EVENT_SCHEMA_VERSION, ROUND_EVENT_KINDS
from specround.statemachine.round_ids import derived_round_id

__all__ = [
    "COMPACT",
    "COMPACT2",
    "RAW",
    "SMALL_FIELDS",
    "decode_round",
    "encode_raw",
    "encode_round",
    "raw_payloads",
]

COMPACT = 1
RAW = 2
COMPACT2 = 3
_INT64 = 1 << 63

_INT_CODES = ("B", "H", "I", "q")
_INT_LIMITS = (0xFF, 0xFFFF, 0xFFFF_FFFF)
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
_FIRST_MASS = 4
"""Optional floats from this index on are probabilities of the rows (float32 when the rows were)."""
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
_KINDS = ROUND_EVENT_KINDS
"""The five events of a round, in order (each decoded event's ``kind``)."""
_SCHEMA_VERSION = EVENT_SCHEMA_VERSION
"""The only schema version a compact body holds (each decoded event's ``schema_version``)."""
SMALL_FIELDS = 30
"""Entries of the small-integer array of a ``COMPACT`` body."""
_SEQUENCE_TYPES = {list, tuple}
_SMALL_STRUCTS = tuple(struct.Struct(f"={SMALL_FIELDS}{code}") for code in _INT_CODES)
"""The small-integer array of each type code, as the reader unpacks it."""
_ITEM_SIZE = {code: array(code).itemsize for code in (*_INT_CODES, "f", "d")}
if any(struct.calcsize(f"={code}") != size for code, size in _ITEM_SIZE.items()):  # pragma: no cover
    raise ImportError("this platform's array item sizes differ from the stored round layout's")
_unpack_from = struct.unpack_from


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
    generation: int,
    commit_digest: str,
    payloads: Sequence[bytes],
    previous_processor: str | None = None,
    form: int = COMPACT2,
) -> bytes:
    """The body of a round from its five events' values (record fields or decoded JSON objects).

    ``payloads`` are the events' canonical bytes, stored as they are when the values do not fit the
    compact form exactly. ``generation`` and ``commit_digest`` are the row's columns; ``previous_processor``
    is the previous round's ``processor_after`` when the reader will have it (None: store it in full).
    ``form`` is the compact form to write: ``COMPACT2`` (what the log writes) or the older ``COMPACT``.
    """
    if form not in (COMPACT, COMPACT2):
        raise ValueError(f"no compact stored round form {form}")
    try:
        return _encode_compact(
            events, request_id, round_id, generation, commit_digest, previous_processor, form
        )
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


def _code(values: list[int]) -> int:
    if not values:
        return 0
    if min(values) < 0:
        return 3
    high = max(values)
    return next((code for code, limit in enumerate(_INT_LIMITS) if high <= limit), 3)


def _encode_compact(
    events: Sequence[Mapping[str, Any]],
    request_id: str,
    round_id: str,
    generation: int,
    commit_digest: str,
    previous_processor: str | None,
    form: int = COMPACT,
) -> bytes:
    if len(events) != len(_KINDS):
        raise _NotCompactError
    ready, verified, decided, staged, published = events
    for event, kind in zip(events, _KINDS, strict=True):
        _check(event, kind, request_id, round_id)
    try:
        drafts, q_draft, q_rows = ready["draft_ids"], ready["q_draft"], ready["q_rows_digest"]
        p_draft, p_rows = verified["p_draft"], verified["p_rows_digest"]
        uniforms, emitted = decided["accept_uniforms"], decided["emitted_ids"]
        committed, discarded = staged["committed_kv_ids"], staged["discarded_kv_ids"]
        rng_before, rng_after = staged["rng_before"], staged["rng_after"]
        sequences = (drafts, q_draft, p_draft, uniforms, emitted, committed, discarded, rng_before, rng_after)
        if not set(map(type, sequences)) <= _SEQUENCE_TYPES or len(rng_before) != 3 or len(rng_after) != 3:
            raise _NotCompactError
        row = decided["terminal_row"]
        scalars = (
            ready["expected_generation"],
            ready["proposal_before"],
            ready["proposal_after"],
            verified["verify_rows"],
            decided["accepted"],
            decided["accept_counter"],
            decided["accept_draws"],
            decided["terminal_counter"],
            decided["terminal_draws"],
            published["generation"],
            0 if row is None else row,
            *rng_before,
            *rng_after,
        )
        if set(map(type, scalars)) != {int}:
            raise _NotCompactError
        mask = 0
        drawn: list[Any] = []
        masses: list[Any] = []
        for bit, name in enumerate(_OPTIONAL_FLOATS):
            value = decided[name]
            if value is not None:
                mask |= 1 << bit
                (masses if bit >= _FIRST_MASS else drawn).append(value)
        before = staged["processor_before"]
        reference = previous_processor is not None and before == previous_processor
        timings = published["timings"]
        small = [
            generation - 1 - ready["expected_generation"],
            ready["proposal_before"] - rng_before[0],
            ready["proposal_after"] - rng_after[0],
            len(drafts),
            len(q_draft),
            0 if q_rows is None else 1,
            verified["verify_rows"],
            len(p_draft),
            0 if p_rows is None else 1,
            decided["accepted"],
            _TERMINAL_CODE[decided["terminal"]],
            decided["accept_counter"] - rng_before[1],
            decided["accept_draws"],
            decided["terminal_counter"] - rng_before[2],
            decided["terminal_draws"],
            0 if row is None else row + 1,
            _flag(decided["degenerate_correction"]),
            _flag(decided["finished"]),
            _REASON_CODE[decided["finish_reason"]],
            mask,
            len(uniforms),
            len(emitted),
            len(committed),
            len(discarded),
            rng_after[0] - rng_before[0],
            rng_after[1] - rng_before[1],
            rng_after[2] - rng_before[2],
            generation - published["generation"],
            0 if timings is None else 1,
            1 if reference else 0,
        ]
        wide = [*rng_before, *drafts, *emitted, *committed, *discarded]
        probabilities = [*q_draft, *p_draft, *masses]
        others = [*uniforms, *drawn]
        if timings is not None:
            values = timings if isinstance(timings, dict) else timings.__dict__
            if values.keys() != _TIMING_KEYS:
                raise _NotCompactError
            others += [values[name] for name in _TIMINGS]
        digests = [ready["coordinate_digest"]]
        if q_rows is not None:
            digests.append(q_rows)
        if p_rows is not None:
            digests.append(p_rows)
        if not reference:
            digests.append(before)
        digests += (staged["processor_after"], staged["successor_digest"])
        if published["commit_digest"] != commit_digest or type(published["commit_digest"]) is not str:
            raise _NotCompactError
    except (KeyError, TypeError) as exc:  # an unknown enum value, a non-sequence, a wrong type
        raise _NotCompactError from exc
    if not set(map(type, wide)) <= {int} or not set(map(type, probabilities + others)) <= {float}:
        raise _NotCompactError
    if not set(map(type, digests)) <= {str} or any(len(value) != 64 for value in digests):
        raise _NotCompactError
    joined = "".join(digests)
    try:
        digest_bytes = bytes.fromhex(joined)
    except ValueError as exc:
        raise _NotCompactError from exc
    if digest_bytes.hex() != joined:  # uppercase hex would come back lowercase
        raise _NotCompactError
    if form == COMPACT2:
        return _pack_compact2(
            small,
            (rng_before, drafts, emitted, committed, discarded),
            decided["accepted"],
            probabilities,
            others,
            mask,
            digest_bytes,
            staged["processor_after"] == before,
        )
    small_code, wide_code = _code(small), _code(wide)
    try:
        small_array = array(_INT_CODES[small_code], small)
        wide_array = array(_INT_CODES[wide_code], wide)
    except OverflowError as exc:  # beyond int64
        raise _NotCompactError from exc
    first, first_narrow = _floats(probabilities)
    second, second_narrow = _floats(others)
    header = bytes((COMPACT, small_code | wide_code << 2 | first_narrow << 4 | second_narrow << 5))
    return b"".join((header, small_array.tobytes(), wide_array.tobytes(), first, second, digest_bytes))


def _varints(values: Sequence[int]) -> bytes:
    """Zigzag LEB128 varints of ints in the int64 range (one byte each below 64)."""
    try:  # (v << 1) ^ (v >> 63) is the zigzag code of an int64 (never negative, whatever the int)
        return b"".join([_SHORT_VARINTS[(value << 1) ^ (value >> 63)] for value in values])
    except IndexError:  # a code of three bytes or more
        pass
    out = bytearray()
    for value in values:
        if not -_INT64 <= value < _INT64:
            raise _NotCompactError
        zz = value << 1 if value >= 0 else (-value << 1) - 1
        while zz > 0x7F:
            out.append(zz & 0x7F | 0x80)
            zz >>= 7
        out.append(zz)
    return bytes(out)


def _short_varint(zz: int) -> bytes:
    """The LEB128 bytes of a zigzag code below 2**14 (one or two bytes)."""
    return bytes((zz,)) if zz < 0x80 else bytes((zz & 0x7F | 0x80, zz >> 7))


_SHORT_VARINTS = tuple(_short_varint(zz) for zz in range(1 << 14))
"""The varint of every zigzag code of one or two bytes (|value| below 8192), by code."""


def _read_varints(body: bytes, at: int, count: int) -> tuple[list[int], int]:
    """``count`` zigzag varints from ``body[at:]`` and the offset after them."""
    chunk = body[at : at + count]
    if len(chunk) == count and (not chunk or max(chunk) < 0x80):  # every value one byte (the usual case)
        return list(map(_UNZIGZAG.__getitem__, chunk)), at + count
    out = []
    for _ in range(count):
        byte = body[at]
        at += 1
        zz = byte & 0x7F
        shift = 7
        while byte & 0x80:
            byte = body[at]
            at += 1
            zz |= (byte & 0x7F) << shift
            shift += 7
            if shift > 70:
                raise ValueError("a stored integer is too long")
        out.append(zz >> 1 if not zz & 1 else -(zz >> 1) - 1)
    return out, at


_UNZIGZAG = tuple(b >> 1 if not b & 1 else -(b >> 1) - 1 for b in range(0x80))
"""The value of each one-byte zigzag varint."""


def _shift(source: Sequence[int], target: list[int], sign: int) -> list[int]:
    """Subtract (``sign`` -1, writing) or add (+1, reading) each small field's ``COMPACT2`` prediction.

    The predictions (0 for the fields not named here) are read from ``source``; each reads only fields
    before it, in field order, so a reader passes the same list as ``source`` and ``target`` and every
    prediction sees the fields it reads restored already. Returns ``target``.
    """
    drafts, accepted, terminal = source[3], source[9], source[10]  # fields without a prediction
    target[4] += sign * drafts  # len(q_draft) = len(draft_ids)
    target[6] += sign * (drafts + 1)  # verify_rows: the drafts and the bonus row
    target[7] += sign * drafts  # len(p_draft)
    target[12] += sign * (accepted + (terminal == 0))  # accept_draws: the accepted and a rejected draft
    target[15] += sign * (accepted + 1)  # terminal_row + 1 = accepted + 1
    target[19] += sign * _ALL_OPTIONAL  # every optional float present
    draws = source[12]  # restored above when reading
    target[20] += sign * draws  # len(accept_uniforms) = accept_draws
    target[21] += sign * (accepted + (terminal != 2))  # emitted: the accepted and the terminal token
    target[22] += sign * (accepted + 1)  # committed: the previous token and the accepted drafts
    target[23] += sign * (drafts - accepted)  # discarded: the drafts not accepted
    target[25] += sign * draws  # the accept counter moved by the draws
    target[26] += sign * source[14]  # the terminal counter moved by the draws
    return target


_ALL_OPTIONAL = (1 << len(_OPTIONAL_FLOATS)) - 1
_FIELD_BITS = tuple(1 << index for index in range(SMALL_FIELDS))
_AFTER_SAME = 1
_TP_SAME = 2
_TQ_ZERO = 4
_EMITTED_DERIVED = 8
_KV_DERIVED = 16
_FIRST_NARROW = 32
_SECOND_NARROW = 64
_TIMINGS_MICROS = 128
_MICRO = 1e6
_LONGEST_TIMING = 2.0**32
"""Timings from this many seconds on are stored as floats (their microseconds would not be small)."""
_F64 = struct.Struct("=d")
_ZERO = _F64.pack(0.0)


def _pack_compact2(
    small: list[int],
    lists: tuple[Sequence[int], Sequence[int], Sequence[int], Sequence[int], Sequence[int]],
    accepted: int,
    probabilities: list[Any],
    others: list[Any],
    mask: int,
    digest_bytes: bytes,
    after_same: bool,
) -> bytes:
    """The ``COMPACT2`` body of a round from the parts :func:`_encode_compact` gathered."""
    rng_before, drafts, emitted, committed, discarded = lists
    flags = 0
    shifted = _shift(small, list(small), -1)
    bitmap = sum(compress(_FIELD_BITS, shifted))  # bit i: field i differs from its prediction
    residuals = list(filter(None, shifted))
    wide = [*rng_before, *drafts]
    head = len(committed) - accepted
    if 0 <= accepted <= len(drafts) and list(emitted[:accepted]) == list(drafts[:accepted]):
        flags |= _EMITTED_DERIVED
        wide += emitted[accepted:]
    else:
        wide += emitted
    if (
        0 <= accepted <= len(drafts)
        and head >= 0
        and list(committed[head:]) == list(drafts[:accepted])
        and list(discarded) == list(drafts[accepted:])
    ):
        flags |= _KV_DERIVED
        wide += committed[:head]
    else:
        wide += [*committed, *discarded]
    probabilities = list(probabilities)
    if mask >> 5 & 1 and _F64.pack(probabilities[-1]) == _ZERO:
        flags |= _TQ_ZERO
        probabilities.pop()
    if mask >> 4 & 1 and mask >> 3 & 1:
        at = len(probabilities) - 1 - (0 if flags & _TQ_ZERO else mask >> 5 & 1)
        token_mass = others[small[20] + (mask & 7).bit_count()]
        if _F64.pack(probabilities[at]) == _F64.pack(token_mass):
            flags |= _TP_SAME
            del probabilities[at]
    if after_same:
        flags |= _AFTER_SAME
        digest_bytes = digest_bytes[:-64] + digest_bytes[-32:]
    micros = _whole_microseconds(others[-len(_TIMINGS) :]) if small[28] else None
    if micros is not None:
        flags |= _TIMINGS_MICROS
        others = others[: -len(_TIMINGS)]
        wide += micros
    first, first_narrow = _floats(probabilities)
    second, second_narrow = _floats(others)
    flags |= _FIRST_NARROW * first_narrow | _SECOND_NARROW * second_narrow
    return b"".join(
        (
            bytes((COMPACT2, flags)),
            bitmap.to_bytes(4, "little"),
            _varints(residuals),
            _varints(wide),
            first,
            second,
            digest_bytes,
        )
    )


def _whole_microseconds(timings: list[Any]) -> list[int] | None:
    """The timings as whole microseconds when each is exactly ``n / 1e6`` for a whole ``n >= 0``, else None.

    Recorded timings are rounded to microseconds (:func:`~specround.statemachine.events.whole_microseconds`),
    so they are stored as small integers; the check is on the bits, so reading restores the same float.
    """
    out = []
    for value in timings:
        if not 0.0 <= value < _LONGEST_TIMING:  # also NaN
            return None
        count = round(value * _MICRO)
        if _F64.pack(count / _MICRO) != _F64.pack(value):
            return None
        out.append(count)
    return out


def _floats(values: list[float]) -> tuple[bytes, int]:
    """The bytes of a float array, and 1 when they are float32 (every value exactly a float32)."""
    wide = array("d", values)
    try:
        narrow = array("f", values)
    except OverflowError:
        return wide.tobytes(), 0
    if array("d", narrow) == wide:
        return narrow.tobytes(), 1
    return wide.tobytes(), 0


def decode_round(
    body: bytes,
    request_id: str,
    round_id: str,
    generation: int,
    commit_digest: str,
    previous_processor: str | None = None,
) -> list[dict[str, Any]]:
    """The five events of a round as canonical JSON objects (what ``load(canonical_bytes(event))`` gives).

    ``previous_processor`` is the previous round's ``processor_after`` (needed when the body refers to
    it). ``commit_digest`` is the round's whole commit digest (64 hex) or, as a row written since migration
    0008 keeps it, its first :data:`~specround.adapters.sql.tables.COMMIT_PREFIX_BYTES` bytes: a compact
    body's digest is then rebuilt from its events
    (:func:`~specround.statemachine.commit_record.commit_digest_of_events`: the one that begins with
    them; none does, and the bytes come back padded with ``-``, when the body or the column was edited). An
    empty ``round_id`` stands for the round's derived id
    (:func:`~specround.statemachine.round_ids.derived_round_id`), which a compact body's events then carry;
    a ``RAW`` body's texts carry their own. Raises :class:`~specround.errors.LogIntegrityError` for a body
    that cannot be read.
    """
    try:
        form = body[0]
        if form == RAW:
            return _decode_raw(body)
        if form in (COMPACT2, COMPACT):
            decode = _decode_compact2 if form == COMPACT2 else _decode_compact
            events = decode(body, request_id, round_id, generation, commit_digest, previous_processor)
            if not round_id:  # a derived id, stored as "": rebuilt from the round's coordinate and drafts
                ready = events[0]
                derived = derived_round_id(generation - 1, ready["coordinate_digest"], ready["draft_ids"])
                for event in events:
                    event["round_id"] = derived
            if len(commit_digest) != 64:  # the row keeps the digest's first bytes: rebuilt from the events
                events[4]["commit_digest"] = _full_commit_digest(events, commit_digest)
            return events
    except (IndexError, ValueError, TypeError, KeyError, struct.error) as exc:
        raise LogIntegrityError(
            f"request {request_id!r} round {round_id!r}: unreadable stored round ({exc})"
        ) from exc
    raise LogIntegrityError(f"request {request_id!r} round {round_id!r}: unknown stored round form {form}")


def _full_commit_digest(events: list[dict[str, Any]], prefix: str) -> str:
    """The commit digest of a compact round whose row stores only its first bytes (``prefix``, hex).

    A prefix that begins no commit of the events (an edited body or column) comes back padded with
    ``-``: the rebuilt ``round_published`` event then fails its hash link, and the audit names the edit.
    """
    if len(prefix) != 2 * COMMIT_PREFIX_BYTES:
        raise ValueError(
            f"the stored commit digest holds {len(prefix) // 2} bytes, not {COMMIT_PREFIX_BYTES} or 32"
        )
    digest = commit_digest_of_events(events[0], events[2], events[3], prefix)
    return prefix + _UNRESOLVED_COMMIT if digest is None else digest


_UNRESOLVED_COMMIT = "-" * (64 - 2 * COMMIT_PREFIX_BYTES)
"""Pads a stored commit prefix that begins no commit digest of its round's events."""


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


def _decode_compact(
    body: bytes,
    request_id: str,
    round_id: str,
    generation: int,
    commit_digest: str,
    previous_processor: str | None,
) -> list[dict[str, Any]]:
    codes = body[1]
    small = _SMALL_STRUCTS[codes & 3]
    end = 2 + small.size
    fields = small.unpack_from(body, 2)
    n_drafts, n_q, n_p, mask, t_flag = fields[3], fields[4], fields[7], fields[19], fields[28]
    n_u, n_e, n_c, n_d = fields[20:24]
    # Whole arrays at once (struct reads the encoder's native-order arrays: standard sizes, no padding).
    wide_code = _INT_CODES[codes >> 2 & 3]
    count = 3 + n_drafts + n_e + n_c + n_d
    w = list(_unpack_from(f"={count}{wide_code}", body, end))
    end += count * _ITEM_SIZE[wide_code]
    n_masses = bin(mask >> _FIRST_MASS).count("1")
    n_drawn = bin(mask & ((1 << _FIRST_MASS) - 1)).count("1")
    first_code = "f" if codes & 16 else "d"
    count = n_q + n_p + n_masses
    p = list(_unpack_from(f"={count}{first_code}", body, end))
    end += count * _ITEM_SIZE[first_code]
    second_code = "f" if codes & 32 else "d"
    count = n_u + n_drawn + 4 * t_flag
    f = list(_unpack_from(f"={count}{second_code}", body, end))
    end += count * _ITEM_SIZE[second_code]
    if codes > 63:
        raise ValueError("the stored round's type codes are out of range")
    return _events(
        fields, w, p, f, body[end:].hex(), request_id, round_id, generation, commit_digest, previous_processor
    )


def _decode_compact2(
    body: bytes,
    request_id: str,
    round_id: str,
    generation: int,
    commit_digest: str,
    previous_processor: str | None,
) -> list[dict[str, Any]]:
    flags = body[1]
    bitmap = int.from_bytes(body[2:6], "little")
    if bitmap >> SMALL_FIELDS:
        raise ValueError("the stored round's flags are out of range")
    residuals, end = _read_varints(body, 6, bitmap.bit_count())
    fields = [0] * SMALL_FIELDS
    rest = bitmap
    for residual in residuals:
        low = rest & -rest
        fields[low.bit_length() - 1] = residual
        rest ^= low
    _shift(fields, fields, 1)
    n_drafts, n_q, n_p, accepted = fields[3], fields[4], fields[7], fields[9]
    mask, n_u, n_e, n_c, n_d, t_flag = fields[19], fields[20], fields[21], fields[22], fields[23], fields[28]
    if min(n_drafts, n_q, n_p, n_u, n_e, n_c, n_d) < 0:
        raise ValueError("the stored round has a negative count")
    emitted_derived, kv_derived = flags & _EMITTED_DERIVED, flags & _KV_DERIVED
    micros = flags & _TIMINGS_MICROS
    if micros and not t_flag:
        raise ValueError("the stored round's timing flag does not match its timings")
    count = (
        3
        + n_drafts
        + (n_e - accepted if emitted_derived else n_e)
        + (n_c - accepted if kv_derived else n_c + n_d)
    )
    if micros:
        count += len(_TIMINGS)
    if (emitted_derived or kv_derived) and not 0 <= accepted <= min(
        n_drafts, n_e if emitted_derived else n_c
    ):
        raise ValueError("the stored round's derived token lists do not fit its counts")
    stored, end = _read_varints(body, end, count)
    drafts = stored[3 : 3 + n_drafts]
    at = 3 + n_drafts
    if emitted_derived:
        emitted = drafts[:accepted] + stored[at : at + n_e - accepted]
        at += n_e - accepted
    else:
        emitted = stored[at : at + n_e]
        at += n_e
    if kv_derived:
        if n_d != n_drafts - accepted:
            raise ValueError("the stored round's derived token lists do not fit its counts")
        tokens = stored[at : at + n_c - accepted] + drafts[:accepted] + drafts[accepted:]
    else:
        tokens = stored[at : at + n_c + n_d]
    w = stored[: 3 + n_drafts] + emitted + tokens
    n_masses = (mask >> _FIRST_MASS).bit_count()
    tq_zero = bool(flags & _TQ_ZERO)
    tp_same = bool(flags & _TP_SAME)
    if (tq_zero and not mask >> 5 & 1) or (tp_same and mask >> 3 & 3 != 3):
        raise ValueError("the stored round's float flags do not match its optional floats")
    first_code = "d" if not flags & _FIRST_NARROW else "f"
    count = n_q + n_p + n_masses - (1 if tq_zero else 0) - (1 if tp_same else 0)
    p = list(_unpack_from(f"={count}{first_code}", body, end))
    end += count * _ITEM_SIZE[first_code]
    second_code = "d" if not flags & _SECOND_NARROW else "f"
    count = n_u + (mask & ((1 << _FIRST_MASS) - 1)).bit_count() + (0 if micros else 4 * t_flag)
    f = list(_unpack_from(f"={count}{second_code}", body, end))
    end += count * _ITEM_SIZE[second_code]
    if micros:
        f += [count / _MICRO for count in stored[-len(_TIMINGS) :]]
    if tp_same:
        p.insert(n_q + n_p, f[n_u + (mask & 7).bit_count()])
    if tq_zero:
        p.append(0.0)
    hexes = body[end:].hex()
    if flags & _AFTER_SAME:
        if len(hexes) < (64 if fields[29] else 128):
            raise ValueError("the stored round's digests do not match its flags")
        before = previous_processor if fields[29] else hexes[-128:-64]
        if before is None:
            raise ValueError("the round refers to a previous round's processor digest that is not there")
        hexes = hexes[:-64] + before + hexes[-64:]  # processor_after, before successor_digest
    return _events(
        tuple(fields), w, p, f, hexes, request_id, round_id, generation, commit_digest, previous_processor
    )


def _events(
    fields: Sequence[int],
    w: list[int],
    p: list[float],
    f: list[float],
    hexes: str,
    request_id: str,
    round_id: str,
    generation: int,
    commit_digest: str,
    previous_processor: str | None,
) -> list[dict[str, Any]]:
    """The five events from a compact body's small fields, integers, floats and digests (hex)."""
    (
        expected_delta,
        before_delta,
        after_delta,
        n_drafts,
        n_q,
        q_flag,
        verify_rows,
        n_p,
        p_flag,
        accepted,
        terminal,
        counter_delta,
        accept_draws,
        terminal_delta,
        terminal_draws,
        row,
        degenerate,
        finished,
        reason,
        mask,
        n_u,
        n_e,
        n_c,
        n_d,
        moved0,
        moved1,
        moved2,
        generation_delta,
        t_flag,
        reference,
    ) = fields
    n_digests = 3 + q_flag + p_flag + (0 if reference else 1)
    if len(hexes) != 64 * n_digests or len(w) != 3 + n_drafts + n_e + n_c + n_d:
        raise ValueError("the stored round's digests do not match its flags")
    if reference and previous_processor is None:
        raise ValueError("the round refers to a previous round's processor digest that is not there")
    rng_before = w[0:3]
    at = 3
    drafts = w[at : at + n_drafts]
    at += n_drafts
    emitted = w[at : at + n_e]
    at += n_e
    committed = w[at : at + n_c]
    at += n_c
    discarded = w[at : at + n_d]
    rng_after = [rng_before[0] + moved0, rng_before[1] + moved1, rng_before[2] + moved2]
    d = 64
    ready = {
        "kind": "round_ready",
        "schema_version": _SCHEMA_VERSION,
        "request_id": request_id,
        "round_id": round_id,
        "expected_generation": generation - 1 - expected_delta,
        "coordinate_digest": hexes[0:64],
        "draft_ids": drafts,
        "q_draft": p[0:n_q],
        "proposal_before": rng_before[0] + before_delta,
        "proposal_after": rng_after[0] + after_delta,
        "q_rows_digest": None,
    }
    if q_flag:
        ready["q_rows_digest"] = hexes[d : d + 64]
        d += 64
    y = n_q + n_p
    verified = {
        "kind": "round_verified",
        "schema_version": _SCHEMA_VERSION,
        "request_id": request_id,
        "round_id": round_id,
        "p_draft": p[n_q:y],
        "verify_rows": verify_rows,
        "p_rows_digest": None,
    }
    if p_flag:
        verified["p_rows_digest"] = hexes[d : d + 64]
        d += 64
    decided = {
        "kind": "round_decided",
        "schema_version": _SCHEMA_VERSION,
        "request_id": request_id,
        "round_id": round_id,
        "accepted": accepted,
        "terminal": _TERMINALS[terminal],
        "emitted_ids": emitted,
        "accept_counter": rng_before[1] + counter_delta,
        "accept_draws": accept_draws,
        "accept_uniforms": f[0:n_u],
        "terminal_counter": rng_before[2] + terminal_delta,
        "terminal_draws": terminal_draws,
        "terminal_row": row - 1 if row else None,
        "degenerate_correction": degenerate == 1,
        "finished": finished == 1,
        "finish_reason": _REASONS[reason],
    }
    x = n_u
    for bit, name in enumerate(_OPTIONAL_FLOATS):
        if not mask >> bit & 1:
            decided[name] = None
        elif bit >= _FIRST_MASS:
            decided[name] = p[y]
            y += 1
        else:
            decided[name] = f[x]
            x += 1
    if reference:
        before = previous_processor
    else:
        before = hexes[d : d + 64]
        d += 64
    staged = {
        "kind": "round_staged",
        "schema_version": _SCHEMA_VERSION,
        "request_id": request_id,
        "round_id": round_id,
        "committed_kv_ids": committed,
        "discarded_kv_ids": discarded,
        "rng_before": rng_before,
        "rng_after": rng_after,
        "processor_before": before,
        "processor_after": hexes[d : d + 64],
        "successor_digest": hexes[d + 64 : d + 128],
    }
    published = {
        "kind": "round_published",
        "schema_version": _SCHEMA_VERSION,
        "request_id": request_id,
        "round_id": round_id,
        "generation": generation - generation_delta,
        "commit_digest": commit_digest,
        "timings": dict(zip(_TIMINGS, f[x : x + 4], strict=True)) if t_flag else None,
    }
    if len(f) != x + 4 * t_flag or len(p) != y or mask >> len(_OPTIONAL_FLOATS):
        raise ValueError("the stored round has values left over")
    return [ready, verified, decided, staged, published]
