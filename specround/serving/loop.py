"""The serving loop: a batch of requests driven through rounds by a target, a proposer and the controller.

One :meth:`ServingLoop.step` runs one round of every unfinished request:

1. **K.** The draft-length policy picks each request's K (:mod:`specround.serving.policy`), capped by its
   remaining budget (a round emits at most ``A + 1`` tokens, so ``K <= remaining - 1``).
2. **Frontier** (``retained_frontier`` only). One packed call computes and retains the K/V row and ``p_1``
   logits of every frontier that has none yet (:meth:`TargetModel.materialize_frontier`).
3. **Draft.** One proposer call for the requests with ``K > 0``; each gets a clone of its published
   processor chain, its seed and its next PROPOSAL counter. The policy then decides how many of the
   offered drafts to verify (:meth:`DraftLengthPolicy.trim`; a lookup proposer may offer fewer than asked).
4. **Verify.** ONE packed target call over every request's branch ``[F, d_1..d_K]``.
5. **p rows.** Each request's raw logits are processed by its own chain at their logical prefixes
   (:meth:`ProcessorChain.rows_along`): row i at the state advanced over ``d_1..d_i``
   (contract#processed-rows).
6. **Decide and publish.** One controller step: lifecycle, one batched exact decision, staging, one
   group-committed publication under each request's generation fence.
7. **K/V.** The controller's instruction is executed: a published round commits the first ``keep`` logical
   rows of its branch and drops the rest (INV-5); an aborted round drops the branch; the proposer hears of
   every publication (:meth:`Proposer.on_published`) so a draft model rolls its own cache back.

**Time ledger (contract#time-ledger).** Every published event carries
:class:`~specround.statemachine.events.RoundTimings`. A step's wall time is split among its rounds: proposer
time by the drafts each request asked for, target time by the rows each request's branch computed, the p-row
work as measured per request, the gap since the previous step (the caller's streaming callback, admission of
new requests) evenly. A publication cannot carry the duration of its own publish, so a round's ``state_s``
holds its p-row work plus the *closing* work of the request's previous round (its share of the controller
step, its K/V execution and the proposer notification). Summed over a request's rounds the ledger therefore
covers its wall time except the prompt prefill and the closing work of its final round, which the loop's own
total (:attr:`ServingLoop.wall_seconds`) includes. The share-out is :mod:`specround.serving.step_timings`.

**Failures.** Nothing is half-published: the controller's step either publishes a round or leaves its state
as it was (INV-7). An aborted round's branch is discarded and the request keeps its state; a round aborted by
an injected fault before publication is retried in the next step, any other abort fails the request (its
error is in :attr:`ServingLoop.errors`). An exception escaping a step discards every live branch, and
the next step re-synchronises each request's target cache with its published state (``C == O[:-1]``,
INV-1) before drafting.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from specround.errors import InjectedFaultError, InvalidRequestError, SpecroundError
from specround.sampling.layouts import retains_frontier
from specround.sampling.processors.processor_chain import ProcessorChain, sampling_chain
from specround.sampling.types import PAD_ID, Layout
from specround.serving.policy import (
    MAX_DRAFT_LENGTH,
    DraftLengthPolicy,
    DraftSlot,
    FixedDraftLength,
    StepCosts,
)
from specround.serving.run_stats import AcceptanceStats, RoundOutcome
from specround.serving.step_timings import RoundWork, StepTimes, share_out, verify_calls
from specround.statemachine.controller import RoundController
from specround.statemachine.events import RoundTimings
from specround.statemachine.model_ports import (
    BranchHandle,
    Proposal,
    ProposalRequest,
    Proposer,
    TargetModel,
    VerifyRequest,
    VerifyResult,
)
from specround.statemachine.rounds import RoundResult, RoundStatus
from specround.statemachine.state import RequestState
from specround.telemetry.observation import RoundObservation, RoundRecorder

__all__ = ["MAX_FAULT_RETRIES", "GenerationRequest", "ServingLoop"]

MAX_FAULT_RETRIES = 8
"""Consecutive rounds of one request aborted by injected faults before the loop gives the request up."""


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """What a caller asks the loop to generate."""

    prompt_ids: tuple[int, ...]
    """The prompt's token ids (at least one)."""
    max_new_tokens: int
    seed: int = 0
    processors: ProcessorChain | None = None
    """The target's decoding policy; None means plain sampling at temperature 1."""
    stop_token_ids: tuple[int, ...] = ()
    """Tokens that end the request when emitted (EOS)."""
    stop_sequences: tuple[tuple[int, ...], ...] = ()
    """Token sequences that end the request when emitted."""
    request_id: str | None = None


