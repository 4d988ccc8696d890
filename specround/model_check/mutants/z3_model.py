"""Mutations of the z3 model: wrong variants of its rules, each refuted by the proof it names.

Contract: contract#failure-lab.

The seams are the rules of :mod:`specround.model_check.z3.rules` where :mod:`~specround.model_check.z3.
transition` binds them (by identity, as for the code path); each wrong variant is built from the original
rule. The step proofs run on the replay layout; ``retained skips frontier row`` breaks the retained layout
only, and the layout-equivalence proof must see it. The pipelined-publication mutations replace the rules
:mod:`~specround.model_check.z3.pipelined_rounds` binds and are refuted by the replay layout's pipelined
proofs (:mod:`~specround.model_check.z3.pipelined_proofs`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import z3

from specround.model_check.mutants.mutation import Mutation, Scratch, Seam
from specround.model_check.z3 import pipelined_rounds, rules, transition
from specround.model_check.z3.protocol_state import ProtocolConfig, ProtocolState, RoundInputs
from specround.model_check.z3.rules import CommitPlan, Emission, Publication
from specround.model_check.z3.terms import Bool, Int, TokenList
from specround.sampling.types import Layout

__all__ = ["MODEL_MUTATIONS"]

_STEP = "protocol.step.replay_frontier"
_PIPELINED = "protocol.pipelined.replay_frontier"


def _commit_rejected_row(original: Any, _scratch: Scratch) -> Any:
    def commit_plan(
        pre: ProtocolState, inputs: RoundInputs, emission: Emission, config: ProtocolConfig
    ) -> Any:
        plan: CommitPlan = original(pre, inputs, emission, config)
        rejected = z3.And(emission.terminal_emitted, inputs.accepted < inputs.draft_len)
        return replace(plan, count=z3.If(rejected, plan.count + 1, plan.count))

    return commit_plan


def _without_frontier_row(plan: CommitPlan) -> CommitPlan:
    return CommitPlan(rows=plan.rows[1:], expected=plan.expected[1:], count=plan.count - 1)


def _skip_frontier_row(original: Any, _scratch: Scratch) -> Any:
    def commit_plan(
        pre: ProtocolState, inputs: RoundInputs, emission: Emission, config: ProtocolConfig
    ) -> Any:
        return _without_frontier_row(original(pre, inputs, emission, config))

    return commit_plan


def _retained_skips_frontier_row(original: Any, _scratch: Scratch) -> Any:
    def commit_plan(
        pre: ProtocolState, inputs: RoundInputs, emission: Emission, config: ProtocolConfig
    ) -> Any:
        plan: CommitPlan = original(pre, inputs, emission, config)
        return _without_frontier_row(plan) if config.layout is Layout.RETAINED_FRONTIER else plan

    return commit_plan


def _trust_rows(_original: Any, _scratch: Scratch) -> Any:
    def rows_valid(pre: ProtocolState, inputs: RoundInputs, plan: CommitPlan) -> Bool:
        return z3.BoolVal(True)

    return rows_valid


def _continue_after_stop(_original: Any, _scratch: Scratch) -> Any:
    def ends_emission(token: Int, position: int, remaining: Int, config: ProtocolConfig) -> Bool:
        return position == remaining

    return ends_emission


def _round_after_finish(_original: Any, _scratch: Scratch) -> Any:
    def finished_gate(pre: ProtocolState) -> Bool:
        return z3.BoolVal(False)

    return finished_gate


def _every_accept_draw(_original: Any, _scratch: Scratch) -> Any:
    def accept_draws(inputs: RoundInputs, emission: Emission) -> Int:
        return inputs.draft_len

    return accept_draws


def _terminal_draw_always(_original: Any, _scratch: Scratch) -> Any:
    def terminal_draws(emission: Emission) -> Int:
        return z3.IntVal(1)

    return terminal_draws


def _advance_over_drafts(_original: Any, _scratch: Scratch) -> Any:
    def processed_after(pre: ProtocolState, inputs: RoundInputs, emission: Emission) -> TokenList:
        return pre.processed.extended(inputs.drafts, inputs.draft_len)

    return processed_after


def _no_fence(_original: Any, _scratch: Scratch) -> Any:
    def fresh_generation(pre: ProtocolState, inputs: RoundInputs) -> Bool:
        return z3.BoolVal(True)

    return fresh_generation


def _stage_in_place(original: Any, _scratch: Scratch) -> Any:
    def authoritative_post(
        pre: ProtocolState, successor: ProtocolState, publication: Publication, inputs: RoundInputs
    ) -> ProtocolState:
        post: ProtocolState = original(pre, successor, publication, inputs)
        fault = inputs.fault
        staged = z3.And(publication.runs, publication.rows_valid, z3.Or(fault == 0, fault >= 4))
        return replace(post, cache=successor.cache.choose(staged, pre.cache))

    return authoritative_post


def _rng_kept_on_abort(original: Any, _scratch: Scratch) -> Any:
    def authoritative_post(
        pre: ProtocolState, successor: ProtocolState, publication: Publication, inputs: RoundInputs
    ) -> ProtocolState:
        post: ProtocolState = original(pre, successor, publication, inputs)
        runs = publication.runs
        return replace(
            post,
            rng_proposal=z3.If(runs, successor.rng_proposal, pre.rng_proposal),
            rng_accept=z3.If(runs, successor.rng_accept, pre.rng_accept),
            rng_terminal=z3.If(runs, successor.rng_terminal, pre.rng_terminal),
        )

    return authoritative_post


def _no_parent_gate(_original: Any, _scratch: Scratch) -> Any:
    def parent_gate(parent_durable: Bool) -> Bool:
        return z3.BoolVal(True)

    return parent_gate


def _fence_on_staged(_original: Any, _scratch: Scratch) -> Any:
    def fresh_generation(pre: ProtocolState, inputs: RoundInputs) -> Bool:
        return z3.BoolVal(True)

    return fresh_generation


def _rollback_to_staged(_original: Any, _scratch: Scratch) -> Any:
    def last_durable(before: ProtocolState, staged: ProtocolState, durable: Bool) -> ProtocolState:
        return staged

    return last_durable


def _release_on_decision(_original: Any, _scratch: Scratch) -> Any:
    def released(submitted: Bool, durable: Bool, acknowledged: Bool) -> Bool:
        return submitted

    return released


def _mutation(
    name: str,
    failure_class: str,
    invariant: str,
    seam: Seam,
    refuted_by: str = "",
    sections: tuple[str, ...] = (),
) -> Mutation:
    """A mutation of one rule, refuted by the replay-layout step proof of ``invariant`` unless named."""
    violates = (invariant, *sections)
    return Mutation(name, "z3 model", failure_class, violates, (seam,), refuted_by or f"{_STEP}.{invariant}")


MODEL_MUTATIONS = (
    _mutation(
        "commit rejected row",
        "the rejected draft's K/V row is committed as well",
        "INV-5",
        Seam(transition, rules.commit_plan, _commit_rejected_row),
    ),
    _mutation(
        "skip frontier row",
        "only the accepted draft rows are committed, never the frontier row",
        "INV-5",
        Seam(transition, rules.commit_plan, _skip_frontier_row),
    ),
    _mutation(
        "skip row validation",
        "the target's reported rows are trusted without checking token identities and positions",
        "INV-5",
        Seam(transition, rules.rows_valid, _trust_rows),
    ),
    _mutation(
        "continue after stop",
        "emission goes on after a stop token",
        "INV-2",
        Seam(transition, rules.ends_emission, _continue_after_stop),
    ),
    _mutation(
        "round after finish",
        "a finished request still gets rounds",
        "INV-2",
        Seam(transition, rules.finished_gate, _round_after_finish),
    ),
    _mutation(
        "extra accept draw",
        "every drafted position's acceptance uniform is counted, reached or not",
        "INV-3",
        Seam(transition, rules.accept_draws, _every_accept_draw),
    ),
    _mutation(
        "terminal draw on prefix stop",
        "a TERMINAL uniform is consumed even when a stop inside the accepted prefix ends the request",
        "INV-3",
        Seam(transition, rules.terminal_draws, _terminal_draw_always),
    ),
    _mutation(
        "advance over drafts",
        "the processors advance over every verified draft instead of the emitted tokens",
        "INV-4",
        Seam(transition, rules.processed_after, _advance_over_drafts),
    ),
    _mutation(
        "no generation fence",
        "publication does not compare the generation",
        "INV-6",
        Seam(transition, rules.fresh_generation, _no_fence),
    ),
    _mutation(
        "stage in place",
        "the committed K/V rows are written into the authoritative cache at F-3 instead of at publication",
        "INV-7",
        Seam(transition, rules.authoritative_post, _stage_in_place),
    ),
    _mutation(
        "advance rng on abort",
        "the consumed RNG counters are kept when the round aborts",
        "INV-7",
        Seam(transition, rules.authoritative_post, _rng_kept_on_abort),
    ),
    _mutation(
        "retained skips frontier row",
        "the retained layout commits only the accepted draft rows (the replay layout is intact)",
        "INV-5",
        Seam(transition, rules.commit_plan, _retained_skips_frontier_row),
        refuted_by="protocol.layout_equivalence",
        sections=("contract#staging",),
    ),
    _mutation(
        "t+1 on a fenced-out round",
        "the writer hands t + 1 to the log although t lost the fence (only the generation fence guards it)",
        "INV-6",
        Seam(pipelined_rounds, rules.parent_gate, _no_parent_gate),
        refuted_by=f"{_PIPELINED}.write_conflicts",
        sections=("write conflicts", "contract#fenced-publication"),
    ),
    Mutation(
        "t+1 publishes although t failed",
        "z3 model",
        "t + 1 is written without its parent's durability or the log's generation, after t's write failed",
        ("INV-7", "write fails", "contract#fenced-publication"),
        (
            Seam(pipelined_rounds, rules.parent_gate, _no_parent_gate),
            Seam(pipelined_rounds, rules.fresh_generation, _fence_on_staged),
        ),
        f"{_PIPELINED}.write_fails",
    ),
    _mutation(
        "rollback ignores the failed round",
        "rollback_to crops the engine's K/V to t's staged successor, as if t's failed write were durable",
        "INV-7",
        Seam(pipelined_rounds, rules.last_durable, _rollback_to_staged),
        refuted_by=f"{_PIPELINED}.write_fails",
        sections=("write fails", "contract#kv-commit"),
    ),
    _mutation(
        "release before durable",
        "a round's tokens are released once the sampler decided, before its write is durable",
        "INV-7",
        Seam(pipelined_rounds, rules.released, _release_on_decision),
        refuted_by=f"{_PIPELINED}.safety",
        sections=("write fails", "write conflicts"),
    ),
)
"""Every mutation of the z3 model, each refuted by the proof it names (``protocol.mutant.*``)."""
