"""A step: the rounds of one engine iteration driven through the lifecycle together.

Contract: contract#round-transaction.

One trigger per phase for the whole batch, one batched sampler decision per group of compatible rounds,
one group-committed publication; each round keeps its own phase, fence and outcome.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from functools import partial
from types import TracebackType
from typing import Any

import torch

from specround.errors import (
    DuplicateRoundError,
    EventLogError,
    IllegalTransitionError,
    InjectedFaultError,
    InvalidRequestError,
    SpecroundError,
    StaleGenerationError,
)
from specround.sampling.exact import decide, decide_from_uniforms
from specround.sampling.layouts import retains_frontier, verify_row_count
from specround.sampling.types import SamplerBatch, SamplerDecision
from specround.sampling.validation import ValidationMode
from specround.statemachine.batch_rows import BatchRows
from specround.statemachine.batching import (
    batch_from_tensors,
    build_batch,
    record_decisions,
    rows_digest,
    signed64,
)
from specround.statemachine.commit_record import commit_values
from specround.statemachine.events import (
    EVENT_SCHEMA_VERSION,
    RoundPublished,
    RoundReady,
    RoundStaged,
    RoundVerified,
)
from specround.statemachine.faults import FaultPlan, FaultPoint
from specround.statemachine.lifecycle import LifecycleDispatch, RoundPhase, Trigger, next_phase
from specround.statemachine.ports import EventLog, PublishOutcome, PublishStatus, RoundPublication
from specround.statemachine.records import assemble, record_digest_of
from specround.statemachine.rounds import (
    KvInstruction,
    RoundInput,
    RoundResult,
    RoundStatus,
    RoundVerification,
)
from specround.statemachine.staging import stage_kv, stage_successor
from specround.statemachine.state import RngCounters, SpeculativeCommit
from specround.statemachine.step_inputs import CheckedProposal, check_identity, check_verification
from specround.statemachine.step_result import RowDecision
from specround.statemachine.uniform_cache import batch_uniforms
from specround.statemachine.work import LastRound, RoundWork
from specround.statemachine.writer import RoundKey, WriteKey

__all__ = ["Step", "StepFsm", "StepSettings", "refused_result", "unacknowledged_result"]

_HOST = torch.device("cpu")


@dataclass(frozen=True, slots=True)
class StepSettings:
    """What a step needs from its controller."""

    log: EventLog
    faults: FaultPlan | None
    validate: ValidationMode
    row_digests: bool
    release: Callable[[StepFsm], None]
    """Hands the step's machine model back to the controller's pool."""

    def fault(self, point: FaultPoint, work: RoundWork) -> None:
        """Raise :class:`~specround.errors.InjectedFaultError` if the plan fails this round here."""
        faults = self.faults
        if faults is not None and point in faults.points:
            faults.check(point, work.request_id, work.generation)


class StepFsm:
    """The lifecycle model of one step (pooled and reused across steps): its phase, moved by triggers.

    Triggers fire through the controller's :class:`~specround.statemachine.lifecycle.LifecycleDispatch`,
    compiled from its ``transitions`` machine: the ``publish`` trigger runs :meth:`write_publication` first
    and, if that raises, the phase stays ``STAGED``.
    """

    __slots__ = ("_dispatch", "state", "step")

    def __init__(self, dispatch: LifecycleDispatch) -> None:
        self._dispatch = dispatch
        self.state = RoundPhase.ROUND_READY
        self.step: Step | None = None

    def trigger(self, name: str) -> None:
        """Fire a lifecycle trigger; IllegalTransitionError if the table forbids it in this phase."""
        self.state = self._dispatch.fire(self, self.state, name)

    def write_publication(self) -> None:
        """``before`` callback of ``publish``: the durable group commit (never in ``on_enter``)."""
        assert self.step is not None
        self.step._write_publication()


def _no_work(rnd: RoundWork) -> None:
    """Per-round work of a phase that has none (its rounds only change phase)."""


def _proposal_of(rnd: RoundWork) -> CheckedProposal:
    """The checked proposal an open round was built from (its fields were checked at ``begin_step``)."""
    return CheckedProposal(
        rnd.request_id,
        rnd.coordinate_digest,
        rnd.draft_ids,
        rnd.q_rows,
        rnd.proposal_draws,
        rnd.round_id,
        rnd.timings,
    )


def _own_input(items: list[RoundVerification | RoundInput], rnd: RoundWork) -> RoundInput | None:
    """The round input the round was opened from, when the step was handed whole inputs in order.

    So that a second input for the same request (whose first was refused) is verified with its own rows.
    """
    item = items[rnd.index] if rnd.index < len(items) else None
    return item if isinstance(item, RoundInput) and item.request_id == rnd.request_id else None


def _as_refusal(rnd: RoundWork, error: Exception) -> SpecroundError:
    """A round's own failure as a specround error (an :class:`InputError` of the sampler stays as it is)."""
    if isinstance(error, SpecroundError):
        return error
    return InvalidRequestError(f"the sampler cannot decide the round of {rnd.request_id!r}: {error!r}")