@dataclass(slots=True)
class _Request:
    """The loop's working record of one unfinished request."""

    request_id: str
    state: RequestState
    seed: int
    stats: AcceptanceStats = field(default_factory=AcceptanceStats)
    needs_prefill: bool = True
    closing_s: float = 0.0
    """Closing work of the previous round, reported in the next round's ``state_s``."""
    fault_retries: int = 0


@dataclass(slots=True)
class _Round:
    """One request's round inside a step."""

    req: _Request
    k: int
    digest: str = ""
    proposal: Proposal | None = None
    drafts: tuple[int, ...] = ()
    """The drafts verified (a prefix of the proposal's)."""
    q_rows: torch.Tensor | None = None  # [len(drafts), V]
    verified: VerifyResult | None = None
    p_rows: torch.Tensor | None = None  # [k+1, V]
    rows_s: float = 0.0
    frontier_rows: int = 0
    result: RoundResult | None = None
    submitted: bool = False
    """Pipelined loop: the round was staged and its K/V instruction already executed."""


@dataclass(slots=True)
class _Prepared:
    """A step's rounds after steps 1-5, with their time ledger."""

    rounds: list[_Round]
    drafting: list[_Round]
    times: StepTimes
    work: list[RoundWork]
    timings: list[RoundTimings]


