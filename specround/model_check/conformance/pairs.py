"""Conformance pairs: one observed round attempt of the real controller against the z3 round relation.

:class:`Harness` makes :class:`Attempt` s on controllers over one log and turns each into a
:class:`ConformancePair`: the authoritative state before it (replayed from the log by a fresh controller),
the model's inputs, the authoritative state after it and whether the caller was acknowledged, decided
against :func:`~specround.model_check.z3.transition.round_outcome`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import z3

from specround.errors import InputError, SpecroundError
from specround.model_check.conformance.request_model import model_config_args, processed_tokens
from specround.model_check.z3.protocol_state import NO_TXN, ProtocolConfig, ProtocolState, RoundInputs
from specround.model_check.z3.transition import conforms as relation_conforms
from specround.model_check.z3.transition import round_outcome, state_values
from specround.statemachine.controller import RoundController
from specround.statemachine.faults import FaultPoint
from specround.statemachine.lifecycle import RoundPhase
from specround.statemachine.ports import EventLog
from specround.statemachine.rounds import RoundInput, RoundResult, RoundStatus
from specround.statemachine.state import RequestConfig, RequestState

__all__ = ["Attempt", "ConformancePair", "Harness", "Values"]

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

    def _planned(self, attempt: Attempt, result: RoundResult) -> tuple[int, int]:
        """``(A, terminal token)`` the attempt is checked with: its plan, else the logged decision."""
        if attempt.planned is not None:
            return attempt.planned
        published = result.phase is RoundPhase.PUBLISHED
        decided = self._decision(attempt.item.request_id, result.round_id) if published else None
        return decided if decided is not None else (0, 0)

    def _model_inputs(
        self, attempt: Attempt, result: RoundResult, pre: _View, planned: tuple[int, int]
    ) -> Values:
        """The keyword arguments of :meth:`RoundInputs.concrete` for this attempt."""
        item = attempt.item
        drafts = tuple(int(d) for d in item.draft_ids)
        accepted, terminal = planned
        round_id = result.round_id
        txn = self.txn(round_id) if round_id is not None else self.txn(f"unnamed:{len(self._txns)}")
        # A refusal is an abort before publication: the model's F-1.
        fault = FaultPoint.AFTER_VERIFICATION.value if attempt.refusal else attempt.fault
        return {
            "max_draft": max(1, len(drafts)),
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

    def _observed(
        self, controller: RoundController, rid: str, pre: _View, problems: list[str]
    ) -> _View | None:
        """The authoritative state after the attempt; else the writer's live state (with a problem noted)."""
        try:
            return self.authoritative(rid)
        except SpecroundError as error:
            problems.append(f"the log does not rebuild the request: {error}")
        try:  # report what the writer holds instead (its live projection)
            return self.view(controller.state(rid), pre.config)
        except SpecroundError:
            return None

    def _pair(
        self, scenario: str, controller: RoundController, attempt: Attempt, result: RoundResult, pre: _View
    ) -> ConformancePair:
        rid = attempt.item.request_id
        acknowledged = result.status in (RoundStatus.PUBLISHED, RoundStatus.ACKNOWLEDGED)
        problems: list[str] = []
        if attempt.refusal and (
            result.status is not RoundStatus.ABORTED or not isinstance(result.error, InputError)
        ):
            problems.append(f"malformed input was not refused with an InputError ({result.error!r})")
        accepted, terminal = planned = self._planned(attempt, result)
        input_args = self._model_inputs(attempt, result, pre, planned)
        config_args = model_config_args(pre.config, input_args["max_draft"])
        cfg = ProtocolConfig.concrete(**config_args)
        # One outcome serves the relation itself (round_relation(pre, inputs, post) is
        # post.identical(round_outcome(pre, inputs).post)), the acknowledgement and the expected successor.
        outcome = round_outcome(pre.model(), RoundInputs.concrete(**input_args), cfg)
        expected_ack = bool(z3.is_true(z3.simplify(outcome.acknowledged)))
        post = self._observed(controller, rid, pre, problems)
        observed = None if post is None else post.values
        ok = post is not None and _holds(z3.And(cfg.constraints(), post.model().identical(outcome.post)))
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
            attempt=_describe(attempt, accepted, terminal, input_args["txn"]),
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
