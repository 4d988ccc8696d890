"""Conformance of the real round controller to the z3 round relation (0x06A-0x06E; DESIGN §4, §9).

The z3 proofs (:mod:`specround.model_check.z3`) are about a model; this module checks that the
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

Where the pairs come from:

* **Witnesses** (:func:`run_witnesses`). For every branch kind of the protocol (:class:`BranchKind`: A = 0,
  a partial accept, full accept + bonus, k = 0, a stop token inside the accepted prefix, EOS as the last
  accepted draft, EOS as correction and as bonus, the length cap inside the prefix and at the terminal,
  each fault point F-1..F-6, a retry after a lost acknowledgement, a stale writer, a round offered to a
  finished request, three growing rounds) z3 is asked for a concrete witness from the initial state,
  restricted to what a real request can be (vocabulary :data:`WITNESS_VOCAB`, short prompts, a correction
  that differs from the rejected draft). The witness is replayed on a real controller with p/q rows built
  by :func:`forced_rows` so that the real sampler, fed the request's counter-based uniforms (known in
  advance: ``Philox(seed, stream, counter)``), must take exactly the witness's decision; the pair is then
  checked with the witness's *planned* decision as input. The rows are not one-hot: every acceptance
  ratio sits just above (or below) its uniform and the terminal token's inverse-CDF bracket is narrow, so
  a sampler that reads another row, another uniform or an unnormalised residual leaves the plan.
  The model's ``invalid_rows_abort`` branch (a target reporting branch rows of the wrong tokens or
  positions) has no witness here: the controller is handed p rows, not K/V rows, so every attempt's rows
  are modelled as ``[F, d_1..d_k]`` at ``P``; the adapter's rows are checked on the tiny model by the
  mutation lab's ``model K/V`` check.
* **Refusals** (:func:`run_refusals`): malformed proposals (q(d) = 0, NaN, a draft outside the
  vocabulary, wrong shapes, rows that do not sum to one) must be refused with an
  :class:`~specround.errors.InputError` before any state changes; they are checked against the relation's
  abort path (a failure before publication, modelled as F-1).
* **Random walk** (:class:`MachineWalk`): seeded random rounds on a few requests at a time (both layouts,
  some with a stateful penalty, a new one admitted as others finish), batched steps, faults at F-1..F-6,
  retries, stale publishers, crash-and-replay and rounds offered to finished requests. Every attempt is a
  pair (inputs read back from the logged decision), and the state-machine invariants INV-1..INV-9 of
  ``tests/statemachine/test_state_machine.py`` are checked after every rule as a callable
  (:meth:`MachineWalk.check_invariants`), so ``specround check`` and the mutation lab run them without
  pytest. Hypothesis drives the same walk in the tests through :class:`Chooser`.
* **Batch independence** (:func:`batch_independence`): the same rounds stepped together and one request
  at a time publish identical states (counter-based randomness, DESIGN §5).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cache
from typing import Any, ClassVar, Protocol

import torch
import z3

from specround.errors import (
    InjectedFaultError,
    InputError,
    RequestFinishedError,
    SpecroundError,
    StaleGenerationError,
)
from specround.model_check.z3.invariants import initial_state
from specround.model_check.z3.protocol_state import (
    NO_TXN,
    ProtocolConfig,
    ProtocolState,
    RoundInputs,
    fault_code,
)
from specround.model_check.z3.transition import conforms as relation_conforms
from specround.model_check.z3.transition import round_outcome, state_values
from specround.sampling.processors.processor_chain import ProcessorChain
from specround.sampling.rng import uniforms
from specround.sampling.types import Layout, Stream, TerminalKind
from specround.statemachine.chain_verification import verify_chain
from specround.statemachine.controller import RoundController
from specround.statemachine.faults import FaultPlan, FaultPoint, FaultRule
from specround.statemachine.lifecycle import RoundPhase
from specround.statemachine.ports import EventLog
from specround.statemachine.replay import replay_states
from specround.statemachine.rounds import RoundInput, RoundResult, RoundStatus
from specround.statemachine.staging import chain_from_config
from specround.statemachine.state import RequestConfig, RequestState

__all__ = [
    "BRACKET_HALF_WIDTH",
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

WITNESS_VOCAB = 8
"""Vocabulary of the witness requests (token ids of a witness lie in ``[0, WITNESS_VOCAB)``)."""
WITNESS_MAX_DRAFT = 4
"""Largest draft length z3 may choose for a witness round."""
WITNESS_MAX_PROMPT = 4
"""Longest witness prompt."""
WITNESS_MAX_NEW = 10
"""Largest witness output budget."""
UNMATCHED_PROCESSORS = -2
"""The processed-token list of a state whose processor digest matches no chain advanced over its generated
tokens (a value no token id takes, so the model's INV-4 comparison fails on it)."""
BRACKET_HALF_WIDTH = 0.1
"""Half the width of the forced terminal token's inverse-CDF bracket (as a fraction of the row's mass)."""

LogFactory = Callable[[], EventLog]
"""Makes a fresh, empty event log (the memory log by default)."""


def _memory_log() -> EventLog:
    from specround.adapters.memory_log import MemoryEventLog

    return MemoryEventLog(clock=lambda: 0.0)


# --- the model of a real request ------------------------------------------------------------------------


def _stop_ids(config: RequestConfig) -> tuple[int, ...]:
    """Single-token stop ids of a request (the model knows no longer stop sequences)."""
    stops: set[int] = set()
    for spec in config.processors:
        if spec["kind"] != "stop_sequences":
            continue
        for sequence in spec["params"]["sequences"]:
            if len(sequence) != 1:
                raise InputError(
                    f"request {config.request_id!r} has the stop sequence {sequence}; the z3 model knows "
                    "single-token stops only"
                )
            stops.add(int(sequence[0]))
    return tuple(sorted(stops))


def model_config_args(config: RequestConfig, max_draft: int) -> dict[str, Any]:
    """The keyword arguments of :meth:`ProtocolConfig.concrete` for a real request."""
    return {
        "max_draft": max_draft,
        "layout": config.layout,
        "prompt_len": len(config.prompt_ids),
        "max_new": config.max_new_tokens,
        "stop_ids": _stop_ids(config),
    }


def model_config(config: RequestConfig, max_draft: int) -> ProtocolConfig:
    """The z3 configuration of a real request for rounds of at most ``max_draft`` drafts."""
    return ProtocolConfig.concrete(**model_config_args(config, max_draft))


def processed_tokens(config: RequestConfig, state: RequestState) -> tuple[int, ...]:
    """G as the model sees it: the generated tokens if the processors were advanced over exactly them.

    Returns ``(UNMATCHED_PROCESSORS,)`` when the state's processor digest is not the declared chain's after
    those tokens (advanced over something else, or in another order).
    """
    chain = chain_from_config(config)
    chain.advance_many(state.output if config.prompt_advances_processors else state.generated)
    return state.generated if chain.digest() == state.processors_digest else (UNMATCHED_PROCESSORS,)


# --- rows that force a decision ---------------------------------------------------------------------------


def bracket_row(vocab: int, token: int, u: float, *, excluded: int | None = None) -> torch.Tensor:
    """A distribution [V] whose inverse CDF at ``u`` is ``token``, with a narrow bracket around ``u``.

    Mass before ``token`` (in id order) is ``u - h`` and ``token`` holds ``2 h`` (``h`` =
    :data:`BRACKET_HALF_WIDTH`, clipped at 0 and 1), spread evenly over the other tokens; ``excluded`` gets
    no mass. Another uniform, or the same uniform against another row, mostly lands on another token.
    """
    if excluded == token or not 0 <= token < vocab or not 0.0 <= u < 1.0:
        raise InputError(f"no row can put token {token} at u = {u} (vocab {vocab}, excluded {excluded})")
    eligible = [j for j in range(vocab) if j != excluded]
    below = [j for j in eligible if j < token]
    above = [j for j in eligible if j > token]
    low = max(0.0, u - BRACKET_HALF_WIDTH) if below else 0.0
    high = min(1.0, u + BRACKET_HALF_WIDTH) if above else 1.0
    row = torch.zeros(vocab, dtype=torch.float64)  # [V]
    if below:
        row[below] = low / len(below)
    row[token] = high - low
    if above:
        row[above] = (1.0 - high) / len(above)
    return row


def _spread(vocab: int, token: int, mass: float) -> torch.Tensor:
    """[V]: ``mass`` on ``token`` and the rest spread evenly over the other tokens."""
    row = torch.full((vocab,), (1.0 - mass) / (vocab - 1), dtype=torch.float64)
    row[token] = mass
    return row


def forced_rows(
    vocab: int,
    drafts: Sequence[int],
    accepted: int,
    terminal_token: int,
    accept_uniforms: Sequence[float],
    terminal_uniform: float,
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Rows that force a decision: q [k, V] and p [k+1, V] for the exact sampler fed these uniforms.

    The sampler accepts ``d_1..d_accepted``, then rejects and corrects to ``terminal_token`` (``accepted <
    k``) or draws ``terminal_token`` as the bonus (``accepted == k``).

    Accepted test i: ``q_i(d_i) = 1/2`` and ``p_i(d_i) / q_i(d_i)`` halfway between ``u_i`` and 1. Rejected
    test: ``q = 1/2 e_d + 1/2 w`` and ``p = r/2 e_d + 1/2 w + Z rho`` with ``r = u/2`` (below the uniform),
    ``w`` uniform off ``d``, ``Z = (1 - r)/2``, so the normalised residual is exactly ``rho``, a
    :func:`bracket_row` around the TERMINAL uniform. The bonus row is such a bracket row itself. Rows of
    tests that are never reached are valid but arbitrary. q is None when there are no drafts.
    """
    k = len(drafts)
    if not 0 <= accepted <= k or len(accept_uniforms) < k:
        raise InputError(f"cannot force A = {accepted} with {k} drafts and {len(accept_uniforms)} uniforms")
    if vocab < 3:
        raise InputError("forced rows need a vocabulary of at least 3 tokens")
    q_rows: list[torch.Tensor] = []
    p_rows: list[torch.Tensor] = []
    for i, draft in enumerate(drafts):
        u = float(accept_uniforms[i])
        q = _spread(vocab, draft, 0.5)
        q_rows.append(q)
        if i < accepted:
            ratio = u + (1.0 - u) / 2.0  # u < ratio < 1: accepted, and only just
            p_rows.append(_spread(vocab, draft, 0.5 * ratio))
        elif i == accepted:
            if terminal_token == draft:
                raise InputError("a correction differs from the rejected draft")
            ratio = u / 2.0  # ratio <= u: rejected (u = 0 gives p(d) = 0)
            others = torch.full((vocab,), 0.5 / (vocab - 1), dtype=torch.float64)
            others[draft] = 0.0
            residual = (1.0 - ratio) / 2.0
            rho = bracket_row(vocab, terminal_token, terminal_uniform, excluded=draft)
            p = others + residual * rho
            p[draft] = 0.5 * ratio
            p_rows.append(p)
        else:
            p_rows.append(q.clone())
    if accepted == k:
        p_rows.append(bracket_row(vocab, terminal_token, terminal_uniform))
    else:
        p_rows.append(torch.full((vocab,), 1.0 / vocab, dtype=torch.float64))
    return (torch.stack(q_rows) if q_rows else None), torch.stack(p_rows)


def _round_uniforms(seed: int, state: RequestState, k: int) -> tuple[list[float], float]:
    """The ACCEPT uniforms of tests 1..k and the TERMINAL uniform a round from ``state`` will be fed."""
    accept = uniforms(seed, Stream.ACCEPT, torch.arange(k, dtype=torch.int64) + state.rng.accept).tolist()
    terminal = float(uniforms(seed, Stream.TERMINAL, state.rng.terminal))
    return [float(u) for u in accept], terminal


# --- pairs ----------------------------------------------------------------------------------------------


Values = dict[str, Any]


@dataclass(frozen=True)
class ConformancePair:
    """One observed round attempt against the z3 relation."""

    scenario: str
    request_id: str
    attempt: str
    """What was attempted (drafts, decision, fault, expected generation, transaction)."""
    status: str
    """The controller's :class:`~specround.statemachine.rounds.RoundStatus` (or ``error``)."""
    pre: Values
    observed: Values | None
    """The authoritative state after the attempt; when the log cannot be replayed, the writing controller's
    live state (and the pair does not conform); None when neither is available."""
    expected: Values | None
    """The state the relation allows after the attempt (given for pairs that do not conform)."""
    acknowledged: bool
    expected_acknowledged: bool
    conforms: bool
    detail: str = ""
    inputs: Values = field(default_factory=dict)
    """The keyword arguments of :meth:`RoundInputs.concrete` this attempt was checked with."""
    config: Values = field(default_factory=dict)
    """The keyword arguments of :meth:`ProtocolConfig.concrete` of its request."""

    def recheck(self) -> bool:
        """Decide the pair again with :func:`~specround.model_check.z3.transition.conforms` (a solver call).

        Only the transition relation: the acknowledgement is not part of it.
        """
        if self.observed is None:
            return False
        return relation_conforms(
            _model_of(self.pre),
            RoundInputs.concrete(**self.inputs),
            _model_of(self.observed),
            ProtocolConfig.concrete(**self.config),
        )

    def as_json(self) -> dict[str, Any]:
        """JSON-able form (token tuples as lists)."""

        def plain(values: Values | None) -> dict[str, Any] | None:
            if values is None:
                return None
            return {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}

        return {
            "scenario": self.scenario,
            "request_id": self.request_id,
            "attempt": self.attempt,
            "status": self.status,
            "conforms": self.conforms,
            "acknowledged": self.acknowledged,
            "expected_acknowledged": self.expected_acknowledged,
            "pre": plain(self.pre),
            "observed": plain(self.observed),
            "expected": plain(self.expected),
            "detail": self.detail,
            "inputs": {k: list(v) if isinstance(v, tuple) else v for k, v in self.inputs.items()},
            "config": {k: list(v) if isinstance(v, tuple) else v for k, v in self.config.items()},
        }


def _model_of(values: Values) -> ProtocolState:
    """The z3 state of plain values (as :func:`~.z3.transition.state_values` gives them)."""
    return ProtocolState.concrete(
        output=values["output"],
        cache=values["cache"],
        frontier=values["frontier"],
        position=values["position"],
        processed=values["processed"],
        rng=values["rng"],
        generation=values["generation"],
        finished=values["finished"],
        log_rounds=values["log_rounds"],
        last_txn=values["last_txn"],
    )


@dataclass(frozen=True)
class Attempt:
    """One round attempt a scenario makes, with what the model needs to know about it."""

    item: RoundInput
    expected_generation: int
    """The generation the proposal was made at (the compare-and-swap operand)."""
    fault: str | None = None
    """The fault point armed for this attempt (``F-n``), if any."""
    planned: tuple[int, int] | None = None
    """``(A, terminal token)`` the rows force; None: read the decision back from the log."""
    refusal: bool = False
    """Malformed input the controller must refuse (checked as an abort before publication)."""


def _describe(attempt: Attempt, accepted: int, terminal: int, txn: int) -> str:
    drafts = tuple(attempt.item.draft_ids)
    parts = [f"drafts={drafts}", f"A={accepted}", f"terminal={terminal}"]
    if attempt.fault:
        parts.append(f"fault={attempt.fault}")
    if attempt.refusal:
        parts.append("malformed")
    parts += [f"expected_generation={attempt.expected_generation}", f"txn={txn}"]
    return " ".join(parts)


def _holds(term: z3.BoolRef) -> bool:
    """A closed term's truth value (the relation of concrete values simplifies to true or false)."""
    value = z3.simplify(term)
    if z3.is_true(value) or z3.is_false(value):
        return bool(z3.is_true(value))
    solver = z3.Solver()  # not closed after all: decide it
    solver.add(term)
    return bool(solver.check() == z3.sat)


def _diff(expected: Values, observed: Values | None) -> str:
    if observed is None:
        return ""
    fields = [key for key in expected if expected[key] != observed.get(key)]
    return "; ".join(f"{key}: expected {expected[key]}, observed {observed.get(key)}" for key in fields)


@dataclass(frozen=True)
class _View:
    """A request as the log has it: its state, config and the model's plain values of it."""

    state: RequestState
    config: RequestConfig
    values: Values

    def model(self) -> ProtocolState:
        """The z3 state of these values."""
        return _model_of(self.values)


class Harness:
    """Runs attempts on controllers over one log and turns each into a :class:`ConformancePair`."""

    def __init__(self, log: EventLog) -> None:
        self.log = log
        self.pairs: list[ConformancePair] = []
        self._txns: dict[str, int] = {}
        self._views: dict[tuple[str, str], _View] = {}

    def txn(self, round_id: str) -> int:
        """The model's transaction id of a round id (numbered in order of first appearance)."""
        return self._txns.setdefault(round_id, len(self._txns))

    def authoritative(self, request_id: str) -> _View:
        """The log's state of a request, rebuilt by a fresh controller (replay checked against the head).

        Cached per head hash. Raises :class:`~specround.errors.SpecroundError` when the log cannot be
        replayed or disagrees with its head.
        """
        head = self.log.head(request_id)
        key = (request_id, head.hash if head is not None else "")
        view = self._views.get(key)
        if view is not None:
            return view
        fresh = RoundController(self.log)
        view = self.view(fresh.state(request_id), fresh.config(request_id))
        self._views[key] = view
        return view

    def view(self, state: RequestState, config: RequestConfig) -> _View:
        """The model's values of ``state``, with the log's published rounds of its request."""
        rounds = [e for e in self.log.events(state.request_id) if e.kind == "round_published"]
        if state.frontier is None:
            raise InputError(f"request {state.request_id!r} has no frontier; the model requires F == O[-1]")
        values: Values = {
            "output": state.output,
            "cache": state.cache,
            "frontier": state.frontier,
            "position": state.position,
            "processed": processed_tokens(config, state),
            "rng": state.rng.as_tuple(),
            "generation": state.generation,
            "finished": state.finished,
            "log_rounds": len(rounds),
            "last_txn": self.txn(str(rounds[-1].round_id)) if rounds else NO_TXN,
        }
        return _View(state, config, values)

    def _decision(self, request_id: str, round_id: str | None) -> tuple[int, int] | None:
        """``(A, terminal token)`` of a round as its ``round_decided`` event logs it."""
        if round_id is None:
            return None
        for event in self.log.events(request_id):
            if event.kind == "round_decided" and event.round_id == round_id:
                emitted = list(event.payload["emitted_ids"])
                terminal = emitted[-1] if event.payload["terminal"] != "stop" else 0
                return int(event.payload["accepted"]), int(terminal)
        return None

    def run(
        self, scenario: str, controller: RoundController, attempts: Sequence[Attempt]
    ) -> list[RoundResult]:
        """Make the attempts as ONE step of ``controller`` (distinct requests); record a pair for each."""
        before = {a.item.request_id: self.authoritative(a.item.request_id) for a in attempts}
        results = controller.step([a.item for a in attempts])
        for attempt, result in zip(attempts, results, strict=True):
            pre = before[attempt.item.request_id]
            self.pairs.append(self._pair(scenario, controller, attempt, result, pre))
        return results

    def _pair(
        self, scenario: str, controller: RoundController, attempt: Attempt, result: RoundResult, pre: _View
    ) -> ConformancePair:
        item = attempt.item
        rid = item.request_id
        drafts = tuple(int(d) for d in item.draft_ids)
        acknowledged = result.status in (RoundStatus.PUBLISHED, RoundStatus.ACKNOWLEDGED)
        problems: list[str] = []
        if attempt.planned is not None:
            accepted, terminal = attempt.planned
        else:
            published = result.phase is RoundPhase.PUBLISHED
            decided = self._decision(rid, result.round_id) if published else None
            accepted, terminal = decided if decided is not None else (0, 0)
        fault = attempt.fault
        if attempt.refusal:
            fault = "F-1"  # a refusal is an abort before publication
            if result.status is not RoundStatus.ABORTED or not isinstance(result.error, InputError):
                problems.append(f"malformed input was not refused with an InputError ({result.error!r})")
        round_id = result.round_id
        txn = self.txn(round_id) if round_id is not None else self.txn(f"unnamed:{len(self._txns)}")
        max_draft = max(1, len(drafts))
        config_args = model_config_args(pre.config, max_draft)
        cfg = ProtocolConfig.concrete(**config_args)
        input_args: Values = {
            "max_draft": max_draft,
            "drafts": drafts,
            "accepted": min(accepted, len(drafts)),
            "terminal_token": terminal,
            "row_tokens": (int(pre.values["frontier"]), *drafts),
            "row_base": int(pre.values["position"]),
            "expected_generation": attempt.expected_generation,
            "txn": txn,
            "proposal_draws": item.proposal_draws,
            "fault": fault,
        }
        inputs = RoundInputs.concrete(**input_args)
        # One outcome serves the relation itself (round_relation(pre, inputs, post) is
        # post.identical(round_outcome(pre, inputs).post)), the acknowledgement and the expected successor.
        outcome = round_outcome(pre.model(), inputs, cfg)
        expected_ack = bool(z3.is_true(z3.simplify(outcome.acknowledged)))
        observed: Values | None
        post: _View | None
        try:
            post = self.authoritative(rid)
        except SpecroundError as error:
            problems.append(f"the log does not rebuild the request: {error}")
            try:  # report what the writer holds instead (its live projection)
                post = self.view(controller.state(rid), pre.config)
            except SpecroundError:
                post = None
        if post is None:
            observed, ok = None, False
        else:
            observed = post.values
            ok = _holds(z3.And(cfg.constraints(), post.model().identical(outcome.post)))
        if acknowledged != expected_ack:
            problems.append(f"acknowledged={acknowledged}, the model says {expected_ack}")
        expected: Values | None = None
        if not ok or problems:
            expected = state_values(outcome.post)
            if observed is not None:
                problems.append(_diff(expected, observed))
        if problems and result.error is not None:
            problems.append(f"controller: {type(result.error).__name__}: {result.error}")
        return ConformancePair(
            scenario=scenario,
            request_id=rid,
            attempt=_describe(attempt, accepted, terminal, txn),
            status=result.status.value,
            pre=pre.values,
            observed=observed,
            expected=expected,
            acknowledged=acknowledged,
            expected_acknowledged=expected_ack,
            conforms=ok and not problems,
            detail="; ".join(p for p in problems if p),
            inputs=input_args,
            config=config_args,
        )


# --- witnesses ------------------------------------------------------------------------------------------


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
    FAULT_F1 = "fault_F-1"
    FAULT_F2 = "fault_F-2"
    FAULT_F3 = "fault_F-3"
    FAULT_F4 = "fault_F-4"
    FAULT_F5 = "fault_F-5"
    FAULT_F6 = "fault_F-6"
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


@cache
def witness(kind: BranchKind, layout: Layout) -> Witness:
    """Ask z3 for a concrete run from the initial state that reaches ``kind`` (cached per kind and layout).

    Raises :class:`~specround.errors.InputError` when z3 finds none (the model no longer allows the
    branch: a vacuity failure) or gives up.
    """
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
    s, x, o = s0, inputs[0], outcomes[0]
    is_stop = config.is_stop
    correction, bonus, stop = (int(TerminalKind.CORRECTION), int(TerminalKind.BONUS), int(TerminalKind.STOP))
    remaining = config.max_new - (s.output.length - config.prompt_len)
    last_draft = z3.Sum([z3.If(x.draft_len == j + 1, d, 0) for j, d in enumerate(x.drafts)])
    fault = kind.fault
    if fault is None and kind is not BranchKind.RETRY_AFTER_LOST_ACK:
        facts.append(x.fault == 0)
    conditions: dict[BranchKind, z3.BoolRef] = {
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
    if fault is not None:
        clean = round_outcome(s, x.with_fault(0), config)
        conditions[kind] = z3.And(
            x.fault == fault_code(fault),
            x.draft_len >= 1,
            clean.published,
            z3.Not(clean.finishes),
            z3.Not(o.acknowledged),
        )
    if kind is BranchKind.RETRY_AFTER_LOST_ACK:
        y, second = inputs[1], outcomes[1]
        conditions[kind] = z3.And(
            x.fault == 6,
            x.draft_len >= 1,
            x.accepted >= 1,
            o.published,
            z3.Not(o.finishes),
            z3.Not(o.acknowledged),
            y.fault == 0,
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
    elif kind is BranchKind.STALE_WRITER:
        y, second = inputs[1], outcomes[1]
        conditions[kind] = z3.And(
            o.published,
            z3.Not(o.finishes),
            x.draft_len >= 1,
            y.fault == 0,
            y.expected_generation == 0,
            y.txn == 1,
            y.draft_len >= 1,
            second.stale,
            z3.Not(second.acknowledged),
            z3.Or(*[a != b for a, b in zip(x.drafts, y.drafts, strict=True)], x.draft_len != y.draft_len),
        )
    elif kind is BranchKind.FINISHED_REFUSED:
        y, second = inputs[1], outcomes[1]
        conditions[kind] = z3.And(
            o.published,
            o.finishes,
            y.fault == 0,
            y.expected_generation == 1,
            y.txn == 1,
            second.refused_finished,
        )
    elif kind is BranchKind.THREE_ROUNDS:
        conditions[kind] = z3.And(
            *[z3.And(out.published, z3.Not(out.finishes)) for out in outcomes],
            *[_growth(states[n], states[n + 1]) >= 2 for n in range(3)],
            *[i.fault == 0 for i in inputs],
        )
    solver = z3.Solver()
    solver.set("timeout", 30_000)
    solver.add(*facts, conditions[kind])
    if solver.check() != z3.sat:
        raise InputError(f"z3 finds no witness of {kind.value} ({layout.value}): {solver.reason_unknown()}")
    model = solver.model()

    def value(term: z3.ExprRef) -> int:
        return int(model.eval(term, model_completion=True).as_long())

    prompt_len = value(config.prompt_len)
    rounds = []
    for x_n in inputs:
        k = value(x_n.draft_len)
        code = value(x_n.fault)
        rounds.append(
            WitnessRound(
                drafts=tuple(value(d) for d in x_n.drafts[:k]),
                accepted=value(x_n.accepted),
                terminal_token=value(x_n.terminal_token),
                proposal_draws=value(x_n.proposal_draws),
                fault=f"F-{code}" if code else None,
                expected_generation=value(x_n.expected_generation),
            )
        )
    return Witness(
        kind=kind,
        layout=layout,
        prompt=tuple(value(s0.output.at(i)) for i in range(prompt_len)),
        max_new=value(config.max_new),
        stop_ids=tuple(sorted({value(t) for t in config.stop_ids})),
        rounds=tuple(rounds),
    )


def _seed(name: str) -> int:
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little")


def forced_input(controller: RoundController, rid: str, plan: WitnessRound) -> RoundInput:
    """The round input whose rows force ``plan`` on ``controller``'s current view of ``rid``."""
    config = controller.config(rid)
    state = controller.state(rid)
    accept_u, terminal_u = _round_uniforms(config.seed, state, len(plan.drafts))
    q_rows, p_rows = forced_rows(
        config.vocab_size, plan.drafts, plan.accepted, plan.terminal_token, accept_u, terminal_u
    )
    return RoundInput(
        request_id=rid,
        coordinate_digest=controller.coordinate_digest(rid),
        draft_ids=plan.drafts,
        q_rows=q_rows,
        p_rows=p_rows,
        proposal_draws=plan.proposal_draws,
    )


def _witness_processors(vocab: int) -> tuple[dict[str, Any], ...]:
    """A stateful penalty on every witness request, so that G changes with every token it consumes."""
    return ProcessorChain.from_spec(
        [{"kind": "frequency_penalty", "params": {"penalty": 0.25}, "state": {}}], vocab_size=vocab
    ).to_spec()


def run_witness(witness_: Witness, log: EventLog, harness: Harness) -> None:
    """Replay one witness on real controllers over ``log``; its pairs go to ``harness``."""
    kind = witness_.kind
    rid = f"witness-{witness_.layout.value}-{kind.value}"
    plan = FaultPlan()
    controller = RoundController(log, faults=plan)
    controller.open_request(
        witness_.prompt,
        seed=_seed(rid),
        max_new_tokens=witness_.max_new,
        vocab_size=WITNESS_VOCAB,
        processors=_witness_processors(WITNESS_VOCAB),
        layout=witness_.layout,
        stop_token_ids=witness_.stop_ids,
        request_id=rid,
    )
    stale = RoundController(log) if kind is BranchKind.STALE_WRITER else None
    if stale is not None:
        stale.state(rid)  # the stale writer has loaded generation 0
    first: RoundInput | None = None
    for n, round_plan in enumerate(witness_.rounds):
        writer = stale if (stale is not None and n == 1) else controller
        if kind is BranchKind.RETRY_AFTER_LOST_ACK and n == 1:
            assert first is not None
            item = first  # the very same transaction, bound to the old coordinate
        else:
            item = forced_input(writer, rid, round_plan)
        if round_plan.fault is not None:
            generation = writer.state(rid).generation + 1
            plan.add(
                FaultRule(
                    FaultPoint(round_plan.fault),
                    request_ids=frozenset({rid}),
                    generations=frozenset({generation}),
                )
            )
        attempt = Attempt(
            item=item,
            expected_generation=round_plan.expected_generation,
            fault=round_plan.fault,
            planned=(round_plan.accepted, round_plan.terminal_token),
        )
        harness.run(kind.value, writer, [attempt])
        first = first or item


def run_witnesses(
    layouts: Sequence[Layout] = tuple(Layout), log_factory: LogFactory = _memory_log
) -> tuple[list[ConformancePair], list[EventLog], list[str]]:
    """Every :class:`BranchKind` witness on every layout: pairs, the logs written, and scenario failures."""
    pairs: list[ConformancePair] = []
    logs: list[EventLog] = []
    failures: list[str] = []
    for layout in layouts:
        log = log_factory()
        logs.append(log)
        harness = Harness(log)
        for kind in BranchKind:
            try:
                run_witness(witness(kind, Layout(layout)), log, harness)
            except Exception as error:  # a crash of the code under test is a finding, not an abort
                failures.append(
                    f"witness {kind.value} ({Layout(layout).value}): {type(error).__name__}: {error}"
                )
        pairs += harness.pairs
    return pairs, logs, failures


# --- refusals -------------------------------------------------------------------------------------------


def _refusal_inputs(controller: RoundController, rid: str) -> dict[str, RoundInput]:
    """Malformed proposals, each refused for one reason, by name."""
    vocab = controller.config(rid).vocab_size
    digest = controller.coordinate_digest(rid)
    drafts = (3, 5)
    q_rows, p_rows = forced_rows(vocab, drafts, 2, 1, [0.5, 0.5], 0.5)
    assert q_rows is not None

    def item(ids: Sequence[int], q: torch.Tensor | None, p: torch.Tensor) -> RoundInput:
        return RoundInput(request_id=rid, coordinate_digest=digest, draft_ids=tuple(ids), q_rows=q, p_rows=p)

    zero_q = q_rows.clone()
    zero_q[0] = _spread(vocab, 4, 0.5)
    zero_q[0, 3] = 0.0  # q_1(d_1) = 0 while p_1(d_1) > 0: a proposal q could not have sampled
    zero_q[0] /= zero_q[0].sum()
    nan_p = p_rows.clone()
    nan_p[0, drafts[0]] = float("nan")  # p_1(d_1): a value the decision reads
    unnormalised = p_rows.clone()
    unnormalised[len(drafts)] *= 1.5  # the bonus row: read in full by the terminal draw
    return {
        "q(d) = 0": item(drafts, zero_q, p_rows),
        "NaN in p": item(drafts, q_rows, nan_p),
        "draft outside the vocabulary": item((3, vocab), q_rows, p_rows),
        "p rows of the wrong shape": item(drafts, q_rows, p_rows[:2]),
        "p row not normalised": item(drafts, q_rows, unnormalised),
    }


def run_refusals(
    layouts: Sequence[Layout] = tuple(Layout), log_factory: LogFactory = _memory_log
) -> tuple[list[ConformancePair], list[EventLog], list[str]]:
    """Malformed proposals on every layout: each must be refused and change nothing."""
    pairs: list[ConformancePair] = []
    logs: list[EventLog] = []
    failures: list[str] = []
    for layout in layouts:
        log = log_factory()
        logs.append(log)
        harness = Harness(log)
        controller = RoundController(log)
        rid = f"refusals-{Layout(layout).value}"
        controller.open_request(
            (1, 2, 3),
            seed=_seed(rid),
            max_new_tokens=8,
            vocab_size=WITNESS_VOCAB,
            layout=layout,
            request_id=rid,
            stop_token_ids=(7,),
        )
        for name, item in _refusal_inputs(controller, rid).items():
            try:
                generation = controller.state(rid).generation
                harness.run(f"refusal: {name}", controller, [Attempt(item, generation, refusal=True)])
            except Exception as error:
                failures.append(f"refusal {name!r} ({Layout(layout).value}): {type(error).__name__}: {error}")
        pairs += harness.pairs
    return pairs, logs, failures


# --- batch independence ---------------------------------------------------------------------------------


def _random_input(
    controller: RoundController, rid: str, k: int, seed: int, *, dtype: torch.dtype = torch.float64
) -> RoundInput:
    """Drafts sampled from seeded random q rows, with independent seeded random p rows (softmax of 2 z)."""
    vocab = controller.config(rid).vocab_size
    generator = torch.Generator().manual_seed(seed)
    q_rows = torch.softmax(
        torch.randn(k, vocab, generator=generator, dtype=torch.float64) * 2.0, -1
    )  # [k, V]
    drafts = torch.multinomial(q_rows, 1, generator=generator).squeeze(1).tolist() if k else []
    p_rows = torch.softmax(torch.randn(k + 1, vocab, generator=generator, dtype=torch.float64) * 2.0, -1)
    return RoundInput(
        request_id=rid,
        coordinate_digest=controller.coordinate_digest(rid),
        draft_ids=tuple(int(d) for d in drafts),
        q_rows=q_rows.to(dtype) if k else None,
        p_rows=p_rows.to(dtype),  # [k+1, V]
        proposal_draws=k,
    )


def batch_independence(
    seed: int = 0, rounds: int = 4, log_factory: LogFactory = _memory_log
) -> tuple[list[str], list[EventLog]]:
    """The same rounds stepped as one batch and one request at a time must publish identical states.

    Returns the requests whose states differ (one line each) and the two logs written.
    """
    together_log, alone_log = log_factory(), log_factory()
    together, alone = RoundController(together_log), RoundController(alone_log)
    layouts = (Layout.REPLAY_FRONTIER, Layout.RETAINED_FRONTIER, Layout.REPLAY_FRONTIER)
    rids = [f"batch-{n}" for n in range(len(layouts))]
    for n, (rid, layout) in enumerate(zip(rids, layouts, strict=True)):
        for controller in (together, alone):
            controller.open_request(
                (1, 2, 3),
                seed=seed * 1000 + 17 * n + 1,
                max_new_tokens=12,
                vocab_size=WITNESS_VOCAB,
                layout=layout,
                request_id=rid,
                stop_token_ids=(WITNESS_VOCAB - 1,),
            )
    findings: list[str] = []
    for r in range(rounds):
        active = [rid for rid in rids if not together.state(rid).finished]
        if not active:
            break
        ks = {rid: (r + n) % 4 + 1 for n, rid in enumerate(active)}
        row_seed = {rid: seed * 7919 + 101 * r + n for n, rid in enumerate(active)}
        together.step([_random_input(together, rid, ks[rid], row_seed[rid]) for rid in active])
        for rid in active:
            alone.step([_random_input(alone, rid, ks[rid], row_seed[rid])])
        for rid in active:
            a, b = together.state(rid), alone.state(rid)
            if a.digest() != b.digest():
                findings.append(
                    f"{rid} round {r + 1}: stepped in a batch it emits {a.generated}, alone {b.generated}"
                )
    return findings, [together_log, alone_log]


# --- the state-machine walk -----------------------------------------------------------------------------


class Chooser(Protocol):
    """Where a walk's choices come from: a seeded ``random.Random`` or Hypothesis' ``data.draw``."""

    def integer(self, low: int, high: int) -> int:
        """An integer in ``[low, high]``."""
        ...


class RandomChooser:
    """Choices from a seeded :class:`random.Random` (what ``specround check`` uses)."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(f"specround-walk:{seed}")

    def integer(self, low: int, high: int) -> int:
        """An integer in ``[low, high]``."""
        return self._rng.randint(low, high)


@dataclass(frozen=True)
class Violation:
    """A state-machine invariant that failed after a rule of the walk."""

    rule: str
    invariant: str
    message: str

    def __str__(self) -> str:
        return f"{self.invariant} after {self.rule}: {self.message}"


WALK_VOCAB = 12
WALK_EOS = 11
WALK_MAX_NEW = 16
WALK_OPEN_REQUESTS = 3
"""Requests the walk opens at the start; it opens another whenever fewer stay unfinished."""
WALK_MAX_REQUESTS = 9
"""Requests a walk opens at most."""


UNEXPLORED = 8
"""Weight factor of a walk rule (or fault point) that has not been run yet."""


def _weighted(chooser: Chooser, weights: Sequence[int]) -> int:
    """An index drawn with the given positive integer weights."""
    ticket = chooser.integer(0, sum(weights) - 1)
    for index, weight in enumerate(weights):
        ticket -= weight
        if ticket < 0:
            return index
    return len(weights) - 1


def _fingerprint(log: EventLog) -> list[tuple[str, int, str]]:
    return [(e.request_id, e.seq, e.hash) for e in log.events()]


class MachineWalk:
    """Seeded random rules over a controller and a log with every state-machine invariant checked.

    The rules and invariants are those of ``tests/statemachine/test_state_machine.py``, written as a
    callable: a failure is recorded as a :class:`Violation` (with its INV number) instead of raising, so a
    walk under a mutation reports everything it breaks. A rule that crashes ends the walk.
    """

    RULES: ClassVar[dict[str, int]] = {
        "open_request": 2,
        "step": 4,
        "fault": 3,
        "retry": 3,
        "stale_publisher": 2,
        "crash_and_replay": 1,
        "finished_refused": 1,
    }
    """Each rule with its weight when enabled."""

    def __init__(self, log_factory: LogFactory = _memory_log) -> None:
        self.log = log_factory()
        self.plan = FaultPlan()
        self.controller = RoundController(self.log, faults=self.plan)
        self.harness = Harness(self.log)
        self.known: dict[str, RequestState] = {}
        self.unacknowledged: dict[str, tuple[RoundInput, RequestState]] = {}
        self.violations: list[Violation] = []
        self.rules_run: list[str] = []
        self.points_run: set[FaultPoint] = set()
        self._rule = "open"
        for _ in range(WALK_OPEN_REQUESTS):
            self._open()

    def _open(self) -> None:
        """Open the next request: layouts alternate, every third carries a stateful presence penalty."""
        index = len(self.known)
        rid = f"walk-{index}"
        penalty = ProcessorChain.from_spec(
            [{"kind": "presence_penalty", "params": {"penalty": 0.3}, "state": {}}], vocab_size=WALK_VOCAB
        )
        self.known[rid] = self.controller.open_request(
            (1, 2, 3),
            seed=100 + index,
            processors=penalty if index % 3 == 2 else None,
            vocab_size=WALK_VOCAB,
            layout=Layout.RETAINED_FRONTIER if index % 2 else Layout.REPLAY_FRONTIER,
            request_id=rid,
            max_new_tokens=WALK_MAX_NEW,
            stop_token_ids=[WALK_EOS],
        )

    @property
    def pairs(self) -> list[ConformancePair]:
        """Every attempt of the walk as a conformance pair."""
        return self.harness.pairs

    # --- running ----------------------------------------------------------------------------------------

    def enabled(self) -> list[str]:
        """Rules whose preconditions hold."""
        unfinished = bool(self._unfinished())
        ready = {
            "open_request": len(self._unfinished()) < WALK_OPEN_REQUESTS
            and len(self.known) < WALK_MAX_REQUESTS,
            "step": unfinished,
            "fault": unfinished,
            "retry": bool(self.unacknowledged),
            "stale_publisher": unfinished,
            "crash_and_replay": True,
            "finished_refused": any(s.finished for s in self.known.values()),
        }
        return [rule for rule in self.RULES if ready[rule]]

    def run(self, chooser: Chooser, rules: int) -> None:
        """Apply ``rules`` rules picked by ``chooser``, checking every invariant after each."""
        for _ in range(rules):
            if not self.apply(chooser):
                return

    def apply(self, chooser: Chooser) -> bool:
        """One rule and the invariant checks; False when the rule crashed (the walk cannot go on).

        Rules are drawn by weight; a rule the walk has not run yet weighs :data:`UNEXPLORED` times more, so
        that a short walk still reaches every rule (and every fault point) whose precondition comes true.
        """
        enabled = self.enabled()
        weights = [self.RULES[r] * (UNEXPLORED if r not in self.rules_run else 1) for r in enabled]
        rule = enabled[_weighted(chooser, weights)]
        self._rule = rule
        self.rules_run.append(rule)
        try:
            getattr(self, f"rule_{rule}")(chooser)
        except Exception as error:  # the code under test crashed: a finding, and the end of the walk
            self._violate("crash", f"{type(error).__name__}: {error}")
            return False
        self.check_invariants()
        return True

    def _violate(self, invariant: str, message: str) -> None:
        self.violations.append(Violation(self._rule, invariant, message))

    def _expect(self, condition: bool, invariant: str, message: str) -> bool:
        if not condition:
            self._violate(invariant, message)
        return condition

    def _unfinished(self) -> list[str]:
        return [rid for rid, state in self.known.items() if not state.finished]

    def _pick(self, chooser: Chooser, options: Sequence[str]) -> str:
        return options[chooser.integer(0, len(options) - 1)]

    def _input(self, controller: RoundController, rid: str, k: int, seed: int) -> RoundInput:
        return _random_input(controller, rid, k, seed, dtype=torch.float32 if seed % 2 else torch.float64)

    def _check_round(self, before: RequestState, result: RoundResult) -> None:
        """INV-2, INV-3, INV-5, INV-6 of one published round."""
        after = result.state
        if not self._expect(after is not None and result.kv is not None, "INV-6", "no published state"):
            return
        assert after is not None and result.kv is not None
        emitted = result.emitted_ids
        self._expect(after.output == before.output + emitted, "INV-2", f"output grew by {emitted} wrongly")
        stop = result.terminal == "stop"
        self._expect(
            len(emitted) == result.accepted + (0 if stop else 1),
            "INV-2",
            f"{len(emitted)} tokens emitted for A = {result.accepted} ({result.terminal})",
        )
        remaining = WALK_MAX_NEW - len(before.generated)
        self._expect(len(emitted) <= remaining, "INV-2", f"{len(emitted)} tokens with {remaining} left")
        self._expect(all(t != WALK_EOS for t in emitted[:-1]), "INV-2", f"tokens after a stop in {emitted}")
        self._expect(
            bool(emitted) and result.finished == (emitted[-1] == WALK_EOS or len(emitted) == remaining),
            "INV-2",
            f"finished={result.finished} after {emitted}",
        )
        draws = (after.rng.accept - before.rng.accept, after.rng.terminal - before.rng.terminal)
        reached = result.accepted + (1 if result.terminal == "correction" else 0)
        self._expect(
            draws == (reached, 0 if stop else 1), "INV-3", f"draws {draws} for a {result.terminal} round"
        )
        self._expect(
            bool(emitted) and result.kv.committed_token_ids == (before.frontier, *emitted[:-1]),
            "INV-5",
            f"committed {result.kv.committed_token_ids} for frontier {before.frontier} and {emitted}",
        )
        self._expect(after.generation == before.generation + 1, "INV-6", "the generation did not move by one")

    # --- rules ------------------------------------------------------------------------------------------

    def rule_open_request(self, chooser: Chooser) -> None:
        """Admit another request (its generation-0 state is checked by the invariants)."""
        self._open()

    def rule_step(self, chooser: Chooser) -> None:
        """A batched step of 1..3 unfinished requests with random rows."""
        unfinished = self._unfinished()
        rids = [rid for rid in unfinished if chooser.integer(0, 1)] or [self._pick(chooser, unfinished)]
        attempts = [
            Attempt(
                self._input(self.controller, rid, chooser.integer(0, 4), chooser.integer(0, 2**20)),
                self.known[rid].generation,
            )
            for rid in rids
        ]
        before = {rid: self.known[rid] for rid in rids}
        results = self.harness.run("walk: step", self.controller, attempts)
        for rid, result in zip(rids, results, strict=True):
            if not self._expect(result.status is RoundStatus.PUBLISHED, "INV-6", f"{rid}: {result.error!r}"):
                continue
            self._check_round(before[rid], result)
            assert result.state is not None
            self.known[rid] = result.state
            self.unacknowledged.pop(rid, None)

    def rule_fault(self, chooser: Chooser) -> None:
        """A round failing at a random fault point F-1..F-6."""
        rid = self._pick(chooser, self._unfinished())
        points = list(FaultPoint)
        point = points[_weighted(chooser, [1 if p in self.points_run else UNEXPLORED for p in points])]
        self.points_run.add(point)
        item = self._input(self.controller, rid, chooser.integer(0, 4), chooser.integer(0, 2**20))
        generation = self.known[rid].generation
        self.plan.add(FaultRule(point, request_ids=frozenset({rid}), generations=frozenset({generation + 1})))
        fingerprint = _fingerprint(self.log)
        [result] = self.harness.run(
            "walk: fault", self.controller, [Attempt(item, generation, fault=point.value)]
        )
        self._expect(
            isinstance(result.error, InjectedFaultError) and result.error.point == point.value,
            "INV-7",
            f"no injected fault at {point.value}: {result.error!r}",
        )
        if point.before_publication:
            self._expect(result.status is RoundStatus.ABORTED, "INV-7", f"{point.value}: {result.status}")
            self._expect(_fingerprint(self.log) == fingerprint, "INV-7", f"{point.value} changed the log")
            self._expect(
                self.controller.state(rid).digest() == self.known[rid].digest(),
                "INV-7",
                f"{point.value} changed the state",
            )
        else:
            self._expect(result.status is RoundStatus.UNACKNOWLEDGED, "INV-6", f"F-6: {result.status}")
            published = self.controller.state(rid)
            if self._expect(published.generation == generation + 1, "INV-6", "F-6 did not publish"):
                self.unacknowledged[rid] = (item, self.known[rid])
                self.known[rid] = published

    def rule_retry(self, chooser: Chooser) -> None:
        """Re-submit a round whose acknowledgement was lost at F-6: acknowledged, nothing appended."""
        rid = self._pick(chooser, sorted(self.unacknowledged))
        item, before = self.unacknowledged.pop(rid)
        fingerprint = _fingerprint(self.log)
        [result] = self.harness.run("walk: retry", self.controller, [Attempt(item, before.generation)])
        self._expect(
            result.status is RoundStatus.ACKNOWLEDGED and result.state == self.known[rid],
            "INV-6",
            f"retry: {result.status} {result.error!r}",
        )
        if result.state is not None:
            self._check_round(before, result)
        self._expect(_fingerprint(self.log) == fingerprint, "INV-6", "the retry appended to the log")

    def rule_stale_publisher(self, chooser: Chooser) -> None:
        """A second controller loaded before a publication tries to publish a different round."""
        rid = self._pick(chooser, self._unfinished())
        stale = RoundController(self.log)
        stale_generation = stale.state(rid).generation
        stale_item = self._input(stale, rid, 3, chooser.integer(0, 999))
        winner = Attempt(
            self._input(self.controller, rid, 2, chooser.integer(1000, 2**20)), self.known[rid].generation
        )
        before = self.known[rid]
        [won] = self.harness.run("walk: winner", self.controller, [winner])
        if not self._expect(won.status is RoundStatus.PUBLISHED, "INV-6", f"winner: {won.error!r}"):
            return
        self._check_round(before, won)
        assert won.state is not None
        self.known[rid] = won.state
        self.unacknowledged.pop(rid, None)
        if won.state.finished:
            return
        fingerprint = _fingerprint(self.log)
        [lost] = self.harness.run("walk: stale writer", stale, [Attempt(stale_item, stale_generation)])
        self._expect(
            lost.status is RoundStatus.ABORTED and isinstance(lost.error, StaleGenerationError),
            "INV-6",
            f"the stale writer got {lost.status} ({lost.error!r})",
        )
        self._expect(_fingerprint(self.log) == fingerprint, "INV-6", "the stale writer appended to the log")

    def rule_crash_and_replay(self, chooser: Chooser) -> None:
        """Drop the controller; a new one rebuilds every request from the log (INV-8)."""
        self.controller = RoundController(self.log, faults=self.plan)
        rebuilt = self.controller.load_all()
        self._expect(
            {rid: s.digest() for rid, s in rebuilt.items()}
            == {rid: s.digest() for rid, s in self.known.items()},
            "INV-8",
            "the reloaded controller disagrees with the published states",
        )

    def rule_finished_refused(self, chooser: Chooser) -> None:
        """A round offered to a finished request is refused and appends nothing (INV-2)."""
        rid = self._pick(chooser, sorted(r for r, s in self.known.items() if s.finished))
        fingerprint = _fingerprint(self.log)
        generator = torch.Generator().manual_seed(0)
        item = RoundInput(
            rid,
            self.controller.coordinate_digest(rid),
            (),
            None,
            torch.softmax(torch.randn(1, WALK_VOCAB, generator=generator, dtype=torch.float64), -1),
        )
        [result] = self.harness.run(
            "walk: finished", self.controller, [Attempt(item, self.known[rid].generation)]
        )
        self._expect(
            isinstance(result.error, RequestFinishedError), "INV-2", f"finished request: {result.status}"
        )
        self._expect(_fingerprint(self.log) == fingerprint, "INV-2", "a finished request's round appended")

    # --- invariants -------------------------------------------------------------------------------------

    def check_invariants(self) -> None:
        """INV-1, the live projection against the log's head, INV-8 (replay), INV-9 (chains), INV-4."""
        for rid, state in self.known.items():
            self._expect(
                state.cache == state.output[:-1]
                and state.frontier == state.output[-1]
                and state.position == len(state.cache),
                "INV-1",
                f"{rid}: C, F, P do not follow O",
            )
            live = self.controller.state(rid)
            head = self.log.head(rid)
            self._expect(
                live == state, "INV-8", f"{rid}: the live projection differs from the published state"
            )
            self._expect(
                head is not None
                and head.state_digest == state.digest()
                and head.generation == state.generation,
                "INV-8",
                f"{rid}: the log's head differs from the published state",
            )
        try:
            replayed = replay_states(self.log)
        except SpecroundError as error:
            self._violate("INV-8", f"replay refuses the log: {error}")
        else:
            self._expect(
                replayed == self.known, "INV-8", "replaying the log does not give the published states"
            )
        for rid in self.known:
            findings = verify_chain(self.log.events(rid), self.log.head(rid))
            self._expect(not findings, "INV-9", f"{rid}: {[str(f) for f in findings]}")
        for rid, state in self.known.items():
            config = self.controller.config(rid)
            self._expect(
                processed_tokens(config, state) == state.generated,
                "INV-4",
                f"{rid}: the processors were not advanced over exactly the published tokens",
            )


# --- everything -----------------------------------------------------------------------------------------


@dataclass
class ConformanceRun:
    """One run of every conformance scenario and the state-machine walk."""

    pairs: list[ConformancePair] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    """Scenarios that crashed and batch-dependent outcomes."""
    violations: list[Violation] = field(default_factory=list)
    """State-machine invariants that failed during the walk."""
    logs: list[EventLog] = field(default_factory=list)
    """Every log the run wrote (for the audit)."""
    witnesses: list[Witness] = field(default_factory=list)
    walk_rules: list[str] = field(default_factory=list)
    walk_events: list[tuple[str, int, str]] = field(default_factory=list)
    """(request, seq, hash) of every event the walk stored."""

    @property
    def nonconforming(self) -> list[ConformancePair]:
        """Pairs the relation does not allow."""
        return [p for p in self.pairs if not p.conforms]

    @property
    def conforming(self) -> bool:
        """Every pair conforms and no scenario failed."""
        return bool(self.pairs) and not self.nonconforming and not self.failures

    def observation(self) -> str:
        """A digest of everything observable: each pair's status and state, and every stored event."""
        h = hashlib.sha256()
        for pair in self.pairs:
            h.update(repr((pair.scenario, pair.status, pair.acknowledged, pair.observed)).encode())
        h.update(repr(self.events()).encode())
        return h.hexdigest()

    def events(self) -> list[list[tuple[str, int, str]]]:
        """(request, seq, hash) of every stored event, log by log."""
        return [_fingerprint(log) for log in self.logs]


def run_conformance(
    *,
    layouts: Sequence[Layout] = tuple(Layout),
    walk_seed: int = 0,
    walk_rules: int = 40,
    log_factory: LogFactory = _memory_log,
) -> ConformanceRun:
    """Witnesses, refusals, batch independence and a seeded walk; see the module docstring."""
    run = ConformanceRun()
    for scenarios in (run_witnesses, run_refusals):
        pairs, logs, failures = scenarios(layouts, log_factory)
        run.pairs += pairs
        run.logs += logs
        run.failures += failures
    run.witnesses = [witness(kind, Layout(layout)) for layout in layouts for kind in BranchKind]
    try:
        findings, logs = batch_independence(walk_seed, log_factory=log_factory)
    except Exception as error:
        run.failures.append(f"batch independence: {type(error).__name__}: {error}")
    else:
        run.failures += [f"batch independence: {f}" for f in findings]
        run.logs += logs
    walk = MachineWalk(log_factory)
    walk.run(RandomChooser(walk_seed), walk_rules)
    run.pairs += walk.pairs
    run.violations = list(walk.violations)
    run.logs.append(walk.log)
    run.walk_rules = list(walk.rules_run)
    run.walk_events = _fingerprint(walk.log)
    return run
