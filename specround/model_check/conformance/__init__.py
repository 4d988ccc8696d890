"""Conformance of the real round controller to the z3 round relation (contract#round-transaction).

The z3 proofs (:mod:`specround.model_check.z3`) are about a model; this package checks that the
code does what the model says, round by round. Every round *attempt* made on a real
:class:`~specround.statemachine.controller.RoundController` becomes a :class:`ConformancePair`: the
authoritative state before it, the attempt's inputs, the authoritative state after it and whether the
caller was acknowledged. The pair must satisfy the z3 transition relation
:func:`~specround.model_check.z3.transition.round_relation` (``post`` identical to the outcome's successor,
which for concrete values z3 simplifies to true or false, as
:func:`~specround.model_check.z3.transition.conforms` decides it) and the model's acknowledgement; a pair
that does not is reported with the successor the relation expects (the outcome's ``post``, as
:func:`~specround.model_check.z3.transition.expected_post` gives it) and the fields that differ.

What "the authoritative state" is: the state a fresh controller rebuilds from the log (replay, checked
against the log's head), with the model's view of the log beside it (published rounds, the transaction of
the last one) and the processor state G read back as the tokens the declared chain must be advanced over
to reach it (the generated tokens when it matches; :data:`UNMATCHED_PROCESSORS` otherwise).

The parts, one module each:

* :mod:`.request_model`: a real request as the model sees it, and the witness limits;
* :mod:`.forced_rows`: p/q rows on which the real sampler, fed the request's counter-based uniforms, must
  take a planned decision;
* :mod:`.pairs`: :class:`Attempt`, :class:`ConformancePair` and the :class:`Harness` that makes one from
  each attempt;
* :mod:`.witness`: for every :class:`BranchKind`, a concrete run of the model that reaches it;
* :mod:`.scenarios`: the witnesses replayed on the controller (:func:`run_witnesses`), malformed proposals
  (:func:`run_refusals`) and :func:`batch_independence`;
* :mod:`.walk`: :class:`MachineWalk`, seeded random rules (pipelined steps among them, each ending one of
  :data:`PIPELINE_ENDINGS`) with the invariants of :mod:`specround.statemachine.invariants` checked after
  every rule;
* :mod:`.run`: :func:`run_conformance`, everything at once.
"""

from specround.model_check.conformance.conformance_run import ConformanceRun, run_conformance
from specround.model_check.conformance.forced_rows import BRACKET_HALF_WIDTH, bracket_row, forced_rows
from specround.model_check.conformance.pairs import Attempt, ConformancePair, Harness
from specround.model_check.conformance.request_model import (
    UNMATCHED_PROCESSORS,
    WITNESS_MAX_DRAFT,
    WITNESS_MAX_NEW,
    WITNESS_MAX_PROMPT,
    WITNESS_VOCAB,
    LogFactory,
    model_config,
    model_config_args,
    processed_tokens,
)
from specround.model_check.conformance.scenarios import (
    batch_independence,
    forced_input,
    run_refusals,
    run_witness,
    run_witnesses,
)
from specround.model_check.conformance.walk import (
    PIPELINE_ENDINGS,
    UNEXPLORED,
    WALK_MAX_NEW,
    WALK_VOCAB,
    Chooser,
    MachineWalk,
    RandomChooser,
    Violation,
)
from specround.model_check.conformance.witness import BranchKind, Witness, WitnessRound, witness

__all__ = [
    "BRACKET_HALF_WIDTH",
    "PIPELINE_ENDINGS",
    "UNEXPLORED",
    "UNMATCHED_PROCESSORS",
    "WALK_MAX_NEW",
    "WALK_VOCAB",
    "WITNESS_MAX_DRAFT",
    "WITNESS_MAX_NEW",
    "WITNESS_MAX_PROMPT",
    "WITNESS_VOCAB",
    "Attempt",
    "BranchKind",
    "Chooser",
    "ConformancePair",
    "ConformanceRun",
    "Harness",
    "LogFactory",
    "MachineWalk",
    "RandomChooser",
    "Violation",
    "Witness",
    "WitnessRound",
    "batch_independence",
    "bracket_row",
    "forced_input",
    "forced_rows",
    "model_config",
    "model_config_args",
    "processed_tokens",
    "run_conformance",
    "run_refusals",
    "run_witness",
    "run_witnesses",
    "witness",
]
