"""The stored body of a round gives back each event's canonical bytes exactly, or keeps the JSON text."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

from specround.adapters.sql.round_body import COMPACT, COMPACT2, RAW, decode_round, encode_round, raw_payloads
from specround.canonical import canonical_bytes, dumps_trusted, load
from specround.errors import LogIntegrityError
from specround.statemachine.events import whole_microseconds
from specround.statemachine.ports import RoundPublication
from tests.adapters.synthetic_rounds import make_config, open_request, run_rounds


def _rounds(count: int = 3) -> list[RoundPublication]:
    config = make_config("req-body", max_new_tokens=40)
    _, state = open_request(config)
    return [publication for publication, _ in run_rounds(config, state, count)]


def _encode(
    pub: RoundPublication,
    values: list[dict[str, Any]] | None = None,
    previous: str | None = None,
    form: int = COMPACT2,
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
        form,
    )


def _decode(pub: RoundPublication, body: bytes, previous: str | None = None) -> list[bytes]:
    events = decode_round(
        body, pub.request_id, pub.round_id, pub.expected_generation + 1, pub.commit_digest, previous
    )
    return [dumps_trusted(event) for event in events]


@pytest.mark.parametrize("form", [COMPACT, COMPACT2])
def test_record_values_and_json_objects_encode_to_the_same_compact_body(form: int) -> None:
    for pub in _rounds():
        payloads = [canonical_bytes(event) for event in pub.events()]
        body = _encode(pub, form=form)
        assert body[0] == form and len(body) < sum(map(len, payloads)) // 3
        assert _decode(pub, body) == payloads
        assert _encode(pub, [load(p) for p in payloads], form=form) == body


def test_compact2_is_smaller_than_compact() -> None:
    for pub in _rounds(6):
        assert len(_encode(pub)) < len(_encode(pub, form=COMPACT)) - 40


@pytest.mark.parametrize("form", [COMPACT, COMPACT2])
def test_processor_before_is_a_reference_to_the_previous_round(form: int) -> None:
    first, second, _ = _rounds()
    previous = first.staged.processor_after
    assert second.staged.processor_before == previous
    full, short = _encode(second, form=form), _encode(second, previous=previous, form=form)
    assert len(short) == len(full) - (32 if form == COMPACT else 31)  # COMPACT2: one byte for the flag
    assert _decode(second, short, previous) == _decode(second, full)
    with pytest.raises(LogIntegrityError, match="unreadable"):
        _decode(second, short)  # the reference cannot be resolved without the previous round
    other = "ab" * 32
    assert _encode(second, previous=other, form=form) == full  # no reference to a digest that differs


def _edited(pub: RoundPublication, kind: str, **changes: Any) -> list[dict[str, Any]]:
    values = [load(canonical_bytes(event)) for event in pub.events()]
    target = next(v for v in values if v["kind"] == kind)
    target.update(changes)
    return values


@pytest.mark.parametrize(
    ("kind", "changes"),
    [
        ("round_staged", {"processor_after": "cd" * 32}),  # a processor that moved
        ("round_decided", {"terminal_q": 0.25}),  # a terminal q that is not zero
        ("round_decided", {"terminal_q": -0.0}),  # minus zero is not zero
        ("round_decided", {"terminal_p": 0.125}),  # a terminal p that is not the token's mass
        ("round_decided", {"emitted_ids": [7, 8, 9]}),  # emitted tokens that are not the accepted drafts
        ("round_staged", {"committed_kv_ids": [5]}),  # committed tokens that are not the accepted drafts
        ("round_staged", {"discarded_kv_ids": [1, 2, 3, 4, 5, 6]}),
        ("round_staged", {"rng_before": [1 << 40, -3, 0]}),  # wide and negative integers
        ("round_ready", {"expected_generation": -7}),  # a small field far from its prediction
        ("round_decided", {"accepted": 9}),  # more accepted than drafts: nothing is derived
    ],
)
def test_compact2_keeps_values_that_do_not_follow_the_derived_pattern(kind: str, changes: Any) -> None:
    for pub in _rounds(3):
        values = _edited(pub, kind, **changes)
        payloads = [dumps_trusted(v) for v in values]
        body = _encode(pub, values)
        assert body[0] == COMPACT2
        assert _decode(pub, body) == payloads


def test_every_cut_or_flipped_compact2_body_is_refused_or_read_without_other_errors() -> None:
    pub = _rounds(2)[1]
    body = _encode(pub)
    for end in range(len(body)):
        with pytest.raises(LogIntegrityError):
            _decode(pub, body[:end])
    for at in range(len(body)):
        for bit in (1, 128):
            flipped = body[:at] + bytes((body[at] ^ bit,)) + body[at + 1 :]
            with contextlib.suppress(LogIntegrityError):  # read (the chain judges it) or refused
                _decode(pub, flipped)


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


@pytest.mark.parametrize(("form", "bit"), [(COMPACT, 16), (COMPACT2, 32)])
def test_float32_values_are_stored_in_four_bytes(form: int, bit: int) -> None:
    pub = _rounds(1)[0]
    values = [load(canonical_bytes(event)) for event in pub.events()]
    wide = list(values)
    wide[0] = {**values[0], "q_draft": [v + 1e-12 for v in values[0]["q_draft"]]}  # not float32-exact
    narrow_body = _encode(pub, values, form=form)
    wide_body = _encode(pub, wide, form=form)
    assert narrow_body[1] & bit and not wide_body[1] & bit  # the probabilities; the uniforms stay float64
    assert len(wide_body) > len(narrow_body)


@pytest.mark.parametrize(
    "body",
    [b"", b"\x07abc", b"\x01\x00\x01", b"\x02\x05\x00\x00\x00{}", b"\x03\x80", b"\x03\x00\xff\xff\xff\xff"],
)
def test_an_unreadable_body_is_an_integrity_error(body: bytes) -> None:
    pub = _rounds(1)[0]
    with pytest.raises(LogIntegrityError):
        _decode(pub, body)


def _with_timings(pub: RoundPublication, **timings: float) -> list[dict[str, Any]]:
    seconds = {"draft_s": 0.0, "queue_s": 0.0, "state_s": 0.0, "verify_s": 0.0, **timings}
    return _edited(pub, "round_published", timings=seconds)


def test_timings_in_whole_microseconds_are_stored_as_integers() -> None:
    for pub in _rounds(2):
        whole = _with_timings(
            pub,
            draft_s=whole_microseconds(0.0123456789),
            verify_s=whole_microseconds(1.5),
            state_s=whole_microseconds(3.2e-5),
        )
        fine = _with_timings(pub, draft_s=0.0123456789, verify_s=1.5, state_s=3.2e-5)
        whole_body, fine_body = _encode(pub, whole), _encode(pub, fine)
        assert whole_body[1] & 128 and not fine_body[1] & 128
        assert len(whole_body) <= len(fine_body) - 20  # four float64 (32 bytes) against a few varints
        assert _decode(pub, whole_body) == [dumps_trusted(v) for v in whole]
        assert _decode(pub, fine_body) == [dumps_trusted(v) for v in fine]


@pytest.mark.parametrize("odd", [-0.0, 1e-7, 2.0**32, 0.12345678])
def test_timings_that_are_not_whole_microseconds_stay_floats(odd: float) -> None:
    pub = _rounds(1)[0]
    values = _with_timings(pub, verify_s=0.25, queue_s=odd)
    body = _encode(pub, values)
    assert body[0] == COMPACT2 and not body[1] & 128
    assert _decode(pub, body) == [dumps_trusted(v) for v in values]


def test_the_microsecond_flag_without_timings_is_refused() -> None:
    pub = _rounds(1)[0]
    body = _encode(pub)
    assert not body[1] & 128
    with pytest.raises(LogIntegrityError, match="timing flag"):
        _decode(pub, body[:1] + bytes((body[1] | 128,)) + body[2:])


def test_recorded_timings_are_whole_microseconds() -> None:
    from specround.serving.step_timings import RoundWork, StepTimes, share_out

    times = StepTimes(draft_s=0.0123456789, verify_s=0.333333333, frontier_s=0.01, gap_s=1e-9)
    work = [RoundWork(asked=4, computed_rows=5, frontier_rows=1, own_s=2.5e-7), RoundWork(2, 3)]
    for timing in share_out(times, work):
        for value in timing.__dict__.values():
            assert value == whole_microseconds(value) and round(value * 1e6) / 1e6 == value
