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

import hashlib
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from pydantic import ValidationError

from specround.errors import (
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
from specround.sampling.processors.base import StopAutomaton
from specround.sampling.processors.chain import ProcessorChain
from specround.sampling.processors.stop import StopSequences
from specround.sampling.types import Layout
from specround.sampling.validation import ValidationMode
from specround.statemachine.binding import coordinate_digest, round_coordinate, static_coordinate
from specround.statemachine.events import (
    RequestOpened,
)
from specround.statemachine.faults import FaultPlan
from specround.statemachine.lifecycle import RoundPhase, build_lifecycle_machine
from specround.statemachine.ports import EventLog
from specround.statemachine.replay import replay_request
from specround.statemachine.rounds import (
    RoundInput,
    RoundProposal,
    RoundResult,
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
from specround.statemachine.step_inputs import INT64_END, check_identity, check_proposal
from specround.statemachine.work import LastRound, LiveRequest, RoundWork

__all__ = ["RoundController", "Step"]

_SEED_MIN, _SEED_END = -(2**63), 2**64


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
        self._fsm_pool: list[StepFsm] = []
        self._settings = StepSettings(
            log=log, faults=faults, validate=validate, row_digests=row_digests, release=self._release_fsm
        )

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
        if live is None and self._log.head(request_id) is not None:
            live = self._load(request_id)  # known to the log: continue from its published state
        if live is not None:
            if live.config != config:
                raise InvalidRequestError(
                    f"request {request_id!r} is already open with another configuration"
                )
            return live.current.state
        snapshot = open_snapshot(config)
        event = RequestOpened(request_id=request_id, config=config, initial_state_digest=snapshot.digest)
        self._log.open_request(event, snapshot.digest)
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
        """The round coordinate of the request's published state (0x01A)."""
        live = self._entry(request_id)
        return round_coordinate(live.config, live.current, live.target_config_digest)

    def coordinate_digest(self, request_id: str) -> str:
        """Digest of the current round coordinate; a proposal must carry it (else StaleCoordinateError)."""
        return self._current_coordinate_digest(self._entry(request_id))

    def remaining(self, request_id: str) -> int:
        """Output tokens the request may still emit (0 once finished)."""
        live = self._entry(request_id)
        state = live.current.state
        return 0 if state.finished else live.config.max_new_tokens - len(state.generated)

    def refresh(self, request_id: str) -> RequestState:
        """Drop the in-memory projection of a request and rebuild it from the log (after losing a race)."""
        if self._live.get(request_id) is not None and self._live[request_id].in_flight:
            raise IllegalTransitionError(f"request {request_id!r} has a round in flight")
        self._live.pop(request_id, None)
        return self._entry(request_id).current.state

    def load_all(self) -> dict[str, RequestState]:
        """Rebuild every request of the log that is not live yet; returns every live state."""
        for request_id in self._log.request_ids():
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
        fsm = self._fsm_pool.pop() if self._fsm_pool else self._new_fsm()
        step = Step(self._settings, fsm, len(proposals))
        for index, proposal in enumerate(proposals):
            try:
                step._rounds.append(self._open_round(index, proposal))
            except SpecroundError as error:
                rid = proposal.request_id
                live = self._live.get(rid) if isinstance(rid, str) else None
                generation = live.current.state.generation if live is not None else -1
                step._results[index] = refused_result(proposal, error, generation)
        return step

    def step(self, inputs: Sequence[RoundInput]) -> list[RoundResult]:
        """Run one step end to end: propose, verify, decide, stage, publish. Results in input order."""
        # A RoundInput carries the fields of both halves: no per-round proposal/verification copies.
        with self._begin_step(inputs) as step:  # aborts if anything raises
            step.verify(inputs)
            step.decide()
            step.stage()
            return step.publish()

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
        head = self._log.head(request_id)
        if head is None:
            raise InvalidRequestError(f"unknown request {request_id!r}")
        replayed = replay_request(self._log.events(request_id))
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
        fsm = StepFsm()
        self._machine.add_model(fsm, initial=RoundPhase.ROUND_READY)
        return fsm

    def _release_fsm(self, fsm: StepFsm) -> None:
        fsm.step = None
        self._machine.set_state(RoundPhase.ROUND_READY, model=fsm)
        self._fsm_pool.append(fsm)

    def _open_round(self, index: int, proposal: RoundProposal | RoundInput) -> RoundWork:
        request_id = check_identity(proposal)
        live = self._entry(request_id)
        if live.in_flight:
            raise IllegalTransitionError(f"request {request_id!r} already has a round in flight")
        checked = check_proposal(proposal, live.config.vocab_size, live.current.state.rng.proposal)
        offered = checked.coordinate_digest
        retry = False
        if offered == self._current_coordinate_digest(live):
            start = live.current
        elif live.last is not None and offered == live.last.coordinate_digest:
            start, retry = live.last.start, True  # a retry of the last published round (e.g. after F-6)
        else:
            raise StaleCoordinateError(
                f"request {request_id!r}: the proposal is bound to coordinate {offered[:16]}..., the request "
                f"is at generation {live.current.state.generation} with coordinate "
                f"{self._current_coordinate_digest(live)[:16]}..."
            )
        state = start.state
        if state.finished:
            raise RequestFinishedError(f"request {request_id!r} finished ({state.finish_reason})")
        draft_ids = checked.draft_ids
        round_id = checked.round_id or _derived_round_id(state.generation, offered, draft_ids)
        live.in_flight = True
        return RoundWork(
            index=index,
            request_id=request_id,
            live=live,
            start=start,
            retry=retry,
            coordinate_digest=offered,
            round_id=round_id,
            draft_ids=draft_ids,
            q_rows=checked.q_rows,
            proposal_draws=checked.proposal_draws,
            timings=checked.timings,
        )


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


def _derived_round_id(generation: int, coordinate: str, draft_ids: tuple[int, ...]) -> str:
    """``g<published generation>-<16 hex>``: the same coordinate and drafts name the same round."""
    h = hashlib.sha256(coordinate.encode("ascii"))
    h.update(b"|")
    h.update(",".join(map(str, draft_ids)).encode("ascii"))
    return f"g{generation + 1}-{h.hexdigest()[:16]}"
