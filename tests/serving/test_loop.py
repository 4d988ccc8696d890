"""The serving loop on the tiny random-weights model: K/V invariants after every round, both layouts and
every proposer, the time ledger in the log, failures before and after publication, and input checks."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from specround.adapters.llama import LlamaBundle, LlamaTarget, tiny_llama
from specround.adapters.memory_log import MemoryEventLog
from specround.adapters.proposers import ModelProposer, NGramProposer, early_exit_proposer
from specround.audit import audit_log
from specround.errors import InvalidRequestError
from specround.sampling.processors import ProcessorChain, sampling_chain
from specround.sampling.types import Layout
from specround.serving import (
    AdaptiveDraftLength,
    FixedDraftLength,
    GenerationRequest,
    RoundOutcome,
    ServingLoop,
)
from specround.statemachine.controller import RoundController
from specround.statemachine.faults import FaultPlan, FaultPoint
from specround.statemachine.model_ports import Proposal, ProposalRequest, Proposer, VerifyRequest

V = 8
PROMPT = (1, 2, 3, 1, 2, 4)
LAYOUTS = [Layout.REPLAY_FRONTIER, Layout.RETAINED_FRONTIER]
PROPOSERS = ["ngram", "early_exit", "draft_model"]


@pytest.fixture(scope="module")
def draft_bundle() -> LlamaBundle:
    return tiny_llama(seed=1)


def make_proposer(name: str, target: LlamaTarget, draft_bundle: LlamaBundle) -> Proposer:
    if name == "ngram":
        return NGramProposer(V, max_ngram=2)
    if name == "early_exit":
        return early_exit_proposer(target, 1)
    return ModelProposer(LlamaTarget(draft_bundle.model, model_id=draft_bundle.model_id))


def chain() -> ProcessorChain:
    return sampling_chain(V, temperature=0.9, top_k=6, top_p=0.95, repetition_penalty=1.2)


def check_cache(
    loop: ServingLoop, target: LlamaTarget, bundle: LlamaBundle
) -> Callable[[RoundOutcome], None]:
    """INV-1 / INV-5 after every published round, and logits of the committed rows == a fresh prefill."""

    def on_round(outcome: RoundOutcome) -> None:
        state = loop.state(outcome.request_id)
        if state.finished:
            return
        rid = outcome.request_id
        committed = target.committed_token_ids(rid)
        assert committed == state.cache == state.output[:-1]  # INV-1, INV-5: nothing else committed
        assert state.frontier == state.output[-1]
        fresh = bundle.model.logits(torch.tensor(state.output))[-1]  # [V]
        if target.retained_frontier(rid) is not None:
            from_cache = target.materialize_frontier({rid: state.frontier})[rid]  # stored, not recomputed
        else:
            (res,) = target.verify([VerifyRequest(rid, Layout.REPLAY_FRONTIER, state.frontier, ())])
            from_cache = res.logits[0]
            target.discard(rid, res.branch)
        torch.testing.assert_close(from_cache, fresh, rtol=1e-4, atol=1e-4)

    return on_round


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("name", PROPOSERS)
def test_committed_cache_is_output_minus_frontier_after_every_round(
    tiny: LlamaBundle, draft_bundle: LlamaBundle, name: str, layout: Layout
) -> None:
    target = LlamaTarget(tiny.model, model_id=tiny.model_id)
    proposer = make_proposer(name, target, draft_bundle)
    log = MemoryEventLog()
    loop = ServingLoop(RoundController(log), target, proposer, policy=FixedDraftLength(3), layout=layout)
    loop.on_round = check_cache(loop, target, tiny)
    ids = [
        loop.submit(GenerationRequest(PROMPT, 14, seed=seed, processors=chain(), stop_token_ids=(7,)))
        for seed in range(6)
    ]
    finished = loop.run()
    assert set(finished) == set(ids) and not loop.errors
    for rid in ids:
        state = finished[rid]
        assert state.finished and len(state.generated) <= 14
        assert state.finish_reason == "stop" or len(state.generated) == 14
        assert not target.is_open(rid)  # released
    assert loop.stats.proposed > 0 and loop.stats.rounds > 0
    assert audit_log(log).ok


def test_layouts_publish_the_same_outputs(tiny: LlamaBundle, draft_bundle: LlamaBundle) -> None:
    outputs = []
    for layout in LAYOUTS:
        target = LlamaTarget(tiny.model, model_id=tiny.model_id)
        loop = ServingLoop(
            RoundController(MemoryEventLog()),
            target,
            make_proposer("draft_model", target, draft_bundle),
            policy=FixedDraftLength(3),
            layout=layout,
        )
        ids = [loop.submit(GenerationRequest(PROMPT, 10, seed=s, processors=chain())) for s in range(4)]
        finished = loop.run()
        outputs.append([finished[rid].output for rid in ids])
    assert outputs[0] == outputs[1]


def test_every_published_round_logs_its_time_ledger(tiny: LlamaBundle) -> None:
    target = LlamaTarget(tiny.model, model_id=tiny.model_id)
    log = MemoryEventLog()
    loop = ServingLoop(
        RoundController(log), target, NGramProposer(V), policy=AdaptiveDraftLength(), layout="replay_frontier"
    )
    rid = loop.submit(GenerationRequest(PROMPT, 12, seed=3, processors=chain()))
    loop.run()
    published = [e.payload for e in log.events(rid) if e.payload["kind"] == "round_published"]
    assert len(published) == loop.request_stats(rid).rounds
    totals = dict.fromkeys(("draft_s", "verify_s", "state_s", "queue_s"), 0.0)
    for event in published:
        timings = event["timings"]
        assert timings is not None and all(timings[name] >= 0.0 for name in totals)
        assert timings["verify_s"] > 0.0  # every round ran a target call
        for name in totals:
            totals[name] += timings[name]
    stats = loop.request_stats(rid)
    assert totals["verify_s"] == pytest.approx(stats.verify_s)
    # The logged rounds cover the loop's wall time except prefill and the last round's closing work.
    assert stats.logged_seconds <= loop.wall_seconds


@pytest.mark.parametrize("point", [FaultPoint.AFTER_KV_STAGING, FaultPoint.BEFORE_PUBLICATION])
def test_a_fault_before_publication_is_retried_and_changes_nothing(
    tiny: LlamaBundle, point: FaultPoint
) -> None:
    """INV-7: the aborted round leaves state and log as they were; the retry publishes the same round."""

    def run(faults: FaultPlan | None) -> tuple[tuple[int, ...], MemoryEventLog, ServingLoop]:
        target = LlamaTarget(tiny.model, model_id=tiny.model_id)
        log = MemoryEventLog()
        loop = ServingLoop(
            RoundController(log, faults=faults),
            target,
            early_exit_proposer(target, 1),
            layout="retained_frontier",
        )
        rid = loop.submit(GenerationRequest(PROMPT, 12, seed=5, processors=chain(), request_id="r"))
        loop.run()
        return loop.state(rid).output, log, loop

    clean, _, _ = run(None)
    plan = FaultPlan.at(point, generations=[2], times=2)
    faulted, log, loop = run(plan)
    assert len(plan.fired) == 2
    assert faulted == clean
    assert audit_log(log).ok and not loop.errors


def test_a_lost_acknowledgement_is_recovered_from_the_published_state(tiny: LlamaBundle) -> None:
    """F-6: published but unacknowledged; the loop re-synchronises its caches with the published state."""
    outputs = []
    for faults in (None, FaultPlan.at(FaultPoint.AFTER_PUBLICATION, generations=[1, 3])):
        target = LlamaTarget(tiny.model, model_id=tiny.model_id)
        log = MemoryEventLog()
        loop = ServingLoop(
            RoundController(log, faults=faults), target, NGramProposer(V), layout="replay_frontier"
        )
        rid = loop.submit(GenerationRequest(PROMPT, 12, seed=9, processors=chain(), request_id="r"))
        loop.on_round = check_cache(loop, target, tiny)
        loop.run()
        outputs.append(loop.state(rid).output)
        assert audit_log(log).ok
    assert outputs[0] == outputs[1]


class FailingProposer:
    """Wraps a proposer and raises on one chosen call (a crash in the middle of a step)."""

    def __init__(self, inner: Proposer, fail_on: int) -> None:
        self.inner = inner
        self.calls = 0
        self.fail_on = fail_on

    @property
    def proposer_id(self) -> str:
        return self.inner.proposer_id

    def propose(self, requests: list[ProposalRequest]) -> list[Proposal]:
        self.calls += 1
        if self.calls == self.fail_on:
            raise RuntimeError("proposer crashed")
        return self.inner.propose(requests)

    def on_published(self, request_id: str, output_ids: tuple[int, ...], cache_len: int) -> None:
        self.inner.on_published(request_id, output_ids, cache_len)

    def release(self, request_id: str) -> None:
        self.inner.release(request_id)


def test_an_exception_mid_run_leaves_an_auditable_prefix_and_the_loop_resumes(tiny: LlamaBundle) -> None:
    def build(proposer_fails_on: int | None) -> tuple[ServingLoop, MemoryEventLog, LlamaTarget]:
        target = LlamaTarget(tiny.model, model_id=tiny.model_id)
        inner = early_exit_proposer(target, 1)
        proposer: Proposer = inner if proposer_fails_on is None else FailingProposer(inner, proposer_fails_on)
        log = MemoryEventLog()
        loop = ServingLoop(RoundController(log), target, proposer, policy=FixedDraftLength(2))
        return loop, log, target

    clean, _, _ = build(None)
    ids = [
        clean.submit(GenerationRequest(PROMPT, 10, seed=s, processors=chain(), request_id=f"r{s}"))
        for s in (1, 2)
    ]
    expected = {rid: state.output for rid, state in clean.run().items()}

    loop, log, target = build(3)
    for s in (1, 2):
        loop.submit(GenerationRequest(PROMPT, 10, seed=s, processors=chain(), request_id=f"r{s}"))
    loop.step()
    loop.step()
    with pytest.raises(RuntimeError, match="proposer crashed"):
        loop.step()
    assert audit_log(log).ok  # only complete, published rounds
    for rid in ids:
        assert target.committed_token_ids(rid) == loop.state(rid).cache  # no branch left committed
    loop.on_round = check_cache(loop, target, tiny)
    finished = loop.run()
    assert {rid: state.output for rid, state in finished.items()} == expected
    assert audit_log(log).ok


def test_budget_caps_the_draft_length(tiny: LlamaBundle) -> None:
    target = LlamaTarget(tiny.model, model_id=tiny.model_id)
    seen: list[RoundOutcome] = []
    loop = ServingLoop(
        RoundController(MemoryEventLog()),
        target,
        early_exit_proposer(target, 1),
        policy=FixedDraftLength(8),
        on_round=seen.append,
    )
    rid = loop.submit(GenerationRequest(PROMPT, 5, seed=0, processors=chain()))
    loop.run()
    generated = 0
    for outcome in seen:
        assert outcome.requested_k <= 5 - generated - 1  # a round emits at most K + 1 <= remaining
        generated += outcome.emitted
    assert generated == len(loop.state(rid).generated) <= 5


def test_submit_refuses_bad_requests(tiny: LlamaBundle) -> None:
    target = LlamaTarget(tiny.model, model_id=tiny.model_id)
    log = MemoryEventLog()
    loop = ServingLoop(RoundController(log), target, NGramProposer(V))
    with pytest.raises(InvalidRequestError):
        loop.submit(GenerationRequest((), 4))
    with pytest.raises(InvalidRequestError):
        loop.submit(GenerationRequest(PROMPT, 0))
    with pytest.raises(InvalidRequestError):
        loop.submit(GenerationRequest(PROMPT, target.context_length))
    with pytest.raises(InvalidRequestError):
        loop.submit(GenerationRequest(PROMPT, 4, processors=sampling_chain(V + 1)))
    assert log.request_ids() == []  # nothing was opened
    with pytest.raises(InvalidRequestError):
        ServingLoop(RoundController(log), target, layout="sideways")
