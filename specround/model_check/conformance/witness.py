"""Witnesses: concrete runs of the z3 model, from the initial state, that reach each branch of the protocol.

For every :class:`BranchKind` (A = 0, a partial accept, full accept + bonus, k = 0, a stop token inside the
accepted prefix, EOS as the last accepted draft, EOS as correction and as bonus, the length cap inside the
prefix and at the terminal, each fault point F-1..F-6, a retry after a lost acknowledgement, a stale writer,
a round offered to a finished request, three growing rounds) :func:`witness` asks z3 for a run restricted
to what a real request can be (vocabulary :data:`WITNESS_VOCAB`, short prompts, a correction that differs
from the rejected draft). A kind z3 finds no run for is a vacuity failure of the model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from functools import cache
from typing import Any

import z3

from specround.errors import InputError
from specround.model_check.conformance.request_model import (
    WITNESS_MAX_DRAFT,
    WITNESS_MAX_NEW,
    WITNESS_MAX_PROMPT,
    WITNESS_VOCAB,
)
from specround.model_check.z3.protocol_invariants import initial_state
from specround.model_check.z3.protocol_state import ProtocolConfig, ProtocolState, RoundInputs
from specround.model_check.z3.transition import RoundOutcome, round_outcome
from specround.sampling.types import Layout, TerminalKind
from specround.statemachine.faults import NO_FAULT, FaultPoint

__all__ = ["BranchKind", "Witness", "WitnessRound", "witness"]


class BranchKind(StrEnum):
    """The protocol's branches a witness is asked for."""

    ZERO_ACCEPT = "zero_accept"
    PARTIAL_ACCEPT = "partial_accept"
    FULL_ACCEPT_BONUS = "full_accept_bonus"
    PLAIN_DECODE = "plain_decode_k0"
    STOP_INSIDE_PREFIX = "stop_inside_prefix"
    EOS_LAST_DRAFT = "eos_as_last_accepted_draft"
    EOS_AS_CORRECTION = "eos_as_correction"
    EOS_AS_BONUS = "eos_as_bonus"
    LENGTH_CAP_INSIDE_PREFIX = "length_cap_inside_prefix"
    LENGTH_CAP_AT_TERMINAL = "length_cap_at_terminal"
    FAULT_F1 = f"fault_{FaultPoint.AFTER_VERIFICATION.value}"
    FAULT_F2 = f"fault_{FaultPoint.AFTER_DECISION.value}"
    FAULT_F3 = f"fault_{FaultPoint.AFTER_KV_STAGING.value}"
    FAULT_F4 = f"fault_{FaultPoint.AFTER_OUTPUT_STAGING.value}"
    FAULT_F5 = f"fault_{FaultPoint.BEFORE_PUBLICATION.value}"
    FAULT_F6 = f"fault_{FaultPoint.AFTER_PUBLICATION.value}"
    RETRY_AFTER_LOST_ACK = "retry_after_lost_ack"
    STALE_WRITER = "stale_writer"
    FINISHED_REFUSED = "finished_request_refused"
    THREE_ROUNDS = "three_rounds"

    @property
    def fault(self) -> str | None:
        """The fault point of a ``fault_F-n`` kind."""
        return self.value.removeprefix("fault_") if self.value.startswith("fault_") else None

    @property
    def rounds(self) -> int:
        """Attempts the scenario makes."""
        if self is BranchKind.THREE_ROUNDS:
            return 3
        if self in (BranchKind.RETRY_AFTER_LOST_ACK, BranchKind.STALE_WRITER, BranchKind.FINISHED_REFUSED):
            return 2
        return 1


@dataclass(frozen=True)
class WitnessRound:
    """One attempt of a witness, as z3 chose it."""

    drafts: tuple[int, ...]
    accepted: int
    terminal_token: int
    proposal_draws: int
    fault: str | None
    expected_generation: int


@dataclass(frozen=True)
class Witness:
    """A concrete run of the model that reaches one :class:`BranchKind`."""

    kind: BranchKind
    layout: Layout
    prompt: tuple[int, ...]
    max_new: int
    stop_ids: tuple[int, ...]
    rounds: tuple[WitnessRound, ...]

    def as_json(self) -> dict[str, Any]:
        """JSON-able form."""
        return {
            "kind": self.kind.value,
            "layout": self.layout.value,
            "prompt": list(self.prompt),
            "max_new": self.max_new,
            "stop_ids": list(self.stop_ids),
            "rounds": [
                {
                    "drafts": list(r.drafts),
                    "accepted": r.accepted,
                    "terminal_token": r.terminal_token,
                    "proposal_draws": r.proposal_draws,
                    "fault": r.fault,
                    "expected_generation": r.expected_generation,
                }
                for r in self.rounds
            ],
        }


