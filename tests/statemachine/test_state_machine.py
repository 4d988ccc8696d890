"""A Hypothesis state machine over the controller and an event log: rounds on both layouts with seeded
random rows, injected faults F-1..F-6, retries of publication, stale publishers and crash-and-replay, with
every invariant INV-1..INV-9 checked after every step (INV-10 by the audit's re-derivation). The checks
are those of :mod:`specround.statemachine.invariants`, which the conformance walk of ``specround check``
runs as well; here a breach fails the example.

Parametrised over ``event_log_factory`` (tests/statemachine/conftest.py), so every backend runs it.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from specround.sampling.processors.processor_chain import sampling_chain
from specround.sampling.types import Layout
from specround.statemachine import invariants
from specround.statemachine.controller import RoundController
from specround.statemachine.faults import FaultPlan, FaultPoint, FaultRule
from specround.statemachine.invariants import Breach
from specround.statemachine.ports import EventLog
from specround.statemachine.rounds import RoundInput, RoundResult, RoundStatus
from specround.statemachine.state import RequestState
from tests.statemachine._synthetic import log_fingerprint, random_input
from tests.statemachine.conftest import LogFactory

V = 12
EOS = 11
REQUESTS = {
    "replay-a": Layout.REPLAY_FRONTIER,
    "retained-b": Layout.RETAINED_FRONTIER,
    "replay-c": Layout.REPLAY_FRONTIER,
}


def _hold(breaches: list[Breach]) -> None:
    """Fail the example on any breach, naming every one."""
    assert not breaches, "; ".join(str(b) for b in breaches)


class RoundMachine(RuleBasedStateMachine):
    """The model: the live states the controller acknowledged, and the rounds awaiting acknowledgement."""

    factory: LogFactory

    def __init__(self) -> None:
        super().__init__()
        self.directory = tempfile.TemporaryDirectory()
        self.log: EventLog = self.factory.new(Path(self.directory.name))
        self.plan = FaultPlan()
        self.controller = RoundController(self.log, faults=self.plan)
        self.known: dict[str, RequestState] = {}
        self.unacknowledged: dict[str, tuple[RoundInput, RequestState]] = {}
        self.handles: list[EventLog] = []

    def teardown(self) -> None:
        for handle in self.handles:
            handle.close()
        self.log.close()
        self.directory.cleanup()

    def _reopen(self) -> EventLog:
        """A new handle on the same log, as another process would get (closed at teardown)."""
        handle = self.factory.reopen(self.log)
        if handle is not self.log:
            self.handles.append(handle)
        return handle

    @initialize()
    def open_requests(self) -> None:
        chain = sampling_chain(V, presence_penalty=0.3)
        for index, (rid, layout) in enumerate(REQUESTS.items()):
            state = self.controller.open_request(
                (1, 2, 3),
                seed=100 + index,
                processors=chain if index == 2 else None,
                vocab_size=V,
                layout=layout,
                request_id=rid,
                max_new_tokens=10,
                stop_token_ids=[EOS],
            )
            self.known[rid] = state

    # --- helpers ----------------------------------------------------------------------------------------

    def _unfinished(self) -> list[str]:
        return [rid for rid, state in self.known.items() if not state.finished]

    def _input(self, rid: str, k: int, seed: int) -> RoundInput:
        generator = torch.Generator().manual_seed(seed)
        dtype = torch.float32 if seed % 2 else torch.float64
        return random_input(self.controller, rid, k, generator, dtype=dtype)

    def _check_round(self, before: RequestState, result: RoundResult) -> None:
        """INV-2, INV-3, INV-5, INV-6 for one published round."""
        _hold(invariants.published_round(self.controller.config(before.request_id), before, result))

    # --- rules ------------------------------------------------------------------------------------------

    @precondition(lambda self: bool(self._unfinished()))
    @rule(data=st.data())
    def step(self, data: st.DataObject) -> None:
        rids = data.draw(st.lists(st.sampled_from(self._unfinished()), min_size=1, unique=True))
        items = [
            self._input(rid, data.draw(st.integers(0, 4)), data.draw(st.integers(0, 2**20))) for rid in rids
        ]
        before = {rid: self.known[rid] for rid in rids}
        for item, result in zip(items, self.controller.step(items), strict=True):
            assert result.status is RoundStatus.PUBLISHED, result.error  # INV-6
            self._check_round(before[item.request_id], result)
            assert result.state is not None
            self.known[item.request_id] = result.state
            self.unacknowledged.pop(item.request_id, None)

    @precondition(lambda self: bool(self._unfinished()))
    @rule(data=st.data(), point=st.sampled_from(list(FaultPoint)))
    def fault(self, data: st.DataObject, point: FaultPoint) -> None:
        rid = data.draw(st.sampled_from(self._unfinished()))
        item = self._input(rid, data.draw(st.integers(0, 4)), data.draw(st.integers(0, 2**20)))
        generation = self.known[rid].generation + 1
        self.plan.add(FaultRule(point, request_ids=frozenset({rid}), generations=frozenset({generation})))
        fingerprint = log_fingerprint(self.log)
        [result] = self.controller.step([item])
        authoritative = self.controller.state(rid)
        unchanged = log_fingerprint(self.log) == fingerprint
        _hold(invariants.fault_effect(point, result, self.known[rid], authoritative, log_unchanged=unchanged))
        if not point.before_publication:  # F-6: published, not acknowledged (INV-6); else INV-7
            self.unacknowledged[rid] = (item, self.known[rid])
            self.known[rid] = authoritative

    @precondition(lambda self: bool(self.unacknowledged))
    @rule(data=st.data())
    def retry_publication(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(self.unacknowledged)))
        item, before = self.unacknowledged.pop(rid)
        fingerprint = log_fingerprint(self.log)
        result = self.controller.run_round(item)
        unchanged = log_fingerprint(self.log) == fingerprint
        _hold(invariants.retry_acknowledged(result, self.known[rid], log_unchanged=unchanged))  # INV-6
        self._check_round(before, result)

    @precondition(lambda self: bool(self._unfinished()))
    @rule(data=st.data())
    def stale_publisher(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(self._unfinished()))
        stale = RoundController(self._reopen())
        stale_item = random_input(
            stale, rid, 3, torch.Generator().manual_seed(data.draw(st.integers(0, 999)))
        )
        winner_item = self._input(rid, 2, data.draw(st.integers(1000, 2**20)))
        before = self.known[rid]
        [won] = self.controller.step([winner_item])
        assert won.status is RoundStatus.PUBLISHED and won.state is not None
        self._check_round(before, won)
        self.known[rid] = won.state
        self.unacknowledged.pop(rid, None)
        fingerprint = log_fingerprint(self.log)
        if won.state.finished:
            return
        [lost] = stale.step([stale_item])
        unchanged = log_fingerprint(self.log) == fingerprint
        _hold(invariants.stale_writer_refused(lost, log_unchanged=unchanged))  # INV-6

    @rule()
    def crash_and_replay(self) -> None:
        self.controller = RoundController(self._reopen(), faults=self.plan)
        _hold(invariants.reload_agrees(self.controller.load_all(), self.known))  # INV-8

    @precondition(lambda self: any(s.finished for s in self.known.values()))
    @rule(data=st.data())
    def finished_requests_get_no_round(self, data: st.DataObject) -> None:
        rid = data.draw(st.sampled_from(sorted(r for r, s in self.known.items() if s.finished)))
        fingerprint = log_fingerprint(self.log)
        generator = torch.Generator().manual_seed(0)
        item = RoundInput(
            rid,
            self.controller.coordinate_digest(rid),
            (),
            None,
            torch.softmax(torch.randn(1, V, generator=generator), -1),
        )
        [result] = self.controller.step([item])
        unchanged = log_fingerprint(self.log) == fingerprint
        _hold(invariants.finished_request_refused(result, log_unchanged=unchanged))  # INV-2

    # --- invariants -------------------------------------------------------------------------------------

    @invariant()
    def frontier_shape(self) -> None:
        for rid, state in self.known.items():  # INV-1 (and kept by finished requests too)
            _hold(invariants.frontier_shape(rid, state))

    @invariant()
    def live_projection_matches_the_log(self) -> None:
        for rid, state in self.known.items():  # INV-8
            _hold(
                invariants.live_projection_agrees(rid, state, self.controller.state(rid), self.log.head(rid))
            )

    @invariant()
    def replay_reproduces_the_live_state(self) -> None:
        _hold(invariants.replay_reproduces(self.log, self.known))  # INV-8

    @invariant()
    def chains_are_intact(self) -> None:
        for rid in self.known:
            _hold(invariants.chain_intact(self.log, rid))  # INV-9

    @invariant()
    def processors_follow_published_tokens(self) -> None:
        for rid, state in self.known.items():  # INV-4
            _hold(invariants.processors_follow_output(self.controller.config(rid), state))


def test_round_state_machine(event_log_factory: LogFactory) -> None:
    machine = type(f"RoundMachine_{event_log_factory.name}", (RoundMachine,), {"factory": event_log_factory})
    run_state_machine_as_test(
        machine,
        settings=settings(
            settings.default, max_examples=min(settings.default.max_examples, 25), stateful_step_count=12
        ),
    )


def test_the_invariants_catch_a_diverging_model() -> None:
    """Guard against vacuous invariants: a model that diverges from the log must be caught."""
    from tests.statemachine.conftest import EVENT_LOG_FACTORIES

    machine_class = type("RoundMachine_guard", (RoundMachine,), {"factory": EVENT_LOG_FACTORIES["memory"]})
    machine = machine_class()
    try:
        machine.open_requests()
        stale = machine.known["replay-a"]
        result = machine.controller.run_round(machine._input("replay-a", 2, 5))
        assert result.state is not None
        machine.known["replay-a"] = result.state
        machine.live_projection_matches_the_log()
        machine.replay_reproduces_the_live_state()
        machine.known["replay-a"] = stale
        with pytest.raises(AssertionError):
            machine.live_projection_matches_the_log()
        with pytest.raises(AssertionError):
            machine.replay_reproduces_the_live_state()
    finally:
        machine.teardown()
