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
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

import torch
from pydantic import ValidationError

from specround.errors import (
    DraftIdOutOfVocabError,
    DuplicateRoundError,
    EventLogError,
    IllegalTransitionError,
    InjectedFaultError,
    InputError,
    InvalidRequestError,
    LogIntegrityError,
    RequestFinishedError,
    ShapeMismatchError,
    SpecroundError,
    StaleCoordinateError,
    StaleGenerationError,
    UnknownLayoutError,
)
from specround.sampling.coordinate import RoundCoordinate
from specround.sampling.exact import decide
from specround.sampling.processors.base import StopAutomaton
from specround.sampling.processors.chain import ProcessorChain
from specround.sampling.processors.stop import StopSequences
from specround.sampling.types import PAD_ID, Layout, SamplerBatch, SamplerDecision, TerminalKind
from specround.sampling.validation import ValidationMode
from specround.statemachine.binding import coordinate_digest, round_coordinate, static_coordinate
from specround.statemachine.events import (
    RequestOpened,
    RoundDecided,
    RoundPublished,
    RoundReady,
    RoundStaged,
    RoundTimings,
    RoundVerified,
)
from specround.statemachine.faults import FaultPlan, FaultPoint
from specround.statemachine.lifecycle import RoundPhase, Trigger, build_lifecycle_machine, next_phase
from specround.statemachine.ports import EventLog, PublishOutcome, PublishStatus, RoundPublication
from specround.statemachine.records import assemble
from specround.statemachine.replay import replay_request
from specround.statemachine.rounds import (
    KvInstruction,
    RoundInput,
    RoundProposal,
    RoundResult,
    RoundStatus,
    RoundVerification,
)
from specround.statemachine.staging import (
    KvStaging,
    RequestSnapshot,
    open_snapshot,
    stage_kv,
    stage_successor,
)
from specround.statemachine.state import (
    FinishReason,
    RequestConfig,
    RequestState,
    RngCounters,
    SpeculativeCommit,
    TerminalName,
)

__all__ = ["RoundController", "Step"]

_TERMINAL_NAMES: dict[int, TerminalName] = {
    int(TerminalKind.CORRECTION): "correction",
    int(TerminalKind.BONUS): "bonus",
    int(TerminalKind.STOP): "stop",
}
_SEED_MIN, _SEED_END = -(2**63), 2**64


def _signed64(value: int) -> int:
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= (1 << 63) else value


def _finite_or_none(value: float) -> float | None:
    return None if value != value else value  # NaN -> None (canonical JSON refuses NaN)


@dataclass(slots=True)
class _LastRound:
    """The most recently published round of a request (what a retry of it needs)."""

    start: RequestSnapshot
    coordinate_digest: str
    round_id: str


@dataclass(slots=True)
class _Live:
    """The live projection of one request."""

    config: RequestConfig
    current: RequestSnapshot
    target_config_digest: str
    has_stop_automaton: bool
    last: _LastRound | None = None
    coordinate_digest: str | None = None
    """Cached digest of ``current``'s coordinate (reset whenever ``current`` changes)."""
    in_flight: bool = False


@dataclass(slots=True)
class _Round:
    """The working record of one round inside a step (mutable; never leaves the controller)."""

    index: int
    request_id: str
    live: _Live
    start: RequestSnapshot
    retry: bool
    coordinate_digest: str
    round_id: str
    draft_ids: tuple[int, ...]
    q_rows: torch.Tensor  # [k, V]
    proposal_draws: int
    timings: RoundTimings | None
    phase: RoundPhase = RoundPhase.ROUND_READY
    error: SpecroundError | None = None
    p_rows: torch.Tensor | None = None  # [k+1, V]
    branch: Any = None
    verify_rows: int = 0
    decided: RoundDecided | None = None
    p_draft: tuple[float, ...] = ()
    q_draft: tuple[float, ...] = ()
    kv: KvStaging | None = None
    successor: RequestSnapshot | None = None
    commit: SpeculativeCommit | None = None
    publication: RoundPublication | None = None
    result: RoundResult | None = None

    @property
    def generation(self) -> int:
        """The generation this round would publish."""
        return self.start.state.generation + 1


