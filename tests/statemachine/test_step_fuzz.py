"""Step isolation under a seeded fuzz, and the named refusals at the input boundary (issue 12).

Malformed rounds of many kinds, about 30 % of them beside a valid round of another request: every count
of :mod:`tests.statemachine.step_fuzz` must be 0 and the log must audit clean. ``SPECROUND_STEP_FUZZ_STEPS``
(or ``HYPOTHESIS_PROFILE=dev``) runs more steps.
"""

from __future__ import annotations

import os

import pytest
import torch

from specround.adapters.memory_log import MemoryEventLog
from specround.audit import audit_log
from specround.errors import DuplicateRoundError, InvalidRequestError
from specround.statemachine.controller import RoundController
from specround.statemachine.ports import EventLog
from specround.statemachine.rounds import RoundStatus
from specround.statemachine.step_inputs import MAX_DRAFT_LENGTH
from tests.statemachine.step_fuzz import describe, random_input, run_step_fuzz

DEV = os.environ.get("HYPOTHESIS_PROFILE") == "dev"
STEPS = int(os.environ.get("SPECROUND_STEP_FUZZ_STEPS", "10000" if DEV else "800"))


def assert_fuzz_clean(log: EventLog, steps: int, seed: int) -> None:
    """Run the fuzz on ``log``; every count must be 0 and the log must audit clean."""
    counts = run_step_fuzz(log, steps, seed)
    assert counts.refused == steps and all(v == 0 for v in counts.failures().values()), describe(counts)
    report = audit_log(log)
    assert report.ok and report.rounds > 0, report.findings[:5]


def test_malformed_rounds_never_harm_another_request_in_memory() -> None:
    assert_fuzz_clean(MemoryEventLog(), STEPS, seed=12)


def _controller() -> tuple[RoundController, MemoryEventLog]:
    log = MemoryEventLog()
    controller = RoundController(log)
    for rid in ("a", "b"):
        controller.open_request((1, 2, 3), seed=4, vocab_size=16, request_id=rid, max_new_tokens=500)
    return controller, log


def test_a_draft_longer_than_the_uniform_cache_is_refused_by_name() -> None:
    controller, _ = _controller()
    generator = torch.Generator().manual_seed(1)
    item = random_input(controller, "a", MAX_DRAFT_LENGTH + 1, generator)
    [result] = controller.step([item])
    assert isinstance(result.error, InvalidRequestError) and "at most 64" in str(result.error)
    [ok] = controller.step([random_input(controller, "a", MAX_DRAFT_LENGTH, generator)])
    assert ok.status is RoundStatus.PUBLISHED


@pytest.mark.parametrize("field", ["max_new_tokens", "proposal_draws", "verify_rows"])
def test_integers_of_64_bits_and_more_are_refused_by_name(field: str) -> None:
    controller, _ = _controller()
    if field == "max_new_tokens":
        with pytest.raises(InvalidRequestError, match="max_new_tokens"):
            controller.open_request((1,), seed=0, vocab_size=16, max_new_tokens=2**64)
        return
    from dataclasses import replace

    item = replace(random_input(controller, "a", 2, torch.Generator().manual_seed(2)), **{field: 2**64})
    [result] = controller.step([item])
    assert isinstance(result.error, InvalidRequestError) and field in str(result.error)


@pytest.mark.parametrize("round_id", [123, "", "r" * 201, b"rid"])
def test_a_round_id_must_be_a_short_nonempty_str(round_id: object) -> None:
    from dataclasses import replace

    controller, log = _controller()
    item = replace(random_input(controller, "a", 1, torch.Generator().manual_seed(3)), round_id=round_id)
    [result] = controller.step([item])
    assert isinstance(result.error, InvalidRequestError) and "round_id" in str(result.error)
    assert audit_log(log).ok


def test_a_reused_round_id_is_refused_for_that_round_only() -> None:
    from dataclasses import replace

    controller, log = _controller()
    generator = torch.Generator().manual_seed(4)
    first = replace(random_input(controller, "a", 2, generator), round_id="same")
    assert controller.step([first])[0].status is RoundStatus.PUBLISHED
    again = replace(random_input(controller, "a", 1, generator), round_id="same")
    neighbour = random_input(controller, "b", 2, generator)
    reused, other = controller.step([again, neighbour])
    assert isinstance(reused.error, DuplicateRoundError)
    assert other.status is RoundStatus.PUBLISHED
    assert controller.step([random_input(controller, "a", 1, generator)])[0].status is RoundStatus.PUBLISHED
    assert audit_log(log).ok


OPEN_CASES: dict[str, dict[str, object]] = {
    "prompt None": {"prompt_ids": None},
    "prompt a str": {"prompt_ids": "ab"},
    "prompt of 2**64": {"prompt_ids": (2**64,)},
    "prompt float tensor": {"prompt_ids": torch.tensor([1.0])},
    "vocab 0": {"vocab_size": 0},
    "vocab 2**64": {"vocab_size": 2**64},
    "vocab a str": {"vocab_size": "16"},
    "request id an int": {"request_id": 123},
    "request id of 201 characters": {"request_id": "x" * 201},
    "request id empty": {"request_id": ""},
    "unknown processor": {"processors": [{"kind": "nope"}]},
    "processors a str": {"processors": "abc"},
    "stop id of 2**64": {"stop_token_ids": [2**64]},
    "stop id a str": {"stop_token_ids": ["a"]},
    "stop sequence of None": {"stop_sequences": [[None]]},
    "stop sequences a str": {"stop_sequences": "ab"},
    "seed a float": {"seed": 1.5},
    "seed of 2**64": {"seed": 2**64},
    "max_new_tokens a float": {"max_new_tokens": 2.0},
    "prompt_advances_processors a str": {"prompt_advances_processors": "yes"},
    "unknown layout": {"layout": 5},
}


@pytest.mark.parametrize("name", sorted(OPEN_CASES))
def test_open_request_refuses_malformed_arguments_by_name(name: str) -> None:
    from specround.errors import InputError

    log = MemoryEventLog()
    controller = RoundController(log)
    arguments: dict[str, object] = {"seed": 0, "max_new_tokens": 5, "vocab_size": 16, **OPEN_CASES[name]}
    prompt = arguments.pop("prompt_ids", (1, 2))
    with pytest.raises(InputError):
        controller.open_request(prompt, **arguments)  # type: ignore[arg-type]
    assert log.request_ids() == []


def test_a_second_input_for_a_request_is_verified_with_its_own_rows() -> None:
    from dataclasses import replace

    from specround.errors import StaleCoordinateError

    controller, log = _controller()
    generator = torch.Generator().manual_seed(6)
    refused = replace(random_input(controller, "a", 3, generator), coordinate_digest="0" * 64)
    valid = random_input(controller, "a", 1, generator)
    first, second = controller.step([refused, valid])
    assert isinstance(first.error, StaleCoordinateError)
    assert second.status is RoundStatus.PUBLISHED and second.error is None
    assert audit_log(log).ok
