"""Pipelined publication in the protocol model: step t + 1 built on t's staged successor while t's write runs.

:meth:`~specround.statemachine.controller.RoundController.submit_batch` hands the engine step t's decision
and K/V instruction as soon as the sampler decided and the staged successor validated, and writes t on the
writer thread; the engine builds t + 1 on t's staged successor before t is durable. :func:`pipelined_outcome`
composes two rounds of :func:`~.transition.round_outcome` with the outcome of t's write, one of
:data:`WRITE_OUTCOMES`:

``durable``
    t's transaction commits; t + 1 is written after it.
``write fails``
    t's transaction raises: nothing is written for t.
``write conflicts``
    a rival writer published a different round of the request from the same snapshot first: t's write
    meets the generation fence on the rival's state (and is refused by it).
``F-5 in flight``
    t + 1 hits F-5 while t's write runs (t's write commits).
``ack lost in flight``
    t hits F-6: its transaction commits, its acknowledgement is lost; t + 1 is written after it.

t + 1 reaches the log only through :func:`~.rules.parent_gate` and the generation fence on the log's state
after t; a round that ran but did not become durable is aborted, and if it had been handed to the writer
its ``rollback_to`` is the cache length of :func:`~.rules.last_durable`; tokens are released through
:func:`~.rules.released`. The guarantees are stated and proved in :mod:`.pipelined_proofs`.
"""

from __future__ import annotations

from dataclasses import dataclass

import z3

from specround.model_check.z3.protocol_state import (
    LOST_ACK_FAULT,
    ProtocolConfig,
    ProtocolState,
    RoundInputs,
)
from specround.model_check.z3.rules import fresh_generation, last_durable, parent_gate, released
from specround.model_check.z3.terms import Bool, Int
from specround.model_check.z3.transition import RoundOutcome, round_outcome
from specround.statemachine.faults import FaultPoint

__all__ = [
    "NO_ROLLBACK",
    "WRITE_ACK_LOST",
    "WRITE_CONFLICTS",
    "WRITE_DURABLE",
    "WRITE_F5_IN_FLIGHT",
    "WRITE_FAILS",
    "WRITE_OUTCOMES",
    "PipelinedInputs",
    "PipelinedOutcome",
    "PipelinedRound",
    "pipelined_outcome",
]

WRITE_DURABLE = 0
"""t's write commits and nothing else goes wrong."""
WRITE_FAILS = 1
"""t's transaction raises."""
WRITE_CONFLICTS = 2
"""A rival's round of the request was published first (t loses the fence)."""
WRITE_F5_IN_FLIGHT = 3
"""t + 1 hits F-5 while t's write runs."""
WRITE_ACK_LOST = 4
"""t hits F-6 (durable, acknowledgement lost) with t + 1 in flight."""
WRITE_OUTCOMES: dict[str, int] = {
    "durable": WRITE_DURABLE,
    "write fails": WRITE_FAILS,
    "write conflicts": WRITE_CONFLICTS,
    "F-5 in flight": WRITE_F5_IN_FLIGHT,
    "ack lost in flight": WRITE_ACK_LOST,
}
"""The model's code of each outcome of t's write, by the name of its ``specround faults`` cell."""
NO_ROLLBACK = -1
"""``rollback_to`` of a round that needs no K/V crop (durable, or aborted before its write was handed on)."""


@dataclass(frozen=True)
class PipelinedInputs:
    """Round t, round t + 1 (built on t's staged successor), a rival writer's round, and t's write outcome."""

    first: RoundInputs
    """Round t, on the durable state."""
    second: RoundInputs
    """Round t + 1, on t's staged successor (its expected generation is the staged one)."""
    rival: RoundInputs
    """Another writer's round from the same durable state (published first under ``write conflicts``)."""
    write: Int
    """One of :data:`WRITE_OUTCOMES`."""

    @classmethod
    def symbolic(cls, name: str, max_draft: int) -> PipelinedInputs:
        """Unconstrained inputs named by ``name``."""
        return cls(
            first=RoundInputs.symbolic(f"{name}_t", max_draft),
            second=RoundInputs.symbolic(f"{name}_t1", max_draft),
            rival=RoundInputs.symbolic(f"{name}_rival", max_draft),
            write=z3.Int(f"{name}_write"),
        )