class _StepFsm:
    """The model the lifecycle machine drives for one step (pooled and reused across steps)."""

    state: RoundPhase
    step: Step | None = None

    if TYPE_CHECKING:

        def trigger(self, name: str) -> bool:
            """Fire a lifecycle trigger (bound by ``Machine.add_model``)."""
            ...

    def write_publication(self) -> None:
        """``before`` callback of ``publish``: the durable group commit (never in ``on_enter``)."""
        assert self.step is not None
        self.step._write_publication()


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
        self._live: dict[str, _Live] = {}
        self._machine = build_lifecycle_machine()
        self._fsm_pool: list[_StepFsm] = []

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
        fsm = self._fsm_pool.pop() if self._fsm_pool else self._new_fsm()
        step = Step(self, fsm, len(proposals))
        for index, proposal in enumerate(proposals):
            try:
                step._rounds.append(self._open_round(index, proposal))
            except SpecroundError as error:
                step._results[index] = _refused_result(proposal, error)
        return step

    def step(self, inputs: Sequence[RoundInput]) -> list[RoundResult]:
        """Run one step end to end: propose, verify, decide, stage, publish. Results in input order."""
        with self.begin_step([item.proposal() for item in inputs]) as step:  # aborts if anything raises
            step.verify([item.verification() for item in inputs])
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
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise InvalidRequestError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
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
        sequences = [(int(t),) for t in stop_token_ids] + [tuple(int(t) for t in s) for s in stop_sequences]
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

    def _make_live(self, config: RequestConfig, snapshot: RequestSnapshot) -> _Live:
        return _Live(
            config=config,
            current=snapshot,
            target_config_digest=snapshot.chain.config_digest(),
            has_stop_automaton=any(isinstance(p, StopAutomaton) for p in snapshot.chain.processors),
        )

    def _entry(self, request_id: str) -> _Live:
        live = self._live.get(request_id)
        return live if live is not None else self._load(request_id)

    def _load(self, request_id: str) -> _Live:
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
            live.last = _LastRound(replayed.previous, replayed.last_coordinate_digest, replayed.last_round_id)
        self._live[request_id] = live
        return live

    def _current_coordinate_digest(self, live: _Live) -> str:
        if live.coordinate_digest is None:
            live.coordinate_digest = coordinate_digest(live.config, live.current, live.target_config_digest)
        return live.coordinate_digest

    # --- internals: rounds ------------------------------------------------------------------------------

    def _new_fsm(self) -> _StepFsm:
        fsm = _StepFsm()
        self._machine.add_model(fsm, initial=RoundPhase.ROUND_READY)
        return fsm

    def _release_fsm(self, fsm: _StepFsm) -> None:
        fsm.step = None
        self._machine.set_state(RoundPhase.ROUND_READY, model=fsm)
        self._fsm_pool.append(fsm)

    def _open_round(self, index: int, proposal: RoundProposal) -> _Round:
        request_id = proposal.request_id
        live = self._entry(request_id)
        if live.in_flight:
            raise IllegalTransitionError(f"request {request_id!r} already has a round in flight")
        offered = proposal.coordinate_digest
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
        vocab = live.config.vocab_size
        draft_ids = _token_tuple(proposal.draft_ids, "draft_ids")
        for token in draft_ids:
            if not 0 <= token < vocab:
                raise DraftIdOutOfVocabError(f"draft id {token} outside [0, {vocab}) for {request_id!r}")
        k = len(draft_ids)
        q_rows = proposal.q_rows
        if q_rows is None:
            if k:
                raise ShapeMismatchError(f"{k} drafts need q rows [{k}, {vocab}]")
            q_rows = torch.empty(0, vocab, dtype=torch.float64)
        if q_rows.dim() != 2 or tuple(q_rows.shape) != (k, vocab) or not q_rows.dtype.is_floating_point:
            raise ShapeMismatchError(
                f"q rows of {request_id!r} must be float [{k}, {vocab}], "
                f"got {q_rows.dtype} {tuple(q_rows.shape)}"
            )
        draws = proposal.proposal_draws
        if isinstance(draws, bool) or not isinstance(draws, int) or draws < 0:
            raise InvalidRequestError(f"proposal_draws must be a non-negative integer, got {draws!r}")
        round_id = proposal.round_id or _derived_round_id(state.generation, offered, draft_ids)
        live.in_flight = True
        return _Round(
            index=index,
            request_id=request_id,
            live=live,
            start=start,
            retry=retry,
            coordinate_digest=offered,
            round_id=round_id,
            draft_ids=draft_ids,
            q_rows=q_rows,
            proposal_draws=draws,
            timings=proposal.timings,
        )

    def _fault(self, point: FaultPoint, rnd: _Round) -> None:
        faults = self._faults
        if faults is not None and point in faults.points:
            faults.check(point, rnd.request_id, rnd.generation)


