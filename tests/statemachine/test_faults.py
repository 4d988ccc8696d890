"""Fault points F-1..F-6 on both layouts and every outcome shape (INV-7, INV-6), checked by digests."""

from __future__ import annotations

from pathlib import Path

import pytest

from specround.errors import InjectedFaultError, InvalidRequestError
from specround.sampling.types import Layout
from specround.statemachine.controller import RoundController
from specround.statemachine.faults import FAULT_POINTS_BEFORE_PUBLICATION, FaultPlan, FaultPoint, FaultRule
from specround.statemachine.lifecycle import RoundPhase
from specround.statemachine.ports import EventLog
from specround.statemachine.rounds import RoundInput, RoundStatus
from tests.statemachine._synthetic import log_fingerprint, scripted_input
from tests.statemachine.conftest import LogFactory

V = 16
EOS = 15
# (drafts, accepted, terminal token, max_new_tokens): A = 0, partial, full + bonus, EOS inside the accepted
# prefix, length cap inside the accepted prefix.
OUTCOMES = {
    "A=0": ((5, 6, 7), 0, 9, 32),
    "partial": ((5, 6, 7), 2, 9, 32),
    "full": ((5, 6, 7), 3, 9, 32),
    "eos-in-prefix": ((5, EOS, 7), 3, 9, 32),
    "length-cap": ((5, 6, 7), 3, 9, 2),
}
LAYOUTS = [Layout.REPLAY_FRONTIER, Layout.RETAINED_FRONTIER]


def _open(log: EventLog, plan: FaultPlan | None, layout: Layout, budget: int) -> RoundController:
    controller = RoundController(log, faults=plan)
    controller.open_request(
        (1, 2, 3),
        seed=4,
        vocab_size=V,
        layout=layout,
        request_id="r",
        max_new_tokens=budget,
        stop_token_ids=[EOS],
    )
    return controller


def _item(controller: RoundController, outcome: str) -> RoundInput:
    drafts, accepted, terminal, _ = OUTCOMES[outcome]
    return scripted_input(controller, "r", drafts, accepted, terminal)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("outcome", sorted(OUTCOMES))
@pytest.mark.parametrize("point", FAULT_POINTS_BEFORE_PUBLICATION)
def test_faults_before_publication_leave_state_and_log_unchanged(
    event_log: EventLog, layout: Layout, outcome: str, point: FaultPoint
) -> None:
    plan = FaultPlan.at(point, request_ids=["r"], generations=[1])
    controller = _open(event_log, plan, layout, OUTCOMES[outcome][3])
    item = _item(controller, outcome)
    state_digest = controller.state("r").digest()
    fingerprint = log_fingerprint(event_log)
    [result] = controller.step([item])
    assert result.status is RoundStatus.ABORTED and result.phase is RoundPhase.ABORTED
    assert isinstance(result.error, InjectedFaultError) and result.error.point == point.value
    # INV-7: the authoritative state and the log are exactly as they were.
    assert controller.state("r").digest() == state_digest
    assert log_fingerprint(event_log) == fingerprint
    head = event_log.head("r")
    assert head is not None and head.state_digest == state_digest and head.generation == 0
    assert plan.fired == ((point, "r", 1),)
    # Retrying the same round re-derives the same decision (counters did not move) and publishes it.
    retried = controller.run_round(item)
    reference = _open_reference(layout, outcome)
    assert retried.status is RoundStatus.PUBLISHED
    assert retried.state is not None and retried.state.digest() == reference


def _open_reference(layout: Layout, outcome: str) -> str:
    from specround.adapters.memory_log import MemoryEventLog

    controller = _open(MemoryEventLog(), None, layout, OUTCOMES[outcome][3])
    result = controller.run_round(_item(controller, outcome))
    assert result.state is not None
    return result.state.digest()


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("outcome", sorted(OUTCOMES))
def test_fault_after_publication_is_recovered_by_idempotent_acknowledgement(
    event_log: EventLog, layout: Layout, outcome: str
) -> None:
    plan = FaultPlan.at(FaultPoint.AFTER_PUBLICATION)
    controller = _open(event_log, plan, layout, OUTCOMES[outcome][3])
    item = _item(controller, outcome)
    [result] = controller.step([item])
    assert result.status is RoundStatus.UNACKNOWLEDGED and isinstance(result.error, InjectedFaultError)
    assert result.phase is RoundPhase.PUBLISHED and result.state is None and result.kv is None
    # The round is published: the log and the live projection hold the successor.
    published = controller.state("r")
    assert published.generation == 1 and published.digest() == _open_reference(layout, outcome)
    fingerprint = log_fingerprint(event_log)
    # Recovery: retrying the same round returns the already-published successor and appends nothing.
    ack = controller.run_round(item)
    assert ack.status is RoundStatus.ACKNOWLEDGED and ack.state == published
    assert ack.kv is not None and ack.kv.keep == len(ack.emitted_ids)
    assert log_fingerprint(event_log) == fingerprint


def test_fault_after_publication_then_crash_is_acknowledged_by_a_new_controller(
    event_log_factory: LogFactory, tmp_path: Path
) -> None:
    log = event_log_factory.new(tmp_path)
    controller = _open(log, FaultPlan.at("F-6"), Layout.REPLAY_FRONTIER, 32)
    item = _item(controller, "partial")
    assert controller.step([item])[0].status is RoundStatus.UNACKNOWLEDGED
    fingerprint = log_fingerprint(log)
    restarted = RoundController(event_log_factory.reopen(log))  # the process died before the ack
    ack = restarted.run_round(item)
    assert ack.status is RoundStatus.ACKNOWLEDGED and ack.state == restarted.state("r")
    assert log_fingerprint(log) == fingerprint


def test_a_fault_hits_only_the_rounds_it_names(event_log: EventLog) -> None:
    plan = FaultPlan((FaultRule(FaultPoint.AFTER_KV_STAGING, request_ids=frozenset({"b"})),))
    controller = RoundController(event_log, faults=plan)
    for rid in ("a", "b", "c"):
        controller.open_request((1, 2), seed=1, vocab_size=V, request_id=rid, max_new_tokens=8)
    results = controller.step([scripted_input(controller, rid, (5,), 1, 9) for rid in ("a", "b", "c")])
    assert [r.status for r in results] == [RoundStatus.PUBLISHED, RoundStatus.ABORTED, RoundStatus.PUBLISHED]
    assert controller.state("b").generation == 0


def test_fault_rules_count_their_firings_and_match_generations() -> None:
    plan = FaultPlan((FaultRule(FaultPoint.AFTER_DECISION, generations=frozenset({2}), times=2),))
    assert not plan.should_fail(FaultPoint.AFTER_DECISION, "x", 1)
    assert not plan.should_fail(FaultPoint.AFTER_VERIFICATION, "x", 2)
    assert plan.should_fail(FaultPoint.AFTER_DECISION, "x", 2)
    with pytest.raises(InjectedFaultError) as caught:
        plan.check(FaultPoint.AFTER_DECISION, "y", 2)
    assert caught.value.point == "F-2"
    assert not plan.should_fail(FaultPoint.AFTER_DECISION, "z", 2)  # both firings used
    unlimited = FaultPlan.at("F-3", times=None)
    assert all(unlimited.should_fail(FaultPoint.AFTER_KV_STAGING, "x", g) for g in range(5))
    assert [p.value for p in FaultPoint] == ["F-1", "F-2", "F-3", "F-4", "F-5", "F-6"]
    with pytest.raises(InvalidRequestError):
        FaultRule(FaultPoint.AFTER_DECISION, times=0)