def _token(x: z3.ArithRef) -> z3.BoolRef:
    return z3.And(x >= 0, x < WITNESS_VOCAB)


def _realizable(inputs: RoundInputs, pre: ProtocolState, max_draft: int) -> list[z3.BoolRef]:
    """What a real proposal can be: ids in the vocabulary, valid rows, a correction != the rejected draft."""
    k, accepted, terminal = inputs.draft_len, inputs.accepted, inputs.terminal_token
    facts = [
        k >= 0,
        k <= max_draft,
        accepted >= 0,
        accepted <= k,
        _token(terminal),
        inputs.proposal_draws >= 0,
        inputs.proposal_draws <= k,
        inputs.row_base == pre.position,
        inputs.row_tokens[0] == pre.frontier,
    ]
    for j, draft in enumerate(inputs.drafts):
        facts.append(z3.If(j < k, _token(draft), draft == 0))
        facts.append(inputs.row_tokens[j + 1] == draft)
        facts.append(z3.Implies(z3.And(accepted == j, j < k), terminal != draft))
    return facts


def _growth(pre: ProtocolState, post: ProtocolState) -> z3.ArithRef:
    return post.output.length - pre.output.length


@dataclass(frozen=True)
class _Unrolled:
    """The symbolic run a witness is searched in.

    z3 rounds from the initial state, with what a real request and a real proposal can be as facts.
    """

    config: ProtocolConfig
    states: list[ProtocolState]
    """``states[0]`` the initial state, ``states[n + 1]`` the authoritative state after attempt ``n``."""
    inputs: list[RoundInputs]
    outcomes: list[RoundOutcome]
    facts: list[z3.BoolRef]
    remaining: z3.ArithRef
    """The output budget left at the start of the first round."""
    last_draft: z3.ArithRef
    """The first round's last draft (0 when it has none)."""


def _unroll(kind: BranchKind, layout: Layout) -> _Unrolled:
    """``kind.rounds`` symbolic attempts from the initial state of a witness-sized request."""
    big_k = WITNESS_MAX_DRAFT
    config = ProtocolConfig.symbolic(big_k, layout, stops=2, name="w")
    s0 = ProtocolState.symbolic("w0")
    facts: list[z3.BoolRef] = [
        config.constraints(),
        initial_state(s0, config),
        config.prompt_len <= WITNESS_MAX_PROMPT,
        config.max_new <= WITNESS_MAX_NEW,
        *[_token(s) for s in config.stop_ids],
        *[z3.Implies(i < config.prompt_len, _token(s0.output.at(i))) for i in range(WITNESS_MAX_PROMPT)],
    ]
    inputs = [RoundInputs.symbolic(f"w_in{n}", big_k) for n in range(kind.rounds)]
    states = [s0]
    outcomes = []
    for n, x in enumerate(inputs):
        facts += _realizable(x, states[-1], big_k)
        outcome = round_outcome(states[-1], x, config)
        outcomes.append(outcome)
        states.append(outcome.post)
        if n == 0 or kind is BranchKind.THREE_ROUNDS:
            facts += [x.txn == n, x.expected_generation == states[-2].generation]
    x = inputs[0]
    remaining = config.max_new - (s0.output.length - config.prompt_len)
    last_draft = z3.Sum([z3.If(x.draft_len == j + 1, d, 0) for j, d in enumerate(x.drafts)])
    if kind.fault is None and kind is not BranchKind.RETRY_AFTER_LOST_ACK:
        facts.append(x.fault == NO_FAULT)
    return _Unrolled(config, states, inputs, outcomes, facts, remaining, last_draft)


