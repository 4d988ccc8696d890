"""The protocol proofs: induction per invariant and layout, fault points, fencing and bounded runs.

The style is mypyvy's: the initial state satisfies the state invariants, every transition preserves each
round obligation (``INV and T and not INV'`` is unsat, per INV, per layout, K = 8), publication is
idempotent and fenced, the two layouts publish the same successor, bounded runs of six attempts with
arbitrary faults, retries and stale writers reach no violation, and pipelined publication (round t + 1
built on t's staged successor while t's write fails, conflicts, or hits F-5 / F-6) keeps the guarantees of
specs/faults.md (:mod:`.pipelined_proofs`). The sat-trace regressions
(:mod:`.regressions`) keep the interesting behaviours reachable, so an over-constrained relation cannot
pass vacuously; the mutations of the model (:data:`specround.model_check.mutants.MODEL_MUTATIONS`) show
that the proofs they name can fail.
"""

from __future__ import annotations

from dataclasses import replace

import z3

from specround.model_check.z3.pipelined_proofs import register_pipelined
from specround.model_check.z3.proofs import Obligation, Proof, ProofRegistry
from specround.model_check.z3.protocol_invariants import (
    ROUND_INVARIANTS,
    STATE_INVARIANTS,
    initial_state,
    round_obligations,
    state_invariants,
)
from specround.model_check.z3.protocol_state import (
    FAULT_POINTS,
    FIRST_FAULT,
    LAST_ABORTING_FAULT,
    LOST_ACK_FAULT,
    MAX_MODEL_DRAFT,
    NO_FAULT,
    ProtocolConfig,
    ProtocolState,
    RoundInputs,
    fault_code,
)
from specround.model_check.z3.regressions import register_regressions
from specround.model_check.z3.transition import round_outcome, round_relation, show_round
from specround.sampling.types import Layout

__all__ = ["BMC_MAX_DRAFT", "BMC_ROUNDS", "LAYOUTS", "protocol_proofs"]

BMC_ROUNDS = 6
"""Rounds of the bounded model check from the initial state."""
BMC_MAX_DRAFT = 2
"""Draft length of the bounded runs: each round emits 1..K+1 tokens and the cost grows like (K + 2)^rounds,
so the bounded runs use a small K while the inductive proofs use ``MAX_MODEL_DRAFT``."""
LAYOUTS = (Layout.REPLAY_FRONTIER, Layout.RETAINED_FRONTIER)
"""Both layouts, in registration order."""


def _init(invariant: str) -> Obligation:
    config = ProtocolConfig.symbolic(MAX_MODEL_DRAFT, Layout.REPLAY_FRONTIER)
    s0 = ProtocolState.symbolic("s0")
    return Obligation(
        premises=(config.constraints(), initial_state(s0, config)),
        goal=state_invariants(s0, config)[invariant],
        show=(("len_O", s0.output.length), ("prompt_len", config.prompt_len)),
    )


def _step(layout: Layout, invariant: str) -> Obligation:
    config = ProtocolConfig.symbolic(MAX_MODEL_DRAFT, layout)
    pre, post = ProtocolState.symbolic("pre"), ProtocolState.symbolic("post")
    inputs = RoundInputs.symbolic("in", MAX_MODEL_DRAFT)
    premises = (
        config.constraints(),
        *state_invariants(pre, config).values(),
        round_relation(pre, inputs, post, config),
    )
    goal = round_obligations(pre, inputs, post, config)[invariant]
    outcome = round_outcome(pre, inputs, config)
    return Obligation(premises=premises, goal=goal, show=show_round(pre, inputs, outcome, config))


def _fault(layout: Layout, point: str) -> Obligation:
    config = ProtocolConfig.symbolic(MAX_MODEL_DRAFT, layout)
    pre = ProtocolState.symbolic("pre")
    inputs = RoundInputs.symbolic("in", MAX_MODEL_DRAFT)
    code = fault_code(point)
    outcome = round_outcome(pre, inputs, config)
    clean = round_outcome(pre, inputs.with_fault(0), config)
    premises = (config.constraints(), *state_invariants(pre, config).values(), inputs.fault == code)
    if code <= 5:
        goal = z3.And(outcome.post.identical(pre), z3.Not(outcome.published), z3.Not(outcome.acknowledged))
    else:
        goal = z3.And(
            outcome.post.identical(clean.post),
            z3.Implies(clean.published, z3.And(outcome.published, z3.Not(outcome.acknowledged))),
        )
    return Obligation(premises=premises, goal=goal, show=show_round(pre, inputs, outcome, config))


