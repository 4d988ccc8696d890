"""The protocol model's invariants: the initial state, INV-1..INV-6 of a state, and what a round must do.

:func:`state_invariants` are properties of one state; :func:`round_obligations` states, declaratively over
``(pre, inputs, post)``, what every round attempt must satisfy (INV-1..INV-8 and INV-10; INV-9, the hash
chain, is modelled in :mod:`.hash_chain`).
"""

from __future__ import annotations

from dataclasses import dataclass

import z3

from specround.model_check.z3.protocol_state import (
    FIRST_FAULT,
    LAST_ABORTING_FAULT,
    LOST_ACK_FAULT,
    NO_FAULT,
    NO_TXN,
    ProtocolConfig,
    ProtocolState,
    RoundInputs,
)
from specround.model_check.z3.terms import Bool, Int, first_true
from specround.model_check.z3.transition import RoundOutcome, replay_round, round_outcome
from specround.sampling.types import TerminalKind

__all__ = ["ROUND_INVARIANTS", "STATE_INVARIANTS", "initial_state", "round_obligations", "state_invariants"]

STATE_INVARIANTS = ("INV-1", "INV-2", "INV-3", "INV-4", "INV-6")
"""The invariants of a single state (:func:`state_invariants`)."""
ROUND_INVARIANTS = ("INV-1", "INV-2", "INV-3", "INV-4", "INV-5", "INV-6", "INV-7", "INV-8", "INV-10")
"""The obligations of a round attempt (:func:`round_obligations`)."""


def _index() -> Int:
    return z3.Int("i")


def initial_state(s: ProtocolState, config: ProtocolConfig) -> Bool:
    """The state a request is opened in: O = the prompt, C = O[:-1], F = O[-1], nothing generated."""
    i = _index()
    return z3.And(
        s.output.length == config.prompt_len,
        s.cache.length == s.output.length - 1,
        z3.ForAll([i], z3.Implies(z3.And(i >= 0, i < s.cache.length), s.cache.at(i) == s.output.at(i))),
        s.frontier == s.output.last(),
        s.position == s.cache.length,
        s.processed.length == 0,
        s.rng_proposal == 0,
        s.rng_accept == 0,
        s.rng_terminal == 0,
        s.generation == 0,
        z3.Not(s.finished),
        s.log_rounds == 0,
        s.last_txn == NO_TXN,
    )


def state_invariants(s: ProtocolState, config: ProtocolConfig) -> dict[str, Bool]:
    """The state invariants, by number (INV-5, INV-7, INV-8 and INV-10 are properties of a round)."""
    i = _index()
    out, cache, processed = s.output, s.cache, s.processed
    generated = out.length - config.prompt_len
    last = out.last()
    is_stop = config.is_stop
    return {
        # INV-1 is stated for unfinished requests; the project keeps the same shape after the final round
        # (the last token's row is never materialised), so the model checks it in every state.
        "INV-1": z3.And(
            out.length >= 1,
            cache.length == out.length - 1,
            z3.ForAll([i], z3.Implies(z3.And(i >= 0, i < cache.length), cache.at(i) == out.at(i))),
            s.frontier == last,
            s.position == cache.length,
        ),
        "INV-2": z3.And(
            generated >= 0,
            generated <= config.max_new,
            z3.ForAll(
                [i],
                z3.Implies(z3.And(config.prompt_len <= i, i < out.length - 1), z3.Not(is_stop(out.at(i)))),
            ),
            z3.Implies(
                z3.Not(s.finished),
                z3.And(generated < config.max_new, z3.Or(generated == 0, z3.Not(is_stop(last)))),
            ),
            z3.Implies(s.finished, z3.And(generated >= 1, z3.Or(is_stop(last), generated == config.max_new))),
        ),
        # Every published round draws its terminal uniform, except a final round that a stop inside the
        # accepted prefix ended: so terminal == V while unfinished, and V - 1 <= terminal <= V after.
        "INV-3": z3.And(
            s.rng_proposal >= 0,
            s.rng_accept >= 0,
            s.rng_accept <= config.max_draft * s.generation,
            z3.Implies(z3.Not(s.finished), s.rng_terminal == s.generation),
            z3.Implies(
                s.finished, z3.And(s.rng_terminal <= s.generation, s.rng_terminal >= s.generation - 1)
            ),
        ),
        "INV-4": z3.And(
            processed.length == generated,
            z3.ForAll(
                [i],
                z3.Implies(
                    z3.And(i >= 0, i < processed.length), processed.at(i) == out.at(config.prompt_len + i)
                ),
            ),
        ),
        "INV-6": z3.And(
            s.generation >= 0,
            s.log_rounds == s.generation,
            z3.Implies(s.generation == 0, s.last_txn == NO_TXN),
        ),
    }


