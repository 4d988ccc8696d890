"""The stored body of a round gives back each event's canonical bytes exactly, or keeps the JSON text."""

from __future__ import annotations

from typing import Any

import pytest

from specround.adapters.sql.round_body import COMPACT, RAW, decode_round, encode_round, raw_payloads
from specround.canonical import canonical_bytes, dumps_trusted, load
from specround.errors import LogIntegrityError
from specround.statemachine.ports import RoundPublication
from tests.adapters.synthetic_rounds import make_config, open_request, run_rounds


def _rounds(count: int = 3) -> list[RoundPublication]:
    config = make_config("req-body", max_new_tokens=40)
    _, state = open_request(config)
    return [publication for publication, _ in run_rounds(config, state, count)]


def _encode(
    pub: RoundPublication, values: list[dict[str, Any]] | None = None, previous: str | None = None
) -> bytes:
    payloads = [canonical_bytes(event) for event in pub.events()]
    events = values if values is not None else [event.__dict__ for event in pub.events()]
    return encode_round(
        events,
        pub.request_id,
        pub.round_id,
        pub.expected_generation + 1,
        pub.commit_digest,
        payloads,
        previous,
    )


def _decode(pub: RoundPublication, body: bytes, previous: str | None = None) -> list[bytes]:
    events = decode_round(
        body, pub.request_id, pub.round_id, pub.expected_generation + 1, pub.commit_digest, previous
    )
    return [dumps_trusted(event) for event in events]


def test_record_values_and_json_objects_encode_to_the_same_compact_body() -> None:
    for pub in _rounds():
        payloads = [canonical_bytes(event) for event in pub.events()]
        body = _encode(pub)
        assert body[0] == COMPACT and len(body) < sum(map(len, payloads)) // 3
        assert _decode(pub, body) == payloads
        assert _encode(pub, [load(p) for p in payloads]) == body


def test_processor_before_is_a_reference_to_the_previous_round() -> None:
    first, second, _ = _rounds()
    previous = first.staged.processor_after
    assert second.staged.processor_before == previous
    full, short = _encode(second), _encode(second, previous=previous)
    assert len(short) == len(full) - 32
    assert _decode(second, short, previous) == _decode(second, full)
    with pytest.raises(LogIntegrityError, match="unreadable"):
        _decode(second, short)  # the reference cannot be resolved without the previous round
    other = "ab" * 32
    assert _encode(second, previous=other) == full  # no reference to a digest that differs


@pytest.mark.parametrize(
    ("kind", "field", "value"),
    [
        ("round_decided", "residual_mass", 1),  # an int where a float is expected: "1", not "1.0"
        ("round_decided", "terminal_row", True),  # a bool would come back as an int
        ("round_ready", "coordinate_digest", "AB" * 32),  # uppercase hex would come back lowercase
        ("round_decided", "terminal", "other"),  # no code for an unknown terminal
        ("round_ready", "schema_version", 0),  # another schema version
    ],
)
def test_values_the_compact_form_cannot_restore_are_kept_as_json(kind: str, field: str, value: Any) -> None:
    pub = _rounds(1)[0]
    values = [load(canonical_bytes(event)) for event in pub.events()]
    target = next(v for v in values if v["kind"] == kind)
    target[field] = value
    payloads = [dumps_trusted(v) for v in values]
    body = encode_round(
        values, pub.request_id, pub.round_id, pub.expected_generation + 1, pub.commit_digest, payloads
    )
    assert body[0] == RAW and raw_payloads(body) == payloads
    assert _decode(pub, body) == payloads


def test_float32_values_are_stored_in_four_bytes() -> None:
    pub = _rounds(1)[0]
    values = [load(canonical_bytes(event)) for event in pub.events()]
    wide = list(values)
    wide[0] = {**values[0], "q_draft": [v + 1e-12 for v in values[0]["q_draft"]]}  # not float32-exact
    narrow_body = _encode(pub, values)
    wide_body = _encode(pub, wide)
    assert narrow_body[1] & 16 and not wide_body[1] & 16  # the probabilities; the uniforms stay float64
    assert len(wide_body) > len(narrow_body)


@pytest.mark.parametrize("body", [b"", b"\x07abc", b"\x01\x00\x01", b"\x02\x05\x00\x00\x00{}"])
def test_an_unreadable_body_is_an_integrity_error(body: bytes) -> None:
    pub = _rounds(1)[0]
    with pytest.raises(LogIntegrityError):
        _decode(pub, body)
