"""One round attempt of the protocol model, composed from :mod:`.rules`, and the transition relation.

:func:`round_outcome` builds the z3 terms of one attempt from a state and symbolic (or concrete) round
inputs: the emission scan, the RNG draws, the committed rows and their validation, the successor, and the
publication (a fault at F-1..F-5, failed validation or bad input leaves the state as it was; F-6
publishes but the acknowledgement is lost; re-publishing the same transaction at the generation it
already moved is acknowledged without change; any other stale generation is refused).

``round_relation(pre, inputs, post, config)`` is one z3 term, so concrete (before, after) pairs observed
from the real state machine can be checked against it (:func:`conforms`); :func:`replay_round` is what
replaying a published round's log record does.
"""

from __future__ import annotations

from dataclasses import dataclass

import z3

from specround.errors import InputError
from specround.model_check.z3.proofs import Shown
from specround.model_check.z3.protocol_state import (
    FIRST_FAULT,
    LAST_ABORTING_FAULT,
    LOST_ACK_FAULT,
    NO_FAULT,
    ProtocolConfig,
    ProtocolState,
    RoundInputs,
)
from specround.model_check.z3.rules import (
    CommitPlan,
    Emission,
    Publication,
    accept_draws,
    authoritative_post,
    commit_plan,
    ends_emission,
    finished_gate,
    fresh_generation,
    processed_after,
    rows_valid,
    terminal_draws,
)
from specround.model_check.z3.terms import Bool, Int, TokenList, select
from specround.sampling.types import Layout, TerminalKind

__all__ = [
    "LoggedRound",
    "RoundOutcome",
    "conforms",
    "expected_post",
    "replay_round",
    "round_outcome",
    "round_relation",
    "show_round",
    "state_values",
]


@dataclass(frozen=True)
class LoggedRound:
    """What a published round's log record carries (emitted ids, committed K/V ids, counters, ...)."""

    emitted: tuple[Int, ...]
    emitted_count: Int
    committed: tuple[Int, ...]
    committed_count: Int
    rng_after: tuple[Int, Int, Int]
    """(proposal, accept, terminal)."""
    finished: Bool
    txn: Int


@dataclass(frozen=True)
class RoundOutcome(Publication):
    """One round attempt: its decision, record, successor and the authoritative state afterwards.

    The :class:`Publication` fields say how the attempt met the generation fence and the fault points.
    """

    candidates: tuple[Int, ...]
    """e_1..e_{K+1}: d_1..d_A then the terminal token (positions beyond A + 1 are don't-care)."""
    emitted_count: Int
    """n = min(A + 1, H)."""
    last_token: Int
    terminal_kind: Int
    """A :class:`~specround.sampling.types.TerminalKind` code."""
    accept_draws: Int
    terminal_draws: Int
    committed_rows: Int
    """Logical branch rows committed (the frontier row counts)."""
    verify_rows: Int
    """Input rows computed by the verification pass (k + 1 under replay, k under retained)."""
    finishes: Bool
    record: LoggedRound
    successor: ProtocolState
    """The staged S_1 (meaningful when ``runs``)."""
    post: ProtocolState
    """The authoritative state after the attempt."""


def _emission(pre: ProtocolState, inputs: RoundInputs, config: ProtocolConfig) -> Emission:
    """Scan e_1 = d_1, ..., e_A = d_A, e_(A+1) = the terminal token; stop where :func:`ends_emission` says."""
    big_k, accepted, terminal = config.max_draft, inputs.accepted, inputs.terminal_token
    remaining = config.max_new - (pre.output.length - config.prompt_len)
    candidates = (
        *[z3.If(j <= accepted, inputs.drafts[j - 1], terminal) for j in range(1, big_k + 1)],
        terminal,
    )
    count: Int = accepted + 1
    for j in reversed(range(1, big_k + 2)):
        count = z3.If(
            z3.And(j <= accepted + 1, ends_emission(candidates[j - 1], j, remaining, config)), j, count
        )
    last = select(candidates, count)
    return Emission(
        candidates=candidates,
        count=count,
        last=last,
        terminal_emitted=count == accepted + 1,
        finishes=z3.Or(config.is_stop(last), count == remaining),
    )