def _token_tuple(values: Sequence[int] | torch.Tensor, name: str) -> tuple[int, ...]:
    if isinstance(values, torch.Tensor):
        if values.dim() != 1 or values.dtype.is_floating_point or values.dtype == torch.bool:
            raise ShapeMismatchError(
                f"{name} must be a 1-D integer tensor, got {values.dtype} {tuple(values.shape)}"
            )
        return tuple(int(v) for v in values.tolist())
    out = []
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidRequestError(f"{name} must hold integers, got {value!r}")
        out.append(value)
    return tuple(out)


def _derived_round_id(generation: int, coordinate: str, draft_ids: tuple[int, ...]) -> str:
    """``g<published generation>-<16 hex>``: the same coordinate and drafts name the same round."""
    h = hashlib.sha256(coordinate.encode("ascii"))
    h.update(b"|")
    h.update(",".join(map(str, draft_ids)).encode("ascii"))
    return f"g{generation + 1}-{h.hexdigest()[:16]}"


def _refused_result(proposal: RoundProposal, error: SpecroundError) -> RoundResult:
    return RoundResult(
        request_id=proposal.request_id,
        round_id=proposal.round_id,
        status=RoundStatus.ABORTED,
        phase=RoundPhase.ABORTED,
        generation=-1,
        state=None,
        error=error,
    )


