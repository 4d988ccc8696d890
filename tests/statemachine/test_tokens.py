"""A request's token sequences extend in place, and every state still sees exactly its own tokens."""

from __future__ import annotations

import copy
import pickle
import threading
from dataclasses import replace

import pytest

from specround.canonical import canonical_bytes
from specround.statemachine.staging import open_snapshot, stage_successor
from specround.statemachine.state import RequestState, RngCounters
from specround.statemachine.tokens import Tokens
from tests.statemachine.test_state_and_staging import BASE, _config


def test_tokens_behave_as_the_tuple_of_their_ids() -> None:
    tokens = Tokens([4, 5, 6])
    assert tokens == (4, 5, 6) and tokens.__eq__((4, 5, 6)) and tokens == [4, 5, 6] and tokens != (4, 5)
    assert (4, 5, 6).__eq__(tokens) is NotImplemented  # a tuple defers to the Tokens' own equality
    assert len(tokens) == 3 and tokens[0] == 4 and tokens[-1] == 6 and list(tokens) == [4, 5, 6]
    assert tokens[1:] == (5, 6) and isinstance(tokens[1:], tuple) and tokens[::-1] == (6, 5, 4)
    assert list(reversed(tokens)) == [6, 5, 4] and 5 in tokens and tokens.index(6) == 2
    assert hash(tokens) == hash((4, 5, 6)) and repr(tokens) == "(4, 5, 6)"
    assert tokens.__add__((7,)) == (4, 5, 6, 7) and tokens.__radd__((3,)) == (3, 4, 5, 6)
    with pytest.raises(IndexError):
        tokens[3]
    with pytest.raises(IndexError):
        tokens[-4]
    assert pickle.loads(pickle.dumps(tokens)) == tokens and copy.deepcopy(tokens) == tokens


def test_a_slice_of_a_shorter_view_never_reads_past_its_end() -> None:
    base = Tokens(range(10))
    base.extended(range(10, 20))  # the shared list now holds 20 entries
    expected = tuple(range(10))
    bounds = (None, -12, -3, -1, 0, 2, 9, 10, 15)
    for start in bounds:
        for stop in bounds:
            for step in (None, 1, 2, -1, -3):
                assert base[start:stop:step] == expected[start:stop:step], (start, stop, step)


def test_an_extension_leaves_the_shorter_view_as_it_was() -> None:
    base = Tokens([1, 2])
    longer = base.extended([3, 4])
    assert base == (1, 2) and longer == (1, 2, 3, 4)
    # A second extension of the same view (a retry staged from the same state) copies the prefix.
    sibling = base.extended([9])
    assert sibling == (1, 2, 9) and longer == (1, 2, 3, 4) and base == (1, 2)
    assert longer.extended([5]) == (1, 2, 3, 4, 5) and sibling.extended([8]) == (1, 2, 9, 8)
    assert base[-1] == 2 and longer[-1] == 4 and sibling[-1] == 9


def test_extensions_from_many_threads_each_see_their_own_tokens() -> None:
    base = Tokens(range(10))
    barrier = threading.Barrier(4)
    results: dict[int, list[Tokens]] = {}

    def extend(worker: int) -> None:
        barrier.wait()
        results[worker] = [base.extended([100 * worker + i]) for i in range(200)]

    threads = [threading.Thread(target=extend, args=(w,)) for w in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for worker, extended in results.items():
        for i, tokens in enumerate(extended):
            assert tokens == (*range(10), 100 * worker + i)
    assert base == tuple(range(10))


def test_a_state_validates_any_sequence_into_tokens_and_dumps_a_tuple() -> None:
    values = {**BASE, "output": [1, 2, 3]}  # a list validates as well as a tuple
    state = RequestState(**values)
    assert isinstance(state.output, Tokens) and isinstance(state.cache, Tokens)
    assert state.model_dump()["output"] == (1, 2, 3) and '"output":[1,2,3]' in state.model_dump_json()
    assert RequestState.model_validate_json(state.model_dump_json()) == state
    assert canonical_bytes(state) == canonical_bytes(state.model_dump(mode="json"))
    schema = RequestState.model_json_schema()["properties"]["output"]
    assert schema["type"] == "array" and schema["items"] == {"type": "integer"}
    with pytest.raises(ValueError):
        RequestState(**{**values, "output": ["a"]})


def test_staging_twice_from_one_state_keeps_both_successors_apart() -> None:
    start = open_snapshot(_config(vocab_size=16))
    first = stage_successor(start, (5, 9), (3, 5), RngCounters(), finished=False, finish_reason=None)
    retry = stage_successor(start, (7,), (3,), RngCounters(), finished=False, finish_reason=None)
    after_first = stage_successor(first, (4,), (9,), RngCounters(), finished=False, finish_reason=None)
    assert start.state.output == (1, 2, 3) and start.state.cache == (1, 2)
    assert first.state.output == (1, 2, 3, 5, 9) and first.state.cache == (1, 2, 3, 5)
    assert retry.state.output == (1, 2, 3, 7) and retry.state.cache == (1, 2, 3)
    assert after_first.state.output == (1, 2, 3, 5, 9, 4) and after_first.state.cache == (1, 2, 3, 5, 9)
    for snapshot in (start, first, retry, after_first):
        assert snapshot.digest == snapshot.state.digest()


def test_staging_from_a_state_built_without_validation_starts_its_own_tokens() -> None:
    start = open_snapshot(_config(vocab_size=16))
    raw = start.state.model_copy(update={"output": (1, 2, 3), "cache": (1, 2)})  # tuples, not validated
    assert isinstance(raw.output, tuple)
    successor = stage_successor(
        replace(start, state=raw), (5,), (3,), RngCounters(), finished=False, finish_reason=None
    )
    assert successor.state.output == (1, 2, 3, 5) and isinstance(successor.state.output, Tokens)
    assert Tokens.of(successor.state.output) is successor.state.output