def _decision_branches(run: _Unrolled) -> dict[BranchKind, z3.BoolRef]:
    """The branches of the acceptance decision, each in a first round that does not finish."""
    x, o = run.inputs[0], run.outcomes[0]
    correction, bonus = int(TerminalKind.CORRECTION), int(TerminalKind.BONUS)
    return {
        BranchKind.ZERO_ACCEPT: z3.And(
            o.published, x.draft_len >= 2, x.accepted == 0, o.terminal_kind == correction, z3.Not(o.finishes)
        ),
        BranchKind.PARTIAL_ACCEPT: z3.And(
            o.published,
            x.accepted >= 1,
            x.accepted < x.draft_len,
            o.terminal_kind == correction,
            z3.Not(o.finishes),
        ),
        BranchKind.FULL_ACCEPT_BONUS: z3.And(
            o.published,
            x.draft_len >= 2,
            x.accepted == x.draft_len,
            o.terminal_kind == bonus,
            z3.Not(o.finishes),
        ),
        BranchKind.PLAIN_DECODE: z3.And(o.published, x.draft_len == 0, z3.Not(o.finishes)),
    }


def _stop_branches(run: _Unrolled) -> dict[BranchKind, z3.BoolRef]:
    """The branches where a stop token or the length cap ends the request in the first round."""
    s, x, o, is_stop, remaining = (
        run.states[0],
        run.inputs[0],
        run.outcomes[0],
        run.config.is_stop,
        run.remaining,
    )
    correction, bonus, stop = (int(TerminalKind.CORRECTION), int(TerminalKind.BONUS), int(TerminalKind.STOP))
    last_draft = run.last_draft
    return {
        BranchKind.STOP_INSIDE_PREFIX: z3.And(
            o.published,
            o.terminal_kind == stop,
            is_stop(o.last_token),
            o.emitted_count >= 1,
            o.emitted_count < x.accepted,
            o.emitted_count < remaining,
        ),
        BranchKind.EOS_LAST_DRAFT: z3.And(
            o.published,
            x.draft_len >= 2,
            x.accepted == x.draft_len,
            is_stop(last_draft),
            o.terminal_kind == stop,
            o.emitted_count == x.draft_len,
            o.emitted_count < remaining,
        ),
        BranchKind.EOS_AS_CORRECTION: z3.And(
            o.published,
            x.accepted >= 1,
            o.terminal_kind == correction,
            is_stop(x.terminal_token),
            o.finishes,
            _growth(s, o.post) < remaining,
        ),
        BranchKind.EOS_AS_BONUS: z3.And(
            o.published,
            x.draft_len >= 2,
            o.terminal_kind == bonus,
            is_stop(x.terminal_token),
            o.finishes,
            _growth(s, o.post) < remaining,
        ),
        BranchKind.LENGTH_CAP_INSIDE_PREFIX: z3.And(
            o.published,
            o.terminal_kind == stop,
            z3.Not(is_stop(o.last_token)),
            o.finishes,
            o.emitted_count >= 2,
            o.emitted_count < x.accepted,
        ),
        BranchKind.LENGTH_CAP_AT_TERMINAL: z3.And(
            o.published,
            x.accepted >= 1,
            o.terminal_kind != stop,
            z3.Not(is_stop(o.last_token)),
            o.finishes,
        ),
    }


def _fault_branch(run: _Unrolled, point: FaultPoint) -> z3.BoolRef:
    """A first round that would publish (and not finish) without the fault, failing at ``point``."""
    s, x, o = run.states[0], run.inputs[0], run.outcomes[0]
    clean = round_outcome(s, x.with_fault(NO_FAULT), run.config)
    return z3.And(
        x.fault == point.number,
        x.draft_len >= 1,
        clean.published,
        z3.Not(clean.finishes),
        z3.Not(o.acknowledged),
    )


def _retry_branch(run: _Unrolled) -> z3.BoolRef:
    """A round published at F-6 without its acknowledgement, then the very same transaction again."""
    x, o = run.inputs[0], run.outcomes[0]
    y, second = run.inputs[1], run.outcomes[1]
    return z3.And(
        x.fault == FaultPoint.AFTER_PUBLICATION.number,
        x.draft_len >= 1,
        x.accepted >= 1,
        o.published,
        z3.Not(o.finishes),
        z3.Not(o.acknowledged),
        y.fault == NO_FAULT,
        y.expected_generation == 0,
        y.txn == x.txn,
        y.draft_len == x.draft_len,
        y.accepted == x.accepted,
        y.terminal_token == x.terminal_token,
        y.proposal_draws == x.proposal_draws,
        *[a == b for a, b in zip(x.drafts, y.drafts, strict=True)],
        second.retry,
        second.acknowledged,
    )


