"""The round coordinate: every field is bound into the digest, and a proposal or verification
computed under a coordinate that differs in any one field is refused.

Contract: contract#round-coordinate, contract#layout-snapshot, contract#stale-coordinate.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from specround.errors import StaleCoordinateError
from specround.sampling.coordinate import (
    BackendIdentity,
    RoundCoordinate,
    coordinate_diff,
    prefix_digest,
    require_coordinate,
)
from specround.sampling.processors import sampling_chain
from specround.sampling.types import Layout

CONDITIONING = [1, 4, 7, 9, 3, 12]  # contract#layout-snapshot


def snapshot() -> RoundCoordinate:
    """The worked snapshot of contract#layout-snapshot as a coordinate."""
    return RoundCoordinate(
        request_id="req-1",
        target_model_id="target@sha256:aa",
        draft_model_id="draft@sha256:bb",
        backend=BackendIdentity(
            dtype="float32", attention_path="sdpa-mask", software_revision="torch 2.13.0"
        ),
        target_processors_digest=sampling_chain(16, temperature=0.8).config_digest(),
        draft_processors_digest=sampling_chain(16, temperature=1.0).config_digest(),
        vocab_size=16,
        vocab_digest="vocab-16",
        rng_seed=1234,
        rng_counters=(6, 2, 1),
        layout=Layout.REPLAY_FRONTIER,
        prefix_digest=prefix_digest(CONDITIONING),
        cache_length=5,
        frontier_position=5,
        generation=3,
    )


# One single-field mutation per field (dotted names for the nested backend identity).
MUTATIONS: dict[str, Any] = {
    "request_id": "req-2",
    "target_model_id": "target@sha256:ab",
    "draft_model_id": "ngram:3",
    "backend.dtype": "bfloat16",
    "backend.attention_path": "eager-causal",
    "backend.software_revision": "torch 2.13.1",
    "target_processors_digest": sampling_chain(16, temperature=0.8, top_k=5).config_digest(),
    "draft_processors_digest": sampling_chain(16, temperature=0.0).config_digest(),
    "vocab_size": 17,
    "vocab_digest": "vocab-16-remapped",
    "rng_seed": 1235,
    "rng_streams": (0, 1, 3),
    "rng_counters": (6, 3, 1),
    "layout": Layout.RETAINED_FRONTIER,
    "prefix_digest": prefix_digest([1, 4, 7, 9, 3, 11]),
    "cache_length": 6,
    "frontier_position": 6,
    "generation": 4,
}


def mutate(coordinate: RoundCoordinate, field: str, value: Any) -> RoundCoordinate:
    data = coordinate.model_dump()
    if "." in field:
        outer, inner = field.split(".")
        data[outer][inner] = value
    else:
        data[field] = value
    return RoundCoordinate.model_validate(data)


def test_mutations_cover_every_field() -> None:
    names = {name for name in RoundCoordinate.model_fields if name != "backend"}
    names |= {f"backend.{inner}" for inner in BackendIdentity.model_fields}
    assert names == set(MUTATIONS)


@pytest.mark.parametrize("field", list(MUTATIONS))
def test_each_field_changes_the_digest_and_stales_old_results(field: str) -> None:
    base = snapshot()
    changed = mutate(base, field, MUTATIONS[field])
    assert coordinate_diff(base, changed) == [field]
    assert changed.digest() != base.digest()
    assert changed.canonical_bytes() != base.canonical_bytes()
    # A verification computed under the old coordinate carries the old digest: refused.
    with pytest.raises(StaleCoordinateError, match="verification"):
        require_coordinate(changed, base.digest(), "verification")
    # Offered as a coordinate, the refusal names the differing field.
    with pytest.raises(StaleCoordinateError, match=rf"proposal .*: {field} is"):
        require_coordinate(changed, base, "proposal")
    require_coordinate(changed, changed.digest(), "verification")  # the current one is accepted
    require_coordinate(changed, mutate(base, field, MUTATIONS[field]), "proposal")


def test_digest_is_canonical_and_stable() -> None:
    a, b = snapshot(), snapshot()
    assert a.digest() == b.digest()
    assert RoundCoordinate.model_validate_json(a.model_dump_json()).digest() == a.digest()
    assert a.canonical_bytes().startswith(b'{"backend":{')  # sorted keys, compact
    with pytest.raises(ValidationError):
        a.generation = 9  # type: ignore[misc]


def test_prefix_digest_binds_token_identity_and_order() -> None:
    assert prefix_digest(CONDITIONING) == prefix_digest(tuple(CONDITIONING))
    assert prefix_digest(CONDITIONING) != prefix_digest(CONDITIONING[::-1])
    assert prefix_digest(CONDITIONING) != prefix_digest(CONDITIONING[:-1])


def test_multiple_differences_are_all_listed() -> None:
    base = snapshot()
    other = mutate(mutate(base, "layout", Layout.RETAINED_FRONTIER), "cache_length", 6)
    assert coordinate_diff(base, other) == ["layout", "cache_length"]
    with pytest.raises(StaleCoordinateError, match=r"layout is .*\(also differs: cache_length\)"):
        require_coordinate(base, other, "verification")


@pytest.mark.parametrize(
    "change",
    [
        {"rng_counters": (1, 2)},
        {"rng_counters": (1, 2, -1)},
        {"rng_streams": (0, 0, 1)},
        {"vocab_size": 0},
        {"cache_length": -1},
        {"layout": "tree"},
        {"extra": 1},
    ],
)
def test_malformed_coordinates_are_refused(change: dict[str, Any]) -> None:
    data = snapshot().model_dump() | change
    with pytest.raises(ValidationError):
        RoundCoordinate.model_validate(data)