@dataclass(frozen=True)
class PipelinedRound:
    """One round of the pipeline, as the engine and the caller see it."""

    staged: RoundOutcome
    """The round as staged: its decision and K/V instruction go to the engine at once."""
    submitted: Bool
    """Its publication was handed to the writer thread."""
    durable: Bool
    """Its record is in the log."""
    acknowledged: Bool
    """Reported ``PUBLISHED`` (durable, acknowledgement not lost)."""
    aborted: Bool
    """The round ran but did not become durable (``ABORTED``)."""
    released: Bool
    """Its tokens were released to the caller."""
    rollback_to: Int
    """The cache length the engine crops this request's K/V to, or :data:`NO_ROLLBACK`."""


@dataclass(frozen=True)
class PipelinedOutcome:
    """Both rounds, the rival's, and the log's state at each point."""

    first: PipelinedRound
    second: PipelinedRound
    rival: RoundOutcome
    log_before: ProtocolState
    """The log's state when t's write runs (the rival's successor under ``write conflicts``)."""
    after_first: ProtocolState
    """The log's state after t's write."""
    durable: ProtocolState
    """The log's state after both writes (what ``refresh`` reads back)."""
    known: ProtocolState
    """The writer's last durable state of the request (what aborted rounds roll back to)."""


def _round(
    staged: RoundOutcome,
    built: Bool,
    submitted: Bool,
    durable: Bool,
    acknowledged: Bool,
    known: ProtocolState,
) -> PipelinedRound:
    aborted = z3.And(built, staged.runs, z3.Not(durable))
    return PipelinedRound(
        staged=staged,
        submitted=submitted,
        durable=durable,
        acknowledged=acknowledged,
        aborted=aborted,
        released=released(submitted, durable, acknowledged),
        rollback_to=z3.If(z3.And(aborted, submitted), known.cache.length, NO_ROLLBACK),
    )


def pipelined_outcome(s0: ProtocolState, inputs: PipelinedInputs, config: ProtocolConfig) -> PipelinedOutcome:
    """Build the z3 terms of rounds t and t + 1 from the durable state ``s0`` (see the module docstring)."""
    write = inputs.write
    first = round_outcome(s0, inputs.first, config)
    f5 = FaultPoint.BEFORE_PUBLICATION.number
    second_in = inputs.second.with_fault(z3.If(write == WRITE_F5_IN_FLIGHT, f5, inputs.second.fault))
    second = round_outcome(first.successor, second_in, config)
    rival = round_outcome(s0, inputs.rival, config)
    log_before = rival.post.choose(z3.And(write == WRITE_CONFLICTS, rival.published), s0)
    first_in = inputs.first.with_fault(z3.If(write == WRITE_ACK_LOST, LOST_ACK_FAULT, inputs.first.fault))
    write_first = round_outcome(log_before, first_in, config)
    first_submitted = first.published
    first_durable = z3.And(first_submitted, write_first.published, write != WRITE_FAILS)
    after_first = write_first.post.choose(first_durable, log_before)
    known = last_durable(s0, first.successor, first_durable)
    second_submitted = z3.And(first_submitted, second.published)
    second_durable = z3.And(
        second_submitted, parent_gate(first_durable), fresh_generation(after_first, second_in)
    )
    return PipelinedOutcome(
        first=_round(
            first,
            z3.BoolVal(True),
            first_submitted,
            first_durable,
            z3.And(first_durable, write_first.acknowledged),
            known,
        ),
        second=_round(
            second,
            first_submitted,
            second_submitted,
            second_durable,
            z3.And(second_durable, second.acknowledged),
            known,
        ),
        rival=rival,
        log_before=log_before,
        after_first=after_first,
        durable=second.successor.choose(second_durable, after_first),
        known=known,
    )