def _idempotent(layout: Layout) -> Obligation:
    """Publish (acknowledged, or with the acknowledgement lost at F-6), then publish the same transaction."""
    config = ProtocolConfig.symbolic(MAX_MODEL_DRAFT, layout)
    s0 = ProtocolState.symbolic("s0")
    inputs = RoundInputs.symbolic("in", MAX_MODEL_DRAFT)
    first = round_outcome(s0, inputs, config)
    clean = round_outcome(s0, inputs.with_fault(0), config)
    s1 = first.post
    again = round_outcome(s1, inputs.with_fault(0), config)
    premises = (
        config.constraints(),
        *state_invariants(s0, config).values(),
        z3.Or(inputs.fault == NO_FAULT, inputs.fault == LOST_ACK_FAULT),
        clean.published,
    )
    goal = z3.And(
        s1.identical(clean.post),
        z3.Implies(inputs.fault == LOST_ACK_FAULT, z3.Not(first.acknowledged)),
        again.retry,
        again.acknowledged,
        z3.Not(again.published),
        again.post.identical(s1),
    )
    return Obligation(premises=premises, goal=goal, show=show_round(s0, inputs, first, config))


def _stale(layout: Layout) -> Obligation:
    """An attempt whose expected generation is not the current one publishes and appends nothing.

    Only the idempotent re-publication of the last transaction is acknowledged.
    """
    config = ProtocolConfig.symbolic(MAX_MODEL_DRAFT, layout)
    pre = ProtocolState.symbolic("pre")
    inputs = RoundInputs.symbolic("in", MAX_MODEL_DRAFT)
    outcome = round_outcome(pre, inputs, config)
    premises = (
        config.constraints(),
        *state_invariants(pre, config).values(),
        inputs.expected_generation != pre.generation,
    )
    goal = z3.And(
        z3.Not(outcome.published),
        outcome.post.identical(pre),
        z3.Implies(z3.Not(outcome.retry), z3.And(outcome.stale, z3.Not(outcome.acknowledged))),
    )
    return Obligation(premises=premises, goal=goal, show=show_round(pre, inputs, outcome, config))


def _two_writers(layout: Layout) -> Obligation:
    """Writer B publishes first; writer A's different transaction from the same snapshot is refused."""
    config = ProtocolConfig.symbolic(MAX_MODEL_DRAFT, layout)
    s0 = ProtocolState.symbolic("s0")
    in_b, in_a = RoundInputs.symbolic("b", MAX_MODEL_DRAFT), RoundInputs.symbolic("a", MAX_MODEL_DRAFT)
    b = round_outcome(s0, in_b, config)
    a = round_outcome(b.post, in_a, config)
    premises = (
        config.constraints(),
        *state_invariants(s0, config).values(),
        b.published,
        in_a.expected_generation == s0.generation,
        in_a.txn != in_b.txn,
    )
    goal = z3.And(a.stale, z3.Not(a.published), z3.Not(a.acknowledged), a.post.identical(b.post))
    return Obligation(premises=premises, goal=goal, show=show_round(s0, in_a, a, config))


def _layout_equivalence() -> Obligation:
    """Both layouts publish one successor and acknowledgement from one state and input (contract#staging)."""
    replay = ProtocolConfig.symbolic(MAX_MODEL_DRAFT, Layout.REPLAY_FRONTIER)
    retained = replace(replay, layout=Layout.RETAINED_FRONTIER)
    pre = ProtocolState.symbolic("pre")
    inputs = RoundInputs.symbolic("in", MAX_MODEL_DRAFT)
    a = round_outcome(pre, inputs, replay)
    b = round_outcome(pre, inputs, retained)
    premises = (replay.constraints(), *state_invariants(pre, replay).values())
    goal = z3.And(
        a.post.identical(b.post),
        a.acknowledged == b.acknowledged,
        a.committed_rows == b.committed_rows,
    )
    return Obligation(premises=premises, goal=goal, show=show_round(pre, inputs, b, retained))