def _publication(pre: ProtocolState, inputs: RoundInputs, config: ProtocolConfig, valid: Bool) -> Publication:
    """The fence, the finished gate, input validation and the fault points, for one attempt."""
    k, accepted, fault = inputs.draft_len, inputs.accepted, inputs.fault
    well_formed = z3.And(
        k >= 0,
        k <= config.max_draft,
        accepted >= 0,
        accepted <= k,
        *[z3.Implies(j < k, inputs.drafts[j] >= 0) for j in range(config.max_draft)],
        inputs.terminal_token >= 0,
        inputs.proposal_draws >= 0,
        fault >= NO_FAULT,
        fault <= LOST_ACK_FAULT,
    )
    retry = z3.And(
        pre.generation >= 1,
        inputs.expected_generation == pre.generation - 1,
        inputs.txn == pre.last_txn,
    )
    fresh, gate = fresh_generation(pre, inputs), finished_gate(pre)
    runs = z3.And(z3.Not(retry), fresh, z3.Not(gate), well_formed)
    published = z3.And(runs, valid, z3.Or(fault == NO_FAULT, fault == LOST_ACK_FAULT))
    return Publication(
        well_formed=well_formed,
        retry=retry,
        stale=z3.And(z3.Not(retry), z3.Not(fresh)),
        refused_finished=z3.And(z3.Not(retry), fresh, gate),
        runs=runs,
        rows_valid=valid,
        aborted=z3.And(
            runs, z3.Or(z3.And(fault >= FIRST_FAULT, fault <= LAST_ABORTING_FAULT), z3.Not(valid))
        ),
        published=published,
        acknowledged=z3.Or(
            z3.And(published, fault != LOST_ACK_FAULT), z3.And(retry, well_formed, fault == NO_FAULT)
        ),
    )


def _successor(
    pre: ProtocolState,
    inputs: RoundInputs,
    emission: Emission,
    plan: CommitPlan,
    processed: TokenList,
    rng_after: tuple[Int, Int, Int],
) -> ProtocolState:
    """The staged S_1 of a round that runs."""
    return ProtocolState(
        output=pre.output.extended(emission.candidates, emission.count),
        cache=pre.cache.extended(plan.rows, plan.count),
        frontier=emission.last,
        position=pre.position + plan.count,
        processed=processed,
        rng_proposal=rng_after[0],
        rng_accept=rng_after[1],
        rng_terminal=rng_after[2],
        generation=pre.generation + 1,
        finished=emission.finishes,
        log_rounds=pre.log_rounds + 1,
        last_txn=inputs.txn,
    )


def round_outcome(pre: ProtocolState, inputs: RoundInputs, config: ProtocolConfig) -> RoundOutcome:
    """Build the z3 terms of one round attempt from ``pre`` and ``inputs`` (see the module docstring)."""
    big_k = config.max_draft
    if len(inputs.drafts) != big_k or len(inputs.row_tokens) != big_k + 1:
        raise InputError("round inputs were built for a different max_draft")
    k, accepted = inputs.draft_len, inputs.accepted
    emission = _emission(pre, inputs, config)
    kind = z3.If(
        emission.terminal_emitted,
        z3.If(accepted < k, int(TerminalKind.CORRECTION), int(TerminalKind.BONUS)),
        int(TerminalKind.STOP),
    )
    draws = (accept_draws(inputs, emission), terminal_draws(emission))
    plan = commit_plan(pre, inputs, emission, config)
    valid = rows_valid(pre, inputs, plan)
    rng_after = (
        pre.rng_proposal + inputs.proposal_draws,
        pre.rng_accept + draws[0],
        pre.rng_terminal + draws[1],
    )
    record = LoggedRound(
        emitted=emission.candidates,
        emitted_count=emission.count,
        committed=tuple(plan.rows),
        committed_count=plan.count,
        rng_after=rng_after,
        finished=emission.finishes,
        txn=inputs.txn,
    )
    successor = _successor(pre, inputs, emission, plan, processed_after(pre, inputs, emission), rng_after)
    publication = _publication(pre, inputs, config, valid)
    return RoundOutcome(
        **vars(publication),
        candidates=emission.candidates,
        emitted_count=emission.count,
        last_token=emission.last,
        terminal_kind=kind,
        accept_draws=draws[0],
        terminal_draws=draws[1],
        committed_rows=plan.count,
        verify_rows=k + 1 if config.layout is Layout.REPLAY_FRONTIER else k,
        finishes=emission.finishes,
        record=record,
        successor=successor,
        post=authoritative_post(pre, successor, publication, inputs),
    )


