"""The step loop of :func:`specround.hf.generate`: one round of every unfinished row per step, in named steps.

A step chooses each row's K (:meth:`BatchLoop._asked`), drafts (:meth:`BatchLoop._draft`), verifies every
row in ONE target forward and processes the p rows (:meth:`BatchLoop._verify`), shares the step's time out
among the rows (:mod:`specround.serving.step_timings`), publishes the rows as ONE controller step, and then
executes each row's K/V instruction and keeps what the caller asked to see (:meth:`BatchLoop._settle`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from specround.hf.batch_cache import BatchedCausalLM
from specround.hf.controller_bridge import BRIDGE_LAYOUT, ControllerBridge, RoundRequest, StagedRound
from specround.hf.drafting import DraftAsk, Drafter
from specround.hf.generation_settings import GenerationSettings
from specround.sampling.layouts import extract_verification, verification_inputs
from specround.sampling.processors.processor_chain import ProcessorChain
from specround.serving.policy import MAX_DRAFT_LENGTH, DraftLengthPolicy, DraftSlot, StepCosts
from specround.serving.run_stats import AcceptanceStats, RoundOutcome
from specround.serving.step_timings import RoundWork, StepTimes, share_out, verify_calls
from specround.statemachine.events import RoundTimings
from specround.statemachine.state import RequestState

__all__ = ["BatchLoop", "RowRequests"]


@dataclass(frozen=True, slots=True)
class RowRequests:
    """What every row's request is opened with."""

    prompts: list[list[int]]
    seeds: list[int]
    budget: int
    """``max_new_tokens`` of every row."""
    p_chains: list[ProcessorChain]
    """The target's processor chain of each row."""
    eos: tuple[int, ...]
    coordinate: dict[str, Any]


@dataclass(slots=True)
class _Drafts:
    """One step's drafts, per row."""

    tokens: dict[int, tuple[int, ...]]
    q_rows: dict[int, torch.Tensor | None]
    draws: dict[int, int]
    drafting: list[int] = field(default_factory=list)
    """Rows that asked for at least one draft."""
    seconds: float = 0.0


@dataclass(slots=True)
class _Verified:
    """One step's verification, per row."""

    logits: dict[int, torch.Tensor]
    """[k + 1, V] raw target logits."""
    p_rows: dict[int, torch.Tensor]
    """[k + 1, V] processed."""
    work: list[RoundWork]
    seconds: float
    filled: dict[int, int]
    """Committed-cache tokens each row fed ahead of its verification (its prompt, in the first step)."""