def refused_result(
    request_id: str, round_id: str | None, error: SpecroundError, generation: int
) -> RoundResult:
    """The result of a proposal refused before its round opened."""
    return _stateless(request_id, round_id, RoundStatus.ABORTED, error, generation)


def unacknowledged_result(
    request_id: str, round_id: str, error: SpecroundError, generation: int
) -> RoundResult:
    """The result of a round that is durable but whose acknowledgement was lost (F-6)."""
    return _stateless(request_id, round_id, RoundStatus.UNACKNOWLEDGED, error, generation)


def _stateless(
    request_id: str, round_id: str | None, status: RoundStatus, error: SpecroundError, generation: int
) -> RoundResult:
    """A result that carries no state: refused (``ABORTED``) or unacknowledged (``PUBLISHED``)."""
    phase = RoundPhase.PUBLISHED if status is RoundStatus.UNACKNOWLEDGED else RoundPhase.ABORTED
    return RoundResult(
        request_id=request_id,
        round_id=round_id,
        status=status,
        phase=phase,
        generation=generation,
        state=None,
        error=error,
    )


class Step:
    """The rounds of one engine iteration, driven through the lifecycle together.

    Obtain one from :meth:`RoundController.begin_step`; call :meth:`verify`, :meth:`decide`, :meth:`stage`
    and :meth:`publish` in order (or :meth:`abort` at any point before publication). Usable as a context
    manager that aborts whatever is unfinished on exit.
    """

    def __init__(
        self, settings: StepSettings, fsm: StepFsm, size: int, rows: BatchRows | None = None
    ) -> None:
        """Internal: steps are created by :meth:`RoundController.begin_step` and ``step_batch``."""
        self._settings = settings
        self._rows = rows
        """The engine's batch tensors when the step was opened from them (rounds then hold no row slices)."""
        self._fsm = fsm
        fsm.step = self
        self._rounds: list[RoundWork] = []
        self._results: list[RoundResult | None] = [None] * size
        """Results in proposal order: refused proposals at once, the other rounds when the step closes."""
        self._outcomes: list[PublishOutcome] | None = None
        self._pending: Future[list[PublishOutcome]] | None = None
        """The durable write of a submitted (pipelined) step, running on the controller's writer."""
        self._closed = False
        self._final_phase = RoundPhase.ROUND_READY

    @property
    def phase(self) -> RoundPhase:
        """The step's lifecycle phase (rounds that failed on their own are ``ABORTED`` regardless)."""
        return self._fsm.state if not self._closed else self._final_phase

    @property
    def width(self) -> int:
        """K, the widest draft the step's batch can hold (for padding its results)."""
        if self._rows is not None:
            return self._rows.width
        return max((len(r.draft_ids) for r in self._rounds), default=0)

    @property
    def write_done(self) -> bool:
        """Whether a submitted step's durable write has finished (successfully or not)."""
        return self._pending is not None and self._pending.done()

    def decisions(self) -> list[RowDecision | None]:
        """Each row's staged decision in proposal order (None for a row that did not reach staging)."""
        out: list[RowDecision | None] = [None] * len(self._results)
        for rnd in self._live_rounds():
            decided, kv, successor = rnd.decided, rnd.kv, rnd.successor
            if decided is None or kv is None or successor is None:
                continue
            out[rnd.index] = RowDecision(  # positional, in field order (cheaper than by keyword)
                decided.emitted_ids,  # emitted_ids
                decided.accepted,  # accepted
                decided.terminal,  # terminal
                decided.finished,  # finished
                kv.keep,  # keep
                successor.state.frontier,  # new_frontier
                decided.accept_draws,  # reached
                decided.finish_reason,  # finish_reason
            )
        return out

    @property
    def request_ids(self) -> list[str]:
        """Requests with a round in this step that has not been aborted."""
        return [r.request_id for r in self._rounds if r.phase is not RoundPhase.ABORTED]

    def __enter__(self) -> Step:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if not self._closed:
            self.abort("the step was left before publication")

    # --- phases -----------------------------------------------------------------------------------------

    def verify(self, verifications: Iterable[RoundVerification | RoundInput]) -> None:
        """Hand in each round's p rows [k+1, V] and branch handle (-> ``VERIFIED_TEMPORARY``); F-1.

        Whole :class:`RoundInput` records are accepted too (their verification half is read).
        """
        self._require(Trigger.VERIFY)
        items = list(verifications)
        by_request: dict[str, RoundVerification | RoundInput] = {}
        for item in items:
            try:
                by_request.setdefault(check_identity(item), item)
            except SpecroundError:
                continue  # no round of this step can be matched to it: that round finds no verification

        def attach(rnd: RoundWork) -> None:
            found = _own_input(items, rnd) or by_request.get(rnd.request_id)
            if found is None:
                raise InvalidRequestError(f"no verification for request {rnd.request_id!r}")
            self._attach_verification(rnd, found)
            self._settings.fault(FaultPoint.AFTER_VERIFICATION, rnd)

        self._advance_live_rounds(Trigger.VERIFY, attach)

    def verify_batch(
        self, branches: Sequence[Any] | None = None, verify_rows: Sequence[int | None] | None = None
    ) -> None:
        """The target side of a step opened from batch tensors: p is already held (-> ``VERIFIED_TEMPORARY``).

        ``branches[b]`` and ``verify_rows[b]`` belong to row ``b`` of the batch; F-1.
        """
        self._require(Trigger.VERIFY)
        if self._rows is None:
            raise IllegalTransitionError("verify_batch needs a step opened by step_batch; use verify")

        def attach(rnd: RoundWork) -> None:
            b = rnd.batch_row
            rnd.branch = branches[b] if branches is not None else None
            rnd.verify_rows = _verify_row_count(rnd, verify_rows[b] if verify_rows is not None else None)
            self._settings.fault(FaultPoint.AFTER_VERIFICATION, rnd)

        self._advance_live_rounds(Trigger.VERIFY, attach)

    def decide(self) -> None:
        """One batched exact decision for every live round (-> ``DECIDED``); F-2."""
        self._require(Trigger.DECIDE)
        rounds = self._live_rounds()
        if self._rows is not None:
            if rounds:
                self._decide_group(rounds, self._rows_batch)
        else:
            groups: dict[tuple[int, torch.dtype, torch.device], list[RoundWork]] = {}
            for rnd in rounds:
                assert rnd.p_rows is not None
                key = (rnd.p_rows.shape[-1], rnd.p_rows.dtype, rnd.p_rows.device)
                groups.setdefault(key, []).append(rnd)
            for group in groups.values():
                self._decide_group(group, build_batch)
        faulted = self._settings.faults is not None
        work = partial(self._settings.fault, FaultPoint.AFTER_DECISION) if faulted else _no_work
        self._advance_live_rounds(Trigger.DECIDE, work)

    def stage(self) -> None:
        """Stage every live round's successor off to the side and validate it (-> ``STAGED``); F-3, F-4."""
        self._require(Trigger.STAGE)
        self._advance_live_rounds(Trigger.STAGE, self._stage_round)

    def publish(self) -> list[RoundResult]:
        """F-5, then ONE group-committed publish under each request's generation fence; F-6. Returns results.

        A log failure (e.g. :class:`~specround.errors.LogUnavailableError`) aborts every round of the step:
        the log's contract is that a failed transaction appended nothing.
        """
        self._require(Trigger.PUBLISH)
        if not self._before_publication():
            return self._close(RoundPhase.ABORTED)
        return self._commit_and_settle()

    def submit(
        self,
        write: Callable[
            [Callable[[], list[RoundPublication]], list[WriteKey], list[RoundKey | None]],
            Future[list[PublishOutcome]],
        ],
    ) -> bool:
        """F-5, then hand the group commit to ``write`` (the controller's writer) without waiting for it.

        Each live round's request moves on to its staged successor at once (so that its next round can be
        opened while this write runs), remembering its last durable snapshot; :meth:`settle_submitted`
        waits for the write and settles the rounds (a failed write rolls the requests back). Returns False
        when no round was left to publish (the step is then closed).
        """
        self._require(Trigger.PUBLISH)
        if not self._before_publication():
            self._close(RoundPhase.ABORTED)
            return False
        rounds = self._live_rounds()
        keys: list[WriteKey] = []
        parents: list[RoundKey | None] = []
        for rnd in rounds:
            assert rnd.successor is not None
            keys.append((rnd.request_id, rnd.round_id, rnd.start.state.generation))
            live = rnd.live
            parents.append(live.tip if live.pending and rnd.epoch == live.epoch else None)
            live.tip = (rnd.request_id, rnd.round_id)
            if live.pending == 0:
                live.durable, live.durable_last = live.current, live.last
            live.pending += 1
            rnd.pipelined = True
            live.last = LastRound(rnd.start, rnd.coordinate_digest, rnd.round_id)
            live.current = rnd.successor
            live.coordinate_digest = None
            live.in_flight = False
        self._pending = write(lambda: _publications_of(rounds), keys, parents)
        return True

    def settle_submitted(self) -> list[RoundResult]:
        """Wait for a submitted step's durable write and settle its rounds (F-6 included); returns results."""
        if self._pending is None:
            raise IllegalTransitionError("the step was not submitted")
        return self._commit_and_settle()

    def _before_publication(self) -> bool:
        """F-5 for every live round; False (after the ABORT trigger) when none is left."""
        if self._settings.faults is not None:
            for rnd in self._live_rounds():
                try:
                    self._settings.fault(FaultPoint.BEFORE_PUBLICATION, rnd)
                except SpecroundError as error:
                    self._abort_round(rnd, error)
        if not self._live_rounds():
            self._fire(Trigger.ABORT)
            return False
        return True

    def _commit_and_settle(self) -> list[RoundResult]:
        """Fire ``publish`` (the durable group commit in its ``before`` callback) and settle each round."""
        try:
            self._fire(Trigger.PUBLISH)
        except Exception as exc:  # the durable append failed: by the log's contract nothing was appended
            failure = exc if isinstance(exc, SpecroundError) else EventLogError(f"publish failed: {exc!r}")
            for rnd in self._live_rounds():
                self._abort_round(rnd, failure)
            self._fire(Trigger.ABORT)
            results = self._close(RoundPhase.ABORTED)
            if not isinstance(exc, SpecroundError):
                raise
            return results
        assert self._outcomes is not None
        for rnd, outcome in zip(self._live_rounds(), self._outcomes, strict=True):
            self._settle(rnd, outcome.status, outcome.generation)
        return self._close(RoundPhase.PUBLISHED)

    def abort(self, reason: str | SpecroundError = "aborted by the caller") -> list[RoundResult]:
        """Abort every round that is not finished yet (nothing is published); returns the results."""
        if self._closed:
            return self.results()
        if self._pending is not None:  # the write is out of our hands: its outcome decides
            return self.settle_submitted()
        error = reason if isinstance(reason, SpecroundError) else IllegalTransitionError(str(reason))
        for rnd in self._live_rounds():
            if rnd.phase is RoundPhase.PUBLISHED:  # already durable: only the acknowledgement is lost
                rnd.live.in_flight = False
                rnd.result = unacknowledged_result(rnd.request_id, rnd.round_id, error, rnd.generation)
            else:
                self._abort_round(rnd, error)
        if self._fsm.state is not RoundPhase.PUBLISHED:
            self._fire(Trigger.ABORT)
        return self._close(RoundPhase.ABORTED)

    def results(self) -> list[RoundResult]:
        """Every round's result in proposal order (available once the step is published or aborted)."""
        if not self._closed:
            raise IllegalTransitionError(f"the step is in phase {self._fsm.state.name}, not finished")
        results = []
        for index, result in enumerate(self._results):
            assert result is not None, f"round {index} has no result"
            results.append(result)
        return results

    # --- internals ------------------------------------------------------------------------------------

    def _require(self, trigger: str) -> None:
        if self._closed:
            raise IllegalTransitionError(f"trigger {trigger!r}: the step is already finished")
        next_phase(self._fsm.state, trigger)

    def _fire(self, trigger: str) -> None:
        self._fsm.trigger(trigger)

    def _advance_live_rounds(self, trigger: str, work: Callable[[RoundWork], None]) -> None:
        """Run ``work`` on every live round and move it on by ``trigger``, then fire ``trigger``.

        A round whose ``work`` raises a :class:`~specround.errors.SpecroundError` is aborted alone.
        """
        seen: RoundPhase | None = None  # the live rounds move in step: one table look-up per phase met
        after = RoundPhase.ABORTED
        for rnd in self._live_rounds():
            if work is not _no_work:
                try:
                    work(rnd)
                except SpecroundError as error:
                    self._abort_round(rnd, error)
                    continue
            phase = rnd.phase
            if phase is not seen:
                after, seen = next_phase(phase, trigger), phase
            rnd.phase = after
        self._fire(trigger)

    def _live_rounds(self) -> list[RoundWork]:
        return [r for r in self._rounds if r.phase is not RoundPhase.ABORTED and r.result is None]

    def _abort_round(self, rnd: RoundWork, error: SpecroundError) -> None:
        rnd.phase = next_phase(rnd.phase, Trigger.ABORT)
        rnd.error = error
        live = rnd.live
        live.in_flight = False
        if rnd.pipelined:  # its request moved on to the successor this round will never publish
            _settled_pipelined(rnd)
            if rnd.epoch == live.epoch:
                assert live.durable is not None
                live.current, live.last, live.coordinate_digest = live.durable, live.durable_last, None
                live.epoch += 1
                live.tip = None
            if live.pending == 0:
                live.durable = live.durable_last = live.tip = None
        state = live.current.state
        rnd.result = RoundResult(
            request_id=rnd.request_id,
            round_id=rnd.round_id,
            status=RoundStatus.ABORTED,
            phase=RoundPhase.ABORTED,
            generation=state.generation,
            state=None,
            kv=KvInstruction(
                layout=rnd.live.config.layout,
                branch=rnd.branch,
                keep=0,
                committed_token_ids=(),
                discarded_rows=tuple(range(len(rnd.draft_ids) + 1)),
                discarded_token_ids=(rnd.start.state.output[-1], *rnd.draft_ids),
                new_frontier=None,
                new_frontier_position=None,
                materialize_frontier=False,
            ),
            error=error,
        )

    def _close(self, final: RoundPhase) -> list[RoundResult]:
        for rnd in self._rounds:
            assert rnd.result is not None
            self._results[rnd.index] = rnd.result
        self._closed = True
        self._final_phase = final
        self._settings.release(self._fsm)
        return self.results()

    def _attach_verification(self, rnd: RoundWork, verification: RoundVerification | RoundInput) -> None:
        checked = check_verification(verification, _proposal_of(rnd), rnd.live.config.layout)
        rnd.q_rows, rnd.p_rows = checked.q_rows, checked.p_rows
        rnd.branch, rnd.verify_rows = checked.branch, checked.verify_rows

    def _rows_batch(self, group: Sequence[RoundWork]) -> SamplerBatch:
        """The sampler batch of ``group`` read from the step's batch tensors (a gather only if rows left)."""
        rows = self._rows
        assert rows is not None
        index = [rnd.batch_row for rnd in group]
        if len(index) == rows.size:  # rounds keep batch order, so every row is live and in place
            return batch_from_tensors(group, rows.p, rows.q, rows.draft_ids)
        at = torch.tensor(index, dtype=torch.int64, device=rows.p.device)  # [B_live]
        return batch_from_tensors(
            group, rows.p.index_select(0, at), rows.q.index_select(0, at), rows.draft_ids.index_select(0, at)
        )

    def _round_rows(self, rnd: RoundWork) -> tuple[torch.Tensor, torch.Tensor]:
        """A round's own q [k, V] and p [k+1, V] rows (views of the batch tensors for a batch step)."""
        rows = self._rows
        if rows is None:
            assert rnd.p_rows is not None
            return rnd.q_rows, rnd.p_rows
        k = len(rnd.draft_ids)
        return rows.q[rnd.batch_row, :k], rows.p[rnd.batch_row, : k + 1]

    def _decide_group(
        self, group: list[RoundWork], make_batch: Callable[[Sequence[RoundWork]], SamplerBatch]
    ) -> None:
        """Decide one group of rounds sharing V, dtype and device; isolate bad input to its own round."""
        try:
            batch = make_batch(group)
            decision = self._decide_batch(group, batch)
        except Exception:  # find the rounds that fail on their own; the others are decided together
            survivors: list[RoundWork] = []
            for rnd in group:
                try:
                    self._decide_batch([rnd], make_batch([rnd]))
                except Exception as error:
                    self._abort_round(rnd, _as_refusal(rnd, error))
                    continue
                survivors.append(rnd)
            if not survivors:
                return
            group = survivors
            batch = make_batch(group)
            decision = self._decide_batch(group, batch)
        record_decisions(group, batch, decision)

    def _decide_batch(self, group: list[RoundWork], batch: SamplerBatch) -> SamplerDecision:
        """The exact decision, with uniforms from the requests' precomputed windows when they cover it."""
        validate = self._settings.validate
        states = [rnd.start.state for rnd in group]
        drawn = batch_uniforms(
            [rnd.live.uniforms for rnd in group],
            [signed64(rnd.live.config.seed) for rnd in group],
            [state.rng.accept for state in states],
            [state.rng.terminal for state in states],
            [len(rnd.draft_ids) for rnd in group],
            batch.draft_ids.shape[1],
            _HOST,  # the decision's control runs on the host, an accelerator's batch included
        )
        if drawn is None:  # counters near the int64 end: let the sampler draw them
            return decide(batch, validate=validate)
        accept_uniforms, terminal_uniforms, windows = drawn
        for rnd, window in zip(group, windows, strict=True):
            rnd.live.uniforms = window
        return decide_from_uniforms(batch, accept_uniforms, terminal_uniforms, validate=validate)

    def _stage_round(self, rnd: RoundWork) -> None:
        decided = rnd.decided
        assert decided is not None
        start = rnd.start
        s0 = start.state
        emitted = decided.emitted_ids
        settings = self._settings
        # K/V rows: commit [F_0] + accepted drafts before the final token, discard the rest (INV-5).
        kv = stage_kv(s0, rnd.draft_ids, emitted)
        rnd.kv = kv
        settings.fault(FaultPoint.AFTER_KV_STAGING, rnd)
        # Output, processors (INV-4), RNG counters (INV-3), generation; validated by token identity (INV-1).
        before = s0.rng
        proposal = before.proposal + rnd.proposal_draws
        accept = before.accept + decided.accept_draws
        terminal = before.terminal + decided.terminal_draws
        rng_after = assemble(RngCounters, {"proposal": proposal, "accept": accept, "terminal": terminal})
        successor = stage_successor(
            start,
            emitted,
            kv.committed_token_ids,
            rng_after,
            finished=decided.finished,
            finish_reason=decided.finish_reason,
        )
        rnd.successor = successor
        settings.fault(FaultPoint.AFTER_OUTPUT_STAGING, rnd)
        rnd.rng_after = (proposal, accept, terminal)
        if settings.row_digests:  # read now: the engine may reuse the tensors once the step returns
            q_rows, p_rows = self._round_rows(rnd)
            rnd.row_digests = (rows_digest(q_rows), rows_digest(p_rows))

    def _publications(self) -> list[RoundPublication]:
        """The live rounds' publications (their commit records and events; built once, on first call).

        A submitted step calls this on the writer's thread: the encoding is part of the durable write, not
        of the engine's critical path.
        """
        return _publications_of(self._live_rounds())

    def _write_publication(self) -> None:
        """The group commit (called by the machine's ``before`` callback of ``publish``).

        For a submitted step, waiting for the writer's result (its exception, if the write failed).
        """
        if self._pending is not None:
            self._outcomes = self._pending.result()
            return
        self._outcomes = self._settings.log.publish(self._publications())

    def _settle(self, rnd: RoundWork, status: PublishStatus, generation: int) -> None:
        live = rnd.live
        if status is PublishStatus.STALE_GENERATION:
            self._abort_round(
                rnd,
                StaleGenerationError(
                    f"request {rnd.request_id!r}: generation {rnd.start.state.generation} is stale, the log "
                    f"is at {generation}; refresh the request"
                ),
            )
            return
        if status is PublishStatus.DUPLICATE_ROUND:
            self._abort_round(
                rnd,
                DuplicateRoundError(
                    f"round {rnd.round_id!r} of {rnd.request_id!r} was published differently"
                ),
            )
            return
        successor = rnd.successor
        assert successor is not None
        rnd.phase = next_phase(rnd.phase, Trigger.PUBLISH)
        live.in_flight = False
        if rnd.pipelined:  # durable now: the request's durable snapshot catches up with it
            _settled_pipelined(rnd)
            if live.pending == 0:
                live.durable = live.durable_last = live.tip = None
            else:
                live.durable = successor
                live.durable_last = LastRound(rnd.start, rnd.coordinate_digest, rnd.round_id)
        if successor.state.generation > live.current.state.generation:  # published now or before
            live.last = LastRound(rnd.start, rnd.coordinate_digest, rnd.round_id)
            live.current = successor
            live.coordinate_digest = None
        try:
            self._settings.fault(FaultPoint.AFTER_PUBLICATION, rnd)
        except InjectedFaultError as error:
            rnd.error = error
            rnd.result = unacknowledged_result(
                rnd.request_id, rnd.round_id, error, successor.state.generation
            )
            return
        rnd.result = self._published_result(
            rnd, RoundStatus.PUBLISHED if status is PublishStatus.PUBLISHED else RoundStatus.ACKNOWLEDGED
        )

    def _published_result(self, rnd: RoundWork, status: RoundStatus) -> RoundResult:
        decided, kv, successor = rnd.decided, rnd.kv, rnd.successor
        assert decided is not None and kv is not None and successor is not None
        state = successor.state
        layout = rnd.live.config.layout
        # Positional (in field order): a dataclass built by keyword costs about three times as much.
        instruction = KvInstruction(
            layout,  # layout
            rnd.branch,  # branch
            kv.keep,  # keep
            kv.committed_token_ids,  # committed_token_ids
            kv.discarded_rows,  # discarded_rows
            kv.discarded_token_ids,  # discarded_token_ids
            state.frontier,  # new_frontier
            state.position,  # new_frontier_position
            retains_frontier(layout) and not state.finished,  # materialize_frontier
        )
        return RoundResult(
            rnd.request_id,  # request_id
            rnd.round_id,  # round_id
            status,  # status
            RoundPhase.PUBLISHED,  # phase
            state.generation,  # generation
            state,  # state
            decided.emitted_ids,  # emitted_ids
            decided.accepted,  # accepted
            decided.terminal,  # terminal
            decided.finished,  # finished
            decided.finish_reason,  # finish_reason
            instruction,  # kv
            rnd.commit,  # commit
        )


