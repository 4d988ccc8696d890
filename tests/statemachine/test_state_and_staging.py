"""State digests (fold-based, every field bound) and staging by token identity (INV-1, INV-4, INV-5)."""

from __future__ import annotations

from typing import Any

import pytest

from specround.errors import InvalidRequestError, StagingValidationError
from specround.sampling.processors.grammar import TokenGrammar
from specround.sampling.processors.processor_chain import sampling_chain
from specround.sampling.types import Layout
from specround.statemachine.staging import open_snapshot, stage_kv, stage_successor
from specround.statemachine.state import (
    TOKEN_FOLD_SEED,
    RequestConfig,
    RequestState,
    RngCounters,
    fold_tokens,
    state_digest,
)

BASE: dict[str, Any] = {
    "request_id": "r",
    "output": (1, 2, 3),
    "prompt_len": 2,
    "cache": (1, 2),
    "frontier": 3,
    "position": 2,
    "processors": (),
    "processors_digest": "p" * 64,
    "rng": RngCounters(),
    "generation": 1,
}
CHANGES: dict[str, Any] = {
    "request_id": "s",
    "output": (1, 2, 4),
    "prompt_len": 1,
    "cache": (1, 3),
    "frontier": 4,
    "position": 3,
    "processors": ({"kind": "greedy", "params": {}, "state": {}},),
    "processors_digest": "q" * 64,
    "rng": RngCounters(accept=1),
    "generation": 2,
    "finished": True,
    "finish_reason": "stop",
}


def test_every_field_enters_the_state_digest() -> None:
    base = RequestState(**BASE)
    assert set(CHANGES) == set(RequestState.model_fields)
    digests = {base.digest()}
    for field, value in CHANGES.items():
        changed = base.model_copy(update={field: value})
        digests.add(changed.digest())
    assert len(digests) == len(CHANGES) + 1


def test_the_digest_from_folds_equals_the_digest_from_tokens() -> None:
    state = RequestState(**BASE)
    output_fold = fold_tokens(fold_tokens(TOKEN_FOLD_SEED, (1,)), (2, 3))  # folds extend incrementally
    assert output_fold == fold_tokens(TOKEN_FOLD_SEED, (1, 2, 3))
    assert state_digest(state, output_fold, fold_tokens(TOKEN_FOLD_SEED, (1, 2))) == state.digest()
    assert fold_tokens(TOKEN_FOLD_SEED, (1, 2)) != fold_tokens(TOKEN_FOLD_SEED, (2, 1))


def _config(**overrides: Any) -> RequestConfig:
    values: dict[str, Any] = {
        "request_id": "r",
        "prompt_ids": (1, 2, 3),
        "seed": 0,
        "max_new_tokens": 8,
        "layout": Layout.REPLAY_FRONTIER,
        "vocab_size": 8,
    }
    values.update(overrides)
    return RequestConfig(**values)


def test_open_snapshot_advances_processors_over_the_prompt_unless_told_not_to() -> None:
    chain = sampling_chain(8, presence_penalty=1.0)
    advanced = open_snapshot(_config(processors=chain.to_spec()))
    expected = chain.clone()
    expected.advance_many((1, 2, 3))
    assert advanced.state.processors_digest == expected.digest()
    plain = open_snapshot(_config(processors=chain.to_spec(), prompt_advances_processors=False))
    assert plain.state.processors_digest == chain.digest()
    assert advanced.digest == advanced.state.digest()
    state = advanced.state
    assert (state.cache, state.frontier, state.position) == ((1, 2), 3, 2)


def test_a_grammar_that_refuses_the_prompt_is_refused_at_open() -> None:
    grammar = TokenGrammar(num_states=2, start=0, transitions=[(0, 4, 1), (1, 5, 0)])
    chain = sampling_chain(8, grammar=grammar)
    with pytest.raises(InvalidRequestError):
        open_snapshot(_config(processors=chain.to_spec()))
    assert open_snapshot(_config(processors=chain.to_spec(), prompt_advances_processors=False))


@pytest.mark.parametrize(
    ("drafts", "emitted", "keep", "committed", "discarded"),
    [
        ((5, 6, 7), (9,), 1, (3,), (5, 6, 7)),  # A = 0: the frontier row only
        ((5, 6, 7), (5, 6, 9), 3, (3, 5, 6), (7,)),  # partial
        ((5, 6, 7), (5, 6, 7, 9), 4, (3, 5, 6, 7), ()),  # full + bonus
        ((5, 6, 7), (5, 6), 2, (3, 5), (6, 7)),  # a stop at d_2 ends the request
        ((), (9,), 1, (3,), ()),  # k = 0
    ],
)
def test_stage_kv_commits_frontier_and_accepted_rows_only(
    drafts: tuple[int, ...],
    emitted: tuple[int, ...],
    keep: int,
    committed: tuple[int, ...],
    discarded: tuple[int, ...],
) -> None:
    start = open_snapshot(_config()).state
    kv = stage_kv(start, drafts, emitted)
    assert (kv.keep, kv.committed_token_ids, kv.discarded_token_ids) == (keep, committed, discarded)
    assert kv.discarded_rows == tuple(range(keep, len(drafts) + 1))


def test_stage_kv_refuses_a_correction_that_claims_a_draft_row() -> None:
    start = open_snapshot(_config()).state
    with pytest.raises(StagingValidationError):
        stage_kv(start, (5, 6, 7), (5, 4, 9))  # 4 is not the accepted draft 6
    with pytest.raises(StagingValidationError):
        stage_kv(start, (5,), (5, 6, 7))  # more tokens than drafts + 1
    with pytest.raises(StagingValidationError):
        stage_kv(start, (5,), ())


def test_stage_successor_validates_token_identities_not_lengths() -> None:
    start = open_snapshot(_config())
    rng = RngCounters(accept=2, terminal=1)
    good = stage_successor(start, (5, 9), (3, 5), rng, finished=False, finish_reason=None)
    state = good.state
    assert state.output == (1, 2, 3, 5, 9) and state.cache == (1, 2, 3, 5) and state.frontier == 9
    assert state.generation == 1 and state.rng == rng and good.digest == state.digest()
    # Same lengths, wrong identities: a row of the rejected draft cannot stand in for the correction.
    with pytest.raises(StagingValidationError):
        stage_successor(start, (5, 9), (3, 6), rng, finished=False, finish_reason=None)
    with pytest.raises(StagingValidationError):
        stage_successor(start, (5, 9), (5, 9), rng, finished=False, finish_reason=None)
    with pytest.raises(StagingValidationError):
        stage_successor(start, (5, 9), (3, 5), rng, finished=False, finish_reason="stop")


def test_stage_successor_advances_a_clone_over_emitted_tokens_only() -> None:
    chain = sampling_chain(8, frequency_penalty=0.5)
    start = open_snapshot(_config(processors=chain.to_spec()))
    before = start.chain.digest()
    successor = stage_successor(start, (5, 9 - 2), (3, 5), RngCounters(), finished=False, finish_reason=None)
    assert start.chain.digest() == before  # G_0 untouched
    expected = chain.clone()
    expected.advance_many((1, 2, 3, 5, 7))
    assert successor.state.processors_digest == expected.digest()