def round_relation(
    pre: ProtocolState,
    inputs: RoundInputs,
    post: ProtocolState,
    config: ProtocolConfig,
) -> Bool:
    """T(pre, inputs, post): ``post`` is the authoritative state after one round attempt on ``pre``."""
    return post.identical(round_outcome(pre, inputs, config).post)


def replay_round(pre: ProtocolState, record: LoggedRound) -> ProtocolState:
    """Apply a published round's log record to the state before it (what replaying the log does)."""
    emitted_last = select(record.emitted, record.emitted_count)
    return ProtocolState(
        output=pre.output.extended(record.emitted, record.emitted_count),
        cache=pre.cache.extended(record.committed, record.committed_count),
        frontier=emitted_last,
        position=pre.position + record.committed_count,
        processed=pre.processed.extended(record.emitted, record.emitted_count),
        rng_proposal=record.rng_after[0],
        rng_accept=record.rng_after[1],
        rng_terminal=record.rng_after[2],
        generation=pre.generation + 1,
        finished=record.finished,
        log_rounds=pre.log_rounds + 1,
        last_txn=record.txn,
    )


def conforms(
    pre: ProtocolState,
    inputs: RoundInputs,
    post: ProtocolState,
    config: ProtocolConfig,
    *,
    timeout_s: float = 10.0,
) -> bool:
    """Whether an observed (pre, inputs, post) is allowed by the round relation.

    Concrete values decide it by evaluation; symbolic ones ask whether some assignment allows it.
    """
    solver = z3.Solver()
    solver.set("timeout", int(timeout_s * 1000))
    solver.add(config.constraints(), round_relation(pre, inputs, post, config))
    return bool(solver.check() == z3.sat)


def _numeral(term: z3.ExprRef) -> int | bool:
    value = z3.simplify(term)
    if z3.is_int_value(value):
        return int(value.as_long())
    if z3.is_true(value) or z3.is_false(value):
        return bool(z3.is_true(value))
    raise InputError(f"not a concrete value: {value}")


def state_values(state: ProtocolState) -> dict[str, int | bool | tuple[int, ...]]:
    """A concrete state's fields as plain Python values (``InputError`` if any field is symbolic)."""

    def tokens(tokens: TokenList) -> tuple[int, ...]:
        length = _numeral(tokens.length)
        return tuple(int(_numeral(tokens.at(i))) for i in range(int(length)))

    return {
        "output": tokens(state.output),
        "cache": tokens(state.cache),
        "frontier": _numeral(state.frontier),
        "position": _numeral(state.position),
        "processed": tokens(state.processed),
        "rng": (
            int(_numeral(state.rng_proposal)),
            int(_numeral(state.rng_accept)),
            int(_numeral(state.rng_terminal)),
        ),
        "generation": _numeral(state.generation),
        "finished": _numeral(state.finished),
        "log_rounds": _numeral(state.log_rounds),
        "last_txn": _numeral(state.last_txn),
    }


def expected_post(
    pre: ProtocolState, inputs: RoundInputs, config: ProtocolConfig
) -> dict[str, int | bool | tuple[int, ...]]:
    """The authoritative state the relation allows after a concrete round attempt, as plain values."""
    return state_values(round_outcome(pre, inputs, config).post)


def show_round(
    pre: ProtocolState, inputs: RoundInputs, outcome: RoundOutcome, config: ProtocolConfig, tag: str = ""
) -> tuple[tuple[str, Shown], ...]:
    """The terms of one attempt to print from a counterexample or witness (labels prefixed by ``tag``)."""
    return (
        (f"{tag}k", inputs.draft_len),
        (f"{tag}A", inputs.accepted),
        (f"{tag}drafts", inputs.drafts),
        (f"{tag}terminal_token", inputs.terminal_token),
        (f"{tag}fault", inputs.fault),
        (f"{tag}expected_generation", inputs.expected_generation),
        (f"{tag}generation", pre.generation),
        (f"{tag}emitted", outcome.emitted_count),
        (f"{tag}terminal_kind", outcome.terminal_kind),
        (f"{tag}finishes", outcome.finishes),
        (f"{tag}published", outcome.published),
        (f"{tag}len_O", pre.output.length),
        ("prompt_len", config.prompt_len),
        ("max_new", config.max_new),
        ("stop_ids", config.stop_ids),
    )
