"""The round controller: the embedding API that turns drafts and verified rows into published successors.

No model is needed: a serving loop (or a test) hands the controller, per request, the drafts with the q rows
that sampled them and the target's processed p rows, and gets back a published successor and the exact K/V
instruction for its model adapter. Typical use::

    log = MemoryEventLog()                      # or SqlEventLog.open("run.sqlite")
    ctl = RoundController(log)
    rid = ctl.open_request([1, 4, 7], seed=3, max_new_tokens=32, vocab_size=V).request_id
    digest = ctl.coordinate_digest(rid)         # bind the proposal to the round coordinate
    [result] = ctl.step([RoundInput(rid, digest, draft_ids, q_rows, p_rows, branch=handle)])
    adapter.commit(rid, result.kv.branch, result.kv.keep)   # what the model adapter keeps

A **step** drives the rounds of a batch through the lifecycle together (:mod:`.lifecycle`): one batched
sampler call (:func:`specround.sampling.exact.decide`) and one group-committed
:meth:`~specround.statemachine.ports.EventLog.publish` per step, while each request keeps its own fence and
outcome — a round that fails validation, hits a fault point or loses the fence is ``ABORTED`` alone and the
rest of the step proceeds. :meth:`RoundController.begin_step` exposes the phases one by one; :meth:`step`
runs them all; :meth:`run_round` is the single-request form that raises on failure.

Publication is a compare-and-swap on the generation (INV-6). Retrying a published round — same coordinate
digest, same drafts, so the same round id — re-stages it from its S_0 and publishes the same transaction
again: the log appends nothing and the controller returns the already-published successor
(``ACKNOWLEDGED``). This is the recovery after F-6 (:mod:`.faults`).

The controller keeps the live projection in memory. A request it has not seen is loaded from the log by
replay on first use, so a controller re-opened over an existing log continues where the old one stopped.
A controller is not thread-safe: give each thread its own (they may share a log).
"""

from __future__ import annotations

import uuid
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from pydantic import ValidationError

from specround.errors import (
    DraftIdOutOfVocabError,
    IllegalTransitionError,
    InputError,
    InvalidRequestError,
    LogIntegrityError,
    RequestFinishedError,
    ShapeMismatchError,
    SpecroundError,
    StaleCoordinateError,
    UnknownLayoutError,
)
from specround.sampling.coordinate import RoundCoordinate
from specround.sampling.processors.processor import StopAutomaton
from specround.sampling.processors.processor_chain import ProcessorChain
from specround.sampling.processors.stop import StopSequences
from specround.sampling.types import Layout
from specround.sampling.validation import ValidationMode
from specround.statemachine.batch_rows import BatchRows, check_batch_rows
from specround.statemachine.binding import coordinate_digest, round_coordinate, static_coordinate
from specround.statemachine.events import RequestOpened, RoundTimings
from specround.statemachine.faults import FaultPlan
from specround.statemachine.lifecycle import LifecycleDispatch, RoundPhase, build_lifecycle_machine
from specround.statemachine.ports import EventLog
from specround.statemachine.replay import replay_request
from specround.statemachine.round_ids import check_round_id, derived_round_id
from specround.statemachine.rounds import (
    RoundInput,
    RoundProposal,
    RoundResult,
    RoundStatus,
)
from specround.statemachine.staging import (
    RequestSnapshot,
    open_snapshot,
)
from specround.statemachine.state import (
    RequestConfig,
    RequestState,
)
from specround.statemachine.step import Step, StepFsm, StepSettings, refused_result
from specround.statemachine.step_inputs import (
    INT64_END,
    MAX_ROUND_ID_LENGTH,
    CheckedProposal,
    check_identity,
    check_proposal,
)
from specround.statemachine.step_result import PendingStep, StepResult
from specround.statemachine.work import LastRound, LiveRequest, RoundWork
from specround.statemachine.writer import PublicationWriter

__all__ = ["MAX_PENDING_STEPS", "PendingStep", "RoundController", "Step", "StepResult"]

