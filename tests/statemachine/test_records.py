"""Fast record construction and canonical bytes equal the validated, canonical forms."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from specround.canonical import canonical_bytes, digest
from specround.sampling.types import Layout
from specround.statemachine.events import (
    RoundDecided,
    RoundPublished,
    RoundReady,
    RoundStaged,
    RoundTimings,
    RoundVerified,
)
from specround.statemachine.records import assemble, record_bytes, record_digest, register_record
from specround.statemachine.state import RequestState, RngCounters, SpeculativeCommit

IDS = {"request_id": "r-ü", "round_id": "g1-0123456789abcdef"}
SAMPLES: list[tuple[type[BaseModel], dict[str, Any]]] = [
    (RngCounters, {"proposal": 3, "accept": 2**40, "terminal": 0}),
    (
        RequestState,
        {
            "request_id": "r",
            "output": (1, 2, 3),
            "prompt_len": 2,
            "cache": (1, 2),
            "frontier": 3,
            "position": 2,
            "processors": ({"kind": "temperature", "params": {"temperature": 0.5}, "state": {}},),
            "processors_digest": "p" * 64,
            "rng": RngCounters(proposal=1),
            "generation": 4,
            "finished": True,
            "finish_reason": "length",
        },
    ),
    (
        SpeculativeCommit,
        {
            **IDS,
            "expected_generation": 3,
            "layout": Layout.RETAINED_FRONTIER,
            "accepted_draft_count": 1,
            "terminal_kind": "correction",
            "emitted_token_ids": (5, 9),
            "committed_kv_token_ids": (3, 5),
            "discarded_kv_token_ids": (6,),
            "rng_before": (0, 1, 2),
            "rng_after": (2, 3, 3),
            "processor_before_hash": "a" * 64,
            "processor_after_hash": "b" * 64,
            "finished": False,
            "finish_reason": None,
            "coordinate_digest": "c" * 64,
            "successor_digest": "d" * 64,
        },
    ),
    (
        RoundReady,
        {
            **IDS,
            "expected_generation": 0,
            "coordinate_digest": "c" * 64,
            "draft_ids": (1, 2),
            "q_draft": (1e-05, 0.1),
            "proposal_before": 0,
            "proposal_after": 2,
        },
    ),
    (RoundVerified, {**IDS, "p_draft": (1e16, 5e-324), "verify_rows": 3, "p_rows_digest": "e" * 64}),
    (
        RoundDecided,
        {
            **IDS,
            "accepted": 1,
            "terminal": "correction",
            "emitted_ids": (1, 7),
            "accept_counter": 4,
            "accept_draws": 2,
            "accept_uniforms": (0.25, 0.9999999999999999),
            "terminal_counter": 1,
            "terminal_draws": 1,
            "terminal_uniform": 0.5,
            "terminal_row": 1,
            "residual_mass": 0.3,
            "terminal_mass_before": 0.0,
            "terminal_token_mass": 0.3,
            "terminal_p": 0.4,
            "terminal_q": 0.1,
            "finished": False,
        },
    ),
    (
        RoundStaged,
        {
            **IDS,
            "committed_kv_ids": (3, 1),
            "discarded_kv_ids": (2,),
            "processor_before": "a" * 64,
            "processor_after": "a" * 64,
            "rng_before": (0, 0, 0),
            "rng_after": (2, 2, 1),
            "successor_digest": "s" * 64,
        },
    ),
    (
        RoundPublished,
        {
            **IDS,
            "generation": 1,
            "commit_digest": "x" * 64,
            "timings": RoundTimings(draft_s=0.5, verify_s=1.25),
        },
    ),
    (RoundTimings, {"draft_s": 0.0, "verify_s": 2.5}),
]


@pytest.mark.parametrize(("cls", "values"), SAMPLES, ids=[cls.__name__ for cls, _ in SAMPLES])
def test_assemble_equals_validated_construction(cls: type[BaseModel], values: dict[str, Any]) -> None:
    fast = assemble(cls, dict(values))
    slow = cls(**values)
    assert fast == slow
    assert fast.model_dump() == slow.model_dump()
    assert record_bytes(fast) == canonical_bytes(slow)
    assert record_digest(fast) == digest(slow)


def test_assembled_records_share_one_fields_set_that_copies_never_touch() -> None:
    """Every assembled instance has every field set; the set is shared, and a copy with an update (the only
    pydantic path that writes a fields set of a frozen record) changes its own copy, not the shared one."""
    first = assemble(RngCounters, {"proposal": 1, "accept": 2, "terminal": 3})
    second = assemble(RngCounters, {"proposal": 4, "accept": 5, "terminal": 6})
    assert first.model_fields_set is second.model_fields_set
    assert first.model_fields_set == set(RngCounters.model_fields)
    shared = set(first.model_fields_set)
    copied = first.model_copy(update={"accept": 9})
    assert copied.accept == 9 and copied.model_fields_set is not first.model_fields_set
    assert first.model_fields_set == shared and first.accept == 2


def test_commit_digest_is_the_canonical_digest() -> None:
    cls, values = SAMPLES[2]
    commit = cls(**values)
    assert isinstance(commit, SpeculativeCommit)
    assert commit.digest() == digest(commit)


def test_register_refuses_records_that_plain_construction_cannot_build() -> None:
    from pydantic import Field, PrivateAttr

    class Aliased(BaseModel):
        value: int = Field(alias="v")

    class Private(BaseModel):
        value: int
        _hidden: int = PrivateAttr(0)

    class Factory(BaseModel):
        values: list[int] = Field(default_factory=list)

    for cls in (Aliased, Private, Factory):
        with pytest.raises(TypeError):
            register_record(cls)