@dataclass(frozen=True)
class _Round:
    """One attempt ``pre -> post`` and the quantities its obligations are stated in."""

    pre: ProtocolState
    inputs: RoundInputs
    post: ProtocolState
    config: ProtocolConfig
    outcome: RoundOutcome
    """Consulted only for what the caller observes and what the round logs."""
    no_fault: RoundOutcome
    """The same attempt without its fault."""
    after: dict[str, Bool]
    """The state invariants of ``post``."""
    published: Bool
    growth: Int
    emitted: list[Int]
    """d_1..d_A then the terminal token, 1-based."""
    expected_growth: Int
    prefix_stop: Bool
    """A stop inside the accepted prefix ended the round (no terminal token)."""
    reached_tests: Int
    committed_drafts: Int
    retry: Bool
    stale: Bool


def _round(pre: ProtocolState, inputs: RoundInputs, post: ProtocolState, config: ProtocolConfig) -> _Round:
    big_k = config.max_draft
    k, accepted, terminal, drafts = inputs.draft_len, inputs.accepted, inputs.terminal_token, inputs.drafts
    growth = post.output.length - pre.output.length
    emitted = [z3.If(j <= accepted, drafts[j - 1], terminal) for j in range(1, big_k + 1)] + [terminal]
    first_stop = first_true(
        [z3.And(j <= accepted + 1, config.is_stop(emitted[j - 1])) for j in range(1, big_k + 2)], big_k + 2
    )
    remaining = config.max_new - (pre.output.length - config.prompt_len)
    stop_distance = z3.If(first_stop < remaining, first_stop, remaining)
    prefix_stop = growth <= accepted
    reached_tests = z3.Sum(
        [
            z3.If(z3.And(t <= k, t <= accepted + 1, z3.Or(z3.Not(prefix_stop), t <= growth)), 1, 0)
            for t in range(1, big_k + 1)
        ]
        or [z3.IntVal(0)]
    )
    retry = z3.And(
        pre.generation >= 1, inputs.expected_generation == pre.generation - 1, inputs.txn == pre.last_txn
    )
    return _Round(
        pre=pre,
        inputs=inputs,
        post=post,
        config=config,
        outcome=round_outcome(pre, inputs, config),
        no_fault=round_outcome(pre, inputs.with_fault(0), config),
        after=state_invariants(post, config),
        published=post.generation == pre.generation + 1,
        growth=growth,
        emitted=emitted,
        expected_growth=z3.If(accepted + 1 < stop_distance, accepted + 1, stop_distance),
        prefix_stop=prefix_stop,
        reached_tests=reached_tests,
        committed_drafts=z3.If(accepted < growth - 1, accepted, growth - 1),
        retry=retry,
        stale=z3.And(inputs.expected_generation != pre.generation, z3.Not(retry)),
    )


def _inv2(r: _Round) -> Bool:
    return z3.And(
        r.after["INV-2"],
        z3.Implies(r.pre.finished, r.post.identical(r.pre)),
        z3.Implies(r.published, r.growth == r.expected_growth),
    )


def _inv3(r: _Round) -> Bool:
    pre, post = r.pre, r.post
    return z3.And(
        r.after["INV-3"],
        z3.Implies(
            r.published,
            z3.And(
                post.rng_accept - pre.rng_accept == r.reached_tests,
                post.rng_terminal - pre.rng_terminal == z3.If(r.prefix_stop, 0, 1),
                post.rng_proposal - pre.rng_proposal == r.inputs.proposal_draws,
            ),
        ),
    )


