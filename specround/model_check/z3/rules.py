"""The rules one round attempt is made of, each a small function of z3 terms (contract#transaction).

:func:`~.transition.round_outcome` composes them; nothing else decides these questions. A mutation of the
model (:data:`specround.model_check.mutants.MODEL_MUTATIONS`) replaces one rule where
:mod:`.transition` binds it, by reference, for the duration of a ``with`` block, so this specification
carries no mutation hooks.

Between rounds ``C == O[:-1]`` and ``F == O[-1]`` in both layouts. The target reports the logical branch
rows ``[F, d_1..d_k]`` at positions ``P..P+k`` (row 0 replayed by the verify pass under
``replay_frontier``, retained beside the cache from a prior one-row call under ``retained_frontier``).
Emission scans ``d_1..d_A`` then the terminal token and stops after the first stop token or when the
budget is reached (``n = min(A + 1, H)`` tokens); the round commits the rows of ``[F] + d_1..d_(n-1)``
(= ``[F] + d_1..d_A`` whenever the terminal token is emitted; the final token of a finished request never
gets a row) after validating their token identities and positions. RNG: ``accept += min(A + 1, k)`` (or
``n`` when a stop at accepted position ``n`` ends the request), ``terminal += 1`` (0 on such a stop).
Processors advance over the emitted tokens. Publication is a compare-and-swap on the generation.

Pipelined publication (:mod:`.pipelined_rounds`) adds three rules: the writer hands a round's publication to
the log only when the round it was built on became durable (:func:`parent_gate`); an aborted round the
engine already acted on crops its K/V back to the last durable state the writer knows
(:func:`last_durable`); tokens are released only for durable, acknowledged rounds (:func:`released`).
"""

from __future__ import annotations

from dataclasses import dataclass

import z3

from specround.model_check.z3.protocol_state import ProtocolConfig, ProtocolState, RoundInputs
from specround.model_check.z3.terms import Bool, Int, TokenList

__all__ = [
    "CommitPlan",
    "Emission",
    "Publication",
    "accept_draws",
    "authoritative_post",
    "commit_plan",
    "ends_emission",
    "finished_gate",
    "fresh_generation",
    "last_durable",
    "parent_gate",
    "processed_after",
    "released",
    "rows_valid",
    "terminal_draws",
]


@dataclass(frozen=True)
class Emission:
    """What a round emits: e_1..e_{K+1} (d_1..d_A then the terminal token) and how many of them."""

    candidates: tuple[Int, ...]
    """e_1..e_{K+1} (positions beyond A + 1 are don't-care)."""
    count: Int
    """n = min(A + 1, H), shortened by a stop token."""
    last: Int
    """e_n, the new frontier."""
    terminal_emitted: Bool
    """Whether the terminal token is among the emitted ones (``n == A + 1``)."""
    finishes: Bool
    """Whether the round ends the request (a stop token or the budget)."""


@dataclass(frozen=True)
class CommitPlan:
    """The branch rows a round commits, the token each must hold, and how many are committed."""

    rows: tuple[Int, ...]
    """The rows' tokens as the target reports them (validated, not trusted)."""
    expected: tuple[Int, ...]
    """The token each row must hold: ``[F, d_1..d_K]``."""
    count: Int
    """Rows committed (the frontier row counts)."""


@dataclass(frozen=True)
class Publication:
    """How an attempt meets the generation fence and the fault points."""

    well_formed: Bool
    retry: Bool
    """Same transaction re-published at the generation it already moved (idempotent path)."""
    stale: Bool
    """Refused by the fence (StaleGenerationError)."""
    refused_finished: Bool
    """Refused because the request had finished (RequestFinishedError)."""
    runs: Bool
    """The round was computed (fresh generation, unfinished, well-formed input)."""
    rows_valid: Bool
    aborted: Bool
    """A fault at F-1..F-5 or a failed staging validation."""
    published: Bool
    acknowledged: Bool
    """The caller saw success (a publication whose acknowledgement was not lost, or an idempotent retry)."""


def ends_emission(token: Int, position: int, remaining: Int, config: ProtocolConfig) -> Bool:
    """Emission stops after e_position when it is a stop token or fills the budget (INV-2)."""
    return z3.Or(config.is_stop(token), position == remaining)


def accept_draws(inputs: RoundInputs, emission: Emission) -> Int:
    """ACCEPT uniforms consumed: every reached acceptance test (INV-3)."""
    k, accepted = inputs.draft_len, inputs.accepted
    return z3.If(emission.terminal_emitted, z3.If(accepted < k, accepted + 1, k), emission.count)


def terminal_draws(emission: Emission) -> Int:
    """TERMINAL uniforms consumed: one, unless a stop inside the accepted prefix ended the round (INV-3)."""
    return z3.If(emission.terminal_emitted, 1, 0)


def commit_plan(
    pre: ProtocolState, inputs: RoundInputs, emission: Emission, config: ProtocolConfig
) -> CommitPlan:
    """Commit the logical rows ``[F, d_1..d_(n-1)]`` of the branch, in either layout (INV-5)."""
    return CommitPlan(rows=inputs.row_tokens, expected=(pre.frontier, *inputs.drafts), count=emission.count)


def rows_valid(pre: ProtocolState, inputs: RoundInputs, plan: CommitPlan) -> Bool:
    """The committed rows hold the expected tokens at the expected positions (INV-5)."""
    return z3.And(
        inputs.row_base == pre.position,
        *[z3.Implies(j < plan.count, plan.rows[j] == plan.expected[j]) for j in range(len(plan.rows))],
    )


def processed_after(pre: ProtocolState, inputs: RoundInputs, emission: Emission) -> TokenList:
    """The processors advance over the emitted tokens (INV-4)."""
    return pre.processed.extended(emission.candidates, emission.count)


def fresh_generation(pre: ProtocolState, inputs: RoundInputs) -> Bool:
    """The compare-and-swap operand matches the current generation (INV-6)."""
    return inputs.expected_generation == pre.generation


def finished_gate(pre: ProtocolState) -> Bool:
    """A finished request gets no further round (INV-2)."""
    return pre.finished


def authoritative_post(
    pre: ProtocolState, successor: ProtocolState, publication: Publication, inputs: RoundInputs
) -> ProtocolState:
    """The successor once published; otherwise the state exactly as it was (INV-7)."""
    return successor.choose(publication.published, pre)


def parent_gate(parent_durable: Bool) -> Bool:
    """A pipelined round reaches the log only if the round it was built on became durable.

    The writer drops it otherwise: the fence alone lets it through when a rival's round holds the
    generation it expects.
    """
    return parent_durable


def last_durable(before: ProtocolState, staged: ProtocolState, durable: Bool) -> ProtocolState:
    """The writer's last durable state of a request after a pipelined write.

    The staged successor if the write became durable, else the state before it (what ``rollback_to``
    crops the engine's K/V to).
    """
    return staged.choose(durable, before)


def released(submitted: Bool, durable: Bool, acknowledged: Bool) -> Bool:
    """A round's tokens reach the caller once its round is durable and acknowledged.

    Never on the decision alone; an F-6 round is durable but unacknowledged until its idempotent retry.
    """
    return z3.And(durable, acknowledged)