def _bmc(layout: Layout, invariant: str, rounds: int, max_draft: int) -> Obligation:
    """Every run of ``rounds`` attempts from the initial state: the last attempt meets ``invariant``.

    Attempts at F-1..F-5 stutter (``protocol.stutter``), so any run of ``m <= rounds`` attempts that ends in
    a violation extends, by stuttering first, to a run of exactly ``rounds`` attempts whose *last* step
    violates: checking the last step of every ``rounds``-long run covers every depth up to ``rounds``.
    One query per invariant (a conjunction of all of them is an order of magnitude slower).
    """
    config = ProtocolConfig.symbolic(max_draft, layout)
    states = [ProtocolState.symbolic(f"s{n}") for n in range(rounds + 1)]
    inputs = [RoundInputs.symbolic(f"in{n}", max_draft) for n in range(rounds)]
    premises = [config.constraints(), initial_state(states[0], config)]
    for n in range(rounds):
        premises.append(round_relation(states[n], inputs[n], states[n + 1], config))
    last = rounds - 1
    goal = round_obligations(states[last], inputs[last], states[rounds], config)[invariant]
    show = tuple((f"s{n}.V", s.generation) for n, s in enumerate(states))
    show += tuple((f"in{n}.fault", x.fault) for n, x in enumerate(inputs))
    show += tuple((f"s{n}.len_O", s.output.length) for n, s in enumerate(states))
    return Obligation(premises=tuple(premises), goal=goal, show=show)


def _stutter(layout: Layout) -> Obligation:
    """From the initial state, an attempt that fails at F-1..F-5 leaves the state exactly as it was."""
    config = ProtocolConfig.symbolic(MAX_MODEL_DRAFT, layout)
    s0 = ProtocolState.symbolic("s0")
    inputs = RoundInputs.symbolic("in", MAX_MODEL_DRAFT)
    outcome = round_outcome(s0, inputs, config)
    premises = (
        config.constraints(),
        initial_state(s0, config),
        inputs.fault >= FIRST_FAULT,
        inputs.fault <= LAST_ABORTING_FAULT,
    )
    return Obligation(
        premises=premises, goal=outcome.post.identical(s0), show=show_round(s0, inputs, outcome, config)
    )


def _register_steps(registry: ProofRegistry, layout: Layout) -> None:
    tag = layout.value
    for inv in ROUND_INVARIANTS:
        registry.add(
            f"step.{tag}.{inv}",
            _step,
            layout,
            inv,
            covers=(inv, "contract#round-transaction", "contract#staging")
            if inv in ("INV-1", "INV-5")
            else (inv,),
            description=f"INV and T and not {inv}' is unsat (K = {MAX_MODEL_DRAFT})",
        )
    for point in FAULT_POINTS:
        registry.add(
            f"fault.{tag}.{point}",
            _fault,
            layout,
            point,
            covers=("INV-7", point, "contract#fenced-publication"),
            description="a fault here leaves state and log unchanged"
            if point != "F-6"
            else "F-6 publishes the successor but the caller sees no acknowledgement",
        )


def _register_fencing(registry: ProofRegistry, layout: Layout) -> None:
    tag = layout.value
    registry.add(
        f"idempotent_publication.{tag}",
        _idempotent,
        layout,
        covers=("INV-6", "INV-7", "F-6", "contract#fenced-publication"),
        description="re-publishing the same transaction returns the same successor, appends nothing",
    )
    registry.add(
        f"stale_generation.{tag}",
        _stale,
        layout,
        covers=("INV-6",),
        description="a stale generation cannot publish",
    )
    registry.add(
        f"two_writers.{tag}",
        _two_writers,
        layout,
        covers=("INV-6",),
        description="the loser of a publication race is refused and appends nothing",
    )
    stutter = registry.add(
        f"stutter.{tag}",
        _stutter,
        layout,
        covers=("INV-7",),
        description="failed attempts stutter (the premise of the bounded runs' depth argument)",
    )
    for inv in ROUND_INVARIANTS:
        registry.add(
            f"bmc.{tag}.{inv}",
            _bmc,
            layout,
            inv,
            BMC_ROUNDS,
            BMC_MAX_DRAFT,
            covers=(inv, *FAULT_POINTS),
            description=f"every run of <= {BMC_ROUNDS} attempts from the initial state with arbitrary "
            f"faults, retries and stale writers keeps {inv} (K = {BMC_MAX_DRAFT})",
            uses=(stutter,),
        )


def protocol_proofs() -> list[Proof]:
    """The registered protocol proofs: init, inductive steps, faults, fencing, BMC, reachability."""
    registry = ProofRegistry("protocol")
    for inv in STATE_INVARIANTS:
        registry.add(
            f"init.{inv}", _init, inv, covers=(inv,), description="the initial state satisfies the invariant"
        )
    for layout in LAYOUTS:
        _register_steps(registry, layout)
        _register_fencing(registry, layout)
        register_regressions(registry, layout)
        register_pipelined(registry, layout)
    registry.add(
        "layout_equivalence",
        _layout_equivalence,
        covers=("INV-5", "contract#staging"),
        description="both layouts publish the same successor from the same state and inputs",
    )
    return registry.proofs