def _inv4(r: _Round) -> Bool:
    i = _index()
    pre, post = r.pre, r.post
    kept = z3.ForAll(
        [i], z3.Implies(z3.And(i >= 0, i < pre.processed.length), post.processed.at(i) == pre.processed.at(i))
    )
    return z3.And(
        r.after["INV-4"],
        z3.Implies(r.published, z3.And(post.processed.length == pre.processed.length + r.growth, kept)),
    )


def _inv5(r: _Round) -> Bool:
    i = _index()
    pre, post, drafts = r.pre, r.post, r.inputs.drafts
    c_len = pre.cache.length
    return z3.Implies(
        r.published,
        z3.And(
            post.cache.length == c_len + 1 + r.committed_drafts,
            z3.ForAll([i], z3.Implies(z3.And(i >= 0, i < c_len), post.cache.at(i) == pre.cache.at(i))),
            post.cache.at(c_len) == pre.frontier,
            *[
                z3.Implies(j <= r.committed_drafts, post.cache.at(c_len + j) == drafts[j - 1])
                for j in range(1, r.config.max_draft + 1)
            ],
            post.position == pre.position + 1 + r.committed_drafts,
            r.outcome.committed_rows == 1 + r.committed_drafts,
        ),
    )


def _inv6(r: _Round) -> Bool:
    pre, post, inputs, outcome = r.pre, r.post, r.inputs, r.outcome
    return z3.And(
        r.after["INV-6"],
        z3.Or(post.generation == pre.generation, r.published),
        z3.Implies(
            r.published,
            z3.And(
                inputs.expected_generation == pre.generation,
                post.log_rounds == pre.log_rounds + 1,
                post.last_txn == inputs.txn,
            ),
        ),
        z3.Implies(post.generation == pre.generation, post.identical(pre)),
        z3.Implies(inputs.expected_generation != pre.generation, post.identical(pre)),
        z3.Implies(z3.And(r.retry, outcome.well_formed, inputs.fault == NO_FAULT), outcome.acknowledged),
        z3.Implies(r.stale, z3.Not(outcome.acknowledged)),
    )


def _inv7(r: _Round) -> Bool:
    fault, acknowledged = r.inputs.fault, r.outcome.acknowledged
    return z3.And(
        z3.Implies(
            z3.And(fault >= FIRST_FAULT, fault <= LAST_ABORTING_FAULT),
            z3.And(r.post.identical(r.pre), z3.Not(acknowledged)),
        ),
        z3.Implies(
            fault == LOST_ACK_FAULT,
            z3.And(
                r.post.identical(r.no_fault.post),
                z3.Implies(r.no_fault.published, z3.Not(acknowledged)),
            ),
        ),
    )


def _inv10(r: _Round) -> Bool:
    pre, post, inputs = r.pre, r.post, r.inputs
    return z3.Implies(
        r.published,
        z3.And(
            *[
                z3.Implies(j < r.growth, post.output.at(pre.output.length + j) == r.emitted[j])
                for j in range(r.config.max_draft + 1)
            ],
            r.outcome.terminal_kind
            == z3.If(
                r.prefix_stop,
                int(TerminalKind.STOP),
                z3.If(
                    inputs.accepted < inputs.draft_len, int(TerminalKind.CORRECTION), int(TerminalKind.BONUS)
                ),
            ),
        ),
    )


def round_obligations(
    pre: ProtocolState, inputs: RoundInputs, post: ProtocolState, config: ProtocolConfig
) -> dict[str, Bool]:
    """What every round attempt must satisfy, by INV number, stated declaratively over (pre, inputs, post).

    ``post`` is constrained by the relation elsewhere; the outcome is consulted only for what the caller
    observes (acknowledgement) and what the round logs (its record and committed row count).
    """
    r = _round(pre, inputs, post, config)
    return {
        "INV-1": r.after["INV-1"],
        "INV-2": _inv2(r),
        "INV-3": _inv3(r),
        "INV-4": _inv4(r),
        "INV-5": _inv5(r),
        "INV-6": _inv6(r),
        "INV-7": _inv7(r),
        "INV-8": z3.Implies(r.published, post.identical(replay_round(pre, r.outcome.record))),
        "INV-10": _inv10(r),
    }