class Step:
    """The rounds of one engine iteration, driven through the lifecycle together.

    Obtain one from :meth:`RoundController.begin_step`; call :meth:`verify`, :meth:`decide`, :meth:`stage`
    and :meth:`publish` in order (or :meth:`abort` at any point before publication). Usable as a context
    manager that aborts whatever is unfinished on exit.
    """

    def __init__(self, controller: RoundController, fsm: _StepFsm, size: int) -> None:
        self._controller = controller
        self._fsm = fsm
        fsm.step = self
        self._rounds: list[_Round] = []
        self._results: list[RoundResult | None] = [None] * size
        """Results in proposal order: refused proposals at once, the other rounds when the step closes."""
        self._outcomes: list[PublishOutcome] | None = None
        self._closed = False
        self._final_phase = RoundPhase.ROUND_READY

    @property
    def phase(self) -> RoundPhase:
        """The step's lifecycle phase (rounds that failed on their own are ``ABORTED`` regardless)."""
        return self._fsm.state if not self._closed else self._final_phase

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

    def verify(self, verifications: Iterable[RoundVerification]) -> None:
        """Hand in each round's p rows [k+1, V] and branch handle (-> ``VERIFIED_TEMPORARY``); F-1."""
        self._require(Trigger.VERIFY)
        by_request: dict[str, RoundVerification] = {}
        for item in verifications:
            by_request.setdefault(item.request_id, item)
        for rnd in self._live_rounds():
            try:
                found = by_request.get(rnd.request_id)
                if found is None:
                    raise InvalidRequestError(f"no verification for request {rnd.request_id!r}")
                self._attach_verification(rnd, found)
                self._controller._fault(FaultPoint.AFTER_VERIFICATION, rnd)
            except SpecroundError as error:
                self._abort_round(rnd, error)
                continue
            rnd.phase = next_phase(rnd.phase, Trigger.VERIFY)
        self._fire(Trigger.VERIFY)

    def decide(self) -> None:
        """One batched exact decision for every live round (-> ``DECIDED``); F-2."""
        self._require(Trigger.DECIDE)
        rounds = self._live_rounds()
        groups: dict[tuple[int, torch.dtype, torch.device], list[_Round]] = {}
        for rnd in rounds:
            assert rnd.p_rows is not None
            groups.setdefault((rnd.p_rows.shape[-1], rnd.p_rows.dtype, rnd.p_rows.device), []).append(rnd)
        for group in groups.values():
            self._decide_group(group)
        for rnd in self._live_rounds():
            try:
                self._controller._fault(FaultPoint.AFTER_DECISION, rnd)
            except SpecroundError as error:
                self._abort_round(rnd, error)
                continue
            rnd.phase = next_phase(rnd.phase, Trigger.DECIDE)
        self._fire(Trigger.DECIDE)

    def stage(self) -> None:
        """Stage every live round's successor off to the side and validate it (-> ``STAGED``); F-3, F-4."""
        self._require(Trigger.STAGE)
        for rnd in self._live_rounds():
            try:
                self._stage_round(rnd)
            except SpecroundError as error:
                self._abort_round(rnd, error)
                continue
            rnd.phase = next_phase(rnd.phase, Trigger.STAGE)
        self._fire(Trigger.STAGE)

    def publish(self) -> list[RoundResult]:
        """F-5, then ONE group-committed publish under each request's generation fence; F-6. Returns results.

        A log failure (e.g. :class:`~specround.errors.LogUnavailableError`) aborts every round of the step:
        the log's contract is that a failed transaction appended nothing.
        """
        self._require(Trigger.PUBLISH)
        for rnd in self._live_rounds():
            try:
                self._controller._fault(FaultPoint.BEFORE_PUBLICATION, rnd)
            except SpecroundError as error:
                self._abort_round(rnd, error)
        if not self._live_rounds():
            self._fire(Trigger.ABORT)
            return self._close(RoundPhase.ABORTED)
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
        error = reason if isinstance(reason, SpecroundError) else IllegalTransitionError(str(reason))
        for rnd in self._live_rounds():
            if rnd.phase is RoundPhase.PUBLISHED:  # already durable: only the acknowledgement is lost
                rnd.live.in_flight = False
                rnd.result = RoundResult(
                    request_id=rnd.request_id,
                    round_id=rnd.round_id,
                    status=RoundStatus.UNACKNOWLEDGED,
                    phase=RoundPhase.PUBLISHED,
                    generation=rnd.generation,
                    state=None,
                    error=error,
                )
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
        self._fsm.trigger(trigger)  # bound by ``Machine.add_model``

    def _live_rounds(self) -> list[_Round]:
        return [r for r in self._rounds if r.phase is not RoundPhase.ABORTED and r.result is None]

    def _abort_round(self, rnd: _Round, error: SpecroundError) -> None:
        rnd.phase = next_phase(rnd.phase, Trigger.ABORT)
        rnd.error = error
        rnd.live.in_flight = False
        state = rnd.live.current.state
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
        self._controller._release_fsm(self._fsm)
        return self.results()

    def _attach_verification(self, rnd: _Round, verification: RoundVerification) -> None:
        p_rows = verification.p_rows
        k, vocab = len(rnd.draft_ids), rnd.live.config.vocab_size
        if not isinstance(p_rows, torch.Tensor) or p_rows.dim() != 2 or tuple(p_rows.shape) != (k + 1, vocab):
            shape = tuple(p_rows.shape) if isinstance(p_rows, torch.Tensor) else type(p_rows).__name__
            raise ShapeMismatchError(f"p rows of {rnd.request_id!r} must be [{k + 1}, {vocab}], got {shape}")
        if not p_rows.dtype.is_floating_point:
            raise ShapeMismatchError(
                f"p rows of {rnd.request_id!r} must be floating point, got {p_rows.dtype}"
            )
        q_rows = rnd.q_rows
        if k and (q_rows.dtype != p_rows.dtype or q_rows.device != p_rows.device):
            raise ShapeMismatchError(
                f"q rows ({q_rows.dtype}, {q_rows.device}) and p rows ({p_rows.dtype}, {p_rows.device}) of "
                f"{rnd.request_id!r} must share dtype and device"
            )
        if not k:
            rnd.q_rows = q_rows.to(dtype=p_rows.dtype, device=p_rows.device)
        default_rows = k + 1 if rnd.live.config.layout is Layout.REPLAY_FRONTIER else k
        rows = verification.verify_rows if verification.verify_rows is not None else default_rows
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
            raise InvalidRequestError(f"verify_rows must be a non-negative integer, got {rows!r}")
        rnd.p_rows, rnd.branch, rnd.verify_rows = p_rows, verification.branch, rows

    def _decide_group(self, group: list[_Round]) -> None:
        """Decide one group of rounds sharing V, dtype and device; isolate bad input to its own round."""
        validate = self._controller._validate
        batch = _batch(group)
        try:
            decision = decide(batch, validate=validate)
        except InputError:
            survivors: list[_Round] = []
            for rnd in group:
                try:
                    decide(_batch([rnd]), validate=validate)
                except InputError as error:
                    self._abort_round(rnd, error)
                    continue
                survivors.append(rnd)
            if not survivors:
                return
            group = survivors
            batch = _batch(group)
            decision = decide(batch, validate=validate)
        _record_decisions(group, batch, decision)

    def _stage_round(self, rnd: _Round) -> None:
        decided = rnd.decided
        assert decided is not None
        start = rnd.start
        s0 = start.state
        controller = self._controller
        # K/V rows: commit [F_0] + accepted drafts before the final token, discard the rest (INV-5).
        kv = stage_kv(s0, rnd.draft_ids, decided.emitted_ids)
        rnd.kv = kv
        controller._fault(FaultPoint.AFTER_KV_STAGING, rnd)
        # Output, processors (INV-4), RNG counters (INV-3), generation; validated by token identity (INV-1).
        before = s0.rng
        rng_after = assemble(
            RngCounters,
            dict(
                proposal=before.proposal + rnd.proposal_draws,
                accept=before.accept + decided.accept_draws,
                terminal=before.terminal + decided.terminal_draws,
            ),
        )
        successor = stage_successor(
            start,
            decided.emitted_ids,
            kv.committed_token_ids,
            rng_after,
            finished=decided.finished,
            finish_reason=decided.finish_reason,
        )
        rnd.successor = successor
        controller._fault(FaultPoint.AFTER_OUTPUT_STAGING, rnd)
        config = rnd.live.config
        commit = assemble(
            SpeculativeCommit,
            dict(
                request_id=rnd.request_id,
                round_id=rnd.round_id,
                expected_generation=s0.generation,
                layout=config.layout,
                accepted_draft_count=decided.accepted,
                terminal_kind=decided.terminal,
                emitted_token_ids=decided.emitted_ids,
                committed_kv_token_ids=kv.committed_token_ids,
                discarded_kv_token_ids=kv.discarded_token_ids,
                rng_before=before.as_tuple(),
                rng_after=rng_after.as_tuple(),
                processor_before_hash=s0.processors_digest,
                processor_after_hash=successor.state.processors_digest,
                finished=decided.finished,
                finish_reason=decided.finish_reason,
                coordinate_digest=rnd.coordinate_digest,
                successor_digest=successor.digest,
            ),
        )
        commit_digest = commit.digest()
        rnd.commit = commit
        request_id, round_id = rnd.request_id, rnd.round_id
        q_digest = p_digest = None
        if controller._row_digests:
            q_digest, p_digest = _rows_digest(rnd.q_rows), _rows_digest(rnd.p_rows)
        rnd.publication = RoundPublication(
            request_id=rnd.request_id,
            round_id=rnd.round_id,
            expected_generation=s0.generation,
            commit_digest=commit_digest,
            successor_digest=successor.digest,
            finished=decided.finished,
            ready=assemble(
                RoundReady,
                dict(
                    request_id=request_id,
                    round_id=round_id,
                    expected_generation=s0.generation,
                    coordinate_digest=rnd.coordinate_digest,
                    draft_ids=rnd.draft_ids,
                    q_draft=rnd.q_draft,
                    proposal_before=before.proposal,
                    proposal_after=rng_after.proposal,
                    q_rows_digest=q_digest,
                ),
            ),
            verified=assemble(
                RoundVerified,
                dict(
                    request_id=request_id,
                    round_id=round_id,
                    p_draft=rnd.p_draft,
                    verify_rows=rnd.verify_rows,
                    p_rows_digest=p_digest,
                ),
            ),
            decided=decided,
            staged=assemble(
                RoundStaged,
                dict(
                    request_id=request_id,
                    round_id=round_id,
                    committed_kv_ids=kv.committed_token_ids,
                    discarded_kv_ids=kv.discarded_token_ids,
                    processor_before=s0.processors_digest,
                    processor_after=successor.state.processors_digest,
                    rng_before=before.as_tuple(),
                    rng_after=rng_after.as_tuple(),
                    successor_digest=successor.digest,
                ),
            ),
            published=assemble(
                RoundPublished,
                dict(
                    request_id=request_id,
                    round_id=round_id,
                    generation=s0.generation + 1,
                    commit_digest=commit_digest,
                    timings=rnd.timings,
                ),
            ),
        )

    def _write_publication(self) -> None:
        """The group commit (called by the machine's ``before`` callback of ``publish``)."""
        publications = []
        for rnd in self._live_rounds():
            assert rnd.publication is not None
            publications.append(rnd.publication)
        self._outcomes = self._controller._log.publish(publications)

    def _settle(self, rnd: _Round, status: PublishStatus, generation: int) -> None:
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
        if successor.state.generation > live.current.state.generation:  # published now or before
            live.last = _LastRound(rnd.start, rnd.coordinate_digest, rnd.round_id)
            live.current = successor
            live.coordinate_digest = None
        try:
            self._controller._fault(FaultPoint.AFTER_PUBLICATION, rnd)
        except InjectedFaultError as error:
            rnd.error = error
            rnd.result = RoundResult(
                request_id=rnd.request_id,
                round_id=rnd.round_id,
                status=RoundStatus.UNACKNOWLEDGED,
                phase=RoundPhase.PUBLISHED,
                generation=successor.state.generation,
                state=None,
                error=error,
            )
            return
        rnd.result = self._published_result(
            rnd, RoundStatus.PUBLISHED if status is PublishStatus.PUBLISHED else RoundStatus.ACKNOWLEDGED
        )

    def _published_result(self, rnd: _Round, status: RoundStatus) -> RoundResult:
        decided, kv, successor = rnd.decided, rnd.kv, rnd.successor
        assert decided is not None and kv is not None and successor is not None
        state = successor.state
        layout = rnd.live.config.layout
        return RoundResult(
            request_id=rnd.request_id,
            round_id=rnd.round_id,
            status=status,
            phase=RoundPhase.PUBLISHED,
            generation=state.generation,
            state=state,
            emitted_ids=decided.emitted_ids,
            accepted=decided.accepted,
            terminal=decided.terminal,
            finished=decided.finished,
            finish_reason=decided.finish_reason,
            kv=KvInstruction(
                layout=layout,
                branch=rnd.branch,
                keep=kv.keep,
                committed_token_ids=kv.committed_token_ids,
                discarded_rows=kv.discarded_rows,
                discarded_token_ids=kv.discarded_token_ids,
                new_frontier=state.frontier,
                new_frontier_position=state.position,
                materialize_frontier=layout is Layout.RETAINED_FRONTIER and not state.finished,
            ),
            commit=rnd.commit,
        )


