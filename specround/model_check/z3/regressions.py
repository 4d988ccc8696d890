"""Sat-trace regressions: behaviours the protocol model must keep reachable.

Each is a ``REACHABLE`` proof: a satisfying assignment of one or two attempts from the initial state that
shows the behaviour (A = 0 with a correction, a bonus, a stop inside the prefix, a fault at each point, a
retry after a lost acknowledgement, ...). An over-constrained relation would lose one of them, so the
``VALID`` proofs cannot pass vacuously.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeAlias

import z3

from specround.model_check.z3.proofs import Obligation, ProofKind, ProofRegistry
from specround.model_check.z3.protocol_invariants import initial_state
from specround.model_check.z3.protocol_state import (
    FAULT_POINTS,
    LOST_ACK_FAULT,
    MAX_MODEL_DRAFT,
    NO_FAULT,
    ProtocolConfig,
    ProtocolState,
    RoundInputs,
    fault_code,
)
from specround.model_check.z3.terms import Bool, Int
from specround.model_check.z3.transition import RoundOutcome, round_outcome, show_round
from specround.sampling.types import Layout, TerminalKind

__all__ = ["register_regressions"]

Condition: TypeAlias = Callable[[ProtocolState, RoundInputs, RoundOutcome, ProtocolConfig], Bool]
"""A one-attempt behaviour: ``condition(s0, inputs, outcome, config)``."""


def _growth(pre: ProtocolState, outcome: RoundOutcome) -> Int:
    return outcome.post.output.length - pre.output.length


_REACH_ONE: dict[str, Condition] = {
    "zero_accept_correction": lambda s, x, o, c: z3.And(
        o.published,
        x.draft_len >= 1,
        x.accepted == 0,
        o.terminal_kind == int(TerminalKind.CORRECTION),
        z3.Not(o.finishes),
        _growth(s, o) == 1,
        o.committed_rows == 1,
    ),
    "full_accept_bonus": lambda s, x, o, c: z3.And(
        o.published,
        x.draft_len == c.max_draft,
        x.accepted == c.max_draft,
        o.terminal_kind == int(TerminalKind.BONUS),
        z3.Not(o.finishes),
        _growth(s, o) == c.max_draft + 1,
    ),
    "stop_inside_prefix": lambda s, x, o, c: z3.And(
        o.published,
        o.terminal_kind == int(TerminalKind.STOP),
        c.is_stop(o.last_token),
        o.emitted_count >= 2,
        o.emitted_count < x.accepted,
        _growth(s, o) < c.max_new,
        o.terminal_draws == 0,
    ),
    "eos_as_bonus": lambda s, x, o, c: z3.And(
        o.published,
        x.draft_len >= 2,
        _growth(s, o) < c.max_new,
        o.terminal_kind == int(TerminalKind.BONUS),
        c.is_stop(x.terminal_token),
        o.finishes,
    ),
    "eos_as_correction": lambda s, x, o, c: z3.And(
        o.published,
        x.accepted >= 1,
        _growth(s, o) < c.max_new,
        o.terminal_kind == int(TerminalKind.CORRECTION),
        c.is_stop(x.terminal_token),
        o.finishes,
    ),
    "length_cap_inside_prefix": lambda s, x, o, c: z3.And(
        o.published,
        o.emitted_count >= 2,
        o.emitted_count < x.accepted,
        o.terminal_kind == int(TerminalKind.STOP),
        z3.Not(c.is_stop(o.last_token)),
        o.finishes,
    ),
    "length_cap_at_terminal": lambda s, x, o, c: z3.And(
        o.published,
        x.accepted >= 1,
        o.terminal_kind != int(TerminalKind.STOP),
        z3.Not(c.is_stop(o.last_token)),
        o.finishes,
    ),
    "plain_decode_k0": lambda s, x, o, c: z3.And(o.published, x.draft_len == 0, _growth(s, o) == 1),
    "invalid_rows_abort": lambda s, x, o, c: z3.And(
        o.runs,
        x.fault == NO_FAULT,
        z3.Not(o.rows_valid),
        z3.Not(o.published),
        o.post.identical(s),
    ),
}


def _reach_one(layout: Layout, condition: Condition) -> Obligation:
    config = ProtocolConfig.symbolic(MAX_MODEL_DRAFT, layout)
    s0 = ProtocolState.symbolic("s0")
    inputs = RoundInputs.symbolic("in", MAX_MODEL_DRAFT)
    outcome = round_outcome(s0, inputs, config)
    premises = (config.constraints(), initial_state(s0, config))
    return Obligation(
        premises=premises,
        goal=condition(s0, inputs, outcome, config),
        show=show_round(s0, inputs, outcome, config),
    )


def _reach_fault(layout: Layout, point: str) -> Obligation:
    config = ProtocolConfig.symbolic(MAX_MODEL_DRAFT, layout)
    s0 = ProtocolState.symbolic("s0")
    inputs = RoundInputs.symbolic("in", MAX_MODEL_DRAFT)
    outcome = round_outcome(s0, inputs, config)
    clean = round_outcome(s0, inputs.with_fault(0), config)
    goal = z3.And(inputs.fault == fault_code(point), clean.published, z3.Not(outcome.acknowledged))
    return Obligation(
        premises=(config.constraints(), initial_state(s0, config)),
        goal=goal,
        show=show_round(s0, inputs, outcome, config),
    )


Scenario: TypeAlias = Callable[
    [ProtocolState, tuple[RoundInputs, RoundInputs], tuple[RoundOutcome, RoundOutcome], ProtocolConfig], Bool
]
"""A two-attempt behaviour: ``scenario(s0, (inputs0, inputs1), (outcome0, outcome1), config)``."""


def _retry_after_lost_ack(
    s0: ProtocolState,
    x: tuple[RoundInputs, RoundInputs],
    o: tuple[RoundOutcome, RoundOutcome],
    c: ProtocolConfig,
) -> Bool:
    return z3.And(
        x[0].fault == LOST_ACK_FAULT,
        x[0].accepted >= 1,
        z3.Not(o[0].finishes),
        o[0].published,
        z3.Not(o[0].acknowledged),
        x[1].expected_generation == 0,
        x[1].txn == x[0].txn,
        x[1].fault == NO_FAULT,
        o[1].retry,
        o[1].acknowledged,
        o[1].post.identical(o[0].post),
    )


def _stale_writer_refused(
    s0: ProtocolState,
    x: tuple[RoundInputs, RoundInputs],
    o: tuple[RoundOutcome, RoundOutcome],
    c: ProtocolConfig,
) -> Bool:
    return z3.And(
        o[0].published,
        x[1].expected_generation == 0,
        x[1].txn != x[0].txn,
        o[1].stale,
        z3.Not(o[1].acknowledged),
    )


def _finished_request_refused(
    s0: ProtocolState,
    x: tuple[RoundInputs, RoundInputs],
    o: tuple[RoundOutcome, RoundOutcome],
    c: ProtocolConfig,
) -> Bool:
    return z3.And(
        o[0].published,
        o[0].finishes,
        x[1].expected_generation == 1,
        o[1].refused_finished,
        o[1].post.identical(o[0].post),
    )


def _three_rounds(
    s0: ProtocolState,
    x: tuple[RoundInputs, RoundInputs],
    o: tuple[RoundOutcome, RoundOutcome],
    c: ProtocolConfig,
) -> Bool:
    third = round_outcome(o[1].post, RoundInputs.symbolic("in2", MAX_MODEL_DRAFT), c)
    return z3.And(
        *[outcome.published for outcome in (*o, third)],
        *[z3.Not(outcome.finishes) for outcome in (*o, third)],
        _growth(s0, o[0]) >= 2,
        _growth(o[0].post, o[1]) >= 2,
        _growth(o[1].post, third) >= 2,
    )


_REACH_TWO: dict[str, Scenario] = {
    "retry_after_lost_ack": _retry_after_lost_ack,
    "stale_writer_refused": _stale_writer_refused,
    "finished_request_refused": _finished_request_refused,
    "three_rounds": _three_rounds,
}
"""Two-attempt behaviours (three for ``three_rounds``) from the initial state."""


def _reach_two(layout: Layout, scenario: Scenario) -> Obligation:
    config = ProtocolConfig.symbolic(MAX_MODEL_DRAFT, layout)
    s0 = ProtocolState.symbolic("s0")
    first_in, second_in = (
        RoundInputs.symbolic("in0", MAX_MODEL_DRAFT),
        RoundInputs.symbolic("in1", MAX_MODEL_DRAFT),
    )
    first = round_outcome(s0, first_in, config)
    second = round_outcome(first.post, second_in, config)
    return Obligation(
        premises=(config.constraints(), initial_state(s0, config)),
        goal=scenario(s0, (first_in, second_in), (first, second), config),
        show=(
            *show_round(s0, first_in, first, config, "r0."),
            *show_round(first.post, second_in, second, config, "r1."),
        ),
    )


def register_regressions(registry: ProofRegistry, layout: Layout) -> None:
    """Register every sat-trace regression of ``layout`` as ``reach.<layout>.<behaviour>``."""
    tag = layout.value
    for name, condition in _REACH_ONE.items():
        registry.add(
            f"reach.{tag}.{name}",
            _reach_one,
            layout,
            condition,
            covers=("vacuity",),
            kind=ProofKind.REACHABLE,
            description=f"sat-trace regression: {name.replace('_', ' ')} stays reachable",
        )
    for point in FAULT_POINTS:
        registry.add(
            f"reach.{tag}.fault_{point}",
            _reach_fault,
            layout,
            point,
            covers=("vacuity", point),
            kind=ProofKind.REACHABLE,
            description=f"sat-trace regression: a publishable round can fail at {point}",
        )
    for name, scenario in _REACH_TWO.items():
        registry.add(
            f"reach.{tag}.{name}",
            _reach_two,
            layout,
            scenario,
            covers=("vacuity",),
            kind=ProofKind.REACHABLE,
            description=f"sat-trace regression: {name.replace('_', ' ')} stays reachable",
        )