def _stale_branch(run: _Unrolled) -> z3.BoolRef:
    """A published round, then another proposal made at generation 0 that loses the compare-and-swap."""
    x, o = run.inputs[0], run.outcomes[0]
    y, second = run.inputs[1], run.outcomes[1]
    return z3.And(
        o.published,
        z3.Not(o.finishes),
        x.draft_len >= 1,
        y.fault == NO_FAULT,
        y.expected_generation == 0,
        y.txn == 1,
        y.draft_len >= 1,
        second.stale,
        z3.Not(second.acknowledged),
        z3.Or(*[a != b for a, b in zip(x.drafts, y.drafts, strict=True)], x.draft_len != y.draft_len),
    )


def _finished_branch(run: _Unrolled) -> z3.BoolRef:
    """A round that finishes the request, then one more round refused because it finished."""
    o, y, second = run.outcomes[0], run.inputs[1], run.outcomes[1]
    return z3.And(
        o.published,
        o.finishes,
        y.fault == NO_FAULT,
        y.expected_generation == 1,
        y.txn == 1,
        second.refused_finished,
    )


def _three_rounds_branch(run: _Unrolled) -> z3.BoolRef:
    """Three published rounds without a fault, each growing the output by at least two tokens."""
    return z3.And(
        *[z3.And(out.published, z3.Not(out.finishes)) for out in run.outcomes],
        *[_growth(run.states[n], run.states[n + 1]) >= 2 for n in range(3)],
        *[i.fault == NO_FAULT for i in run.inputs],
    )


_MULTI_ROUND_BRANCHES: dict[BranchKind, Callable[[_Unrolled], z3.BoolRef]] = {
    BranchKind.RETRY_AFTER_LOST_ACK: _retry_branch,
    BranchKind.STALE_WRITER: _stale_branch,
    BranchKind.FINISHED_REFUSED: _finished_branch,
    BranchKind.THREE_ROUNDS: _three_rounds_branch,
}


def _branch(kind: BranchKind, run: _Unrolled) -> z3.BoolRef:
    """The condition that the run reaches ``kind``.

    The first-round conditions are built for every kind, in a fixed order, so that z3 sees the same terms
    (and finds the same witnesses) whichever kind is asked for.
    """
    first_round = {**_decision_branches(run), **_stop_branches(run)}
    if kind.fault is not None:
        return _fault_branch(run, FaultPoint(kind.fault))
    if kind in _MULTI_ROUND_BRANCHES:
        return _MULTI_ROUND_BRANCHES[kind](run)
    return first_round[kind]


def _read_witness(kind: BranchKind, layout: Layout, run: _Unrolled, model: z3.ModelRef) -> Witness:
    """The concrete witness z3's model gives for the run."""

    def value(term: z3.ExprRef) -> int:
        return int(model.eval(term, model_completion=True).as_long())

    prompt_len = value(run.config.prompt_len)  # read first: z3 numbers the terms it creates, in order
    rounds = []
    for x_n in run.inputs:
        k = value(x_n.draft_len)
        code = value(x_n.fault)
        rounds.append(
            WitnessRound(
                drafts=tuple(value(d) for d in x_n.drafts[:k]),
                accepted=value(x_n.accepted),
                terminal_token=value(x_n.terminal_token),
                proposal_draws=value(x_n.proposal_draws),
                fault=None if code == NO_FAULT else FaultPoint.numbered(code).value,
                expected_generation=value(x_n.expected_generation),
            )
        )
    return Witness(
        kind=kind,
        layout=layout,
        prompt=tuple(value(run.states[0].output.at(i)) for i in range(prompt_len)),
        max_new=value(run.config.max_new),
        stop_ids=tuple(sorted({value(t) for t in run.config.stop_ids})),
        rounds=tuple(rounds),
    )


@cache
def witness(kind: BranchKind, layout: Layout) -> Witness:
    """Ask z3 for a concrete run from the initial state that reaches ``kind`` (cached per kind and layout).

    Raises :class:`~specround.errors.InputError` when z3 finds none (the model no longer allows the
    branch: a vacuity failure) or gives up.
    """
    run = _unroll(kind, layout)
    solver = z3.Solver()
    solver.set("timeout", 30_000)
    solver.add(*run.facts, _branch(kind, run))
    if solver.check() != z3.sat:
        raise InputError(f"z3 finds no witness of {kind.value} ({layout.value}): {solver.reason_unknown()}")
    return _read_witness(kind, layout, run, solver.model())