# --- batch assembly and decision extraction ------------------------------------------------------------


def _batch(group: Sequence[_Round]) -> SamplerBatch:
    """Pad a group's rows into one :class:`SamplerBatch` (rows never read are uniform, hence valid)."""
    first = group[0]
    assert first.p_rows is not None
    vocab, dtype, device = first.p_rows.shape[-1], first.p_rows.dtype, first.p_rows.device
    lens = [len(r.draft_ids) for r in group]
    k_max = max(lens)
    n = len(group)
    if all(k == k_max for k in lens):
        p = torch.stack([r.p_rows for r in group if r.p_rows is not None])  # [B, K+1, V]
        q = torch.stack([r.q_rows for r in group])  # [B, K, V]
    else:
        p = torch.full((n, k_max + 1, vocab), 1.0 / vocab, dtype=dtype, device=device)  # [B, K+1, V]
        q = torch.full((n, k_max, vocab), 1.0 / vocab, dtype=dtype, device=device)  # [B, K, V]
        for b, rnd in enumerate(group):
            assert rnd.p_rows is not None
            k = lens[b]
            p[b, : k + 1] = rnd.p_rows
            if k:
                q[b, :k] = rnd.q_rows
    draft_ids = [list(r.draft_ids) + [PAD_ID] * (k_max - len(r.draft_ids)) for r in group]
    stop_rows: list[list[list[int]]] = []
    width = 1
    for rnd in group:
        if rnd.live.has_stop_automaton:
            sets = [sorted(s) for s in rnd.start.chain.stop_sets_along(rnd.draft_ids)]
        else:
            sets = [[] for _ in range(len(rnd.draft_ids) + 1)]
        sets += [[] for _ in range(k_max + 1 - len(sets))]
        width = max(width, *(len(s) for s in sets))
        stop_rows.append(sets)
    stop_ids = [[s + [PAD_ID] * (width - len(s)) for s in sets] for sets in stop_rows]
    states = [r.start.state for r in group]
    configs = [r.live.config for r in group]

    def ints(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64, device=device)

    return SamplerBatch(
        p=p,
        q=q,
        draft_ids=torch.tensor(draft_ids, dtype=torch.int64, device=device).reshape(n, k_max),  # [B, K]
        draft_lens=ints(lens),  # [B]
        stop_ids=torch.tensor(stop_ids, dtype=torch.int64, device=device),  # [B, K+1, S]
        remaining=ints(
            [c.max_new_tokens - (len(s.output) - s.prompt_len) for c, s in zip(configs, states, strict=True)]
        ),
        seeds=ints([_signed64(c.seed) for c in configs]),
        accept_counters=ints([s.rng.accept for s in states]),
        terminal_counters=ints([s.rng.terminal for s in states]),
    )


