"""The stop-sequence automaton against brute-force suffix matching."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from specround.errors import InvalidProcessorError
from specround.sampling.processors import StopSequences, processor_from_spec


def brute_stop_tokens(sequences: list[list[int]], history: list[int]) -> set[int]:
    return {
        s[-1]
        for s in sequences
        if len(s) - 1 <= len(history) and history[len(history) - len(s) + 1 :] == s[:-1]
    }


_sequences = st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=4), min_size=1, max_size=5)


@given(sequences=_sequences, history=st.lists(st.integers(0, 3), max_size=25))
def test_stop_tokens_equal_brute_force_suffix_matching(
    sequences: list[list[int]], history: list[int]
) -> None:
    automaton = StopSequences(sequences)
    assert set(automaton.stop_tokens()) == brute_stop_tokens(sequences, [])
    for i, token in enumerate(history):
        automaton.advance(token)
        assert set(automaton.stop_tokens()) == brute_stop_tokens(sequences, history[: i + 1])


@given(
    sequences=_sequences,
    prefix=st.lists(st.integers(0, 3), max_size=8),
    path=st.lists(st.integers(0, 3), max_size=8),
)
def test_stop_sets_along_and_state_round_trip(
    sequences: list[list[int]], prefix: list[int], path: list[int]
) -> None:
    automaton = StopSequences(sequences)
    for token in prefix:
        automaton.advance(token)
    before = automaton.state()
    sets = automaton.stop_sets_along(path)
    assert automaton.state() == before  # not modified
    assert [set(s) for s in sets] == [
        brute_stop_tokens(sequences, prefix + path[:i]) for i in range(len(path) + 1)
    ]
    rebuilt = processor_from_spec(
        json.loads(json.dumps({"kind": "stop_sequences", "params": automaton.params(), "state": before}))
    )
    assert isinstance(rebuilt, StopSequences)
    assert rebuilt.stop_sets_along(path) == sets


def test_state_is_the_longest_suffix_match_and_clones_are_independent() -> None:
    stop = StopSequences([[5, 6, 7], [6, 8], [2]])
    assert stop.stop_tokens() == (2,)
    for token in (1, 5, 6):
        stop.advance(token)
    assert stop.state() == {"match": [5, 6]}
    assert stop.stop_tokens() == (2, 7, 8)
    twin = stop.clone()
    twin.advance(9)
    assert twin.state() == {"match": []}
    assert stop.state() == {"match": [5, 6]}
    assert torch.equal(stop.apply(torch.ones(2, 10)), torch.ones(2, 10))


def test_validation() -> None:
    for bad in ([], [[]], [[1, -2]], "stop", [["a"]], [[1.5]]):
        with pytest.raises(InvalidProcessorError):
            StopSequences(bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidProcessorError):
        StopSequences.from_spec({"sequences": [[1, 2]]}, {"match": [2]})  # not a prefix of any sequence
    with pytest.raises(InvalidProcessorError):
        StopSequences([[3, 40]]).validate_vocab(16)
    assert StopSequences([[2], [2], [1, 2]]).params() == {"sequences": [[1, 2], [2]]}