class ServingLoop:
    """Drive requests through speculative rounds with one target, one proposer and one controller."""

    def __init__(
        self,
        controller: RoundController,
        target: TargetModel,
        proposer: Proposer | None = None,
        *,
        policy: DraftLengthPolicy | None = None,
        layout: Layout | str = Layout.REPLAY_FRONTIER,
        coordinate: Mapping[str, Any] | None = None,
        on_round: Callable[[RoundOutcome], None] | None = None,
        clock: Callable[[], float] = time.perf_counter,
        recorders: Sequence[RoundRecorder] = (),
    ) -> None:
        """Wire ``target`` and ``proposer`` (None: plain decoding) to ``controller``.

        ``policy`` defaults to ``FixedDraftLength(4)`` (or 0 without a proposer). ``coordinate`` holds the
        static round-coordinate fields every request is opened with (target and draft ids, backend, vocab
        digest); ``target_model_id`` and ``draft_model_id`` default to the adapters' ids. ``on_round`` is
        called with every published round after its K/V instruction was executed (streaming).
        ``recorders`` (e.g. :class:`~specround.telemetry.SpecroundMetrics`) observe every round handed to
        the controller, published or not (:class:`~specround.telemetry.RoundObservation`).
        """
        try:
            self.layout = Layout(layout)
        except ValueError:
            raise InvalidRequestError(f"unknown layout {layout!r}") from None
        self.controller = controller
        self.target = target
        self.proposer = proposer
        self.policy: DraftLengthPolicy = policy or FixedDraftLength(4 if proposer is not None else 0)
        static = dict(coordinate or {})
        static.setdefault("target_model_id", target.model_id)
        static.setdefault("draft_model_id", proposer.proposer_id if proposer is not None else "none")
        self._coordinate = static
        self.on_round = on_round
        self.recorders = tuple(recorders)
        self._clock = clock
        self._requests: dict[str, _Request] = {}
        self.finished: dict[str, RequestState] = {}
        """Published final states of finished requests."""
        self.errors: dict[str, SpecroundError] = {}
        """Requests the loop gave up, with the error of the round that failed."""
        self.stats = AcceptanceStats()
        """Totals over every published round of the loop."""
        self.wall_seconds = 0.0
        """Wall time spent inside :meth:`step` (prefill and closing work included)."""
        self._finished_stats: dict[str, AcceptanceStats] = {}
        self._live: list[_Round] = []
        self._last_end: float | None = None
        self._dirty = False

    # --- requests ---------------------------------------------------------------------------------------

    def submit(self, request: GenerationRequest) -> str:
        """Open a request and return its id.

        Its ``request_opened`` event is logged now; its prompt is prefilled at the next step, together with
        the other new requests, in one packed call.
        """
        prompt = tuple(request.prompt_ids)
        if not prompt:
            raise InvalidRequestError("the prompt must hold at least one token")
        budget = request.max_new_tokens
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
            raise InvalidRequestError(f"max_new_tokens must be a positive integer, got {budget!r}")
        if len(prompt) + budget > self.target.context_length:
            raise InvalidRequestError(
                f"prompt ({len(prompt)} tokens) + max_new_tokens ({budget}) exceed the model's context of "
                f"{self.target.context_length} positions"
            )
        vocab = self.target.vocab_size
        chain = request.processors if request.processors is not None else sampling_chain(vocab)
        if chain.vocab_size != vocab:
            raise InvalidRequestError(
                f"the processor chain covers {chain.vocab_size} tokens, the target {vocab}"
            )
        coordinate = dict(self._coordinate)
        coordinate.setdefault("draft_processors_digest", chain.config_digest())
        state = self.controller.open_request(
            prompt,
            seed=request.seed,
            max_new_tokens=budget,
            processors=chain,
            layout=self.layout,
            stop_token_ids=request.stop_token_ids,
            stop_sequences=request.stop_sequences,
            request_id=request.request_id,
            coordinate=coordinate,
        )
        rid = state.request_id
        if rid in self._requests or rid in self.finished:
            raise InvalidRequestError(f"request {rid!r} is already served by this loop")
        if state.finished:
            self.finished[rid] = state
        else:
            self._requests[rid] = _Request(rid, state, seed=request.seed)
        return rid

    @property
    def active(self) -> list[str]:
        """Unfinished requests, in submission order."""
        return list(self._requests)

    def state(self, request_id: str) -> RequestState:
        """The published state of a request the loop serves or finished."""
        if request_id in self._requests:
            return self._requests[request_id].state
        if request_id in self.finished:
            return self.finished[request_id]
        raise InvalidRequestError(f"unknown request {request_id!r}")

    def request_stats(self, request_id: str) -> AcceptanceStats:
        """Acceptance and time totals of one request (served now or finished)."""
        req = self._requests.get(request_id)
        if req is not None:
            return req.stats
        stats = self._finished_stats.get(request_id)
        if stats is None:
            raise InvalidRequestError(f"unknown request {request_id!r}")
        return stats

    # --- running ----------------------------------------------------------------------------------------

    def run(self, max_steps: int | None = None) -> dict[str, RequestState]:
        """Step until every request finished (or ``max_steps``); returns the finished states.

        Raises the first request error after the step in which it happened (the log holds only complete,
        published rounds; the other requests' rounds of that step were published and executed).
        """
        steps = 0
        while self._requests and (max_steps is None or steps < max_steps):
            failed_before = len(self.errors)
            self.step()
            steps += 1
            if len(self.errors) > failed_before:
                raise next(iter(list(self.errors.values())[failed_before:]))
        return dict(self.finished)

    def step(self) -> list[RoundOutcome]:
        """One round of every unfinished request (see the module docstring); returns the published rounds."""
        clock = self._clock
        start = clock()
        gap = 0.0 if self._last_end is None else max(0.0, start - self._last_end)
        try:
            outcomes = self._step(gap)
        except BaseException:
            self._dirty = True
            self._discard_live_branches()
            raise
        finally:
            end = clock()
            self.wall_seconds += end - start
            self._last_end = end
        if self.on_round is not None:
            for outcome in outcomes:
                self.on_round(outcome)
        return outcomes

    def close(self) -> None:
        """Release every request's caches in the target and the proposer (the log is untouched)."""
        for rid in list(self._requests):
            self._release(rid)
        self._requests.clear()

    # --- the step ---------------------------------------------------------------------------------------

    def _step(self, gap: float) -> list[RoundOutcome]:
        prepared = self._prepare(gap, list(self._requests.values()))
        if prepared is None:
            return []
        t0 = self._clock()
        results = self._publish(prepared.rounds, prepared.timings)
        controller_s = self._clock() - t0
        outcomes, state_costs = self._settle_all(prepared.rounds, results, prepared.timings, controller_s)
        self._live = []
        self._observe(prepared, outcomes, state_costs)
        return outcomes

    def _prepare(self, gap: float, requests: list[_Request]) -> _Prepared | None:
        """Steps 1-5 for ``requests`` (after any resync and prefill); None when there is nothing to run."""
        if self._dirty:
            self._resync_all()
            requests = [r for r in requests if r.request_id in self._requests]
        self._prefill_new()
        if not requests:
            return None
        rounds = self._plan_rounds(requests)
        self._live = rounds
        frontier_s = self._materialize_frontiers(rounds)
        drafting = [r for r in rounds if r.k > 0]
        draft_s = self._draft(drafting)
        verify_s = self._verify(rounds)
        self._process_rows(rounds)
        times = StepTimes(draft_s=draft_s, verify_s=verify_s, frontier_s=frontier_s, gap_s=gap)
        work = [
            RoundWork(
                asked=r.k,
                computed_rows=self._verified(r).computed_rows,
                frontier_rows=r.frontier_rows,
                own_s=r.rows_s + r.req.closing_s,
            )
            for r in rounds
        ]
        return _Prepared(rounds, drafting, times, work, share_out(times, work))

    def _observe(
        self, prepared: _Prepared, outcomes: list[RoundOutcome], state_costs: list[tuple[int, float]]
    ) -> None:
        """Step 8: the draft-length policy observes the step's outcomes and costs."""
        drafting, times, work = prepared.drafting, prepared.times, prepared.work
        self.policy.observe(
            outcomes,
            StepCosts(
                draft=(max(r.k for r in drafting), times.draft_s) if drafting and self.proposer else None,
                verify_calls=verify_calls(times, work),
                states=tuple(state_costs),
                gap_s=times.gap_s,
            ),
        )

    def _plan_rounds(self, requests: Sequence[_Request]) -> list[_Round]:
        """Step 1: each request's K from the policy, capped by its budget and context room."""
        caps = [self._cap(req) for req in requests]
        ks = self.policy.choose(
            [DraftSlot(req.request_id, cap) for req, cap in zip(requests, caps, strict=True)]
        )
        return [_Round(req, max(0, min(int(k), cap))) for req, k, cap in zip(requests, ks, caps, strict=True)]

    def _materialize_frontiers(self, rounds: Sequence[_Round]) -> float:
        """Step 2 (retained layout): one packed call for the frontiers without a row; returns its seconds."""
        if not retains_frontier(self.layout):
            return 0.0
        for rnd in rounds:
            rnd.frontier_rows = 0 if self.target.retained_frontier(rnd.req.request_id) is not None else 1
        t0 = self._clock()
        self.target.materialize_frontier({r.req.request_id: self._frontier(r.req) for r in rounds})
        return self._clock() - t0

    def _draft(self, drafting: Sequence[_Round]) -> float:
        """Step 3: one proposer call for the drafting rounds, then the policy's trim; returns its seconds."""
        if not drafting or self.proposer is None:
            return 0.0
        controller = self.controller
        asks = [
            ProposalRequest(
                request_id=r.req.request_id,
                context_ids=r.req.state.output,
                k=r.k,
                processors=controller.processors(r.req.request_id),
                seed=r.req.seed,
                proposal_counter=r.req.state.rng.proposal,
            )
            for r in drafting
        ]
        t0 = self._clock()
        proposals = self.proposer.propose(asks)
        draft_s = self._clock() - t0
        for rnd, proposal in zip(drafting, proposals, strict=True):
            if proposal.request_id != rnd.req.request_id or proposal.draft_ids.numel() > rnd.k:
                raise InvalidRequestError(
                    f"the proposer answered {proposal.request_id!r} with {proposal.draft_ids.numel()} "
                    f"drafts for {rnd.req.request_id!r} (asked for at most {rnd.k})"
                )
            rnd.proposal = proposal
        # Verify a prefix of what was offered (the policy's trim; exactness is kept, see the policy).
        keep = self.policy.trim(
            [DraftSlot(r.req.request_id, r.proposal.draft_ids.numel() if r.proposal else 0) for r in drafting]
        )
        for rnd, count in zip(drafting, keep, strict=True):
            if rnd.proposal is None:
                continue
            offered = rnd.proposal.draft_ids.numel()
            count = max(0, min(int(count), offered))
            rnd.drafts = tuple(int(t) for t in rnd.proposal.draft_ids[:count].tolist())
            rnd.q_rows = rnd.proposal.q_rows[:count]  # [count, V]
        return draft_s

    def _verify(self, rounds: Sequence[_Round]) -> float:
        """Step 4: ONE packed target call over every round's branch; returns its seconds."""
        for rnd in rounds:
            rnd.digest = self.controller.coordinate_digest(rnd.req.request_id)
        t0 = self._clock()
        verified = self.target.verify(
            [VerifyRequest(r.req.request_id, self.layout, self._frontier(r.req), r.drafts) for r in rounds]
        )
        verify_s = self._clock() - t0
        for rnd, checked in zip(rounds, verified, strict=True):
            rnd.verified = checked
        return verify_s

    def _process_rows(self, rounds: Sequence[_Round]) -> None:
        """Step 5: each round's p rows, its chain at its logical prefixes (timed per round)."""
        clock = self._clock
        for rnd in rounds:
            t0 = clock()
            chain = self.controller.processors(rnd.req.request_id)
            rnd.p_rows = chain.rows_along(self._verified(rnd).logits, rnd.drafts)  # [k+1, V]
            rnd.rows_s = clock() - t0

    def _settle_all(
        self,
        rounds: Sequence[_Round],
        results: Sequence[RoundResult],
        timings: Sequence[RoundTimings],
        controller_s: float,
    ) -> tuple[list[RoundOutcome], list[tuple[int, float]]]:
        """Step 7: observe and settle each round; its published outcomes and the per-round state costs."""
        clock = self._clock
        share = 1.0 / len(rounds)
        outcomes: list[RoundOutcome] = []
        state_costs: list[tuple[int, float]] = []
        for rnd, result, timing in zip(rounds, results, timings, strict=True):
            rnd.result = result
            if self.recorders:
                observation = RoundObservation.from_result(
                    result,
                    drafted=len(rnd.drafts),
                    verify_rows=self._verified(rnd).computed_rows,
                    timings=timing,
                )
                for recorder in self.recorders:
                    recorder.observe_round(observation)
            t0 = clock()
            outcome = self._settle(rnd, result, timing)
            closing = controller_s * share + (clock() - t0)
            state_costs.append((len(rnd.drafts), rnd.rows_s + closing))
            if outcome is not None:
                outcomes.append(outcome)
                if outcome.finished:
                    self._finish(rnd.req)
                else:
                    rnd.req.closing_s = closing
        return outcomes, state_costs

    @staticmethod
    def _verified(rnd: _Round) -> VerifyResult:
        assert rnd.verified is not None, "a round is verified before its rows are processed"
        return rnd.verified

    def _publish(self, rounds: Sequence[_Round], timings: Sequence[RoundTimings]) -> list[RoundResult]:
        """Step 6: one controller step over the batch tensors (decide, stage, publish)."""
        args, options = self._batch_inputs(rounds, timings)
        return self.controller.step_batch(*args, **options).results()

    def _batch_inputs(
        self, rounds: Sequence[_Round], timings: Sequence[RoundTimings]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The batch step's arguments: drafts, q and p padded to the step's widest draft, per-row options.

        When every round drafted the same number of tokens nothing needs padding: the rows are stacked
        (one copy), or at B = 1 passed as views of the round's own rows (no copy).
        """
        widths = [len(r.drafts) for r in rounds]
        width = max(widths)
        if widths.count(width) == len(rounds):
            draft_ids, q, p = self._stacked_rows(rounds, width)
        else:
            draft_ids, q, p = self._padded_rows(rounds, width)
        verified = [r.verified for r in rounds]
        lens = torch.tensor(widths, dtype=torch.int64)  # [B]
        options: dict[str, Any] = {
            "coordinate_digests": [r.digest for r in rounds],
            "proposal_draws": [r.proposal.proposal_draws if r.proposal is not None else 0 for r in rounds],
            "branches": [v.branch if v is not None else None for v in verified],
            "verify_rows": [v.computed_rows if v is not None else None for v in verified],
            "timings": timings,
        }
        return ([r.req.request_id for r in rounds], draft_ids, lens, q, p), options

    @staticmethod
    def _stacked_rows(
        rounds: Sequence[_Round], width: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``draft_ids [B, K]``, ``q [B, K, V]``, ``p [B, K+1, V]`` of rounds that all drafted ``width``."""
        p_rows = [_present(r.p_rows) for r in rounds]  # each [K+1, V]
        first = p_rows[0]
        n = len(rounds)
        draft_ids = torch.tensor([r.drafts for r in rounds], dtype=torch.int64).reshape(n, width)
        if not width:
            q = first.new_zeros((n, 0, first.shape[-1]))
        elif n == 1:  # a view: the step reads its rows as they are and never writes them
            q = _present(rounds[0].q_rows).to(first).unsqueeze(0)
        else:
            q = torch.stack([_present(r.q_rows) for r in rounds]).to(first)
        p = first.unsqueeze(0) if n == 1 else torch.stack(p_rows)
        return draft_ids, q, p

    @staticmethod
    def _padded_rows(rounds: Sequence[_Round], width: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``draft_ids [B, K]``, ``q [B, K, V]``, ``p [B, K+1, V]`` padded to the step's widest draft."""
        first = _present(rounds[0].p_rows)
        n, vocab = len(rounds), first.shape[-1]
        p = first.new_zeros((n, width + 1, vocab))  # [B, K+1, V]
        q = first.new_zeros((n, width, vocab))  # [B, K, V]
        draft_ids = torch.full((n, width), PAD_ID, dtype=torch.int64)  # [B, K]
        for b, rnd in enumerate(rounds):
            k = len(rnd.drafts)
            p[b, : k + 1] = _present(rnd.p_rows)
            if k:
                q[b, :k] = _present(rnd.q_rows)
                draft_ids[b, :k] = torch.tensor(rnd.drafts, dtype=torch.int64)
        return draft_ids, q, p

    def _settle(self, rnd: _Round, result: RoundResult, timing: RoundTimings) -> RoundOutcome | None:
        """Execute one round's K/V instruction and bookkeeping; returns its outcome when it published."""
        req = rnd.req
        rid = req.request_id
        assert rnd.verified is not None
        branch: BranchHandle = rnd.verified.branch
        if result.status in (RoundStatus.PUBLISHED, RoundStatus.ACKNOWLEDGED):
            assert result.kv is not None and result.state is not None
            self.target.commit(rid, branch, result.kv.keep)  # INV-5: [F_0] + accepted drafts, nothing else
            self._moved_on(req, result.state)
            return self._published_outcome(rnd, result, timing)
        if result.status is RoundStatus.UNACKNOWLEDGED:
            # Published, but the acknowledgement was lost after publication (F-6): the controller holds the
            # published successor; re-synchronise the target's rows with it from scratch.
            self.target.discard(rid, branch)
            req.state = self.controller.state(rid)
            self._resync(req)
            if req.state.finished:
                self._finish(req)
            return None
        # ABORTED: nothing was published; the round-start state stays authoritative (INV-7).
        self.target.discard(rid, branch)
        self._aborted(req, result)
        return None

    def _moved_on(self, req: _Request, state: RequestState) -> None:
        """The request's state after its round's K/V instruction ran; the proposer hears of it."""
        req.state = state
        if not state.finished and self.proposer is not None:
            self.proposer.on_published(req.request_id, state.output, len(state.cache))

    def _published_outcome(self, rnd: _Round, result: RoundResult, timing: RoundTimings) -> RoundOutcome:
        """The outcome of a durable round, counted in the request's and the loop's statistics."""
        assert result.commit is not None
        before, after = result.commit.rng_before, result.commit.rng_after
        outcome = RoundOutcome(
            request_id=rnd.req.request_id,
            generation=result.generation,
            requested_k=rnd.k,
            drafted=len(rnd.drafts),
            accepted=result.accepted,
            reached=after[1] - before[1],
            emitted_ids=result.emitted_ids,
            terminal=result.terminal or "bonus",
            finished=result.finished,
            finish_reason=result.finish_reason,
            timings=timing,
        )
        rnd.req.fault_retries = 0
        rnd.req.stats.add(outcome)
        self.stats.add(outcome)
        return outcome

    def _aborted(self, req: _Request, result: RoundResult) -> None:
        """An aborted round: an injected fault is retried (a few times); any other abort fails the request."""
        rid = req.request_id
        error = result.error or InvalidRequestError(f"round of {rid!r} aborted")
        if isinstance(error, InjectedFaultError) and req.fault_retries < MAX_FAULT_RETRIES:
            req.fault_retries += 1
            return
        self.errors[rid] = error
        self._release(rid)
        self._requests.pop(rid, None)

    # --- helpers ------------------------------------------------------------------------------------------

    def _cap(self, req: _Request) -> int:
        if self.proposer is None:
            return 0
        state = req.state
        remaining = self.controller.remaining(req.request_id)
        room = self.target.context_length - len(state.cache) - 1
        return max(0, min(remaining - 1, room, MAX_DRAFT_LENGTH))

    @staticmethod
    def _frontier(req: _Request) -> int:
        frontier = req.state.frontier
        assert frontier is not None, "an unfinished request has a frontier"
        return frontier

    def _prefill_new(self) -> None:
        fresh = {rid: req.state.cache for rid, req in self._requests.items() if req.needs_prefill}
        if not fresh:
            return
        self.target.prefill(fresh)
        for rid in fresh:
            self._requests[rid].needs_prefill = False

    def _finish(self, req: _Request) -> None:
        rid = req.request_id
        self.finished[rid] = req.state
        self._finished_stats[rid] = req.stats
        self._release(rid)
        self._requests.pop(rid, None)

    def _release(self, rid: str) -> None:
        self.target.release(rid)
        if self.proposer is not None:
            self.proposer.release(rid)
        self.policy.forget(rid)

    def _discard_live_branches(self) -> None:
        for rnd in getattr(self, "_live", []):
            if rnd.verified is None or (rnd.result is not None and rnd.result.ok):
                continue
            with contextlib.suppress(SpecroundError):  # committed or discarded already: resync follows
                self.target.discard(rnd.req.request_id, rnd.verified.branch)
        self._live = []

    def _resync(self, req: _Request) -> None:
        """Make the target's committed rows equal the published cache C (INV-1), re-prefilling if needed."""
        rid = req.request_id
        if self.target.committed_token_ids(rid) != req.state.cache:
            self.target.release(rid)
            self.target.prefill({rid: req.state.cache})
        if self.proposer is not None:
            self.proposer.on_published(rid, req.state.output, len(req.state.cache))

    def _resync_all(self) -> None:
        for req in list(self._requests.values()):
            req.state = self.controller.state(req.request_id)
            if req.state.finished:
                self._finish(req)
            elif not req.needs_prefill:
                self._resync(req)
        self._dirty = False


def _present(rows: torch.Tensor | None) -> torch.Tensor:
    """``rows``, which the loop has filled in by the time it builds the step's arguments."""
    assert rows is not None, "a verified round has its p rows, and q rows when it drafted"
    return rows