def _record_decisions(group: Sequence[_Round], batch: SamplerBatch, decision: SamplerDecision) -> None:
    """Turn one batched decision into each round's ``round_decided`` event (plain Python values)."""
    output_ids = decision.output_ids.tolist()
    emitted = decision.emitted.tolist()
    accepted = decision.accepted.tolist()
    terminal = decision.terminal.tolist()
    finished = decision.finished.tolist()
    by_token = decision.stopped_by_token.tolist()
    accept_draws = decision.accept_draws.tolist()
    terminal_draws = decision.terminal_draws.tolist()
    p_draft = decision.p_draft.tolist()
    q_draft = decision.q_draft.tolist()
    accept_uniforms = decision.accept_uniforms.tolist()
    terminal_uniform = decision.terminal_uniform.tolist()
    terminal_row = decision.terminal_row.tolist()
    residual_mass = decision.residual_mass.tolist()
    mass_before = decision.terminal_mass_before.tolist()
    token_mass = decision.terminal_token_mass.tolist()
    degenerate = decision.degenerate_correction.tolist()
    terminal_p, terminal_q = _terminal_probabilities(batch, decision)
    for b, rnd in enumerate(group):
        k = len(rnd.draft_ids)
        n_emitted = emitted[b]
        kind = _TERMINAL_NAMES[terminal[b]]
        done = bool(finished[b])
        reason: FinishReason | None = ("stop" if by_token[b] else "length") if done else None
        draws = accept_draws[b]
        has_terminal = terminal_draws[b] == 1
        rnd.p_draft = tuple(p_draft[b][:k])
        rnd.q_draft = tuple(q_draft[b][:k])
        state = rnd.start.state
        rnd.decided = assemble(
            RoundDecided,
            dict(
                request_id=rnd.request_id,
                round_id=rnd.round_id,
                accepted=accepted[b],
                terminal=kind,
                emitted_ids=tuple(output_ids[b][:n_emitted]),
                accept_counter=state.rng.accept,
                accept_draws=draws,
                accept_uniforms=tuple(accept_uniforms[b][:draws]),
                terminal_counter=state.rng.terminal,
                terminal_draws=terminal_draws[b],
                terminal_uniform=terminal_uniform[b] if has_terminal else None,
                terminal_row=terminal_row[b] if has_terminal else None,
                residual_mass=_finite_or_none(residual_mass[b]) if has_terminal else None,
                terminal_mass_before=_finite_or_none(mass_before[b]) if has_terminal else None,
                terminal_token_mass=_finite_or_none(token_mass[b]) if has_terminal else None,
                terminal_p=terminal_p[b] if has_terminal else None,
                terminal_q=terminal_q[b] if has_terminal else None,
                degenerate_correction=bool(degenerate[b]),
                finished=done,
                finish_reason=reason,
            ),
        )


