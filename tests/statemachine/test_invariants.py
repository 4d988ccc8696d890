"""The invariant checks of ``specround.statemachine.invariants`` hold on real rounds and catch breaches."""

from __future__ import annotations

from dataclasses import replace

import torch

from specround.adapters.memory_log import MemoryEventLog
from specround.errors import InjectedFaultError
from specround.model_check.random_rounds import seeded_random_input
from specround.sampling.types import Layout
from specround.statemachine import invariants
from specround.statemachine.controller import RoundController
from specround.statemachine.faults import NO_FAULT, FaultPlan, FaultPoint
from specround.statemachine.lifecycle import RoundPhase
from specround.statemachine.rounds import RoundResult, RoundStatus
from specround.statemachine.step_result import RowDecision

V = 8
EOS = 7


def _opened() -> tuple[RoundController, MemoryEventLog]:
    log = MemoryEventLog(clock=lambda: 0.0)
    controller = RoundController(log, faults=FaultPlan())
    controller.open_request(
        (1, 2, 3),
        seed=5,
        vocab_size=V,
        layout=Layout.REPLAY_FRONTIER,
        request_id="r",
        max_new_tokens=6,
        stop_token_ids=[EOS],
    )
    return controller, log


def test_a_published_round_keeps_every_invariant() -> None:
    controller, log = _opened()
    before = controller.state("r")
    result = controller.run_round(seeded_random_input(controller, "r", 3, seed=11))
    assert result.status is RoundStatus.PUBLISHED and result.state is not None
    assert invariants.published_round(controller.config("r"), before, result) == []
    assert invariants.state_invariants(controller, log, {"r": result.state}) == []


def test_state_invariants_catch_a_stale_published_state() -> None:
    controller, log = _opened()
    stale = controller.state("r")
    controller.run_round(seeded_random_input(controller, "r", 2, seed=3))
    found = {b.invariant for b in invariants.state_invariants(controller, log, {"r": stale})}
    assert found == {"INV-8"}


def test_frontier_shape_catches_a_cache_that_does_not_follow_the_output() -> None:
    controller, _ = _opened()
    state = controller.state("r")
    broken = state.model_copy(update={"cache": (9, 9)})
    assert invariants.frontier_shape("r", state) == []
    assert [b.invariant for b in invariants.frontier_shape("r", broken)] == ["INV-1"]


def test_processors_follow_output_catches_a_foreign_digest() -> None:
    controller, _ = _opened()
    state = controller.state("r")
    broken = state.model_copy(update={"processors_digest": "0" * 64})
    assert invariants.processors_follow_output(controller.config("r"), state) == []
    assert [b.invariant for b in invariants.processors_follow_output(controller.config("r"), broken)] == [
        "INV-4"
    ]


def test_published_round_catches_a_wrong_commit_and_generation() -> None:
    controller, _ = _opened()
    before = controller.state("r")
    result = controller.run_round(seeded_random_input(controller, "r", 2, seed=8))
    assert result.kv is not None and result.state is not None
    config = controller.config("r")
    bumped = result.state.model_copy(update={"generation": result.state.generation + 1})
    skipped = replace(result.kv, committed_token_ids=result.kv.committed_token_ids[1:])
    assert [
        b.invariant for b in invariants.published_round(config, before, replace(result, state=bumped))
    ] == ["INV-6"]
    assert [b.invariant for b in invariants.published_round(config, before, replace(result, kv=skipped))] == [
        "INV-5"
    ]
    assert [b.invariant for b in invariants.published_round(config, before, replace(result, kv=None))] == [
        "INV-6"
    ]


def test_emission_respects_stops() -> None:
    check = invariants.emission_respects_stops
    assert check([4, EOS], [False, True], remaining=5, finished=True) == []
    assert check([4, 5], [False, False], remaining=2, finished=True) == []
    assert [b.invariant for b in check([EOS, 4], [True, False], remaining=5, finished=False)] == ["INV-2"]
    assert len(check([1, 2, 3], [False] * 3, remaining=2, finished=True)) == 1  # over the budget
    assert len(check([4, EOS], [False, True], remaining=5, finished=False)) == 1  # should have finished