class BatchLoop:
    """Every row of one :func:`specround.hf.generate` call, driven step by step until all finished."""

    def __init__(
        self,
        target: BatchedCausalLM,
        drafter: Drafter | None,
        policy: DraftLengthPolicy,
        bridge: ControllerBridge,
        *,
        q_chains: list[ProcessorChain],
        settings: GenerationSettings,
        context: int,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.target = target
        self.drafter = drafter
        self.policy = policy
        self.bridge = bridge
        self.q_chains = q_chains
        """Each row's draft chain at its published state."""
        self.settings = settings
        self.context = context
        self.clock = clock
        self.rids: list[str] = []
        """The request id of each row."""
        self.states: list[RequestState] = []
        """The published state of each row."""
        self.seeds: list[int] = []
        self.rounds: list[list[RoundOutcome]] = []
        """Each row's published rounds."""
        self.stats: list[AcceptanceStats] = []
        self.totals = AcceptanceStats()
        self.scores: list[list[torch.Tensor]] = []
        """Per row, log p of every emitted position (with ``output_scores``)."""
        self.raw: list[list[torch.Tensor]] = []
        """Per row, the raw logits of every emitted position (with ``output_logits``)."""

    def open(self, rows: RowRequests) -> None:
        """Open every row's request; each row's committed cache ``C = O[:-1]`` fills in its first verify."""
        for b, prompt in enumerate(rows.prompts):
            state = self.bridge.open_request(
                prompt,
                seed=rows.seeds[b],
                max_new_tokens=rows.budget,
                chain=rows.p_chains[b],
                stop_token_ids=rows.eos,
                coordinate=rows.coordinate,
                request_id=uuid.uuid4().hex,
            )
            self.rids.append(state.request_id)
            self.states.append(state)
        batch = len(rows.prompts)
        self.seeds = list(rows.seeds)
        self.rounds = [[] for _ in range(batch)]
        self.stats = [AcceptanceStats() for _ in range(batch)]
        self.scores = [[] for _ in range(batch)]
        self.raw = [[] for _ in range(batch)]

    def run(self) -> None:
        """Step until every row finished and every round is durable."""
        live = [b for b in range(len(self.states)) if not self.states[b].finished]
        last_end = self.clock()
        while live:
            live = self.step(live, gap=self.clock() - last_end)
            last_end = self.clock()
        self.bridge.settle()  # every round is durable before any token is returned

    def step(self, live: Sequence[int], gap: float) -> list[int]:
        """One round of every row of ``live``; returns the rows still unfinished."""
        asked = self._asked(live)
        drafts = self._draft(live, asked)
        verified = self._verify(live, asked, drafts)
        times = StepTimes(draft_s=drafts.seconds, verify_s=verified.seconds, gap_s=gap)
        requests = [
            RoundRequest(
                self.rids[b],
                drafts.tokens[b],
                drafts.q_rows[b],
                verified.p_rows[b],
                proposal_draws=drafts.draws[b],
                verify_rows=work.computed_rows - verified.filled[b],
                timings=timing,
            )
            for b, work, timing in zip(live, verified.work, share_out(times, verified.work), strict=True)
        ]
        t0 = self.clock()
        results = self.bridge.submit(requests)  # decided now; durable before generate returns
        controller_s = self.clock() - t0
        outcomes = self._settle(live, asked, requests, results, verified)
        finished = [b for b in live if self.states[b].finished]
        for b in finished:
            self.policy.forget(self.rids[b])
        still = [b for b in live if not self.states[b].finished]
        self.target.tidy(still)
        if self.drafter is not None:
            self.drafter.keep_rows(still)
        self.policy.observe(
            outcomes,
            StepCosts(
                draft=(max(asked[b] for b in drafts.drafting), drafts.seconds)
                if drafts.drafting and self.drafter is not None
                else None,
                verify_calls=verify_calls(times, verified.work),
                states=tuple(
                    (len(r.draft_ids), verified.work[i].own_s + controller_s / len(requests))
                    for i, r in enumerate(requests)
                ),
                gap_s=gap,
            ),
        )
        return still

    def _asked(self, live: Sequence[int]) -> dict[int, int]:
        """Each row's K from the policy, capped by its budget, its context room and the longest draft."""
        caps = {}
        for b in live:
            room = self.context - len(self.states[b].cache) - 1
            remaining = self.bridge.remaining(self.rids[b]) - 1
            caps[b] = 0 if self.drafter is None else max(0, min(remaining, MAX_DRAFT_LENGTH, room))
        ks = self.policy.choose([DraftSlot(self.rids[b], caps[b]) for b in live])
        return {b: max(0, min(int(kk), caps[b])) for b, kk in zip(live, ks, strict=True)}

    def _draft(self, live: Sequence[int], asked: Mapping[int, int]) -> _Drafts:
        """One drafter call for the rows that asked for drafts, then the policy's trim."""
        out = _Drafts({b: () for b in live}, {b: None for b in live}, {b: 0 for b in live})
        out.drafting = [b for b in live if asked[b] > 0]
        if self.drafter is None or not out.drafting:
            return out
        states = self.states
        t0 = self.clock()
        offered = self.drafter.propose(
            [
                DraftAsk(
                    b,
                    states[b].output,
                    asked[b],
                    self.q_chains[b].clone(),
                    self.seeds[b],
                    states[b].rng.proposal,
                )
                for b in out.drafting
            ]
        )
        out.seconds = self.clock() - t0
        kept = self.policy.trim([DraftSlot(self.rids[b], len(offered[b].tokens)) for b in out.drafting])
        for b, count in zip(out.drafting, kept, strict=True):
            got = offered[b]
            n = max(0, min(int(count), len(got.tokens)))
            out.tokens[b] = got.tokens[:n]
            out.q_rows[b] = got.q_rows[:n]
            out.draws[b] = min(got.draws, n) if got.draws else 0
        return out

    def _verify(self, live: Sequence[int], asked: Mapping[int, int], drafts: _Drafts) -> _Verified:
        """ONE target forward over every row's verification inputs, then each row's p rows along its path.

        A row whose target cache lacks part of its committed cache ``C`` (its prompt, on the first step) feeds
        that part first, in the same forward; only the verification inputs get logits.
        """
        states, target = self.states, self.target
        inputs = {
            b: verification_inputs(
                BRIDGE_LAYOUT, int(states[b].frontier or 0), drafts.tokens[b], len(states[b].cache)
            )
            for b in live
        }
        filled = {b: states[b].cache[len(target.tokens[b]) :] for b in live}
        t0 = self.clock()
        computed = target.forward(
            {b: [*filled[b], *inputs[b].input_ids] for b in live},
            tails={b: len(inputs[b].input_ids) for b in live},
        )
        seconds = self.clock() - t0
        logits, p_rows, work = {}, {}, []
        for b in live:
            k = len(drafts.tokens[b])
            logits[b] = extract_verification(BRIDGE_LAYOUT, computed[b], inputs[b].positions, k).p_rows
            t1 = self.clock()
            p_rows[b] = self.bridge.processors(self.rids[b]).rows_along(
                logits[b], drafts.tokens[b]
            )  # [k+1, V]
            rows = len(filled[b]) + len(inputs[b].input_ids)
            work.append(RoundWork(asked[b], rows, own_s=self.clock() - t1))
        return _Verified(logits, p_rows, work, seconds, {b: len(f) for b, f in filled.items()})

    def _settle(
        self,
        live: Sequence[int],
        asked: Mapping[int, int],
        requests: Sequence[RoundRequest],
        results: Sequence[StagedRound],
        verified: _Verified,
    ) -> list[RoundOutcome]:
        """Keep each staged row's round and commit what it kept (the bridge raised any row's failure)."""
        keeps: dict[int, int] = {}
        outcomes = []
        for b, req, result in zip(live, requests, results, strict=True):
            keeps[b] = verified.filled[b] + result.keep
            self.states[b] = result.state
            self.q_chains[b].advance_many(result.emitted_ids)
            self._keep_positions(b, len(result.emitted_ids), verified)
            if self.drafter is not None and not result.finished:
                self.drafter.on_published(b, result.state.output)
            outcome = self._outcome(b, asked[b], req, result)
            self.rounds[b].append(outcome)
            self.stats[b].add(outcome)
            self.totals.add(outcome)
            outcomes.append(outcome)
        self.target.commit(keeps)
        return outcomes

    def _keep_positions(self, b: int, emitted: int, verified: _Verified) -> None:
        """Keep the scores and raw logits of a row's emitted positions, as the settings ask."""
        if self.settings.output_scores:
            self.scores[b].extend(torch.log(verified.p_rows[b][j]) for j in range(emitted))
        if self.settings.output_logits:
            # A copy: the row is a view of the whole step's logits, which it would otherwise keep alive.
            self.raw[b].extend(verified.logits[b][j].clone() for j in range(emitted))

    def _outcome(self, b: int, asked: int, req: RoundRequest, result: StagedRound) -> RoundOutcome:
        """The staged round of row ``b`` as the caller sees it (released once the bridge settled it)."""
        return RoundOutcome(
            request_id=self.rids[b],
            generation=result.generation,
            requested_k=asked,
            drafted=len(req.draft_ids),
            accepted=result.accepted,
            reached=result.reached,
            emitted_ids=result.emitted_ids,
            terminal=result.terminal or "bonus",
            finished=result.finished,
            finish_reason=result.finish_reason,
            timings=req.timings or RoundTimings(),
        )