def _terminal_probabilities(
    batch: SamplerBatch, decision: SamplerDecision
) -> tuple[list[float], list[float]]:
    """P of each terminal token in its row, and q in the rejected position's row (0 for a bonus or stop)."""
    n, k_max = batch.draft_ids.shape
    index = torch.arange(n, device=batch.p.device)  # [B]
    counts = decision.emitted.clamp_min(1)  # [B]
    last = decision.output_ids.gather(1, (counts - 1)[:, None]).squeeze(1).clamp_min(0)  # [B]
    rows = decision.terminal_row.clamp_min(0)  # [B]
    p_t = batch.p[index, rows, last].to(torch.float64)  # [B]
    if k_max == 0:
        return p_t.tolist(), [0.0] * n
    q_t = batch.q[index, rows.clamp_max(k_max - 1), last].to(torch.float64)  # [B]
    q_t = torch.where(decision.terminal == int(TerminalKind.CORRECTION), q_t, 0.0)
    return p_t.tolist(), q_t.tolist()


def _rows_digest(rows: torch.Tensor | None) -> str | None:
    if rows is None:
        return None
    data = rows.detach().to("cpu").contiguous()
    h = hashlib.sha256(f"{data.dtype}|{tuple(data.shape)}|".encode("ascii"))
    h.update(data.numpy().tobytes())
    return h.hexdigest()
