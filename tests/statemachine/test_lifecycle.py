"""The lifecycle table and the long-lived machine built from it (contract#round-transaction)."""

from __future__ import annotations

import pytest

from specround.errors import IllegalTransitionError
from specround.statemachine.lifecycle import (
    LIFECYCLE_TRANSITIONS,
    PUBLISH_CALLBACK,
    LifecycleDispatch,
    RoundPhase,
    Trigger,
    build_lifecycle_machine,
    next_phase,
)

HAPPY_PATH = [
    (Trigger.VERIFY, RoundPhase.VERIFIED_TEMPORARY),
    (Trigger.DECIDE, RoundPhase.DECIDED),
    (Trigger.STAGE, RoundPhase.STAGED),
    (Trigger.PUBLISH, RoundPhase.PUBLISHED),
]


def test_table_walks_the_happy_path_and_aborts_from_every_phase_before_publication() -> None:
    phase = RoundPhase.ROUND_READY
    for trigger, expected in HAPPY_PATH:
        phase = next_phase(phase, trigger)
        assert phase is expected
    for source in (
        RoundPhase.ROUND_READY,
        RoundPhase.VERIFIED_TEMPORARY,
        RoundPhase.DECIDED,
        RoundPhase.STAGED,
    ):
        assert next_phase(source, Trigger.ABORT) is RoundPhase.ABORTED
    for terminal in (RoundPhase.PUBLISHED, RoundPhase.ABORTED):
        assert terminal.terminal
        for trigger in (Trigger.VERIFY, Trigger.DECIDE, Trigger.STAGE, Trigger.PUBLISH, Trigger.ABORT):
            with pytest.raises(IllegalTransitionError):
                next_phase(terminal, trigger)
    with pytest.raises(IllegalTransitionError):
        next_phase(RoundPhase.ROUND_READY, Trigger.PUBLISH)


def test_the_durable_append_is_a_before_callback_never_on_enter() -> None:
    for row in LIFECYCLE_TRANSITIONS:
        assert "after" not in row and "on_enter" not in row
    [publish] = [row for row in LIFECYCLE_TRANSITIONS if row["trigger"] == Trigger.PUBLISH]
    assert publish["before"] == PUBLISH_CALLBACK


class _Model:
    state: RoundPhase

    def __init__(self, fail: bool) -> None:
        self.fail = fail
        self.writes = 0

    def write_publication(self) -> None:
        if self.fail:
            raise RuntimeError("database unavailable")
        self.writes += 1


def test_a_failing_publication_callback_leaves_the_phase_at_staged() -> None:
    machine = build_lifecycle_machine()
    failing, working = _Model(fail=True), _Model(fail=False)
    machine.add_model(failing, initial=RoundPhase.ROUND_READY)
    machine.add_model(working, initial=RoundPhase.ROUND_READY)
    for model in (failing, working):
        for trigger in (Trigger.VERIFY, Trigger.DECIDE, Trigger.STAGE):
            model.trigger(trigger)  # type: ignore[attr-defined]
    with pytest.raises(RuntimeError):
        failing.trigger(Trigger.PUBLISH)  # type: ignore[attr-defined]
    assert failing.state is RoundPhase.STAGED
    failing.trigger(Trigger.ABORT)  # type: ignore[attr-defined]
    assert failing.state is RoundPhase.ABORTED
    working.trigger(Trigger.PUBLISH)  # type: ignore[attr-defined]
    assert working.state is RoundPhase.PUBLISHED and working.writes == 1


def test_the_machine_has_no_shortcut_transitions() -> None:
    machine = build_lifecycle_machine()
    model = _Model(fail=False)
    machine.add_model(model, initial=RoundPhase.ROUND_READY)
    assert not hasattr(model, "to_PUBLISHED")
    with pytest.raises(Exception, match="Can't trigger"):
        model.trigger(Trigger.PUBLISH)  # type: ignore[attr-defined]


def test_a_controller_reuses_one_machine_across_steps() -> None:
    from specround.adapters.memory_log import MemoryEventLog
    from specround.statemachine.controller import RoundController
    from tests.statemachine._synthetic import scripted_input

    controller = RoundController(MemoryEventLog())
    controller.open_request((1, 2), seed=0, vocab_size=8, request_id="r", max_new_tokens=50)
    machine, dispatch = controller._machine, controller._dispatch
    for _ in range(5):
        controller.run_round(scripted_input(controller, "r", (3,), 1, 4))
        assert len(controller._fsm_pool) == 1  # one pooled step model, reused
    assert controller._machine is machine and controller._dispatch is dispatch


def test_the_compiled_dispatch_holds_exactly_the_table() -> None:
    dispatch = LifecycleDispatch(build_lifecycle_machine())
    every = {
        (phase, trigger)
        for phase in RoundPhase
        for trigger in vars(Trigger).values()
        if isinstance(trigger, str) and not trigger.startswith("_")
    }
    allowed = dispatch.moves()
    for phase, trigger in every:
        if (phase, trigger) in allowed:
            assert allowed[(phase, trigger)] is next_phase(phase, trigger)
        else:
            with pytest.raises(IllegalTransitionError):
                next_phase(phase, trigger)
    assert len(allowed) == 8  # four forward moves and ABORT from the four phases before PUBLISHED


def test_a_failing_before_callback_through_the_dispatch_keeps_the_phase() -> None:
    dispatch = LifecycleDispatch(build_lifecycle_machine())
    failing, working = _Model(fail=True), _Model(fail=False)
    phase = RoundPhase.STAGED
    with pytest.raises(RuntimeError):
        dispatch.fire(failing, phase, Trigger.PUBLISH)
    assert failing.writes == 0
    assert dispatch.fire(working, phase, Trigger.PUBLISH) is RoundPhase.PUBLISHED and working.writes == 1
    assert dispatch.fire(failing, phase, Trigger.ABORT) is RoundPhase.ABORTED
    with pytest.raises(IllegalTransitionError):
        dispatch.fire(working, RoundPhase.PUBLISHED, Trigger.ABORT)


def test_a_machine_with_callbacks_the_dispatch_would_skip_is_refused() -> None:
    from transitions import Machine

    table = [dict(row) for row in LIFECYCLE_TRANSITIONS]
    table[0]["after"] = "noted"
    machine = Machine(model=None, states=RoundPhase, transitions=table, initial=RoundPhase.ROUND_READY)
    with pytest.raises(ValueError, match="beyond 'before'"):
        LifecycleDispatch(machine)
