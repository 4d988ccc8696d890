"""The canonical form's floats: exact round trip, NaN and infinities refused on every encoding path."""

from __future__ import annotations

import json
import math
import random
import struct

import pytest

from specround.canonical import canonical_bytes, load
from specround.statemachine.events import RoundDecided, RoundPublished, RoundTimings, RoundVerified
from specround.statemachine.records import assemble, record_bytes, record_digest_of
from specround.statemachine.state import SpeculativeCommit

IDS = {"request_id": "r", "round_id": "g1-0"}


def test_floats_round_trip_bit_for_bit() -> None:
    rng = random.Random(0)  # random bit patterns cover subnormals, huge and tiny exponents, -0.0
    values = [0.1, 1e-7, 1e16, -0.0, 5e-324, 1.7976931348623157e308, 1 / 3]
    while len(values) < 20_000:
        (value,) = struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))
        if math.isfinite(value):
            values.append(value)
    data = canonical_bytes({"v": values})
    for parsed in (load(data)["v"], json.loads(data)["v"]):
        assert [struct.pack("<d", x) for x in parsed] == [struct.pack("<d", x) for x in values]
    assert canonical_bytes(load(data)) == data  # decoding and re-encoding is stable


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_canonical_bytes_refuses_non_finite_floats(bad: float) -> None:
    for value in (bad, [1.0, bad], {"a": {"b": (bad,)}}, {"a": None, "b": bad}):
        with pytest.raises(ValueError):
            canonical_bytes(value)


def _decided(**overrides: object) -> RoundDecided:
    values = {
        **IDS,
        "accepted": 1,
        "terminal": "correction",
        "emitted_ids": (3, 4),
        "accept_counter": 0,
        "accept_draws": 2,
        "accept_uniforms": (0.25, 0.75),
        "terminal_counter": 0,
        "terminal_draws": 1,
        "terminal_uniform": 0.5,
        "terminal_row": 1,
        "residual_mass": 0.3,
        "terminal_mass_before": 0.1,
        "terminal_token_mass": 0.05,
        "terminal_p": 0.2,
        "terminal_q": 0.1,
        "finished": False,
        **overrides,
    }
    return assemble(RoundDecided, values)


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_record_bytes_refuses_non_finite_floats_in_every_kind_of_field(bad: float) -> None:
    assert record_bytes(_decided()) == canonical_bytes(_decided())
    with pytest.raises(ValueError, match="terminal_uniform"):
        record_bytes(_decided(terminal_uniform=bad))  # a scalar float field
    with pytest.raises(ValueError, match="accept_uniforms"):
        record_bytes(_decided(accept_uniforms=(0.25, bad)))  # a tuple of floats
    with pytest.raises(ValueError, match="p_draft"):
        record_bytes(assemble(RoundVerified, {**IDS, "p_draft": (bad,), "verify_rows": 2}))
    timings = assemble(RoundTimings, {"draft_s": 0.0, "verify_s": bad, "state_s": 0.0, "queue_s": 0.0})
    with pytest.raises(ValueError, match="timings"):  # a nested model
        record_bytes(
            assemble(RoundPublished, {**IDS, "generation": 1, "commit_digest": "c", "timings": timings})
        )


def test_record_digest_of_equals_the_record_digest() -> None:
    values = {
        **IDS,
        "expected_generation": 0,
        "layout": "replay_frontier",
        "accepted_draft_count": 0,
        "terminal_kind": "bonus",
        "emitted_token_ids": (1,),
        "committed_kv_token_ids": (0,),
        "discarded_kv_token_ids": (),
        "rng_before": (0, 0, 0),
        "rng_after": (0, 0, 1),
        "processor_before_hash": "a",
        "processor_after_hash": "a",
        "finished": False,
        "finish_reason": None,
        "coordinate_digest": "c",
        "successor_digest": "s",
    }
    assert record_digest_of(SpeculativeCommit, values) == SpeculativeCommit(**values).digest()