_SEED_MIN, _SEED_END = -(2**63), 2**64
MAX_PENDING_STEPS = 2
"""Submitted steps whose durable writes may be outstanding at once (the engine's pipeline depth)."""
_COUNTER_END = 2**63
"""RNG counters are int64: a round never moves one past this."""


class RoundController:
    """Drive request rounds through the lifecycle and publish them to an :class:`EventLog`."""

    def __init__(
        self,
        log: EventLog,
        *,
        faults: FaultPlan | None = None,
        validate: ValidationMode = "read",
        row_digests: bool = False,
    ) -> None:
        """Create a controller over ``log``.

        ``faults`` injects failures at the named points F-1..F-6; ``validate`` is the sampler's validation
        mode (``"read"``: every value the decision reads; ``"full"``: every row); ``row_digests`` logs a
        SHA-256 of the full p and q rows of every round (costs one pass over the rows).
        """
        if validate not in ("read", "full"):
            raise InvalidRequestError(f"validate must be 'read' or 'full', got {validate!r}")
        self._log = log
        self._faults = faults
        self._validate: ValidationMode = validate
        self._row_digests = row_digests
        self._live: dict[str, LiveRequest] = {}
        self._machine = build_lifecycle_machine()
        self._dispatch = LifecycleDispatch(self._machine)  # the machine's table, fired without its engine
        self._fsm_pool: list[StepFsm] = []
        self._settings = StepSettings(
            log=log, faults=faults, validate=validate, row_digests=row_digests, release=self._release_fsm
        )
        self._writer = PublicationWriter(log)
        self._submitted: deque[tuple[Step, PendingStep]] = deque()
        """Submitted steps whose durable writes have not been settled, oldest first."""

    # --- requests ---------------------------------------------------------------------------------------

    @property
    def log(self) -> EventLog:
        """The event log this controller publishes to."""
        return self._log

    def open_request(
        self,
        prompt_ids: Sequence[int] | torch.Tensor,
        *,
        seed: int,
        max_new_tokens: int,
        vocab_size: int | None = None,
        processors: ProcessorChain | Sequence[Mapping[str, Any]] | None = None,
        layout: Layout | str = Layout.REPLAY_FRONTIER,
        stop_token_ids: Iterable[int] = (),
        stop_sequences: Iterable[Sequence[int]] = (),
        request_id: str | None = None,
        coordinate: Mapping[str, Any] | None = None,
        softmax: str | None = None,
        prompt_advances_processors: bool = True,
    ) -> RequestState:
        """Admit a request and log its ``request_opened`` event; returns the generation-0 state.

        ``processors`` is a :class:`ProcessorChain` or its spec (``to_spec()``); ``stop_token_ids`` and
        ``stop_sequences`` are appended to it as one stop-sequence processor (EOS is a one-token sequence).
        ``coordinate`` holds the static identities bound into every round coordinate: ``target_model_id``,
        ``draft_model_id``, ``backend`` (``dtype``, ``attention_path``, ``software_revision``),
        ``draft_processors_digest`` and ``vocab_digest`` (undeclared ones are ``"unspecified"``).
        ``prompt_advances_processors`` chooses whether G_0 is the chain advanced over the prompt (default)
        or the declared chain itself (for a grammar of the generated text only).

        Every argument is validated before anything is logged (:class:`~specround.errors.InvalidRequestError`
        and its siblings). Opening an already-open request with the identical configuration returns its
        current state; with a different one it is refused.
        """
        config = self._build_config(
            prompt_ids,
            seed=seed,
            max_new_tokens=max_new_tokens,
            vocab_size=vocab_size,
            processors=processors,
            layout=layout,
            stop_token_ids=stop_token_ids,
            stop_sequences=stop_sequences,
            request_id=request_id,
            coordinate=coordinate,
            softmax=softmax,
            prompt_advances_processors=prompt_advances_processors,
        )
        request_id = config.request_id
        live = self._live.get(request_id)
        with self._writer.exclusive() as log:
            known = live is None and log.head(request_id) is not None
        if known:
            live = self._load(request_id)  # known to the log: continue from its published state
        if live is not None:
            if live.config != config:
                raise InvalidRequestError(
                    f"request {request_id!r} is already open with another configuration"
                )
            return live.current.state
        snapshot = open_snapshot(config)
        event = RequestOpened(request_id=request_id, config=config, initial_state_digest=snapshot.digest)
        with self._writer.exclusive() as log:
            log.open_request(event, snapshot.digest)
        self._live[request_id] = self._make_live(config, snapshot)
        return snapshot.state

    def state(self, request_id: str) -> RequestState:
        """The published state of a request (loaded from the log by replay on first use)."""
        return self._entry(request_id).current.state

    def processors(self, request_id: str) -> ProcessorChain:
        """A clone of the request's processor chain at its published state (for building p and q rows)."""
        return self._entry(request_id).current.chain.clone()

    def config(self, request_id: str) -> RequestConfig:
        """The request's immutable configuration."""
        return self._entry(request_id).config

    def coordinate(self, request_id: str) -> RoundCoordinate:
        """The round coordinate of the request's published state (contract#round-coordinate)."""
        live = self._entry(request_id)
        return round_coordinate(live.config, live.current, live.target_config_digest)

    def coordinate_digest(self, request_id: str) -> str:
        """Digest of the current round coordinate; a proposal must carry it (else StaleCoordinateError)."""
        return self._current_coordinate_digest(self._entry(request_id))

    def remaining(self, request_id: str) -> int:
        """Output tokens the request may still emit (0 once finished)."""
        live = self._entry(request_id)
        state = live.current.state
        return 0 if state.finished else live.config.max_new_tokens - state.generated_count

    def refresh(self, request_id: str) -> RequestState:
        """Drop the in-memory projection of a request and rebuild it from the log (after losing a race)."""
        self.drain()
        if self._live.get(request_id) is not None and self._live[request_id].in_flight:
            raise IllegalTransitionError(f"request {request_id!r} has a round in flight")
        self._live.pop(request_id, None)
        return self._entry(request_id).current.state

    def load_all(self) -> dict[str, RequestState]:
        """Rebuild every request of the log that is not live yet; returns every live state."""
        with self._writer.exclusive() as log:
            request_ids = log.request_ids()
        for request_id in request_ids:
            self._entry(request_id)
        return {request_id: live.current.state for request_id, live in self._live.items()}

    # --- rounds -----------------------------------------------------------------------------------------

    def begin_step(self, proposals: Sequence[RoundProposal]) -> Step:
        """Open the rounds of one step in ``ROUND_READY``.

        Each proposal is checked on its own (request known and unfinished, no other round in flight,
        coordinate digest current, drafts and q rows well formed); a refused proposal becomes an
        ``ABORTED`` result of the step and the others proceed.
        """
        return self._begin_step(proposals)

    def _begin_step(self, proposals: Sequence[RoundProposal | RoundInput]) -> Step:
        """:meth:`begin_step` for proposals or whole round inputs (which carry the same fields)."""
        self.drain()  # a synchronous commit comes after every submitted one
        fsm = self._fsm_pool.pop() if self._fsm_pool else self._new_fsm()
        step = Step(self._settings, fsm, len(proposals))
        for index, proposal in enumerate(proposals):
            try:
                step._rounds.append(self._open_round(index, proposal))
            except SpecroundError as error:
                rid = proposal.request_id
                live = self._live.get(rid) if isinstance(rid, str) else None
                generation = live.current.state.generation if live is not None else -1
                step._results[index] = refused_result(
                    proposal.request_id, proposal.round_id, error, generation
                )
        return step

    def step(self, inputs: Sequence[RoundInput]) -> list[RoundResult]:
        """Run one step end to end: propose, verify, decide, stage, publish. Results in input order."""
        # A RoundInput carries the fields of both halves: no per-round proposal/verification copies.
        with self._begin_step(inputs) as step:  # aborts if anything raises
            step.verify(inputs)
            step.decide()
            step.stage()
            return step.publish()

    def step_batch(
        self,
        request_ids: Sequence[str],
        draft_ids: torch.Tensor,
        draft_lens: torch.Tensor,
        q: torch.Tensor | None,
        p: torch.Tensor,
        *,
        coordinate_digests: Sequence[str] | None = None,
        proposal_draws: Sequence[int] | None = None,
        branches: Sequence[Any] | None = None,
        verify_rows: Sequence[int | None] | None = None,
        round_ids: Sequence[str | None] | None = None,
        timings: Sequence[RoundTimings | None] | None = None,
    ) -> StepResult:
        """Run one step from the engine's own tensors; row ``b`` is a round of ``request_ids[b]``.

        ``draft_ids [B, K]`` (integers; entries beyond ``draft_lens[b]`` are ignored), ``draft_lens [B]``,
        ``q [B, K, V]`` (the processed rows that sampled the drafts; None when K = 0) and ``p [B, K+1, V]``
        (the target's processed rows) may live on any device; they are read as they are, never sliced per
        request. ``coordinate_digests[b]`` binds row ``b`` to the round coordinate its drafts were made for
        (default: the request's current coordinate, for an engine that drafts from the controller's own
        state). The other keyword sequences are per row as in :class:`RoundInput`.

        A malformed batch (ranks, sizes, dtypes, devices) raises a named
        :class:`~specround.errors.InputError` before any state moves; a row that is malformed on its own or
        refused (unknown or finished request, round in flight, stale coordinate) is ``ABORTED`` alone.
        Returns a :class:`StepResult`: batched tensors plus a lazy per-request view.
        """
        self.drain()  # a synchronous commit comes after every submitted one
        step, ids = self._staged_batch(
            request_ids,
            draft_ids,
            draft_lens,
            q,
            p,
            coordinate_digests,
            proposal_draws,
            round_ids,
            timings,
            branches,
            verify_rows,
        )
        with step:  # aborts if anything raises
            return StepResult(ids, step.width, step.publish())

    def submit_batch(
        self,
        request_ids: Sequence[str],
        draft_ids: torch.Tensor,
        draft_lens: torch.Tensor,
        q: torch.Tensor | None,
        p: torch.Tensor,
        *,
        coordinate_digests: Sequence[str] | None = None,
        proposal_draws: Sequence[int] | None = None,
        branches: Sequence[Any] | None = None,
        verify_rows: Sequence[int | None] | None = None,
        round_ids: Sequence[str | None] | None = None,
        timings: Sequence[RoundTimings | None] | None = None,
    ) -> PendingStep:
        """:meth:`step_batch` with the durable write pipelined off the engine's critical path.

        Returns as soon as the sampler has decided and every staged successor validated: the
        :class:`PendingStep` holds each row's decision and K/V instruction (emitted ids, ``keep``, new
        frontier) for the engine's next forward, while the group commit runs on the controller's writer
        thread. Each request moves on to its staged successor at once, so its next round can be submitted
        before this one is durable (coordinates, :meth:`state` and :meth:`processors` answer for the staged
        successor). :meth:`PendingStep.wait` returns the durable :class:`StepResult`; release tokens to
        the caller only then. A write that fails or loses the fence aborts its rounds and every later round
        built on them: their requests roll back to their last durable state, and ``rollback_to`` tells the
        engine where to crop each such request's K/V. At most :data:`MAX_PENDING_STEPS` steps are
        outstanding; a further submit first waits for the oldest.
        """
        self._settle_done()
        while len(self._submitted) >= MAX_PENDING_STEPS:
            self._settle_oldest()
        step, ids = self._staged_batch(
            request_ids,
            draft_ids,
            draft_lens,
            q,
            p,
            coordinate_digests,
            proposal_draws,
            round_ids,
            timings,
            branches,
            verify_rows,
        )
        try:
            submitted = step.submit(self._writer.submit)
            # After the hand-over: a round aborted at F-5 has no decision for the engine to act on.
            pending = PendingStep(self, ids, step.width, step.decisions() if submitted else [None] * len(ids))
        except BaseException:
            step.abort("the step failed before its write was handed over")
            raise
        if submitted:  # the step stays open until its write is settled
            self._submitted.append((step, pending))
        else:
            pending._finish(step.results(), [-1] * len(ids))
        return pending

    def drain(self) -> None:
        """Wait for every submitted step's durable write and settle it (oldest first)."""
        while self._submitted:
            self._settle_oldest()

    def close(self) -> None:
        """:meth:`drain`, then stop the writer thread (the log stays open; close it yourself)."""
        self.drain()
        self._writer.close()

    def _settle_done(self) -> None:
        """Settle the submitted steps whose writes have finished, oldest first, without blocking."""
        while self._submitted and self._submitted[0][0].write_done:
            self._settle_oldest()

    def _settle_oldest(self) -> None:
        step, pending = self._submitted.popleft()
        results = step.settle_submitted()
        rollback = [
            len(self._live[r.request_id].current.state.cache)
            if r.status is RoundStatus.ABORTED and submitted and r.request_id in self._live
            else -1
            for r, submitted in zip(results, pending.submitted, strict=True)
        ]
        pending._finish(results, rollback)

    def _staged_batch(
        self,
        request_ids: Sequence[str],
        draft_ids: torch.Tensor,
        draft_lens: torch.Tensor,
        q: torch.Tensor | None,
        p: torch.Tensor,
        coordinate_digests: Sequence[str] | None,
        proposal_draws: Sequence[int] | None,
        round_ids: Sequence[str | None] | None,
        timings: Sequence[RoundTimings | None] | None,
        branches: Sequence[Any] | None,
        verify_rows: Sequence[int | None] | None,
    ) -> tuple[Step, tuple[str, ...]]:
        """Check a batch, open its rows and stage them (-> ``STAGED``; the step is aborted if this raises).

        A refused row becomes its ``ABORTED`` result; the caller publishes or submits the step.
        """
        rows = check_batch_rows(request_ids, draft_ids, draft_lens, q, p)
        n = rows.size
        for name, values in (
            ("coordinate_digests", coordinate_digests),
            ("proposal_draws", proposal_draws),
            ("round_ids", round_ids),
            ("timings", timings),
            ("branches", branches),
            ("verify_rows", verify_rows),
        ):
            if values is not None and len(values) != n:
                raise ShapeMismatchError(f"{name} has {len(values)} entries for {n} rows")
        fsm = self._fsm_pool.pop() if self._fsm_pool else self._new_fsm()
        step = Step(self._settings, fsm, n, rows)
        shape = (rows.vocab_size, rows.width)  # read once for the whole batch
        for b, request_id in enumerate(request_ids):
            round_id = round_ids[b] if round_ids is not None else None
            try:
                step._rounds.append(
                    self._open_batch_row(
                        b,
                        rows,
                        request_id,
                        coordinate_digests[b] if coordinate_digests is not None else None,
                        proposal_draws[b] if proposal_draws is not None else 0,
                        _BatchRowExtras(round_id, timings[b] if timings is not None else None),
                        shape,
                    )
                )
            except SpecroundError as error:
                live = self._live.get(request_id) if isinstance(request_id, str) else None
                generation = live.current.state.generation if live is not None else -1
                step._results[b] = refused_result(str(request_id), round_id, error, generation)
        try:
            step.verify_batch(branches, verify_rows)
            step.decide()
            step.stage()
        except BaseException:
            step.abort("the step failed before publication")
            raise
        return step, tuple(str(r) for r in request_ids)

    def run_round(self, item: RoundInput) -> RoundResult:
        """One request's round as a step of one; raises the round's error unless it published or acked."""
        [result] = self.step([item])
        return result.raise_for_error()

    # --- internals: requests ----------------------------------------------------------------------------

    def _build_config(
        self,
        prompt_ids: Sequence[int] | torch.Tensor,
        *,
        seed: int,
        max_new_tokens: int,
        vocab_size: int | None,
        processors: ProcessorChain | Sequence[Mapping[str, Any]] | None,
        layout: Layout | str,
        stop_token_ids: Iterable[int],
        stop_sequences: Iterable[Sequence[int]],
        request_id: str | None,
        coordinate: Mapping[str, Any] | None,
        softmax: str | None,
        prompt_advances_processors: bool,
    ) -> RequestConfig:
        prompt = _token_tuple(prompt_ids, "prompt_ids")
        if not prompt:
            raise InvalidRequestError("the prompt must hold at least one token")
        if isinstance(seed, bool) or not isinstance(seed, int) or not _SEED_MIN <= seed < _SEED_END:
            raise InvalidRequestError(f"seed must be an integer in [-2**63, 2**64), got {seed!r}")
        if (
            isinstance(max_new_tokens, bool)
            or not isinstance(max_new_tokens, int)
            or not 1 <= max_new_tokens < INT64_END
        ):
            raise InvalidRequestError(
                f"max_new_tokens must be an integer in [1, 2**63), got {max_new_tokens!r}"
            )
        try:
            layout = Layout(layout)
        except ValueError:
            raise UnknownLayoutError(f"unknown layout {layout!r}; use {[x.value for x in Layout]}") from None
        chain: ProcessorChain
        if isinstance(processors, ProcessorChain):
            if vocab_size is not None and vocab_size != processors.vocab_size:
                raise InvalidRequestError(
                    f"vocab_size {vocab_size} disagrees with the processor chain's {processors.vocab_size}"
                )
            chain = processors.clone()
        else:
            if vocab_size is None:
                raise InvalidRequestError("vocab_size is required unless a ProcessorChain is given")
            chain = ProcessorChain.from_spec(
                processors or (), vocab_size=vocab_size, softmax=softmax or "max_shift"
            )
        if softmax is not None and softmax != chain.softmax.value:
            raise InvalidRequestError(
                f"softmax {softmax!r} disagrees with the chain's {chain.softmax.value!r}"
            )
        try:
            sequences: list[tuple[int, ...]] = [(_integer(t),) for t in stop_token_ids]
            sequences += [tuple(_integer(t) for t in sequence) for sequence in stop_sequences]
        except TypeError as exc:
            raise InvalidRequestError(
                f"stop_token_ids and stop_sequences must hold integers: {exc}"
            ) from None
        if not isinstance(prompt_advances_processors, bool):
            raise InvalidRequestError(
                f"prompt_advances_processors must be a bool, got {prompt_advances_processors!r}"
            )
        spec = list(chain.to_spec())
        if sequences:
            spec.append(
                {"kind": StopSequences.kind, "params": StopSequences(sequences).params(), "state": {}}
            )
        try:
            declared = ProcessorChain.from_spec(spec, vocab_size=chain.vocab_size, softmax=chain.softmax)
            static = static_coordinate(coordinate, chain.vocab_size)
            return RequestConfig(
                request_id=request_id if request_id is not None else uuid.uuid4().hex,
                prompt_ids=prompt,
                seed=seed,
                max_new_tokens=max_new_tokens,
                layout=layout,
                processors=declared.to_spec(),
                vocab_size=chain.vocab_size,
                coordinate=static,
                softmax=chain.softmax.value,
                prompt_advances_processors=prompt_advances_processors,
            )
        except (ValidationError, TypeError, ValueError) as exc:
            if isinstance(exc, InputError):
                raise
            raise InvalidRequestError(f"invalid request: {exc}") from exc

    def _make_live(self, config: RequestConfig, snapshot: RequestSnapshot) -> LiveRequest:
        return LiveRequest(
            config=config,
            current=snapshot,
            target_config_digest=snapshot.chain.config_digest(),
            has_stop_automaton=any(isinstance(p, StopAutomaton) for p in snapshot.chain.processors),
        )

    def _entry(self, request_id: str) -> LiveRequest:
        live = self._live.get(request_id)
        return live if live is not None else self._load(request_id)

    def _load(self, request_id: str) -> LiveRequest:
        """Rebuild a request's live projection from its events and check it against the log's head."""
        with self._writer.exclusive() as log:
            head = log.head(request_id)
            events = list(log.events(request_id))
        if head is None:
            raise InvalidRequestError(f"unknown request {request_id!r}")
        replayed = replay_request(iter(events))
        if (
            replayed.snapshot.digest != head.state_digest
            or replayed.snapshot.state.generation != head.generation
        ):
            state = replayed.snapshot.state
            raise LogIntegrityError(
                f"request {request_id!r}: replay reaches generation {state.generation} with digest "
                f"{replayed.snapshot.digest}; the log's head says {head.generation} / {head.state_digest}"
            )
        live = self._make_live(replayed.config, replayed.snapshot)
        if replayed.previous is not None and replayed.last_round_id is not None:
            assert replayed.last_coordinate_digest is not None
            live.last = LastRound(replayed.previous, replayed.last_coordinate_digest, replayed.last_round_id)
        self._live[request_id] = live
        return live

    def _current_coordinate_digest(self, live: LiveRequest) -> str:
        if live.coordinate_digest is None:
            live.coordinate_digest = coordinate_digest(live.config, live.current, live.target_config_digest)
        return live.coordinate_digest

    # --- internals: rounds ------------------------------------------------------------------------------

    def _new_fsm(self) -> StepFsm:
        return StepFsm(self._dispatch)

    def _release_fsm(self, fsm: StepFsm) -> None:
        fsm.step = None
        fsm.state = RoundPhase.ROUND_READY
        self._fsm_pool.append(fsm)

    def _open_round(self, index: int, proposal: RoundProposal | RoundInput) -> RoundWork:
        request_id = check_identity(proposal)
        live = self._entry(request_id)
        if live.in_flight:
            raise IllegalTransitionError(f"request {request_id!r} already has a round in flight")
        checked = check_proposal(proposal, live.config.vocab_size, live.current.state.rng.proposal)
        offered = checked.coordinate_digest
        live, start, retry = self._bind(request_id, offered)
        return self._opened(
            index,
            live,
            start,
            retry,
            offered,
            checked.draft_ids,
            checked.q_rows,
            checked.proposal_draws,
            checked,
        )

    def _open_batch_row(
        self,
        b: int,
        rows: BatchRows,
        request_id: str,
        offered: str | None,
        draws: object,
        extras: _BatchRowExtras,
        shape: tuple[int, int],
    ) -> RoundWork:
        """Open row ``b`` of a batch step (no tensor is sliced: the round points at its batch row).

        ``shape`` is the batch's ``(rows.vocab_size, rows.width)``, read once per step.
        """
        if offered is None:
            offered = self._current_coordinate_digest(self._entry(request_id))
        live, start, retry = self._bind(request_id, offered)
        vocab = live.config.vocab_size
        rows_vocab, width = shape
        if rows_vocab != vocab:
            raise ShapeMismatchError(
                f"the batch's rows have V = {rows_vocab}; request {request_id!r} has V = {vocab}"
            )
        k = rows.lens[b]
        if not 0 <= k <= width:
            raise ShapeMismatchError(f"draft_lens[{b}] = {k} is outside [0, {width}]")
        return self._opened(b, live, start, retry, offered, rows.drafts[b], _NO_ROWS, draws, extras, b)

    def _bind(self, request_id: str, offered: str) -> tuple[LiveRequest, RequestSnapshot, bool]:
        """The live request, the snapshot a proposal bound to ``offered`` starts from, and whether it retries.

        Refuses an unknown request, one with a round in flight, and a coordinate that is neither the current
        one nor that of the last published round.
        """
        if not isinstance(request_id, str):
            raise InvalidRequestError(f"request ids must be strings, got {type(request_id).__name__}")
        live = self._entry(request_id)
        if live.in_flight:
            raise IllegalTransitionError(f"request {request_id!r} already has a round in flight")
        if offered == self._current_coordinate_digest(live):
            return live, live.current, False
        if live.last is not None and offered == live.last.coordinate_digest:
            return live, live.last.start, True  # a retry of the last published round (e.g. after F-6)
        raise StaleCoordinateError(
            f"request {request_id!r}: the proposal is bound to coordinate {str(offered)[:16]}..., the "
            f"request "
            f"is at generation {live.current.state.generation} with coordinate "
            f"{self._current_coordinate_digest(live)[:16]}..."
        )

    def _opened(
        self,
        index: int,
        live: LiveRequest,
        start: RequestSnapshot,
        retry: bool,
        offered: str,
        draft_ids: tuple[int, ...],
        q_rows: torch.Tensor,
        draws: object,
        extra: CheckedProposal | _BatchRowExtras,
        batch_row: int = -1,
    ) -> RoundWork:
        """Open a bound round after its last checks (the request's round is then in flight)."""
        request_id = live.config.request_id
        state = start.state
        if state.finished:
            raise RequestFinishedError(f"request {request_id!r} finished ({state.finish_reason})")
        vocab = live.config.vocab_size
        for token in draft_ids:
            if not 0 <= token < vocab:
                raise DraftIdOutOfVocabError(f"draft id {token} outside [0, {vocab}) for {request_id!r}")
        if (
            isinstance(draws, bool)
            or not isinstance(draws, int)
            or not 0 <= draws < _COUNTER_END - state.rng.proposal
        ):
            raise InvalidRequestError(
                f"proposal_draws must be an integer in [0, 2**63 - {state.rng.proposal}) (the PROPOSAL "
                f"counter is int64), got {draws!r}"
            )
        round_id = extra.round_id
        if round_id is not None and (
            not isinstance(round_id, str) or not 0 < len(round_id) <= MAX_ROUND_ID_LENGTH
        ):
            raise InvalidRequestError(
                f"round_id of {request_id!r} must be None or a str of 1..{MAX_ROUND_ID_LENGTH} characters, "
                f"got {type(round_id).__name__}"
            )
        if extra.timings is not None and not isinstance(extra.timings, RoundTimings):
            raise InvalidRequestError(
                f"timings of {request_id!r} must be RoundTimings or None, got {type(extra.timings).__name__}"
            )
        if round_id is None:
            round_id = derived_round_id(state.generation, offered, draft_ids)
        else:
            check_round_id(round_id, state.generation, offered, draft_ids)
        live.in_flight = True
        return RoundWork(  # positional, in field order (a dataclass built by keyword costs more)
            index,  # index
            request_id,  # request_id
            live,  # live
            start,  # start
            retry,  # retry
            offered,  # coordinate_digest
            round_id,  # round_id
            draft_ids,  # draft_ids
            q_rows,  # q_rows
            draws,  # proposal_draws
            extra.timings,  # timings
            batch_row,  # batch_row
            False,  # pipelined
            live.epoch,  # epoch
        )


@dataclass(frozen=True, slots=True)
class _BatchRowExtras:
    """The optional per-row fields of a batch step that a :class:`RoundInput` would carry."""

    round_id: str | None
    timings: RoundTimings | None


_NO_ROWS = torch.empty(0, 0)
"""Placeholder rows of a batch step's round (its rows are read from the batch tensors)."""


def _token_tuple(values: Sequence[int] | torch.Tensor, name: str) -> tuple[int, ...]:
    if isinstance(values, torch.Tensor):
        if values.dim() != 1 or values.dtype.is_floating_point or values.dtype == torch.bool:
            raise ShapeMismatchError(
                f"{name} must be a 1-D integer tensor, got {values.dtype} {tuple(values.shape)}"
            )
        return tuple(values.tolist())  # an integer dtype: tolist gives ints
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise InvalidRequestError(f"{name} must be a sequence of integers, got {type(values).__name__}")
    out = []
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidRequestError(f"{name} must hold integers, got {value!r}")
        out.append(value)
    return tuple(out)


def _integer(value: object) -> int:
    """``value`` if it is an ``int`` (not a ``bool``); TypeError naming it otherwise."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{value!r} is not an integer")
    return value
