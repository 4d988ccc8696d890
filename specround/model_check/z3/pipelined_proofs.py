"""Proofs of pipelined publication: what each outcome of t's write guarantees, with t + 1 in flight.

The pipelined relation is :func:`~.pipelined_rounds.pipelined_outcome`. Every proof (K =
:data:`PIPELINED_MAX_DRAFT`) starts from a state meeting the state invariants, a round t that staged and
validated (so it was handed to the writer) and a round t + 1 built on t's staged successor; the fault
points of both rounds come from the write outcome. The guarantees are stated against rounds recomputed
with :func:`~.transition.round_outcome`, not against the relation's own terms, as in specs/faults.md
("Pipelined publication"):

* ``pipelined.<layout>.durable``: both rounds publish, the log holds t + 1's successor of t's successor;
* ``pipelined.<layout>.write_fails``: t and t + 1 are aborted, the log is as before t, and ``rollback_to``
  of every round handed to the writer is the durable cache length;
* ``pipelined.<layout>.write_conflicts``: t loses the fence, t + 1 is aborted (not written, although the
  fence alone would take it), the log holds the rival's round, ``rollback_to`` is the durable cache
  length this writer knew;
* ``pipelined.<layout>.F-5_in_flight``: t publishes, t + 1 alone is aborted, without a K/V crop;
* ``pipelined.<layout>.ack_lost_in_flight``: t is durable but unacknowledged, t + 1 publishes on it;
* ``pipelined.<layout>.safety``: for every write outcome, nothing built on a non-durable round is
  published, tokens are released only for durable rounds, and a round's ``durable`` is the log's word;
* ``pipelined.<layout>.invariants``: for every write outcome the log's final state meets the state
  invariants (INV-1..INV-4, INV-6).

``reach.<layout>.pipelined_<cell>`` keeps each cell reachable with t + 1 actually handed to the writer (or,
for F-5, staged), so the proofs above cannot hold vacuously.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import z3

from specround.model_check.z3.pipelined_rounds import (
    NO_ROLLBACK,
    WRITE_CONFLICTS,
    WRITE_OUTCOMES,
    PipelinedInputs,
    PipelinedOutcome,
    pipelined_outcome,
)
from specround.model_check.z3.proofs import Obligation, ProofKind, ProofRegistry, Shown
from specround.model_check.z3.protocol_invariants import state_invariants
from specround.model_check.z3.protocol_state import (
    NO_FAULT,
    ProtocolConfig,
    ProtocolState,
)
from specround.model_check.z3.terms import Bool
from specround.model_check.z3.transition import RoundOutcome, round_outcome
from specround.sampling.types import Layout

__all__ = ["PIPELINED_COVERS", "PIPELINED_MAX_DRAFT", "cell_tag", "register_pipelined"]

PIPELINED_MAX_DRAFT = 2
"""Draft length K of the pipelined proofs. A pipelined run composes four round attempts (t, t + 1, the rival's
round, t's write) over one state; the proofs hold in well under a second at ``MAX_MODEL_DRAFT``, but the
counterexample search that refutes their mutations does not finish in minutes there, so (like the bounded
runs) the pipeline uses a small K; each round still emits 1..K+1 tokens, stops and caps included."""

PIPELINED_COVERS: dict[str, tuple[str, ...]] = {
    "durable": ("INV-6", "contract#fenced-publication"),
    "write fails": ("write fails", "INV-7", "contract#fenced-publication", "contract#kv-commit"),
    "write conflicts": ("write conflicts", "INV-6", "contract#fenced-publication", "contract#kv-commit"),
    "F-5 in flight": ("F-5 in flight", "F-5", "INV-7", "contract#fenced-publication"),
    "ack lost in flight": ("ack lost in flight", "F-6", "contract#fenced-publication"),
}
"""What each write outcome's proof covers (the ``specround faults`` cell it models, by name)."""


def cell_tag(cell: str) -> str:
    """The proof-name form of a write outcome: ``"F-5 in flight"`` -> ``"F-5_in_flight"``."""
    return cell.replace(" ", "_")


@dataclass(frozen=True)
class _Pipeline:
    """One pipelined run and the rounds its guarantees are stated against."""

    config: ProtocolConfig
    s0: ProtocolState
    inputs: PipelinedInputs
    outcome: PipelinedOutcome
    first: RoundOutcome
    """Round t on ``s0``, fault-free."""
    second: RoundOutcome
    """Round t + 1 on t's staged successor, fault-free."""
    rival: RoundOutcome
    """The rival's round on ``s0``."""
    premises: tuple[Bool, ...]


def _pipeline(layout: Layout) -> _Pipeline:
    config = ProtocolConfig.symbolic(PIPELINED_MAX_DRAFT, layout)
    s0 = ProtocolState.symbolic("s0")
    x = PipelinedInputs.symbolic("in", PIPELINED_MAX_DRAFT)
    first = round_outcome(s0, x.first, config)
    second = round_outcome(first.successor, x.second, config)
    premises = (
        config.constraints(),
        *state_invariants(s0, config).values(),
        x.first.fault == NO_FAULT,
        x.second.fault == NO_FAULT,
        first.published,
        x.second.expected_generation == s0.generation + 1,
        x.rival.txn != x.first.txn,
        x.write >= min(WRITE_OUTCOMES.values()),
        x.write <= max(WRITE_OUTCOMES.values()),
    )
    return _Pipeline(
        config=config,
        s0=s0,
        inputs=x,
        outcome=pipelined_outcome(s0, x, config),
        first=first,
        second=second,
        rival=round_outcome(s0, x.rival, config),
        premises=premises,
    )


def _show(p: _Pipeline) -> tuple[tuple[str, Shown], ...]:
    o, x = p.outcome, p.inputs
    return (
        ("write", x.write),
        ("t.k", x.first.draft_len),
        ("t.A", x.first.accepted),
        ("t+1.k", x.second.draft_len),
        ("t+1.A", x.second.accepted),
        ("t+1.expected_generation", x.second.expected_generation),
        ("s0.V", p.s0.generation),
        ("s0.len_C", p.s0.cache.length),
        ("t.(submitted, durable, acknowledged, released)", _flags(o, 0)),
        ("t+1.(submitted, durable, acknowledged, released)", _flags(o, 1)),
        ("rollback_to", (o.first.rollback_to, o.second.rollback_to)),
        ("rival.published", p.rival.published),
        ("durable.V", o.durable.generation),
        ("durable.len_C", o.durable.cache.length),
    )


def _flags(o: PipelinedOutcome, index: int) -> tuple[Bool, ...]:
    r = o.first if index == 0 else o.second
    return (r.submitted, r.durable, r.acknowledged, r.released)


def _in_log(p: _Pipeline) -> tuple[Bool, Bool]:
    """Whether t's and t + 1's records are in the log, read off the log's states."""
    o, s0, x = p.outcome, p.s0, p.inputs
    first = z3.And(o.after_first.generation == s0.generation + 1, o.after_first.last_txn == x.first.txn)
    second = z3.And(o.durable.generation == s0.generation + 2, o.durable.last_txn == x.second.txn)
    return first, second


def _durable(p: _Pipeline) -> Bool:
    o = p.outcome
    return z3.And(
        o.first.durable,
        o.first.acknowledged,
        o.first.released,
        o.first.rollback_to == NO_ROLLBACK,
        z3.Implies(
            p.second.published,
            z3.And(o.second.durable, o.second.released, o.durable.identical(p.second.post)),
        ),
        z3.Implies(z3.Not(p.second.published), o.durable.identical(p.first.successor)),
    )


def _aborted_both(p: _Pipeline) -> Bool:
    """Both rounds aborted and unreleased; every round handed to the writer crops to the durable C."""
    o, durable_cache = p.outcome, p.s0.cache.length
    return z3.And(
        o.first.aborted,
        z3.Not(o.first.durable),
        z3.Not(o.second.durable),
        z3.Implies(o.second.submitted, o.second.aborted),
        z3.Not(o.first.released),
        z3.Not(o.second.released),
        o.first.rollback_to == durable_cache,
        z3.Implies(o.second.submitted, o.second.rollback_to == durable_cache),
    )


def _write_fails(p: _Pipeline) -> Bool:
    o = p.outcome
    return z3.And(
        _aborted_both(p),
        o.durable.identical(p.s0),
        o.first.rollback_to == o.durable.cache.length,
    )


def _write_conflicts(p: _Pipeline) -> Bool:
    return z3.And(_aborted_both(p), p.outcome.durable.identical(p.rival.post))


def _f5_in_flight(p: _Pipeline) -> Bool:
    o = p.outcome
    return z3.And(
        o.first.durable,
        o.first.acknowledged,
        o.first.released,
        o.durable.identical(p.first.successor),
        z3.Not(o.second.durable),
        z3.Not(o.second.submitted),
        z3.Implies(p.second.runs, o.second.aborted),
        z3.Not(o.second.released),
        o.second.rollback_to == NO_ROLLBACK,
    )


def _ack_lost_in_flight(p: _Pipeline) -> Bool:
    o = p.outcome
    return z3.And(
        o.first.durable,
        z3.Not(o.first.acknowledged),
        z3.Not(o.first.released),
        o.after_first.identical(p.first.successor),
        z3.Implies(
            p.second.published,
            z3.And(
                o.second.durable,
                o.second.acknowledged,
                o.second.released,
                o.durable.identical(p.second.post),
            ),
        ),
    )


_GUARANTEES: dict[str, Callable[[_Pipeline], Bool]] = {
    "durable": _durable,
    "write fails": _write_fails,
    "write conflicts": _write_conflicts,
    "F-5 in flight": _f5_in_flight,
    "ack lost in flight": _ack_lost_in_flight,
}


def _cell(layout: Layout, cell: str) -> Obligation:
    p = _pipeline(layout)
    premises = (*p.premises, p.inputs.write == WRITE_OUTCOMES[cell])
    if WRITE_OUTCOMES[cell] == WRITE_CONFLICTS:
        premises += (p.rival.published,)
    return Obligation(premises=premises, goal=_GUARANTEES[cell](p), show=_show(p))


def _safety(layout: Layout) -> Obligation:
    """Every write outcome: durability is the log's, t + 1 only on a durable t, release only when durable."""
    p = _pipeline(layout)
    o = p.outcome
    first_in_log, second_in_log = _in_log(p)
    rollback_points = (NO_ROLLBACK, p.s0.cache.length)
    goal = z3.And(
        o.first.durable == first_in_log,
        o.second.durable == second_in_log,
        z3.Implies(o.durable.generation == p.s0.generation + 2, first_in_log),
        z3.Implies(second_in_log, o.after_first.identical(p.first.successor)),
        z3.Implies(o.first.released, z3.And(first_in_log, o.after_first.identical(p.first.successor))),
        z3.Implies(o.second.released, z3.And(second_in_log, p.second.published)),
        z3.Or(*[o.first.rollback_to == r for r in rollback_points]),
        z3.Or(*[o.second.rollback_to == r for r in rollback_points]),
        z3.Implies(o.first.durable, o.first.rollback_to == NO_ROLLBACK),
    )
    return Obligation(premises=p.premises, goal=goal, show=_show(p))


def _invariants(layout: Layout) -> Obligation:
    """Every write outcome leaves the log in a state that meets the state invariants."""
    p = _pipeline(layout)
    goal = z3.And(*state_invariants(p.outcome.durable, p.config).values())
    return Obligation(premises=p.premises, goal=goal, show=_show(p))


_REACH: dict[str, Callable[[PipelinedOutcome], Bool]] = {
    "durable": lambda o: z3.And(o.first.released, o.second.released),
    "write fails": lambda o: z3.And(o.second.submitted, o.second.aborted),
    "write conflicts": lambda o: z3.And(o.rival.published, o.second.submitted, o.second.aborted),
    "F-5 in flight": lambda o: z3.And(o.first.released, o.second.aborted),
    "ack lost in flight": lambda o: z3.And(o.first.durable, z3.Not(o.first.acknowledged), o.second.released),
}
"""Per write outcome: a run in which t + 1 was in flight (handed to the writer, or staged for F-5)."""


def _reach(layout: Layout, cell: str) -> Obligation:
    p = _pipeline(layout)
    premises = (*p.premises, p.inputs.write == WRITE_OUTCOMES[cell])
    return Obligation(premises=premises, goal=_REACH[cell](p.outcome), show=_show(p))


def register_pipelined(registry: ProofRegistry, layout: Layout) -> list[str]:
    """Register the pipelined-publication proofs of ``layout``; returns the names of the cell proofs."""
    tag = layout.value
    names = []
    for cell in WRITE_OUTCOMES:
        names.append(
            registry.add(
                f"pipelined.{tag}.{cell_tag(cell)}",
                _cell,
                layout,
                cell,
                covers=PIPELINED_COVERS[cell],
                description=f"pipelined publication, {cell} with t + 1 in flight: specs/faults.md holds",
            )
        )
        registry.add(
            f"reach.{tag}.pipelined_{cell_tag(cell)}",
            _reach,
            layout,
            cell,
            covers=("vacuity",) if cell == "durable" else ("vacuity", cell),
            kind=ProofKind.REACHABLE,
            description=f"sat-trace regression: {cell} with t + 1 in flight stays reachable",
        )
    names.append(
        registry.add(
            f"pipelined.{tag}.safety",
            _safety,
            layout,
            covers=(*(c for c in WRITE_OUTCOMES if c != "durable"), "INV-6", "INV-7"),
            description="for every write outcome: nothing built on a non-durable round is published and "
            "tokens are released only for durable rounds",
        )
    )
    names.append(
        registry.add(
            f"pipelined.{tag}.invariants",
            _invariants,
            layout,
            covers=(
                "INV-1",
                "INV-2",
                "INV-3",
                "INV-4",
                "INV-6",
                *(c for c in WRITE_OUTCOMES if c != "durable"),
            ),
            description="for every write outcome the log's final state meets the state invariants",
        )
    )
    return names