def test_head_agrees_names_a_missing_or_different_head() -> None:
    controller, log = _opened()
    state = controller.state("r")
    head = log.head("r")
    assert (
        invariants.head_agrees(
            "r", head, state_digest=state.digest(), generation=state.generation, finished=state.finished
        )
        == []
    )
    assert len(invariants.head_agrees("r", None, state_digest="x", generation=0, finished=False)) == 1
    assert len(invariants.head_agrees("r", head, state_digest="x" * 64, generation=0, finished=False)) == 1


def test_fault_effect_before_and_after_publication() -> None:
    controller, _ = _opened()
    before = controller.state("r")
    aborted = RoundResult(
        request_id="r",
        round_id=None,
        status=RoundStatus.ABORTED,
        phase=RoundPhase.ABORTED,
        generation=before.generation,
        state=None,
        error=InjectedFaultError("F-3", "injected"),
    )
    assert (
        invariants.fault_effect(FaultPoint.AFTER_KV_STAGING, aborted, before, before, log_unchanged=True)
        == []
    )
    changed = invariants.fault_effect(
        FaultPoint.AFTER_KV_STAGING, aborted, before, before, log_unchanged=False
    )
    assert [b.invariant for b in changed] == ["INV-7"]
    unpublished = invariants.fault_effect(
        FaultPoint.AFTER_PUBLICATION, aborted, before, before, log_unchanged=True
    )
    assert {b.invariant for b in unpublished} == {"INV-6", "INV-7"}  # wrong point, status and no publication


def test_fault_points_are_numbered_for_models() -> None:
    assert [p.number for p in FaultPoint] == [1, 2, 3, 4, 5, 6]
    assert all(FaultPoint.numbered(p.number) is p for p in FaultPoint)
    assert NO_FAULT not in {p.number for p in FaultPoint}
    assert [p.before_publication for p in FaultPoint] == [True] * 5 + [False]


def test_one_seed_gives_one_round() -> None:
    controller, _ = _opened()
    a = seeded_random_input(controller, "r", 3, seed=2, dtype=torch.float32)
    b = seeded_random_input(controller, "r", 3, seed=2, dtype=torch.float32)
    assert a.draft_ids == b.draft_ids and a.p_rows is not None and torch.equal(a.p_rows, b.p_rows)


def test_the_pipelined_checks_catch_what_they_name() -> None:
    controller, _ = _opened()
    before = controller.state("r")
    result = controller.run_round(seeded_random_input(controller, "r", 2, seed=8))
    assert result.kv is not None and result.state is not None and result.commit is not None
    handed = RowDecision(
        emitted_ids=result.emitted_ids,
        accepted=result.accepted,
        terminal=result.terminal or "stop",
        finished=result.finished,
        keep=result.kv.keep,
        new_frontier=result.state.frontier,
        reached=result.commit.rng_after[1] - result.commit.rng_before[1],
        finish_reason=result.finish_reason,
    )
    assert invariants.pipelined_in_flight("r", handed, result, settled=False, log_unchanged=True) == []
    wrong_keep = replace(handed, keep=handed.keep + 1)
    found = invariants.pipelined_in_flight("r", wrong_keep, result, settled=True, log_unchanged=False)
    assert [b.invariant for b in found] == ["INV-5", "INV-7", "INV-7"]
    assert invariants.pipelined_matches_synchronous(result, result) == []
    other = replace(result, state=before)
    assert [b.invariant for b in invariants.pipelined_matches_synchronous(other, result)] == ["INV-6"]
    # A published round reported as lost: it released tokens, the rollback and the log are wrong (INV-7).
    lost = invariants.pipelined_round_lost(result, -1, before, log_unchanged=False)
    assert [b.invariant for b in lost] == ["INV-7"] * 3
    assert [b.invariant for b in invariants.pipelined_aborted_before_write("r", handed, 3)] == ["INV-7"] * 2
    assert invariants.pipelined_aborted_before_write("r", None, -1) == []