def _verify_row_count(rnd: RoundWork, given: int | None) -> int:
    """Target input rows of a verification: ``given``, or k+1 (replay_frontier) / k (retained_frontier)."""
    if given is None:  # the layout's own count: k + 1 or k, an int well inside [0, 2**63)
        return verify_row_count(rnd.live.config.layout, len(rnd.draft_ids))
    if isinstance(given, bool) or not isinstance(given, int) or not 0 <= given < 2**63:
        raise InvalidRequestError(f"verify_rows must be an integer in [0, 2**63), got {given!r}")
    return given


def _settled_pipelined(rnd: RoundWork) -> None:
    """Count a submitted round as settled (once)."""
    rnd.pipelined = False
    rnd.live.pending -= 1


def _publications_of(rounds: Sequence[RoundWork]) -> list[RoundPublication]:
    """The publications of staged ``rounds`` in order, building each round's on first use."""
    publications = []
    for rnd in rounds:
        if rnd.publication is None:
            _build_publication(rnd)
        assert rnd.publication is not None
        publications.append(rnd.publication)
    return publications


def _build_publication(rnd: RoundWork) -> None:
    """Set a staged round's commit record and its publication (the five events and the envelope)."""
    decided, kv, successor, rng_after = rnd.decided, rnd.kv, rnd.successor, rnd.rng_after
    assert decided is not None and kv is not None and successor is not None and rng_after is not None
    s0 = rnd.start.state
    before = s0.rng
    rng_before = (before.proposal, before.accept, before.terminal)
    finished, finish_reason = decided.finished, decided.finish_reason
    request_id, round_id = rnd.request_id, rnd.round_id
    generation = s0.generation
    processors_after = successor.state.processors_digest
    commit = commit_values(
        request_id=request_id,
        round_id=round_id,
        expected_generation=generation,
        layout=rnd.live.config.layout,
        accepted=decided.accepted,
        terminal=decided.terminal,
        emitted=decided.emitted_ids,
        committed_kv=kv.committed_token_ids,
        discarded_kv=kv.discarded_token_ids,
        rng_before=rng_before,
        rng_after=rng_after,
        processor_before=s0.processors_digest,
        processor_after=processors_after,
        finished=finished,
        finish_reason=finish_reason,
        coordinate_digest=rnd.coordinate_digest,
        successor_digest=successor.digest,
    )
    commit_digest = record_digest_of(SpeculativeCommit, commit)
    rnd.commit = assemble(SpeculativeCommit, commit)
    q_digest, p_digest = rnd.row_digests if rnd.row_digests is not None else (None, None)
    rnd.publication = RoundPublication(
        request_id,
        round_id,
        generation,
        commit_digest,
        successor.digest,
        finished,
        assemble(
            RoundReady,
            {
                "schema_version": EVENT_SCHEMA_VERSION,
                "request_id": request_id,
                "kind": "round_ready",
                "round_id": round_id,
                "expected_generation": generation,
                "coordinate_digest": rnd.coordinate_digest,
                "draft_ids": rnd.draft_ids,
                "q_draft": rnd.q_draft,
                "proposal_before": rng_before[0],
                "proposal_after": rng_after[0],
                "q_rows_digest": q_digest,
            },
        ),
        assemble(
            RoundVerified,
            {
                "schema_version": EVENT_SCHEMA_VERSION,
                "request_id": request_id,
                "kind": "round_verified",
                "round_id": round_id,
                "p_draft": rnd.p_draft,
                "verify_rows": rnd.verify_rows,
                "p_rows_digest": p_digest,
            },
        ),
        decided,
        assemble(
            RoundStaged,
            {
                "schema_version": EVENT_SCHEMA_VERSION,
                "request_id": request_id,
                "kind": "round_staged",
                "round_id": round_id,
                "committed_kv_ids": kv.committed_token_ids,
                "discarded_kv_ids": kv.discarded_token_ids,
                "processor_before": s0.processors_digest,
                "processor_after": processors_after,
                "rng_before": rng_before,
                "rng_after": rng_after,
                "successor_digest": successor.digest,
            },
        ),
        assemble(
            RoundPublished,
            {
                "schema_version": EVENT_SCHEMA_VERSION,
                "request_id": request_id,
                "kind": "round_published",
                "round_id": round_id,
                "generation": generation + 1,
                "commit_digest": commit_digest,
                "timings": rnd.timings,
            },
        ),
    )
